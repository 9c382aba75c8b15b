//! What a consumer call decides, as a pure function of a slice of the state: the handoff
//! machine's [`step`] on the partition's records, turned into one guarded transaction,
//! and what the call needs next ([`next_step`]). The machine (`machine/calls.rs`) reads
//! the slice (from the cache, or the store when the cache may lag), writes what this
//! decides, tells the streams and answers.

use crate::coordinator::causes::TopicUnknown;

use super::records::{AssignmentRecord, ConsumerRecord, HandoffRecord, Keys, TopicRecord, decode};
use super::state::Cache;
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::cas::CAS_ATTEMPTS;
use crate::coordinator::shared::instance::Report;
use crate::handoff::{Cooldowns, Event, HandoffError, Millis, PlanConfig, TopicState, step};
use crate::mutation::{Mutation, is_active};
use crate::store::{Compare, KeyValue, Revision, Txn};

/// A consumer's `PartitionReady` or `PartitionReleased`, as [`decide`] reads it.
#[derive(Clone, Copy, Debug)]
pub(super) struct HandoffCall<'a> {
    /// What it reports.
    pub report: Report,
    /// The consumer that reports it.
    pub consumer: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: u32,
}

/// The part of a topic's state one partition call needs (the partition count, the
/// caller's registration, the partition's owner and handoff), with the revisions to guard
/// on. Built the same way from the cache and from the store.
pub(super) struct PartitionSlice {
    /// The topic state restricted to what the call reads.
    pub state: TopicState,
    /// Mod revision of the caller's registration (0: not registered).
    pub consumer_revision: Revision,
    /// Mod revision of the partition's assignment record (0: none).
    pub owner_revision: Revision,
    /// Mod revision of the partition's handoff record (0: none).
    pub handoff_revision: Revision,
}

impl PartitionSlice {
    /// The slice of `topic` that a call of `consumer` about `partition` reads, from the
    /// cache; `None` when the cache does not know the topic. Built from the topic's
    /// records in O(1), not from a clone of every partition: it is on the handoff fast path.
    pub fn from_cache(cache: &Cache, topic: &str, consumer: &str, partition: u32) -> Option<Self> {
        let entry = cache.topics.get(topic)?;
        let config = entry.config.as_ref()?;
        let mut state = TopicState { partition_count: config.value.partition_count, ..Default::default() };
        let (registration, owner, handoff) =
            (entry.consumers.get(consumer), entry.owners.get(&partition), entry.handoffs.get(&partition));
        if let Some(record) = registration {
            state.consumers.insert(consumer.to_string(), record.value.status);
        }
        if let Some(owner) = owner {
            state.owners.insert(partition, owner.value.clone());
        }
        if let Some(epoch) = entry.epochs.get(&partition) {
            state.epochs.insert(partition, *epoch);
        }
        if let Some(handoff) = handoff {
            state.handoffs.insert(partition, handoff.value.clone());
        }
        Some(Self {
            state,
            consumer_revision: registration.map_or(0, |r| r.mod_revision),
            owner_revision: owner.map_or(0, |o| o.mod_revision),
            handoff_revision: handoff.map_or(0, |h| h.mod_revision),
        })
    }
}

/// The keys a call's slice is read from, in the order [`slice_from_records`] takes them:
/// the topic record, the caller's registration, the partition's assignment and handoff.
pub(super) fn slice_keys(keys: &Keys, topic: &str, consumer: &str, partition: u32) -> [String; 4] {
    [
        keys.topic(topic),
        keys.consumer(topic, consumer),
        keys.assignment(topic, partition),
        keys.handoff(topic, partition),
    ]
}

/// The slice of a call of `consumer` about `partition` of `topic`, from the records read
/// at [`slice_keys`] (pure; `NOT_FOUND` for a topic nobody registered for).
pub(super) fn slice_from_records(
    topic: &str,
    consumer: &str,
    partition: u32,
    keys: &[String; 4],
    records: &[Option<KeyValue>],
) -> Result<PartitionSlice, CoordinatorError> {
    let record = |i: usize| records.get(i).and_then(Option::as_ref);
    let [topic_key, consumer_key, owner_key, handoff_key] = keys;
    let Some(config) = record(0) else {
        return Err(CoordinatorError::UnknownTopic(TopicUnknown::NoConsumers { topic: topic.to_string() }));
    };
    let mut state = TopicState {
        partition_count: decode::<TopicRecord>(topic_key, &config.value)?.partition_count,
        ..Default::default()
    };
    let mut consumer_revision = 0;
    if let Some(kv) = record(1) {
        state
            .consumers
            .insert(consumer.to_string(), decode::<ConsumerRecord>(consumer_key, &kv.value)?.status);
        consumer_revision = kv.mod_revision;
    }
    let (mut owner_revision, mut handoff_revision) = (0, 0);
    if let Some(kv) = record(2) {
        state.owners.insert(partition, decode::<AssignmentRecord>(owner_key, &kv.value)?.owner);
        owner_revision = kv.mod_revision;
    }
    if let Some(kv) = record(3) {
        state.handoffs.insert(partition, decode::<HandoffRecord>(handoff_key, &kv.value)?.handoff);
        handoff_revision = kv.mod_revision;
    }
    Ok(PartitionSlice { state, consumer_revision, owner_revision, handoff_revision })
}

