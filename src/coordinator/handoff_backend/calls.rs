//! The handoff backend's face to the shared instance ([`Backend`]): what a `Deregister`
//! asks before it reaches the instance's loop (the drain policy), the status view, the
//! epochs and the placement view, and what shutdown and crash add; and how the loop
//! answers the consumers' calls (counted and logged).
//!
//! The consumers' calls themselves are events of the loop (`driver.rs`). Ready and
//! released are the fast path of a handoff (docs/design.md §9): the receiving instance's
//! loop decides the call on its cache (`decide.rs`) and applies it with one transaction
//! guarded by the mod revisions of the partition's assignment and handoff records. Only
//! when the cache disagrees (it may lag the store by a watch delivery) or the transaction
//! loses a race does it re-read those records from the store and decide again, so a call
//! is refused only on the store's current state, and a refused call changes nothing. Calls
//! that arrive together share transactions (`shared/batch.rs`): a scale-out brings
//! thousands at once.

use async_trait::async_trait;

use super::Handoff;
use super::decide::{CallInFlight, CallResult};
use super::leave::{LeaveInFlight, LeaveResult, Leaving};
use crate::coordinator::CoordinatorError;
use crate::coordinator::StatusView;
use crate::coordinator::shared::instance::{Backend, Report};
use crate::handoff::HandoffError;

/// Whether `consumer`'s `Deregister` should drain (when the policy says so and someone can
/// take the partitions) rather than hold the partitions for its return. A consumer this
/// instance does not know as registered is refused before the policy is asked (and
/// counted); the loop checks again on the store.
async fn wants_drain(inner: &Handoff, consumer: &str) -> Result<bool, CoordinatorError> {
    if super::leave::registrations(&inner.core.mirror().read(), consumer).is_empty() {
        return Err(super::leave::not_registered(consumer));
    }
    let decider = inner.config.drain_decider.as_deref();
    Ok(crate::drain::wants_drain(decider, inner.config.drain_policy, consumer, inner.core.metrics()).await)
}

/// Answers `call`: a `PartitionReady` that flipped the owner, and every
/// `PartitionReleased` that was not refused, is counted and logged.
pub(super) fn answer(inner: &Handoff, call: CallInFlight, result: CallResult) {
    let CallInFlight { report, consumer, topic, partition, reply, .. } = call;
    let metrics = inner.core.metrics();
    match (&result, report) {
        (Ok(Some(applied)), Report::Ready) => {
            metrics.handoffs_ready.inc();
            metrics.observe_warm_done(&topic, partition, applied.phase_since);
            tracing::info!(topic, partition, consumer, "handoff ready: ownership flipped, release requested");
        }
        (Ok(_), Report::Released) => {
            metrics.handoffs_released.inc();
            metrics.observe_handoff_done(&topic, partition);
            tracing::info!(topic, partition, consumer, "handoff completed");
        }
        _ => {}
    }
    let result = result.map_err(|error| while_rewritten(inner, &topic, &consumer, error));
    let _ = reply.send(result.map(|_| ()));
}

/// A call refused because the store has no registration for its consumer, while this
/// instance still holds the consumer's stream: the store lost the registration and it is
/// being written again (`shared/rebind.rs`), so the refusal is passing, not final (a
/// client gives up on `NOT_FOUND`, and the handoff would wait for its time limit).
fn while_rewritten(
    inner: &Handoff,
    topic: &str,
    consumer: &str,
    error: CoordinatorError,
) -> CoordinatorError {
    let held = inner.core.streams().session_of(topic, consumer).is_some();
    refusal_while_rewritten(topic, consumer, held, error)
}

/// [`while_rewritten`], given whether this instance holds the consumer's stream (`held`;
/// pure).
pub(super) fn refusal_while_rewritten(
    topic: &str,
    consumer: &str,
    held: bool,
    error: CoordinatorError,
) -> CoordinatorError {
    let unknown =
        matches!(&error, CoordinatorError::Handoff { source: HandoffError::UnknownConsumer(_), .. });
    if !unknown || !held {
        return error;
    }
    CoordinatorError::RegistrationLost { consumer: consumer.to_string(), topic: topic.to_string() }
}

/// Answers `leave`, logging how the consumer leaves each topic.
pub(super) fn answer_leave(inner: &Handoff, leave: LeaveInFlight, result: LeaveResult) {
    let LeaveInFlight { consumer, reply, .. } = leave;
    if let Ok(left) = &result {
        for (topic, leaving) in &left.topics {
            match leaving {
                Leaving::Draining => tracing::info!(topic, consumer, "consumer draining"),
                Leaving::Held => {
                    let grace = inner.config.restart_grace;
                    tracing::info!(
                        topic,
                        consumer,
                        ?grace,
                        "consumer shutting down; partitions held for its return"
                    )
                }
            }
        }
    }
    let _ = reply.send(result.map(|left| left.action()));
}

/// The handoff backend's calls, as the shared instance ([`StoreCoordinator`]) runs them.
///
/// [`StoreCoordinator`]: crate::coordinator::StoreCoordinator
#[async_trait]
impl Backend for Handoff {
    async fn wants_drain(&self, consumer: &str) -> Result<bool, CoordinatorError> {
        wants_drain(self, consumer).await
    }

    fn status(&self) -> StatusView {
        super::status::status(self)
    }

    fn epochs(
        &self,
        topic: &str,
        consumer: &str,
        since: crate::store::Revision,
    ) -> Option<Vec<crate::coordinator::PartitionEpoch>> {
        let cache = self.core.mirror().read();
        Some(cache.topics.get(topic).map(|entry| entry.epochs_of(consumer, since)).unwrap_or_default())
    }

    fn placement(&self) -> Vec<crate::coordinator::TopicPlacement> {
        super::placement::placement(self)
    }

    /// The loop resigns leadership as its last store call ([`super::driver`]).
    async fn on_shutdown(&self) {
        self.stopped.cancelled().await;
    }

    fn on_crash(&self) {
        self.leadership.send_replace(Default::default());
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "lost_tests.rs"]
mod lost_tests;
