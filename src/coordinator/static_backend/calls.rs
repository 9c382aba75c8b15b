//! `PartitionReady` / `PartitionReleased` (refused: nothing moves) and `Deregister`.

use super::Static;
use crate::coordinator::causes::{ConsumerUnknown, HandoffFreeBackend};
use crate::coordinator::{CoordinatorError, validate_consumer_name, validate_topic_name};
use crate::proto::v1::DeregisterAction;

/// The static backend never moves a partition: `FAILED_PRECONDITION` (after the names are
/// checked).
pub(super) fn no_handoffs(consumer: &str, topic: &str) -> Result<(), CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    Err(CoordinatorError::NoHandoffs(HandoffFreeBackend::Static))
}

/// `SHUTDOWN_NOW` for any consumer the configuration covers (nothing moves, so there is
/// nothing to drain); `NOT_FOUND` for others.
pub(super) fn deregister(inner: &Static, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
    validate_consumer_name(consumer)?;
    let registered = inner.streams.names().iter().any(|(_, c)| c == consumer);
    if !registered && !inner.config.assignment.covers(consumer) {
        return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::NotInStaticAssignment {
            consumer: consumer.to_string(),
        }));
    }
    Ok(DeregisterAction::ShutdownNow)
}
