//! `Register` for the fleet backend: the member record, re-binding the consumer's leases.
//!
//! The shared registration ([`crate::coordinator::shared::register`]) gives each stream its
//! own session; the member record and every lease the consumer holds are bound to it.
//! Beside each stream runs its claim step (`claim.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::records::{LeaseRecord, MemberRecord};
use super::relay::{FleetTold, relay_one};
use super::{Fleet, claim, state::FleetCache};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::{
    Core,
    cas::CAS_ATTEMPTS,
    records::{RECORD_VERSION, decode, encode},
    register::Registrar,
    streams::{Ending, LocalStream, StreamKey},
};
use crate::store::{Compare, Op, Revision, SessionId, Txn};

#[async_trait]
impl Registrar for Fleet {
    type Cache = FleetCache;
    type Told = FleetTold;

    fn core(&self) -> &Core<FleetCache, FleetTold> {
        &self.core
    }

    async fn write_registration(
        &self,
        consumer: &str,
        topic: &str,
        session: SessionId,
    ) -> Result<Revision, CoordinatorError> {
        write_registration(self, consumer, topic, session).await
    }

    fn relay_one(
        &self,
        cache: &FleetCache,
        topic: &str,
        consumer: &str,
        stream: &mut LocalStream<FleetTold>,
    ) -> Option<Ending> {
        relay_one(topic, consumer, stream, cache.topics.get(topic), cache.revision)
    }

    fn spawn_companion(self: &Arc<Self>, key: StreamKey, registered_at: Revision, done: CancellationToken) {
        tokio::spawn(claim::claim_task(self.clone(), key, registered_at, done));
    }
}

/// Writes the member record bound to `session` and, in the same transaction, re-binds
/// every lease the consumer already holds (a reconnect within the TTL) to it, each guarded
/// by its mod revision. Returns the write's revision.
async fn write_registration(
    inner: &Fleet,
    consumer: &str,
    topic: &str,
    session: SessionId,
) -> Result<Revision, CoordinatorError> {
    let key = inner.core.keys.member(topic, consumer);
    let record = MemberRecord {
        v: RECORD_VERSION,
        session: session.0,
        instance: inner.core.instance_id.clone(),
        leaving: false,
    };
    for _ in 0..CAS_ATTEMPTS {
        let existing = inner.core.store.get(&key).await?.map_or(0, |kv| kv.mod_revision);
        let leases = inner.core.store.get_prefix(&inner.core.keys.leases(topic)).await?;
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
            &key,
            encode(&record),
            session,
        ));
        for kv in leases.kvs {
            let Ok(lease) = decode::<LeaseRecord>(&kv.key, &kv.value) else { continue };
            if lease.owner == consumer {
                txn = txn
                    .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
                    .then(Op::put_in(kv.key, kv.value, session));
            }
        }
        let outcome = inner.core.store.txn(txn).await?;
        if outcome.succeeded {
            return Ok(outcome.revision);
        }
    }
    Err(CoordinatorError::Aborted(format!(
        "consumer '{consumer}' is being registered concurrently elsewhere; retry"
    )))
}
