//! What a `Deregister` decides, as a pure function of the records it read: in each topic
//! the leaving consumer is registered for, drain it (when the drain policy asks for it and
//! another active consumer can take its partitions over) or hold its partitions for its
//! return until `now + restart_grace`. The machine (`machine/calls.rs`) reads the
//! records from the store, writes what this decides in one transaction guarded by each
//! record's mod revision, and decides again on a fresh read when that lost a race.
//!
//! A Deregister is rare and a consumer's record may be bound to another instance's lease,
//! which the cache does not keep, so it is always decided on the store's records, never on
//! the cache. That includes "another active consumer can take over": the cache only names
//! the candidates; their records are read with the leaver's, and a drain is guarded by the
//! record of the one it counts on, still `Active` as read. Otherwise two consumers leaving
//! at once, each through a cache that has not seen the other leave (or each decided before
//! the other's write), would both drain with nobody left to drain to: their drains would
//! never end.

use std::time::Duration;

use super::records::{ConsumerRecord, Keys};
use super::state::Cache;
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::cas::CAS_ATTEMPTS;
use crate::coordinator::shared::records::{decode, encode};
use crate::coordinator::shared::streams::StreamKey;
use crate::handoff::{ConsumerStatus, Millis};
use crate::proto::v1::DeregisterAction;
use crate::store::{Compare, KeyValue, Op, SessionId, Txn};

/// One registration of the leaving consumer, as the call first found it in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// The topic.
    pub topic: String,
    /// Its registration id: only this registration is changed, a newer one (a restart
    /// that raced the call) is left alone.
    pub session: i64,
    /// The other consumers of the topic the cache saw active, in name order: those that
    /// may take its partitions over. Only candidates: whether one can is decided on their
    /// records in the store ([`decide_leave`]).
    pub others: Vec<String>,
}

/// The leaving consumer's registrations in `cache`, in topic order.
pub(super) fn registrations(cache: &Cache, consumer: &str) -> Vec<Found> {
    cache
        .topics
        .iter()
        .filter_map(|(topic, entry)| {
            let session = entry.consumers.get(consumer)?.value.session;
            let others = entry
                .consumers
                .iter()
                .filter(|(name, r)| *name != consumer && can_take_over(&r.value))
                .map(|(name, _)| name.clone())
                .collect();
            Some(Found { topic: topic.clone(), session, others })
        })
        .collect()
}

/// Whether the consumer of `record` can take a leaving consumer's partitions over.
fn can_take_over(record: &ConsumerRecord) -> bool {
    record.status == ConsumerStatus::Active
}

/// The answer to a Deregister of a consumer with no registration.
pub(super) fn not_registered(consumer: &str) -> CoordinatorError {
    CoordinatorError::UnknownConsumer(crate::coordinator::causes::ConsumerUnknown::NotRegistered {
        consumer: consumer.to_string(),
    })
}

/// What a Deregister did in one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leaving {
    /// The consumer drains: the leader hands its partitions over warm.
    Draining,
    /// Its partitions are held for its return.
    Held,
}

/// What a Deregister wrote: per topic, how the consumer leaves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Left {
    /// The topics whose registration changed.
    pub topics: Vec<(String, Leaving)>,
    /// Each registration written, with its topic and registration id.
    pub written: Vec<(String, i64, Vec<u8>)>,
}

impl Left {
    /// The registrations written, as the streams they belong to keep them
    /// (`LocalStream::kept`): a registration the store loses afterwards is written again
    /// as this, so a draining consumer still drains. Kept from the write itself, not from
    /// the mirror, which may not follow the store when the loss comes (a watch being
    /// replaced, then a session the store revoked: the cache never saw the drain).
    pub fn kept<'a>(&'a self, consumer: &'a str) -> impl Iterator<Item = (StreamKey, &'a [u8])> + 'a {
        self.written.iter().map(move |(topic, session, record)| {
            ((topic.clone(), consumer.to_string(), SessionId(*session)), record.as_slice())
        })
    }
}

impl Left {
    /// The answer: wait for the drain when any topic drains.
    pub fn action(&self) -> DeregisterAction {
        if self.topics.iter().any(|(_, leaving)| *leaving == Leaving::Draining) {
            DeregisterAction::WaitForDrain
        } else {
            DeregisterAction::ShutdownNow
        }
    }
}

/// A Deregister's answer.
pub(super) type LeaveResult = Result<Left, CoordinatorError>;

/// A `Deregister` on its way through the machine, answered on `R` (its call id).
#[derive(Debug)]
pub(super) struct LeaveInFlight<R> {
    /// The leaving consumer.
    pub consumer: String,
    /// Whether the drain policy asked to drain (asked before the call reached the
    /// machine: it may ask Kubernetes).
    pub wants_drain: bool,
    /// Its registrations, as first found.
    pub found: Vec<Found>,
    /// Transactions that lost a race so far.
    pub attempt: usize,
    /// Where the answer goes.
    pub reply: R,
}

