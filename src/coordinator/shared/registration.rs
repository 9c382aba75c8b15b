//! The registration record's writes, the same for every store-backed backend: written with
//! compare-and-swap on the record as read ([`write`]), written again after the store lost
//! it ([`rewrite_lost`]), deleted if it is still the same registration ([`delete`]). A
//! backend only says where the record is, what it holds and which records go with it
//! ([`Registrar`]: pure); the store is read and written here.
//!
//! A registration whose stream is gone is deleted here too ([`unregister_retrying`]), once
//! the loop's upkeep says (`departures.rs`, `upkeep.rs`).

use std::collections::HashSet;

use super::batch::{KeyWrite, TXN_LIMIT};
use super::cas::{CAS_ATTEMPTS, create_bound};
use super::mirror::MirrorCache;
use super::registrar::{Caller, Registrar};
use super::streams::StreamKey;
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::Contention;
use crate::store::{Compare, KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn};

/// Writes `consumer`'s registration with id `registration` on `topic`, bound to the
/// instance `lease`, replacing any earlier one of the same name with compare-and-swap on
/// the record as read before the write, and moving the records bound to the earlier one
/// ([`Registrar::bound_prefix`]) to `lease` in the same transaction (a reconnect within the
/// TTL keeps them). Returns the write's revision.
///
/// This is the write decided on the store's state, in a transaction of its own, for what
/// the cache cannot decide or a batch lost (`enrolment.rs`). Each decision is made after
/// its read, and only while the caller waits: `None` when the caller went away before
/// anything was written. A caller gone by then has sent its next attempt, which a write
/// decided from what that attempt wrote would replace (docs/design.md §6).
pub async fn write<R: Registrar>(
    backend: &R,
    consumer: &str,
    topic: &str,
    registration: SessionId,
    lease: SessionId,
    incarnation: u64,
    caller: &Caller,
) -> Result<Option<Written>, CoordinatorError> {
    let core = backend.core();
    let key = backend.registration_key(topic, consumer);
    let record = backend.registration_record(consumer, registration, incarnation);
    let store = &*core.store;
    for _ in 0..CAS_ATTEMPTS {
        let stored = store.get(&key).await?;
        let existing = stored.as_ref().map_or(0, |kv| kv.mod_revision);
        let stored_incarnation = stored.as_ref().map_or(0, |kv| backend.incarnation_in(&key, &kv.value));
        let same_process = is_same_process(incarnation, stored_incarnation);
        // The same process reconnecting has nobody to fence: nothing to raise (§10).
        let epoch_prefixes = if same_process { Vec::new() } else { backend.epoch_prefixes(topic) };
        // One read of each prefix, for the bound records and the raise alike (the fleet's
        // leases are both).
        let bound_prefix = backend.bound_prefix(topic);
        let read = read_prefixes(store, bound_prefix.iter().chain(&epoch_prefixes)).await?;
        let bound =
            bound_prefix.map_or_else(Vec::new, |prefix| bound_in(backend, &read.kvs, &prefix, consumer));
        let raised = if epoch_prefixes.is_empty() {
            Vec::new()
        } else {
            let cache = <R::Cache as MirrorCache>::from_snapshot(core.keys(), read);
            backend.raise_epochs(&cache, topic, consumer, lease, super::records::now_micros())
        };
        if caller.is_gone() {
            return Ok(None);
        }
        // A bound record whose epoch is raised is moved to `lease` by its raise.
        let raised_keys: HashSet<String> =
            raised.iter().flat_map(|w| w.ops.iter().map(|op| op.key().to_string())).collect();
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
            &key,
            record.clone(),
            lease,
        ));
        for kv in bound.into_iter().filter(|kv| !raised_keys.contains(&kv.key)) {
            txn = txn
                .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
                .then(Op::put_in(kv.key, kv.value, lease));
        }
        // The raise goes in the registration's transaction as far as it fits; the rest
        // follows in transactions of their own before the stream is admitted.
        let mut later = vec![Txn::new()];
        for write in raised {
            let target = if fits(&txn, &write) { &mut txn } else { open_txn(&mut later, &write) };
            target.compares.extend(write.compares);
            target.ops.extend(write.ops);
        }
        let outcome = store.txn(txn).await?;
        if !outcome.succeeded {
            continue;
        }
        // The registration's own revision, which is where the stream's epochs start
        // (records written before it are shown once raised, by what follows).
        let revision = outcome.revision;
        for txn in later.into_iter().filter(|t| !t.ops.is_empty()) {
            let outcome = store.txn(txn).await?;
            if !outcome.succeeded {
                // Registered, but not every epoch raised: the stream is not admitted, and
                // the client's next attempt raises them again.
                return Err(CoordinatorError::Contended(Contention::EpochsRaised {
                    consumer: consumer.to_string(),
                }));
            }
        }
        return Ok(Some(Written { revision, same_process }));
    }
    Err(CoordinatorError::Contended(Contention::RegisteredElsewhere { consumer: consumer.to_string() }))
}

/// Whether a registration sent by client process `sent` replaces one that the same process
/// sent (`stored`; 0: unknown): a reconnect, not a new incarnation (docs/design.md §10). A
/// process that sent no number is never taken for the same one.
pub fn is_same_process(sent: u64, stored: u64) -> bool {
    sent != 0 && sent == stored
}

