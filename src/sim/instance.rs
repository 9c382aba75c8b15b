//! One simulated instance: the state and step of the backend the run drives
//! ([`SimConfig::backend`]): `coordinator::handoff_backend::machine` or
//! `coordinator::fleet_backend::machine`, configured from the simulation's settings. Both
//! speak the same inputs and effects (`coordinator::machine::io`), so the cluster drives
//! either through this one type.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::events::PREFIX;
use super::{SimBackend, SimConfig};
use crate::coordinator::HandoffConfig;
use crate::coordinator::fleet_backend::FleetConfig;
use crate::coordinator::fleet_backend::machine::Instance as FleetInstance;
use crate::coordinator::handoff_backend::machine::{Instance, Start};
use crate::coordinator::machine::io::{Effect, Input, Micros};
use crate::handoff::PlanConfig;

/// An instance's state, of either backend.
pub enum Machine {
    /// A handoff instance.
    Handoff(Box<Instance>),
    /// A fleet instance.
    Fleet(Box<FleetInstance>),
}

impl Machine {
    /// A fresh instance `id` at `now`, and its first effects.
    pub fn new(config: &SimConfig, id: &str, nonce: u64, now: Micros) -> (Self, Vec<Effect>) {
        let topic_partitions = {
            let topics = config.topic_set();
            (0..topics.count).map(|t| (topics.name(t), topics.partitions)).collect::<BTreeMap<_, _>>()
        };
        // The shared pieces' monotonic time is anchored here; only differences are read,
        // so the run does not depend on the instant. The simulation's watches send a
        // progress mark every quarter TTL when quiet, as etcd's do when asked.
        let start = Start {
            origin: Instant::now(),
            nonce,
            watch_progress_every: Some(config.ttl / 4),
            plan_nanos_per_partition: config.plan_nanos_per_partition,
            // A simulation reads no clock: its planning cost is the stated one.
            plans_timed: false,
        };
        match config.backend {
            SimBackend::Handoff => {
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
                    topic_partitions,
                    reconcile_interval: config.reconcile,
                    settle_period: config.settle,
                    rebalance_delay: config.reconcile,
                    leader_groups: config.leader_groups,
                    ..HandoffConfig::default()
                };
                let (instance, effects) = Instance::new(handoff, start, now);
                (Self::Handoff(Box::new(instance)), effects)
            }
            SimBackend::Fleet => {
                // The claim step's timer is the reconcile interval: the fleet's safety net
                // plays the part of the handoff leader's periodic pass.
                let fleet = FleetConfig {
                    instance_id: id.to_string(),
                    backend: "simulation".into(),
                    prefix: PREFIX.into(),
                    lease_ttl: config.ttl,
                    topic_partitions,
                    kafka: None,
                    claim_interval: config.reconcile,
                    view: None,
                    ..FleetConfig::default()
                };
                let (instance, effects) = FleetInstance::new(fleet, start, now);
                (Self::Fleet(Box::new(instance)), effects)
            }
        }
    }

    /// Whether its first read of the store answered.
    pub fn loaded(&self) -> bool {
        match self {
            Self::Handoff(m) => m.cache().is_some(),
            Self::Fleet(m) => m.cache().is_some(),
        }
    }

    /// Whether its keeper may keep its lease alive now.
    pub fn renews(&self) -> bool {
        match self {
            Self::Handoff(m) => m.renews(),
            Self::Fleet(m) => m.renews(),
        }
    }

    /// One step.
    pub fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        match self {
            Self::Handoff(m) => m.step(now, input),
            Self::Fleet(m) => m.step(now, input),
        }
    }
}
