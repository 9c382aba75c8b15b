//! Compare-and-swap rewrites of session-bound records, shared by the store-backed
//! coordinators.

use serde::{Serialize, de::DeserializeOwned};

use super::records::{decode, encode};
use crate::store::{Compare, LeaseStore, Op, StoreError, Txn};

/// How many times a compare-and-swap that lost a race is retried with fresh state.
pub(crate) const CAS_ATTEMPTS: usize = 5;

/// How a [`rewrite_bound`] ended.
pub(crate) enum Rewrite<T> {
    /// The record was rewritten as this.
    Written(T),
    /// The change found nothing to do: nothing was written.
    Unchanged,
    /// There is no record.
    Gone,
    /// Every attempt lost a race with another writer.
    Contended,
}

/// Rewrites the record at `key` with `change`, keeping it bound to the session it is bound
/// to, with compare-and-swap on the mod revision it was read at; a lost race is retried on
/// a fresh read, up to [`CAS_ATTEMPTS`] times. `change` returns whether there is anything
/// to write (so it can refuse a record that is not the one the caller meant).
pub(crate) async fn rewrite_bound<T: Serialize + DeserializeOwned>(
    store: &dyn LeaseStore,
    key: &str,
    change: impl Fn(&mut T) -> bool,
) -> Result<Rewrite<T>, StoreError> {
    for _ in 0..CAS_ATTEMPTS {
        let Some(kv) = store.get(key).await? else { return Ok(Rewrite::Gone) };
        let mut record: T = decode(key, &kv.value)?;
        if !change(&mut record) {
            return Ok(Rewrite::Unchanged);
        }
        let op = match kv.session {
            Some(session) => Op::put_in(key, encode(&record), session),
            None => Op::put(key, encode(&record)),
        };
        let txn = Txn::new().when(Compare::ModRevision(key.to_string(), kv.mod_revision)).then(op);
        if store.txn(txn).await?.succeeded {
            return Ok(Rewrite::Written(record));
        }
    }
    Ok(Rewrite::Contended)
}

/// The transaction of [`create_bound`]: `value` at `key`, bound to `session`, only where no
/// record is (compare on absence).
pub(crate) fn create_bound_txn(key: &str, value: Vec<u8>, session: crate::store::SessionId) -> Txn {
    use crate::mutation::{Mutation, is_active};
    let txn = Txn::new().then(Op::put_in(key, value, session));
    if is_active(Mutation::RebindCompareDropped) {
        return txn;
    }
    txn.when(Compare::ModRevision(key.to_string(), 0))
}

/// Writes `value` at `key`, bound to `session`, only where no record is. Returns the
/// revision of the record that is ours afterwards: the write's, or, when a record is there
/// already and `ours` accepts it, that record's (an earlier write whose answer was lost
/// went through). `None` when the record there belongs to someone else.
pub(crate) async fn create_bound(
    store: &dyn LeaseStore,
    key: &str,
    value: Vec<u8>,
    session: crate::store::SessionId,
    ours: impl Fn(&[u8]) -> bool,
) -> Result<Option<crate::store::Revision>, StoreError> {
    let outcome = store.txn(create_bound_txn(key, value, session)).await?;
    if outcome.succeeded {
        return Ok(Some(outcome.revision));
    }
    Ok(store.get(key).await?.filter(|kv| ours(&kv.value)).map(|kv| kv.mod_revision))
}
