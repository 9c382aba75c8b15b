//! What a `Deregister` decides, as a pure function of the leaving consumer's records: in
//! each topic it is registered for, drain it (when the drain policy asks for it and
//! another active consumer can take its partitions over) or hold its partitions for its
//! return until `now + restart_grace`. The instance's loop (`driver.rs`) reads the
//! records from the store, commits what this decides in one transaction guarded by each
//! record's mod revision, and decides again on a fresh read when that lost a race.
//!
//! A Deregister is rare and a consumer's record may be bound to another instance's lease,
//! which the cache does not keep, so it is always decided on the store's records, never on
//! the cache.

use std::time::Duration;

use tokio::sync::oneshot;

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
    /// Whether another active consumer of the topic can take its partitions over.
    pub others: bool,
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
                .any(|(name, r)| name != consumer && r.value.status == ConsumerStatus::Active);
            Some(Found { topic: topic.clone(), session, others })
        })
        .collect()
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

/// A `Deregister` on its way through the instance's loop.
#[derive(Debug)]
pub(super) struct LeaveInFlight<R = oneshot::Sender<Result<DeregisterAction, CoordinatorError>>> {
    /// The leaving consumer.
    pub consumer: String,
    /// Whether the drain policy asked to drain (asked before the call reached the loop:
    /// it may ask Kubernetes).
    pub wants_drain: bool,
    /// Its registrations, as first found.
    pub found: Vec<Found>,
    /// Transactions that lost a race so far.
    pub attempt: usize,
    /// Where the answer goes (once logged, `driver.rs`; the state machine's call id).
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

/// The keys a Deregister reads, one per registration found, in order.
pub(super) fn keys_to_read<R>(keys: &Keys, leave: &LeaveInFlight<R>) -> Vec<String> {
    leave.found.iter().map(|found| keys.consumer(&found.topic, &leave.consumer)).collect()
}

/// What `leave` does at `now` given its records as the store holds them (`records`: one
/// per [`Found`], in order; `None` where the record is gone). One transaction changes
/// every registration still the one found, keeping each record's lease binding, guarded
/// by each record's mod revision; with nothing to change the answer is at once.
pub(super) fn decide_leave<R>(
    leave: &LeaveInFlight<R>,
    records: &[Option<KeyValue>],
    now: Millis,
    restart_grace: Duration,
) -> LeaveStep {
    let mut txn = Txn::new();
    let mut left = Left::default();
    for (found, kv) in leave.found.iter().zip(records) {
        let Some(kv) = kv else { continue };
        let mut record: ConsumerRecord = match decode(&kv.key, &kv.value) {
            Ok(record) => record,
            Err(error) => return LeaveStep::Answer(Err(error.into())),
        };
        if record.session != found.session {
            continue;
        }
        let leaving = if leave.wants_drain && found.others {
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

    use super::{Found, LeaveInFlight, LeaveStep, Leaving, decide_leave};
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

    /// `c` leaving topics `a` (someone else active) and `b` (alone), registration 5 in both.
    fn leaving(wants_drain: bool) -> LeaveInFlight {
        let found = |topic: &str, others| Found { topic: topic.into(), session: 5, others };
        LeaveInFlight {
            consumer: "c".into(),
            wants_drain,
            found: vec![found("a", true), found("b", false)],
            attempt: 0,
            reply: tokio::sync::oneshot::channel().0,
        }
    }

    #[test]
    fn drains_where_someone_can_take_over_and_holds_elsewhere_in_one_guarded_transaction() {
        let records = [Some(stored("/a/c", &record(5), 10)), Some(stored("/b/c", &record(5), 11))];
        let LeaveStep::Write(txn, left) =
            decide_leave(&leaving(true), &records, 1_000, Duration::from_secs(30))
        else {
            panic!("a write");
        };
        assert_eq!(left.topics, [("a".to_string(), Leaving::Draining), ("b".to_string(), Leaving::Held)]);
        assert_eq!(left.action(), DeregisterAction::WaitForDrain);
        assert_eq!(
            txn.compares,
            [Compare::ModRevision("/a/c".into(), 10), Compare::ModRevision("/b/c".into(), 11)]
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
        let records = [Some(stored("/a/c", &record(6), 12)), None];
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
