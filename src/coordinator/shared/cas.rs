//! Compare-and-swap rewrites of session-bound records, shared by the store-backed
//! coordinators.

use serde::{Serialize, de::DeserializeOwned};

use super::records::{decode, encode};
use crate::store::{Compare, LeaseStore, Op, SessionId, StoreError, Txn};

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

/// Rewrites the record at `key` with `change`, keeping it bound to the session it names
/// (`session_of`), with compare-and-swap on the mod revision it was read at; a lost race is
/// retried on a fresh read, up to [`CAS_ATTEMPTS`] times. `change` returns whether there is
/// anything to write.
pub(crate) async fn rewrite_bound<T: Serialize + DeserializeOwned>(
    store: &dyn LeaseStore,
    key: &str,
    session_of: impl Fn(&T) -> i64,
    change: impl Fn(&mut T) -> bool,
) -> Result<Rewrite<T>, StoreError> {
    for _ in 0..CAS_ATTEMPTS {
        let Some(kv) = store.get(key).await? else { return Ok(Rewrite::Gone) };
        let mut record: T = decode(key, &kv.value)?;
        if !change(&mut record) {
            return Ok(Rewrite::Unchanged);
        }
        let session = SessionId(session_of(&record));
        let txn = Txn::new().when(Compare::ModRevision(key.to_string(), kv.mod_revision)).then(Op::put_in(
            key,
            encode(&record),
            session,
        ));
        if store.txn(txn).await?.succeeded {
            return Ok(Rewrite::Written(record));
        }
    }
    Ok(Rewrite::Contended)
}