/// What a call decides on a slice.
pub(super) enum Decision {
    /// The handoff rules refuse it on this slice.
    Refused(HandoffError),
    /// It changes nothing: it is already in effect on this slice.
    InEffect,
    /// This transaction makes it.
    Write(Txn),
}

/// Decides `call` on `slice` at `now`, through the handoff machine's one entry point,
/// [`step`]. The transaction is guarded by everything the decision read: the caller's
/// registration (still the same, so still live and in the same status), the owner and the
/// handoff.
pub(super) fn decide(
    keys: &Keys,
    slice: &PartitionSlice,
    call: HandoffCall<'_>,
    now: Millis,
    plan: &PlanConfig,
) -> Decision {
    let HandoffCall { report, consumer, topic, partition } = call;
    let event = match report {
        Report::Ready => Event::Ready(consumer.to_string(), partition),
        Report::Released => Event::Released(consumer.to_string(), partition),
    };
    let mut next = slice.state.clone();
    let writes = match step(&mut next, &event, now, plan, &mut Cooldowns::default()) {
        Ok(writes) => writes,
        Err(error) => return Decision::Refused(error),
    };
    if writes.is_empty() {
        return Decision::InEffect;
    }
    let mut compares = Vec::with_capacity(3);
    if !is_active(Mutation::CallerRegistrationCompareDropped) {
        compares.push(Compare::ModRevision(keys.consumer(topic, consumer), slice.consumer_revision));
    }
    if !is_active(Mutation::HandoffCompareDropped) {
        compares.push(Compare::ModRevision(keys.assignment(topic, partition), slice.owner_revision));
        compares.push(Compare::ModRevision(keys.handoff(topic, partition), slice.handoff_revision));
    }
    Decision::Write(Txn { compares, ops: keys.write_ops(topic, &writes) })
}

/// What a call that changed the store found: when the partition's handoff phase it moved
/// on from had begun (for the warm-duration metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Applied {
    /// When that phase began.
    pub phase_since: Option<Millis>,
}

/// A call's answer: what it changed (`None`: it was in effect already).
pub(super) type CallResult = Result<Option<Applied>, CoordinatorError>;

/// A consumer call on its way through the machine, answered on `R` (its call id).
#[derive(Debug)]
pub(super) struct CallInFlight<R> {
    /// What the consumer reports.
    pub report: Report,
    /// The consumer.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Decisions that a lagging cache or a lost transaction made void so far: the first is
    /// made on the cache and written with the calls that arrive with it, the next ones on
    /// the store's state, each in a transaction of its own.
    pub attempt: usize,
    /// Where the answer goes.
    pub reply: R,
}

/// What a call needs next.
#[derive(Debug)]
pub(super) enum CallStep {
    /// Its answer.
    Answer(CallResult),
    /// Its slice read from the store, to decide again.
    ReadStore,
    /// This transaction written, then `Applied` answered.
    Write(Txn, Applied),
}

impl<R> CallInFlight<R> {
    /// A call of `consumer` about `partition` of `topic`, answered on `reply`.
    pub fn new(report: Report, consumer: String, topic: String, partition: u32, reply: R) -> Self {
        Self { report, consumer, topic, partition, attempt: 0, reply }
    }

    /// The call, as [`decide`] reads it.
    pub fn call(&self) -> HandoffCall<'_> {
        HandoffCall {
            report: self.report,
            consumer: &self.consumer,
            topic: &self.topic,
            partition: self.partition,
        }
    }

    /// The step after a decision on a cache that may lag, or a transaction whose compare
    /// lost: decide again on the store's state, while attempts remain.
    pub fn retry(&mut self) -> CallStep {
        self.attempt += 1;
        if self.attempt < CAS_ATTEMPTS {
            return CallStep::ReadStore;
        }
        let (topic, partition) = (&self.topic, self.partition);
        CallStep::Answer(Err(CoordinatorError::Contended(
            crate::coordinator::causes::Contention::Partition { topic: topic.to_string(), partition },
        )))
    }
}

/// What `call` needs next, decided at `now` on `slice`, read from the store (`fresh`) or
/// from the cache. A call is refused, or found already in effect, only on the store's
/// word: the cache may lag it by a watch delivery.
pub(super) fn next_step<R>(
    keys: &Keys,
    call: &mut CallInFlight<R>,
    slice: &PartitionSlice,
    fresh: bool,
    now: Millis,
    plan: &PlanConfig,
) -> CallStep {
    match decide(keys, slice, call.call(), now, plan) {
        Decision::Write(txn) => {
            let phase_since = slice.state.handoffs.get(&call.partition).map(|h| h.since);
            CallStep::Write(txn, Applied { phase_since })
        }
        Decision::Refused(error) if fresh => {
            CallStep::Answer(Err(CoordinatorError::from_handoff(&call.topic, error)))
        }
        Decision::InEffect if fresh => CallStep::Answer(Ok(None)),
        Decision::Refused(_) | Decision::InEffect => call.retry(),
    }
}