/// What a Deregister needs next.
#[derive(Debug)]
pub(super) enum LeaveStep {
    /// Its answer.
    Answer(LeaveResult),
    /// Its records read from the store (one per [`Found`], in order), to decide on.
    ReadStore,
    /// This transaction written, then `Left` answered.
    Write(Txn, Left),
}

impl<R> LeaveInFlight<R> {
    /// The step after a lost transaction: decide again on a fresh read, while attempts
    /// remain.
    pub fn retry(&mut self) -> LeaveStep {
        self.attempt += 1;
        if self.attempt < CAS_ATTEMPTS {
            return LeaveStep::ReadStore;
        }
        let consumer = &self.consumer;
        LeaveStep::Answer(Err(CoordinatorError::Contended(
            crate::coordinator::causes::Contention::Consumer { consumer: consumer.to_string() },
        )))
    }
}

/// The keys a Deregister reads, in order: per registration found, the leaver's record,
/// then (when the policy asks to drain) the records of the candidates to take over
/// ([`Found::others`]).
pub(super) fn keys_to_read<R>(keys: &Keys, leave: &LeaveInFlight<R>) -> Vec<String> {
    let mut read = Vec::new();
    for found in &leave.found {
        read.push(keys.consumer(&found.topic, &leave.consumer));
        if leave.wants_drain {
            read.extend(found.others.iter().map(|other| keys.consumer(&found.topic, other)));
        }
    }
    read
}

