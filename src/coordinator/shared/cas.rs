//! Compare-and-swap writes of session-bound records, shared by both machines.

use crate::store::{Compare, Op, Txn};

/// How many times a compare-and-swap that lost a race is retried with fresh state.
pub(crate) const CAS_ATTEMPTS: usize = 5;

/// The transaction that writes `value` at `key`, bound to `session`, only where no record
/// is (compare on absence).
pub(crate) fn create_bound_txn(key: &str, value: Vec<u8>, session: crate::store::SessionId) -> Txn {
    use crate::mutation::{Mutation, is_active};
    let txn = Txn::new().then(Op::put_in(key, value, session));
    if is_active(Mutation::RebindCompareDropped) {
        return txn;
    }
    txn.when(Compare::ModRevision(key.to_string(), 0))
}
