//! This instance's own record, `{prefix}instances/{instance}`, bound to the instance lease.
//!
//! The store deletes it in the same revision as every registration bound to that lease, so
//! its deletion tells the leader that an instance's lease ended: an operator revoked it, a
//! store outage outlived it, or the instance died. In the first two cases the instance is
//! still there and writes its consumers' registrations again on a new lease (the machine's rebind),
//! or its consumers register again within moments; so the leader treats the registrations
//! that vanished with it as interrupted, not departed, and settles before it moves their
//! partitions (the handoff backend's leader).

use serde::{Deserialize, Serialize};

use crate::store::{Op, SessionId, Txn};

/// The key of `instance`'s record under a backend's `prefix` (which ends with `/`).
pub fn instance_key(prefix: &str, instance: &str) -> String {
    format!("{prefix}instances/{instance}")
}

/// An instance record's content: who, and the leader group count it campaigns under
/// (records written before leader groups have none: one group).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// Record format version.
    pub v: u32,
    /// The instance's id.
    pub instance: String,
    /// Its `--leader-groups`.
    #[serde(default = "one_group")]
    pub leader_groups: u32,
}

fn one_group() -> u32 {
    1
}

/// The write of `instance`'s record at `key`, bound to the instance lease `session`.
pub fn instance_record_txn(key: &str, instance: &str, leader_groups: u32, session: SessionId) -> Txn {
    let record = InstanceRecord { v: 1, instance: instance.to_string(), leader_groups };
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    Txn::new().then(Op::put_in(key, bytes, session))
}

/// The leader group count an instance record says (one for a record without it, or one
/// that cannot be read: an instance too old to know groups).
pub fn leader_groups_of(value: &[u8]) -> u32 {
    serde_json::from_slice::<InstanceRecord>(value).map_or(1, |record| record.leader_groups)
}