#[cfg(test)]
mod tests {
    use super::HandoffCall;
    use super::{CallInFlight, CallStep, Decision, PartitionSlice, decide, next_step};
    use crate::coordinator::handoff_backend::records::Keys;
    use crate::coordinator::shared::instance::Report;
    use crate::handoff::{ConsumerStatus, Handoff, Phase, PlanConfig, TopicState};
    use crate::store::{Compare, Op};

    /// Partition 3 of `t` warming from `a` to `b`, each record at its own revision.
    fn warming() -> PartitionSlice {
        let mut state = TopicState { partition_count: 4, ..Default::default() };
        for name in ["a", "b"] {
            state.consumers.insert(name.into(), ConsumerStatus::Active);
        }
        state.owners.insert(3, "a".into());
        let handoff = Handoff { from: "a".into(), to: "b".into(), phase: Phase::Warming, since: 0, epoch: 0 };
        state.handoffs.insert(3, handoff);
        PartitionSlice { state, consumer_revision: 7, owner_revision: 8, handoff_revision: 9 }
    }

    fn call(report: Report, consumer: &str) -> HandoffCall<'_> {
        HandoffCall { report, consumer, topic: "t", partition: 3 }
    }

    #[test]
    fn a_ready_target_flips_the_owner_guarded_by_everything_the_decision_read() {
        let keys = Keys::new("/k/");
        let Decision::Write(txn) =
            decide(&keys, &warming(), call(Report::Ready, "b"), 10, &PlanConfig::default())
        else {
            panic!("the warming target's ready is a write");
        };
        assert_eq!(
            txn.compares,
            [
                Compare::ModRevision(keys.consumer("t", "b"), 7),
                Compare::ModRevision(keys.assignment("t", 3), 8),
                Compare::ModRevision(keys.handoff("t", 3), 9),
            ]
        );
        let sets_owner = |op: &Op| matches!(op, Op::Put { key, .. } if *key == keys.assignment("t", 3));
        assert!(txn.ops.iter().any(sets_owner), "{:?}", txn.ops);
    }

    #[test]
    fn a_ready_from_a_consumer_that_is_not_the_target_is_refused_and_a_repeat_is_in_effect() {
        let keys = Keys::new("/k/");
        let plan = PlanConfig::default();
        assert!(matches!(
            decide(&keys, &warming(), call(Report::Ready, "a"), 10, &plan),
            Decision::Refused(_)
        ));
        let mut flipped = warming();
        flipped.state.owners.insert(3, "b".into());
        if let Some(handoff) = flipped.state.handoffs.get_mut(&3) {
            handoff.phase = Phase::Releasing;
        }
        assert!(matches!(decide(&keys, &flipped, call(Report::Ready, "b"), 10, &plan), Decision::InEffect));
    }

    fn in_flight(report: Report, consumer: &str) -> CallInFlight<()> {
        CallInFlight::new(report, consumer.into(), "t".into(), 3, ())
    }

    #[test]
    fn a_call_is_refused_or_in_effect_only_on_the_stores_word_and_gives_up_after_its_attempts() {
        let (keys, plan) = (Keys::new("/k/"), PlanConfig::default());
        let mut wrong = in_flight(Report::Ready, "a");
        // On the cache: it may lag, so the store decides.
        assert!(matches!(next_step(&keys, &mut wrong, &warming(), false, 10, &plan), CallStep::ReadStore));
        assert_eq!(wrong.attempt, 1);
        // On the store's state: refused, naming why.
        let step = next_step(&keys, &mut wrong, &warming(), true, 10, &plan);
        assert!(
            matches!(step, CallStep::Answer(Err(crate::coordinator::CoordinatorError::Handoff { .. }))),
            "{step:?}"
        );
        let mut ready = in_flight(Report::Ready, "b");
        let step = next_step(&keys, &mut ready, &warming(), false, 10, &plan);
        assert!(matches!(step, CallStep::Write(_, applied) if applied.phase_since == Some(0)), "{step:?}");
        // Each lost transaction decides again on the store, until the attempts run out.
        let steps: Vec<CallStep> =
            (0..crate::coordinator::shared::cas::CAS_ATTEMPTS).map(|_| ready.retry()).collect();
        assert!(steps[..steps.len() - 1].iter().all(|s| matches!(s, CallStep::ReadStore)), "{steps:?}");
        let last = steps.last();
        assert!(
            matches!(last, Some(CallStep::Answer(Err(crate::coordinator::CoordinatorError::Contended(_))))),
            "{last:?}"
        );
    }
}
