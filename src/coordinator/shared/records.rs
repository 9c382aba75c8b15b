//! Records every store-backed backend shares: the format version, the topic record, and
//! encoding. Records are JSON with a version field `v`, so a later release can read (and
//! migrate) what an earlier one wrote. Unknown fields are ignored; a newer `v` is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::store::{Revision, StoreError};

/// The record format this release writes.
pub const RECORD_VERSION: u32 = 1;

/// `{prefix}topics/{topic}`: how many partitions the topic has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// Record format version.
    pub v: u32,
    /// Partition count.
    pub partition_count: u32,
    /// Weights of the partitions that have one (the default weight otherwise): stored with
    /// the topic, so a new leader starts from them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<u32, u64>,
}

impl TopicRecord {
    /// The record of a topic of `partition_count` partitions, with no weights.
    pub fn new(partition_count: u32) -> Self {
        Self { v: RECORD_VERSION, partition_count, weights: BTreeMap::new() }
    }
}

/// The epoch of an ownership decided from a cache at `revision` (docs/design.md §10): one
/// above it, so above every epoch already written (each was at most the revision of its
/// own record's write, which that cache has seen).
pub fn epoch_above(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0) + 1
}

/// The epoch a stored ownership record stands for: its own, or, in a record written before
/// epochs existed (0), the record's mod revision.
pub fn stored_epoch(epoch: u64, mod_revision: Revision) -> u64 {
    if epoch == 0 { u64::try_from(mod_revision).unwrap_or(0) } else { epoch }
}

/// Encodes a record.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

/// Decodes a record, refusing versions newer than this release understands.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version =
        serde_json::from_slice(bytes).map_err(|e| StoreError::Invalid(format!("{key}: {e}")))?;
    if version.v > RECORD_VERSION {
        return Err(StoreError::Invalid(format!(
            "{key}: record version {} is newer than this release ({RECORD_VERSION})",
            version.v
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| StoreError::Invalid(format!("{key}: {e}")))
}
