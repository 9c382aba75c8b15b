//! One simulated instance: the handoff backend's state and step
//! (`coordinator::handoff_backend::machine`), configured from the simulation's settings.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::SimConfig;
use super::events::PREFIX;
use crate::coordinator::HandoffConfig;
use crate::coordinator::handoff_backend::machine::{Instance, Start};
use crate::coordinator::machine::io::{Effect, Input, Micros};
use crate::handoff::PlanConfig;

/// A handoff instance's state.
pub struct Machine(Instance);

impl Machine {
    /// A fresh instance `id` at `now`, and its first effects.
    pub fn new(config: &SimConfig, id: &str, nonce: u64, now: Micros) -> (Self, Vec<Effect>) {
        let handoff = HandoffConfig {
            instance_id: id.to_string(),
            backend: "simulation".into(),
            prefix: PREFIX.into(),
            lease_ttl: config.ttl,
            plan: PlanConfig {
                warm_timeout_ms: config.warm_timeout.as_millis() as u64,
                release_timeout_ms: config.release_timeout.as_millis() as u64,
                max_warming_per_consumer: 4,
            },
            restart_grace: config.ttl * 2,
            topic_partitions: {
                let topics = config.topic_set();
                (0..topics.count).map(|t| (topics.name(t), topics.partitions)).collect::<BTreeMap<_, _>>()
            },
            reconcile_interval: config.reconcile,
            settle_period: config.settle,
            rebalance_delay: config.reconcile,
            leader_groups: config.leader_groups,
            ..HandoffConfig::default()
        };
        // The shared pieces' monotonic time is anchored here; only differences are read,
        // so the run does not depend on the instant. The simulation's watches send a
        // progress mark every quarter TTL when quiet, as etcd's do when asked.
        let start = Start {
            origin: Instant::now(),
            nonce,
            watch_progress_every: Some(config.ttl / 4),
            plan_nanos_per_partition: config.plan_nanos_per_partition,
        };
        let (instance, effects) = Instance::new(handoff, start, now);
        (Self(instance), effects)
    }

    /// Whether its first read of the store answered.
    pub fn loaded(&self) -> bool {
        self.0.cache().is_some()
    }

    /// Whether its keeper may keep its lease alive now.
    pub fn renews(&self) -> bool {
        self.0.renews()
    }

    /// One step.
    pub fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        self.0.step(now, input)
    }
}
