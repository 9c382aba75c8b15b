//! Records every store-backed backend shares: the format version, the topic record, and
//! encoding. Records are JSON with a version field `v`, so a later release can read (and
//! migrate) what an earlier one wrote. Unknown fields are ignored; a newer `v` is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::store::StoreError;

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
