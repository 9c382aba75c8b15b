//! The warm-handoff backend over a [`LeaseStore`] (the `memory` and `etcd` backends).
//!
//! * `machine/`: the instance as one state with one step, which the production driver
//!   (`coordinator/machine/driver/`) runs and the whole-cluster simulation drives: it
//!   follows the store, decides the consumers' calls (`PartitionReady` /
//!   `PartitionReleased`, decided by `decide.rs` and written with compare-and-swap by
//!   whichever instance receives them, no leader round trip; `Deregister`, decided by
//!   `leave.rs`), leads, applies each commit, tells the streams and answers;
//! * `records.rs` / `state.rs`: the key layout, the records and the cache of them;
//! * `register.rs`: the consumer record, and the restart hold after a `SHUTDOWN_NOW`;
//!   `incarnation.rs`: the epochs a registration that replaces another raises;
//! * `relay.rs`: after every revision, what each local consumer is sent, derived from the
//!   new state ([`crate::handoff::diff_views`]);
//! * `leader/`: the leader's decisions: election, each topic's plan with
//!   [`crate::handoff::plan_placed`] cut into fenced batched transactions, and the weights
//!   to store; `leader_groups.rs`: which instance leads which topics;
//! * `calls.rs`: a call refused while a lost registration is written again;
//! * `status.rs`: the status view; `placement.rs`: its placement part (loads, shares and,
//!   in shadow mode, the load plan).
//!
//! Everything here but `machine/` is pure: functions of the cache and the records.

mod calls;
mod decide;
mod incarnation;
mod leader;
pub mod leader_groups;
mod leave;
pub mod machine;
mod placement;
pub mod records;
mod register;
mod relay;
pub mod state;
mod status;

pub use leader::Fence;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::PartitionCounts;
use crate::drain::DrainPolicy;
use crate::handoff::{PlacementSettings, PlanConfig};
use crate::weights::WeightSource;

use leader_groups::LeaderGroup;

/// Settings of a warm-handoff instance.
#[derive(Clone, Debug)]
pub struct HandoffConfig {
    /// This instance's id (in consumer records and the leader key).
    pub instance_id: String,
    /// The backend's name, for the status view.
    pub backend: String,
    /// Key prefix everything is stored under.
    pub prefix: String,
    /// TTL of consumer and instance sessions.
    pub lease_ttl: Duration,
    /// Warm/release time limits and the warm cap.
    pub plan: PlanConfig,
    /// How long a `SHUTDOWN_NOW` consumer's partitions are held for its return.
    pub restart_grace: Duration,
    /// What `Deregister` answers.
    pub drain_policy: DrainPolicy,
    /// Decides `Deregister` instead of `drain_policy` when set (`--drain-policy k8s`).
    pub drain_decider: Option<Arc<dyn crate::drain::DrainDecider>>,
    /// Tells the leader, once per reconcile pass and from memory, whether a topic's
    /// consumers are rolling out (`--drain-policy k8s`): then old-generation consumers
    /// receive nothing and the others are filled only to their final share.
    pub rollout: Option<Arc<dyn crate::drain::RolloutView>>,
    /// Partition counts known without Kafka (topic → count); they override Kafka.
    pub topic_partitions: BTreeMap<String, u32>,
    /// Where the partition counts of other topics come from (`--kafka-brokers`); `None`:
    /// only `topic_partitions`.
    pub kafka: Option<Arc<dyn PartitionCounts>>,
    /// How often the leader asks Kafka for the counts of stored topics (growth).
    pub topic_refresh_interval: Duration,
    /// How often the leader reconciles without a change (time limits, resync).
    pub reconcile_interval: Duration,
    /// After its view of the store was interrupted (it just became leader, its watch
    /// broke, its calls failed), how long the leader waits before it reassigns partitions
    /// whose owners' registrations are gone, so consumers that come straight back keep
    /// them. `None`: one `lease_ttl`.
    pub settle_period: Option<Duration>,
    /// While consumers of a topic are still arriving (a join within this of the previous
    /// one, or the first consumers of an empty group), the leader waits until joins have
    /// been quiet this long, then plans once (Kafka's `group.initial.rebalance.delay.ms`).
    /// A single join to an established group is planned at once.
    pub rebalance_delay: Duration,
    /// How often the watcher re-reads the whole prefix as a safety net.
    pub resync_interval: Duration,
    /// How the leader places partitions (docs/design.md §11): by count, by load, or by
    /// count with the load plan in the shadow (the default).
    pub placement: PlacementSettings,
    /// Where partition weights come from (`--partition-weights[-file]`, or learned from
    /// Kafka); the leader stores them in the topic records. `None`: nothing writes weights
    /// (every partition weighs what its record says, by default 1).
    pub weights: Option<Arc<dyn WeightSource>>,
    /// How often the leader asks `weights` and stores the weights that changed.
    pub weights_refresh: Duration,
    /// Into how many groups the topics are split, each with a leadership of its own
    /// (`leader_groups.rs`), so that several instances share the planning. 1: one leader
    /// plans every topic.
    pub leader_groups: u32,
}

impl HandoffConfig {
    /// How long the leader leaves orphaned partitions alone after an interruption:
    /// [`settle_period`](Self::settle_period), one `lease_ttl` unless configured.
    pub fn settle_for(&self) -> Duration {
        if crate::mutation::is_active(crate::mutation::Mutation::SettleZero) {
            return Duration::ZERO;
        }
        self.settle_period.unwrap_or(self.lease_ttl)
    }

    /// The leader group that plans `topic`.
    pub fn leader_group_of(&self, topic: &str) -> LeaderGroup {
        let groups = self.leader_groups.max(1);
        LeaderGroup { groups, group: leader_groups::group_of(topic, groups) }
    }
}

impl Default for HandoffConfig {
    fn default() -> Self {
        Self {
            instance_id: "kafka-assigner".into(),
            backend: "memory".into(),
            prefix: "/kafka-assigner/".into(),
            lease_ttl: Duration::from_secs(10),
            plan: PlanConfig::default(),
            restart_grace: Duration::from_secs(30),
            drain_policy: DrainPolicy::ShutdownNow,
            drain_decider: None,
            rollout: None,
            topic_partitions: BTreeMap::new(),
            kafka: None,
            topic_refresh_interval: Duration::from_secs(60),
            reconcile_interval: Duration::from_secs(1),
            settle_period: None,
            rebalance_delay: Duration::from_millis(300),
            resync_interval: Duration::from_secs(300),
            placement: PlacementSettings::default(),
            weights: None,
            weights_refresh: Duration::from_secs(10),
            leader_groups: 1,
        }
    }
}
