//! What both machines tell a consumer's call: what it reports about a handoff
//! ([`Report`]), and the error of a call that reached no running instance ([`stopping`]).

use crate::store::StoreError;

/// What a consumer reports about a handoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// `PartitionReady`: it finished warming the partition.
    Ready,
    /// `PartitionReleased`: it released the partition.
    Released,
}

/// What a call that reached no driver, or whose driver stopped before answering, is told.
pub(crate) fn stopping() -> StoreError {
    StoreError::Unavailable(crate::store::Unreachable::Stopping)
}
