//! An instance of a store-backed backend as a state machine: one state, one
//! `step(now, input) -> effects` (issue 40).
//!
//! [`io`] holds the inputs and effects, shared by both store-backed backends ([`observe`]:
//! what an instance says it decided, for metrics and logs); the handoff backend's state and
//! step are in `handoff_backend/machine/`, the fleet's in `fleet_backend/machine/`. The
//! whole-cluster simulation drives instances through them, and so does the production
//! [`driver`] (every memory, etcd and fleet instance), so what the simulation checks is
//! what runs there. [`refresh`] is the Kafka topic refresh both machines keep as a part of
//! their state; [`batching`] their books for writes sent together, and [`topic_wait`] for
//! `Register`s waiting for their topic's record.

pub mod batching;
pub mod driver;
pub mod io;
pub mod observe;
pub mod refresh;
pub mod topic_wait;
pub mod watchdog;

use std::time::Duration;

use tokio::time::Instant;

/// What a driver supplies for one life of an instance beside its config.
#[derive(Clone, Copy, Debug)]
pub struct Start {
    /// Anchors the monotonic time of the shared pieces: any fixed instant (module docs).
    pub origin: Instant,
    /// Random bits of this life, drawn by the driver (a simulation passes seeded ones):
    /// registration ids are derived from them, so a restart under the same instance id
    /// never hands out its previous life's ids again. The step reads no randomness itself.
    pub nonce: u64,
    /// How often the store's watches send a progress mark on a quiet watch
    /// ([`crate::store::LeaseStore::watch_progress_every`]); `None`: they send none, and a
    /// silent watch cannot be told from a quiet store, so none is detected.
    pub watch_progress_every: Option<Duration>,
    /// A stated cost of planning one partition, in ns, for the planning budget: after a
    /// look that planned `n` partitions, the instance's leaders plan again only once
    /// `PLAN_PACE × n × cost` has passed. A simulation models planning time with it (it reads no clock); the
    /// production driver states 0 and tells the measured time instead ([`plans_timed`]).
    /// 0 and not timed: planning is free and never waits.
    ///
    /// [`plans_timed`]: Self::plans_timed
    pub plan_nanos_per_partition: u64,
    /// The driver times every step that planned and tells the machine what it took
    /// ([`io::Input::PlanningTook`]), right after that step: the leaders' budget is then
    /// the measured time, as the running leader's is. Within the step that planned, the
    /// other leader groups wait for that measure (the loop's groups plan one at a time, the
    /// budget set between them), and the groups take their looks in turn.
    pub plans_timed: bool,
}

/// A fresh registration id for an instance's `count`-th registration: from the instance's
/// id and the life's random bits, so a replay gives the same ids, and another instance, or
/// another life of the same one, different ones. Positive, as etcd lease ids are.
pub fn registration_id(instance: &str, nonce: u64, count: u64) -> crate::store::SessionId {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    (instance, nonce, count).hash(&mut hasher);
    crate::store::SessionId((hasher.finish() >> 1) as i64)
}

/// The `Result` of a store answer of the kind `want` picks, or the error it carried (an
/// answer of another kind is the driver's bug, reported as invalid).
pub fn expect<T>(
    answer: Result<io::StoreReply, crate::store::StoreError>,
    want: impl FnOnce(io::StoreReply) -> Option<T>,
) -> Result<T, crate::store::StoreError> {
    want(answer?).ok_or(crate::store::StoreError::Invalid(crate::store::Malformed::WrongAnswerKind))
}

/// What the store's answer to a lost registration's rewrite (a create where no record is,
/// then, if that found a record, a read of it) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rebind {
    /// Written, or found written by this registration (a lost answer), at this revision.
    Rebound(crate::store::Revision),
    /// A record is there: read it, to know whose.
    ReadBack,
    /// Another registration of the name has it: that one wins.
    Taken,
    /// No answer, or no record any more: tried again at the next upkeep.
    Again,
}

impl Rebind {
    /// Classifies `answer`; `ours` says whether a stored record is the rewritten
    /// registration's.
    pub fn of(
        answer: Result<io::StoreReply, crate::store::StoreError>,
        ours: impl Fn(&crate::store::KeyValue) -> bool,
    ) -> Self {
        match answer {
            Ok(io::StoreReply::Txn(outcome)) if outcome.succeeded => Rebind::Rebound(outcome.revision),
            Ok(io::StoreReply::Txn(_)) => Rebind::ReadBack,
            Ok(io::StoreReply::Values(mut records)) => match records.pop().flatten() {
                Some(kv) if ours(&kv) => Rebind::Rebound(kv.mod_revision),
                Some(_) => Rebind::Taken,
                None => Rebind::Again,
            },
            _ => Rebind::Again,
        }
    }
}