/// A registration [`write`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The registration's revision.
    pub revision: Revision,
    /// Whether it replaced a registration of the same client process (nothing raised).
    pub same_process: bool,
}

/// Whether `write` still fits in `txn` within etcd's limits per transaction.
fn fits(txn: &Txn, write: &KeyWrite) -> bool {
    txn.compares.len() + write.compares.len() <= TXN_LIMIT && txn.ops.len() + write.ops.len() <= TXN_LIMIT
}

/// The last of `txns` if `write` fits in it, else a new one.
fn open_txn<'a>(txns: &'a mut Vec<Txn>, write: &KeyWrite) -> &'a mut Txn {
    if !txns.last().is_some_and(|t| fits(t, write)) {
        txns.push(Txn::new());
    }
    let last = txns.len() - 1;
    &mut txns[last]
}

/// The records under each of `prefixes` (each read once), as one snapshot at the latest
/// revision read.
async fn read_prefixes<'a>(
    store: &dyn LeaseStore,
    prefixes: impl Iterator<Item = &'a String>,
) -> Result<PrefixSnapshot, StoreError> {
    let mut snapshot = PrefixSnapshot { kvs: Vec::new(), revision: 0 };
    let mut read = HashSet::new();
    for prefix in prefixes.filter(|p| read.insert(p.as_str())) {
        let answer = store.get_prefix(prefix).await?;
        snapshot.kvs.extend(answer.kvs);
        snapshot.revision = snapshot.revision.max(answer.revision);
    }
    Ok(snapshot)
}

/// Of `kvs`, the records under `prefix` bound to `consumer`'s registration.
fn bound_in<R: Registrar>(backend: &R, kvs: &[KeyValue], prefix: &str, consumer: &str) -> Vec<KeyValue> {
    kvs.iter().filter(|kv| kv.key.starts_with(prefix) && backend.is_bound_to(consumer, kv)).cloned().collect()
}

/// The records bound to `consumer`'s registration on `topic`, as stored now.
async fn bound_records<R: Registrar>(
    backend: &R,
    store: &dyn LeaseStore,
    topic: &str,
    consumer: &str,
) -> Result<Vec<KeyValue>, StoreError> {
    let Some(prefix) = backend.bound_prefix(topic) else { return Ok(Vec::new()) };
    let all = store.get_prefix(&prefix).await?.kvs;
    Ok(bound_in(backend, &all, &prefix, consumer))
}

/// Writes the registration `key` again, bound to the instance `lease`, after the store
/// lost it (the previous lease expired before this instance fenced itself), only where no
/// other registration took the name ([`create_bound`]). It is written as `kept`, what the
/// lost record said as this instance last saw it (a drain, a restart hold: a consumer
/// that called `Deregister` still leaves), or as a fresh registration when nothing was
/// kept. The records that were bound to it went with the lost lease (the fleet's claim
/// step claims again). Returns the revision of the record, or `None` if another
/// registration has the name.
pub async fn rewrite_lost<R: Registrar>(
    backend: &R,
    key: &StreamKey,
    kept: Option<Vec<u8>>,
    lease: SessionId,
) -> Result<Option<Revision>, StoreError> {
    let (topic, consumer, registration) = key;
    let record_key = backend.registration_key(topic, consumer);
    let ours = |bytes: &[u8]| backend.registration_in(&record_key, bytes) == Some(*registration);
    // A kept record that is not this registration's (it cannot be: only the relay keeps it,
    // while the record is ours) is not written.
    let kept = kept.filter(|record| ours(record));
    let record = kept.unwrap_or_else(|| backend.registration_record(consumer, *registration, 0));
    create_bound(&*backend.core().store, &record_key, record, lease, ours).await
}

/// Deletes the registration `key`, and the records bound to it, in one transaction guarded
/// by their mod revisions, if the record is still this registration: what it held is free
/// at once. Returns whether it deleted; a lost race is retried on a fresh read.
pub async fn delete<R: Registrar>(backend: &R, key: &StreamKey) -> Result<bool, StoreError> {
    let (topic, consumer, registration) = key;
    let store = &*backend.core().store;
    let record_key = backend.registration_key(topic, consumer);
    for _ in 0..CAS_ATTEMPTS {
        let Some(kv) = store.get(&record_key).await? else { return Ok(false) };
        if backend.registration_in(&record_key, &kv.value) != Some(*registration) {
            return Ok(false);
        }
        let mut txn = Txn::new()
            .when(Compare::ModRevision(record_key.clone(), kv.mod_revision))
            .then(Op::delete(&record_key));
        for other in bound_records(backend, store, topic, consumer).await? {
            txn = txn
                .when(Compare::ModRevision(other.key.clone(), other.mod_revision))
                .then(Op::delete(other.key));
        }
        if store.txn(txn).await?.succeeded {
            tracing::info!(topic, consumer, "registration deleted; what it held is free");
            return Ok(true);
        }
    }
    Ok(false)
}

/// Deletes the registration `key` if it is still this one, retrying while the store is out
/// of reach (a registration left behind would keep its partitions until the instance
/// restarts); gives up when the instance stops.
pub async fn unregister_retrying<R: Registrar>(backend: &R, key: &StreamKey) {
    let core = backend.core();
    let mut backoff = std::time::Duration::from_millis(50);
    loop {
        match delete(backend, key).await {
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, topic = %key.0, consumer = %key.1, "cannot delete the registration; retrying")
            }
        }
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(core.lease_ttl);
    }
}
