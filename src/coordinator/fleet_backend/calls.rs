//! What the fleet answers to `PartitionReady` / `PartitionReleased`: it moves partitions
//! without handoffs, so both are refused ([`no_handoffs`]).

use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::HandoffFreeBackend;

/// The fleet moves partitions without handoffs, so there is nothing to be ready for or to
/// release: `FAILED_PRECONDITION` (the names were checked before).
pub(super) fn no_handoffs() -> CoordinatorError {
    CoordinatorError::NoHandoffs(HandoffFreeBackend::Fleet)
}
