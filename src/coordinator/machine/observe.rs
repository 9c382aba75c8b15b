//! What an instance saw itself decide, as plain data: the payload of [`Effect::Observe`].
//!
//! The step may touch no shared handle, so it says what happened instead, at each decision
//! point that is counted or logged, and its driver records it (`driver/record.rs`: the
//! counters and histograms of [`crate::metrics::Metrics`], and the log lines). An observation
//! changes nothing: a simulation drops it, and it never enters a trace or its hash.
//!
//! Durations are given as their wall-clock ends in ms (the step's `now / 1000` and the
//! stored phase start), measured from the `since` of the stored records:
//! the driver turns them into seconds.
//!
//! [`Effect::Observe`]: super::io::Effect::Observe

use crate::handoff::{Deferral, Millis, MoveReason, PlanReport};

/// Something an instance decided or saw, for metrics and logs only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The instance's leader groups (the configured count, said once at the start).
    LeaderGroups {
        /// How many groups the topics are split into.
        groups: u32,
    },
    /// This instance won or gave up the leadership of a leader group.
    Leadership {
        /// The group.
        group: u32,
        /// Won (or lost / given up).
        won: bool,
        /// How many groups it leads now.
        led: u32,
    },
    /// The leaders planned in this step (the pure pass over their topics): the driver
    /// counts the step's time as planning time.
    Planned {
        /// How many partitions the looks planned.
        partitions: u64,
    },
    /// A balance move of `topic` started being held back (counted once, not per plan).
    Deferred {
        /// The topic.
        topic: String,
        /// The partition whose move waits.
        partition: u32,
        /// Why.
        why: Deferral,
    },
    /// A batch of a leader's plan was refused by its compare (stale view, or deposed).
    Conflict {
        /// The topic planned.
        topic: String,
    },
    /// A leader is done writing `topic`'s plan: the moves its written batches made and,
    /// when every batch was written, what the plan did.
    Written {
        /// The topic.
        topic: String,
        /// Partitions moved by written batches, with why.
        moves: Vec<(u32, MoveReason)>,
        /// The plan's report, when all of it was written (`None`: it gave up part way).
        report: Option<PlanReport>,
        /// Whether it was planned as a rollout.
        rollout: bool,
    },
    /// `PartitionReady` flipped a warming handoff to its new owner.
    Ready {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The new owner.
        consumer: String,
        /// When its warm began (wall-clock ms; `None`: unknown).
        warm_since: Option<Millis>,
        /// When it was applied (wall-clock ms).
        at: Millis,
    },
    /// `PartitionReleased` was answered OK: the handoff is complete.
    Released {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The old owner.
        consumer: String,
        /// When (wall-clock ms).
        at: Millis,
    },
    /// A `ReleasePartition` was handed to the old owner's stream.
    ReleaseSent {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// When its releasing phase began (`PartitionReady` applied; wall-clock ms).
        ready_since: Millis,
        /// When it was sent (wall-clock ms).
        at: Millis,
    },
    /// A `Deregister` was written: how the consumer leaves `topic`.
    Left {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// It drains (its partitions are handed over warm), or its partitions are held
        /// for its return.
        draining: bool,
    },
    /// The sweep deleted a registration of this instance that no stream held.
    Swept {
        /// The topic.
        topic: String,
        /// The consumer.
        consumer: String,
    },
    /// A fleet claim step gave leases back (the consumer was told first).
    GaveBack {
        /// The topic.
        topic: String,
        /// The consumer.
        consumer: String,
        /// The partitions.
        partitions: Vec<u32>,
        /// Its quota.
        quota: usize,
    },
    /// A fleet claim step claimed leases.
    Claimed {
        /// The topic.
        topic: String,
        /// The consumer.
        consumer: String,
        /// The partitions.
        partitions: Vec<u32>,
        /// Its quota.
        quota: usize,
    },
}
