//! Conversions between our store types and etcd's: TTLs, records, transactions.

use std::time::Duration;

use etcd_client::{CompareOp, PutOptions, TxnOp};

use crate::store::{Compare, KeyValue, Malformed, Op, SessionId, StoreError, Txn};

/// etcd TTLs are whole seconds: round up, at least 1.
pub(super) fn ttl_seconds(ttl: Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

pub(super) fn key_value(kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: key_string(kv)?,
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        session: (kv.lease() != 0).then_some(SessionId(kv.lease())),
    })
}

pub(super) fn key_string(kv: &etcd_client::KeyValue) -> Result<String, StoreError> {
    String::from_utf8(kv.key().to_vec()).map_err(|_| {
        StoreError::Invalid(Malformed::KeyNotUtf8 { key: String::from_utf8_lossy(kv.key()).into_owned() })
    })
}

pub(super) fn etcd_txn(txn: &Txn) -> etcd_client::Txn {
    let compares: Vec<etcd_client::Compare> = txn
        .compares
        .iter()
        .map(|compare| match compare {
            Compare::ModRevision(key, rev) => {
                etcd_client::Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
            }
            Compare::CreateRevision(key, rev) => {
                etcd_client::Compare::create_revision(key.as_str(), CompareOp::Equal, *rev)
            }
            Compare::Value(key, value) => {
                etcd_client::Compare::value(key.as_str(), CompareOp::Equal, value.clone())
            }
        })
        .collect();
    let ops: Vec<TxnOp> = txn
        .ops
        .iter()
        .map(|op| match op {
            Op::Put { key, value, session } => {
                TxnOp::put(key.as_str(), value.clone(), session.map(|s| PutOptions::new().with_lease(s.0)))
            }
            Op::Delete { key } => TxnOp::delete(key.as_str(), None),
        })
        .collect();
    etcd_client::Txn::new().when(compares).and_then(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(10)), 10);
    }
}