/// What `leave` does at `now` given the records of [`keys_to_read`] as the store holds
/// them (`records`: in its order; `None` where the record is gone). One transaction
/// changes every registration still the one found, keeping each record's lease binding,
/// guarded by each record's mod revision; a drain is guarded too by the mod revision of
/// the first candidate whose record says it can take over (with none, the partitions are
/// held instead). With nothing to change the answer is at once.
pub(super) fn decide_leave<R>(
    leave: &LeaveInFlight<R>,
    records: &[Option<KeyValue>],
    now: Millis,
    restart_grace: Duration,
) -> LeaveStep {
    let mut txn = Txn::new();
    let mut left = Left::default();
    let mut rest = records;
    for found in &leave.found {
        let candidates = if leave.wants_drain { found.others.len() } else { 0 };
        let (read, after) = rest.split_at(rest.len().min(1 + candidates));
        rest = after;
        let Some((Some(kv), others)) = read.split_first() else { continue };
        let mut record: ConsumerRecord = match decode(&kv.key, &kv.value) {
            Ok(record) => record,
            Err(error) => return LeaveStep::Answer(Err(error.into())),
        };
        if record.session != found.session {
            continue;
        }
        // The candidate counted on: active in the store, and guarded to stay so until the
        // drain is written (one is enough: of consumers leaving at once, the last to
        // commit finds the one it counts on still active).
        let successor = others.iter().flatten().find(|other| {
            decode::<ConsumerRecord>(&other.key, &other.value).is_ok_and(|r| can_take_over(&r))
        });
        let leaving = if successor.is_some() {
            record.status = ConsumerStatus::Draining;
            Leaving::Draining
        } else {
            record.hold_until = Some(now + restart_grace.as_millis() as Millis);
            Leaving::Held
        };
        let value = encode(&record);
        left.written.push((found.topic.clone(), record.session, value.clone()));
        let op = match kv.session {
            Some(session) => Op::put_in(&kv.key, value, session),
            None => Op::put(&kv.key, value),
        };
        txn = txn.when(Compare::ModRevision(kv.key.clone(), kv.mod_revision)).then(op);
        if let Some(successor) = successor {
            txn = txn.when(Compare::ModRevision(successor.key.clone(), successor.mod_revision));
        }
        left.topics.push((found.topic.clone(), leaving));
    }
    if txn.ops.is_empty() {
        return LeaveStep::Answer(Ok(left));
    }
    LeaveStep::Write(txn, left)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Found, LeaveInFlight, LeaveStep, Leaving, decide_leave, keys_to_read};
    use crate::coordinator::handoff_backend::records::ConsumerRecord;
    use crate::coordinator::shared::records::{decode, encode};
    use crate::handoff::ConsumerStatus;
    use crate::proto::v1::DeregisterAction;
    use crate::store::{Compare, KeyValue, Op, SessionId};

    fn record(session: i64) -> ConsumerRecord {
        ConsumerRecord {
            v: 1,
            status: ConsumerStatus::Active,
            session,
            instance: "i0".into(),
            hold_until: None,
            info: Default::default(),
            incarnation: 0,
        }
    }

    fn stored(key: &str, record: &ConsumerRecord, mod_revision: i64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: encode(record),
            create_revision: 1,
            mod_revision,
            session: Some(SessionId(77)),
        }
    }

    /// `c` leaving topics `a` (where the cache saw `d` active) and `b` (alone), registration
    /// 5 in both.
    fn leaving(wants_drain: bool) -> LeaveInFlight<()> {
        let found = |topic: &str, others: &[&str]| Found {
            topic: topic.into(),
            session: 5,
            others: others.iter().map(|o| o.to_string()).collect(),
        };
        LeaveInFlight {
            consumer: "c".into(),
            wants_drain,
            found: vec![found("a", &["d"]), found("b", &[])],
            attempt: 0,
            reply: (),
        }
    }

    fn draining(session: i64) -> ConsumerRecord {
        ConsumerRecord { status: ConsumerStatus::Draining, ..record(session) }
    }

    #[test]
    fn a_drain_reads_the_candidates_to_take_over_after_the_leavers_record() {
        let keys = crate::coordinator::handoff_backend::records::Keys::new("/p/");
        assert_eq!(
            keys_to_read(&keys, &leaving(true)),
            ["/p/consumers/a/c", "/p/consumers/a/d", "/p/consumers/b/c"],
        );
        assert_eq!(keys_to_read(&keys, &leaving(false)), ["/p/consumers/a/c", "/p/consumers/b/c"]);
    }

    #[test]
    fn drains_where_someone_can_take_over_and_holds_elsewhere_in_one_guarded_transaction() {
        let records = [
            Some(stored("/a/c", &record(5), 10)),
            Some(stored("/a/d", &record(9), 7)),
            Some(stored("/b/c", &record(5), 11)),
        ];
        let LeaveStep::Write(txn, left) =
            decide_leave(&leaving(true), &records, 1_000, Duration::from_secs(30))
        else {
            panic!("a write");
        };
        assert_eq!(left.topics, [("a".to_string(), Leaving::Draining), ("b".to_string(), Leaving::Held)]);
        assert_eq!(left.action(), DeregisterAction::WaitForDrain);
        // The drain is guarded by the record of `d`, which it counts on to take over.
        assert_eq!(
            txn.compares,
            [
                Compare::ModRevision("/a/c".into(), 10),
                Compare::ModRevision("/a/d".into(), 7),
                Compare::ModRevision("/b/c".into(), 11)
            ]
        );
        let written: Vec<(ConsumerStatus, Option<u64>, Option<SessionId>)> = txn
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value, session } => {
                    let r: ConsumerRecord = decode(key, value).expect("a consumer record");
                    (r.status, r.hold_until, *session)
                }
                other => panic!("a put: {other:?}"),
            })
            .collect();
        assert_eq!(
            written,
            [
                (ConsumerStatus::Draining, None, Some(SessionId(77))),
                (ConsumerStatus::Active, Some(31_000), Some(SessionId(77)))
            ],
            "each record keeps its lease binding"
        );
    }

    /// The cache saw `d` active, but `d` left meanwhile (it drains, or its registration is
    /// gone): nobody can take over, so `c` does not drain, whatever the cache said. Two
    /// consumers leaving at once would otherwise both drain, with nobody to drain to.
    #[test]
    fn a_candidate_the_store_shows_leaving_or_gone_takes_nothing_over() {
        for d in [Some(stored("/a/d", &draining(9), 12)), None] {
            let records =
                [Some(stored("/a/c", &record(5), 10)), d.clone(), Some(stored("/b/c", &record(5), 11))];
            let LeaveStep::Write(txn, left) =
                decide_leave(&leaving(true), &records, 1_000, Duration::from_secs(30))
            else {
                panic!("a write");
            };
            assert_eq!(
                left.topics,
                [("a".to_string(), Leaving::Held), ("b".to_string(), Leaving::Held)],
                "{d:?}"
            );
            assert_eq!(left.action(), DeregisterAction::ShutdownNow);
            assert_eq!(
                txn.compares,
                [Compare::ModRevision("/a/c".into(), 10), Compare::ModRevision("/b/c".into(), 11)]
            );
        }
    }

    #[test]
    fn without_a_drain_every_topic_is_held_and_the_answer_is_shutdown_now() {
        let records = [Some(stored("/a/c", &record(5), 10)), Some(stored("/b/c", &record(5), 11))];
        let LeaveStep::Write(_, left) = decide_leave(&leaving(false), &records, 0, Duration::from_secs(1))
        else {
            panic!("a write");
        };
        assert!(left.topics.iter().all(|(_, leaving)| *leaving == Leaving::Held));
        assert_eq!(left.action(), DeregisterAction::ShutdownNow);
    }

    #[test]
    fn a_newer_or_missing_registration_is_left_alone() {
        // `a` was registered again meanwhile (registration 6), `b` is gone.
        let records = [Some(stored("/a/c", &record(6), 12)), Some(stored("/a/d", &record(9), 7)), None];
        let step = decide_leave(&leaving(true), &records, 0, Duration::from_secs(1));
        assert!(matches!(&step, LeaveStep::Answer(Ok(left)) if left.topics.is_empty()), "{step:?}");
    }

    #[test]
    fn a_lost_race_reads_again_until_the_attempts_run_out() {
        let mut leave = leaving(true);
        let steps: Vec<LeaveStep> =
            (0..crate::coordinator::shared::cas::CAS_ATTEMPTS).map(|_| leave.retry()).collect();
        assert!(steps[..steps.len() - 1].iter().all(|s| matches!(s, LeaveStep::ReadStore)), "{steps:?}");
        assert!(
            matches!(
                steps.last(),
                Some(LeaveStep::Answer(Err(crate::coordinator::CoordinatorError::Contended(_))))
            ),
            "{:?}",
            steps.last()
        );
    }
}
