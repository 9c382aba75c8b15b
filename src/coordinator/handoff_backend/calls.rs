//! `PartitionReady`, `PartitionReleased`, `Deregister` and the status view: validated
//! here, decided and applied by the instance's loop.
//!
//! Ready and released are the fast path of a handoff (docs/design.md §9): the receiving
//! instance's loop (`driver.rs`) decides the call on its cache (`decide.rs`) and applies it
//! with one transaction guarded by the mod revisions of the partition's assignment and
//! handoff records. Only when the cache disagrees (it may lag the store by a watch
//! delivery) or the transaction loses a race does it re-read those records from the store
//! (`driver.rs`) and decide again, so a call is refused only on the store's current
//! state, and a refused call changes nothing. Calls that arrive together share
//! transactions (`shared/batch.rs`): a scale-out brings thousands at once.

use super::Handoff;
use super::decide::CallResult;
use super::leave::Leaving;
use async_trait::async_trait;

use crate::coordinator::StatusView;
use crate::coordinator::shared::instance::{Backend, HandoffCall, Report};
use crate::coordinator::{CoordinatorError, validate_consumer_name, validate_topic_name};
use crate::proto::v1::DeregisterAction;

/// Validates one consumer call and has the instance's loop apply it (`driver.rs`): decided
/// on the cache first ([`next_step`](super::decide::next_step), pure), on the store's
/// state when the cache may lag or the transaction lost a race.
async fn apply_call(inner: &Handoff, call: HandoffCall<'_>) -> CallResult {
    validate_consumer_name(call.consumer)?;
    validate_topic_name(call.topic)?;
    inner.driver.call(call).await
}

/// `PartitionReady` flips ownership to the caller and starts the release;
/// `PartitionReleased` completes the handoff.
async fn handoff_call(inner: &Handoff, call: HandoffCall<'_>) -> Result<(), CoordinatorError> {
    let HandoffCall { report, consumer, topic, partition } = call;
    let metrics = inner.core.metrics();
    match report {
        Report::Ready => {
            if let Some(applied) = apply_call(inner, call).await? {
                metrics.handoffs_ready.inc();
                metrics.observe_warm_done(topic, partition, applied.phase_since);
                tracing::info!(
                    topic,
                    partition,
                    consumer,
                    "handoff ready: ownership flipped, release requested"
                );
            }
        }
        Report::Released => {
            apply_call(inner, call).await?;
            metrics.handoffs_released.inc();
            metrics.observe_handoff_done(topic, partition);
            tracing::info!(topic, partition, consumer, "handoff completed");
        }
    }
    Ok(())
}

/// `Deregister`: drain (when the policy says so and someone can take the partitions) or
/// hold the partitions for the consumer's return. The policy is asked here (it may ask
/// Kubernetes); the instance's loop decides and writes the rest (`leave.rs`).
pub(super) async fn deregister(
    inner: &Handoff,
    consumer: &str,
) -> Result<DeregisterAction, CoordinatorError> {
    validate_consumer_name(consumer)?;
    // Not registered: refused before the drain policy is asked (and counted).
    if super::leave::registrations(&inner.core.mirror().read(), consumer).is_empty() {
        return Err(super::leave::not_registered(consumer));
    }
    let decider = inner.config.drain_decider.as_deref();
    let wants_drain =
        crate::drain::wants_drain(decider, inner.config.drain_policy, consumer, inner.core.metrics()).await;
    let left = inner.driver.deregister(consumer, wants_drain).await?;
    for (topic, leaving) in &left.topics {
        match leaving {
            Leaving::Draining => tracing::info!(topic, consumer, "consumer draining"),
            Leaving::Held => {
                tracing::info!(topic, consumer, grace = ?inner.config.restart_grace, "consumer shutting down; partitions held for its return")
            }
        }
    }
    Ok(left.action())
}

/// The handoff backend's calls, as the shared instance ([`StoreCoordinator`]) runs them.
///
/// [`StoreCoordinator`]: crate::coordinator::StoreCoordinator
#[async_trait]
impl Backend for Handoff {
    async fn handoff_call(&self, call: HandoffCall<'_>) -> Result<(), CoordinatorError> {
        handoff_call(self, call).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        deregister(self, consumer).await
    }

    fn status(&self) -> StatusView {
        super::status::status(self)
    }

    fn epochs(&self, topic: &str, consumer: &str) -> Option<Vec<crate::coordinator::PartitionEpoch>> {
        let cache = self.core.mirror().read();
        Some(cache.topics.get(topic).map(|entry| entry.epochs_of(consumer)).unwrap_or_default())
    }

    fn placement(&self) -> Vec<crate::coordinator::TopicPlacement> {
        super::placement::placement(self)
    }

    async fn on_shutdown(&self) {
        super::leader::resign(self).await;
    }

    fn on_crash(&self) {
        self.leadership.send_replace(None);
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
