//! Records every store-backed backend shares: the format version, the topic record, and
//! encoding. Records are JSON with a version field `v`, so a later release can read (and
//! migrate) what an earlier one wrote. Unknown fields are ignored; a newer `v` is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::store::{Malformed, Revision, StoreError};

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

/// The epoch of a new ownership (docs/design.md §10), decided at wall-clock `now_micros`
/// (microseconds since the Unix epoch) from a cache at `revision` in which the highest
/// epoch stored for the partitions concerned is `floor`: the greatest of the three
/// bounds, each of which keeps the promise in a case where the others may not.
///
/// * `floor + 1`: above every epoch this cache holds for the partition, and the write that
///   uses it compares the records it read, so it cannot repeat one written since.
/// * `revision + 1`: above every epoch written as one above an earlier revision.
/// * `now_micros`: a store restored from a snapshot rewinds its revisions and forgets the
///   floors written after the snapshot; the clock does not go back with it, so an epoch
///   decided after the restore is above every one decided before it, as long as the
///   restore took longer than the instances' clocks disagree (§10 says why).
pub fn next_epoch(revision: Revision, floor: u64, now_micros: u64) -> u64 {
    use crate::mutation::{Mutation, is_active};
    let floor = if is_active(Mutation::EpochFloorDropped) { 0 } else { floor };
    let above_revision = u64::try_from(revision).unwrap_or(0).saturating_add(1);
    above_revision.max(floor.saturating_add(1)).max(now_micros)
}

/// The epoch a stored ownership record stands for: its own, or, in a record written before
/// epochs existed (0), the record's mod revision.
pub fn stored_epoch(epoch: u64, mod_revision: Revision) -> u64 {
    if epoch == 0 { u64::try_from(mod_revision).unwrap_or(0) } else { epoch }
}

/// Whether `n` is 0 (serde's `skip_serializing_if` for fields absent from older records).
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Encodes a record.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

fn undecodable(key: &str, error: serde_json::Error) -> StoreError {
    StoreError::Invalid(Malformed::Undecodable { key: key.to_string(), source: std::sync::Arc::new(error) })
}

/// Decodes a record, refusing versions newer than this release understands.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version = serde_json::from_slice(bytes).map_err(|e| undecodable(key, e))?;
    if version.v > RECORD_VERSION {
        return Err(StoreError::Invalid(Malformed::NewerRecord {
            key: key.to_string(),
            version: version.v,
            supported: RECORD_VERSION,
        }));
    }
    serde_json::from_slice(bytes).map_err(|e| undecodable(key, e))
}
