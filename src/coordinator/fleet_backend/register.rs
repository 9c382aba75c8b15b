//! `Register` for the fleet backend: the member record, re-binding the consumer's leases.
//!
//! The shared registration ([`crate::coordinator::shared::register`]) gives each stream its
//! own session; the member record and every lease the consumer holds are bound to it.
//! Beside each stream runs its claim step (`claim.rs`); `registrar.rs` plugs these into the
//! shared registration.

use super::Fleet;
use super::records::{LeaseRecord, MemberRecord};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::{
    cas::{CAS_ATTEMPTS, delete_if},
    records::{RECORD_VERSION, decode, encode},
    registrar::Caller,
    streams::StreamKey,
};
use crate::store::{Compare, KeyValue, Op, Revision, SessionId, StoreError, Txn};

/// The member record of `consumer`'s registration with id `registration` on this
/// instance, with what the Kubernetes view knows of it at this moment (from memory: never
/// waits on the API). Unlike the leader, claiming reads only the stored info, so that
/// every instance computes the same quotas.
pub(super) fn member_record(inner: &Fleet, consumer: &str, registration: SessionId) -> MemberRecord {
    MemberRecord {
        v: RECORD_VERSION,
        session: registration.0,
        instance: inner.core.instance_id().to_string(),
        leaving: false,
        info: inner.config.view.as_ref().and_then(|view| view.info(consumer)).unwrap_or_default(),
    }
}

/// Writes the member record (id `registration`) bound to the instance `lease` and, in the
/// same transaction, re-binds every lease the consumer already holds (a reconnect within
/// the TTL) to it, each guarded by its mod revision. Returns the write's revision; `None`
/// when `caller` went away before anything was written. Each attempt is decided after
/// its reads, and only while the caller waits: a caller gone by then has sent its next
/// attempt, which a write decided from what that attempt wrote would replace
/// (docs/design.md §6).
pub(super) async fn write_registration(
    inner: &Fleet,
    consumer: &str,
    topic: &str,
    registration: SessionId,
    instance_lease: SessionId,
    caller: &Caller,
) -> Result<Option<Revision>, CoordinatorError> {
    let key = inner.core.keys().member(topic, consumer);
    let record = member_record(inner, consumer, registration);
    for _ in 0..CAS_ATTEMPTS {
        let existing = inner.core.store().get(&key).await?.map_or(0, |kv| kv.mod_revision);
        let leases = inner.core.store().get_prefix(&inner.core.keys().leases(topic)).await?;
        if caller.is_gone() {
            return Ok(None);
        }
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
            &key,
            encode(&record),
            instance_lease,
        ));
        for kv in leases.kvs {
            let Ok(lease) = decode::<LeaseRecord>(&kv.key, &kv.value) else { continue };
            if lease.owner == consumer {
                txn = txn.when(Compare::ModRevision(kv.key.clone(), kv.mod_revision)).then(Op::put_in(
                    kv.key,
                    kv.value,
                    instance_lease,
                ));
            }
        }
        let outcome = inner.core.store().txn(txn).await?;
        if outcome.succeeded {
            return Ok(Some(outcome.revision));
        }
    }
    Err(CoordinatorError::Contended(format!(
        "consumer '{consumer}' is being registered concurrently elsewhere; retry"
    )))
}

/// Deletes the member record `key` and every lease its consumer holds, in one transaction
/// guarded by their mod revisions, if the record is still this registration: the leases
/// are free at once.
/// Deletes the member record `key` (and its leases) if it is still this registration's;
/// returns whether it did.
pub(super) async fn unregister(inner: &Fleet, key: &StreamKey) -> Result<bool, StoreError> {
    let (topic, consumer, registration) = key;
    let store = inner.core.store();
    let member = inner.core.keys().member(topic, consumer);
    let held = |kv: &KeyValue| decode::<LeaseRecord>(&kv.key, &kv.value).is_ok_and(|l| l.owner == *consumer);
    let leases = inner.core.keys().leases(topic);
    let ours = |r: &MemberRecord| r.session == registration.0;
    let deleted = delete_if(store, &member, ours, Some((&leases, &held))).await?;
    if deleted {
        tracing::info!(topic, consumer, "member left; its leases are free");
    }
    Ok(deleted)
}
