//! What `Deregister` answers: drain the departing consumer by warm handoffs
//! (`WAIT_FOR_DRAIN`), or hold its partitions for its return (`SHUTDOWN_NOW`).
//!
//! * [`FixedDecider`]: `--drain-policy drain` / `shutdown-now`, the same answer for all.
//! * [`K8sDrainDecider`] (`--drain-policy k8s`): looks the consumer's pod up in the
//!   Kubernetes API (the consumer name is the pod name) and decides with the pure
//!   [`policy::decide`]. When it cannot know (API unreachable, pod not found, RBAC
//!   refusal, timeout) the answer is `SHUTDOWN_NOW`, as the proto says for no Kubernetes
//!   awareness, with a warning log and the `drain_decisions_total{reason}` metric; the
//!   consumer never gets an error.
//!
//! Under `k8s` the leader also plans with a [`RolloutView`] ([`K8sRolloutView`], from
//! [`generations`]): while a Deployment of consumers rolls out, its old pods receive no
//! partitions and its new ones are filled only up to their final share, so each partition
//! moves once ([`crate::assignment::rollout`]). The same view tells what placement knows of
//! each consumer pod ([`info`]: its node's zone, its capacity annotation, its generation):
//! `Register` stores it in the consumer's record, and the leader plans with the view's
//! current info where it has the pod.

pub mod generations;
pub mod info;
mod k8s;
mod nodes;
pub mod policy;
mod rollout;

pub use k8s::{DrainError, K8sDrainDecider, K8sSettings};
pub use rollout::{K8sRolloutView, RolloutView};

use async_trait::async_trait;

use crate::metrics::Metrics;

/// Why a decision was taken (the `reason` label of `drain_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The fixed `--drain-policy` said so.
    Policy,
    /// A StatefulSet pod whose ordinal stays below the desired replicas: it comes back.
    StatefulSetRestart,
    /// A StatefulSet pod at or above the desired replicas: a scale-down.
    StatefulSetScaleDown,
    /// The StatefulSet itself is being deleted.
    StatefulSetDeleted,
    /// A pod of a ReplicaSet (Deployment): its replacement has another name.
    ReplicaSetPod,
    /// A pod with another kind of controller (its replacement has another name).
    OtherController,
    /// A pod with no controller that is being deleted: nothing recreates it.
    NoControllerDeleted,
    /// A pod with no controller that is not being deleted: its container restarts in place.
    NoControllerRestart,
    /// Unknown: the pod's StatefulSet ordinal cannot be read from its name.
    BadOrdinal,
    /// Unknown: the pod (or its StatefulSet) does not exist.
    NotFound,
    /// Unknown: RBAC refused the lookup.
    Forbidden,
    /// Unknown: the API did not answer in time.
    Timeout,
    /// Unknown: the API could not be reached or answered an error.
    ApiError,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Policy => "policy",
            Reason::StatefulSetRestart => "statefulset_restart",
            Reason::StatefulSetScaleDown => "statefulset_scale_down",
            Reason::StatefulSetDeleted => "statefulset_deleted",
            Reason::ReplicaSetPod => "replicaset_pod",
            Reason::OtherController => "other_controller",
            Reason::NoControllerDeleted => "no_controller_deleted",
            Reason::NoControllerRestart => "no_controller_restart",
            Reason::BadOrdinal => "bad_ordinal",
            Reason::NotFound => "not_found",
            Reason::Forbidden => "forbidden",
            Reason::Timeout => "timeout",
            Reason::ApiError => "api_error",
        }
    }

    /// Whether this is an "unknown" answer (the lookup failed).
    pub fn is_unknown(self) -> bool {
        matches!(
            self,
            Reason::BadOrdinal | Reason::NotFound | Reason::Forbidden | Reason::Timeout | Reason::ApiError
        )
    }
}

/// What to answer a departing consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainDecision {
    /// `WAIT_FOR_DRAIN`: hand its partitions off, then end its stream.
    WaitForDrain(Reason),
    /// `SHUTDOWN_NOW`: it comes back under the same name; hold its partitions.
    ShutdownNow(Reason),
}

impl DrainDecision {
    /// Whether the consumer is drained.
    pub fn drains(self) -> bool {
        matches!(self, DrainDecision::WaitForDrain(_))
    }

    /// Why.
    pub fn reason(self) -> Reason {
        match self {
            DrainDecision::WaitForDrain(r) | DrainDecision::ShutdownNow(r) => r,
        }
    }
}

/// Decides what `Deregister` answers for one consumer. Never fails: an unknown answer is
/// `SHUTDOWN_NOW`.
#[async_trait]
pub trait DrainDecider: Send + Sync + std::fmt::Debug + 'static {
    /// The decision for `consumer` (a pod name under `--drain-policy k8s`).
    async fn decide(&self, consumer: &str) -> DrainDecision;
}

/// What `Deregister` answers (docs/design.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DrainPolicy {
    /// `WAIT_FOR_DRAIN`: hand every partition off, then end the stream.
    Drain,
    /// `SHUTDOWN_NOW`: the consumer comes back under the same name; hold its partitions
    /// for the restart grace (the proto's default, with no Kubernetes awareness).
    ShutdownNow,
    /// Ask the Kubernetes API about the consumer's pod (`--k8s-namespace`): a StatefulSet
    /// pod that comes back is held, anything else drains; unknown is `SHUTDOWN_NOW`.
    K8s,
}

/// The same answer for every consumer (`--drain-policy drain` / `shutdown-now`).
#[derive(Clone, Copy, Debug)]
pub struct FixedDecider(pub DrainPolicy);

#[async_trait]
impl DrainDecider for FixedDecider {
    async fn decide(&self, _consumer: &str) -> DrainDecision {
        match self.0 {
            DrainPolicy::Drain => DrainDecision::WaitForDrain(Reason::Policy),
            DrainPolicy::ShutdownNow => DrainDecision::ShutdownNow(Reason::Policy),
            // `k8s` without a Kubernetes decider (an embedding that did not build one):
            // no Kubernetes awareness, so the proto's answer.
            DrainPolicy::K8s => DrainDecision::ShutdownNow(Reason::ApiError),
        }
    }
}

/// The coordinator's hook: asks `decider` (or the fixed `policy` when there is none),
/// records the decision, and says whether to drain.
pub async fn wants_drain(
    decider: Option<&dyn DrainDecider>,
    policy: DrainPolicy,
    consumer: &str,
    metrics: &Metrics,
) -> bool {
    let decision = match decider {
        Some(decider) => decider.decide(consumer).await,
        None => FixedDecider(policy).decide(consumer).await,
    };
    metrics.observe_drain_decision(decision.drains(), decision.reason().as_str());
    decision.drains()
}
