//! `Register` for the handoff backend: the consumer record, and how long it is kept after
//! its stream ended (the TTL, or the restart hold of a `SHUTDOWN_NOW` deregistration).
//!
//! The shared registration ([`crate::coordinator::shared::register`]) binds the consumer
//! record to this instance's lease. When the stream drops, the record is kept for the TTL:
//! a reconnect (to any instance) rewrites it and keeps the partitions. Otherwise the record
//! is deleted and the leader reassigns the partitions.

use async_trait::async_trait;

use super::records::{ConsumerRecord, RECORD_VERSION, decode, encode};
use super::{Handoff, relay, state::Cache};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::{
    Core,
    batch::{Batched, KeyWrite},
    cas::{CAS_ATTEMPTS, create_bound, delete_if},
    registrar::{Caller, Held, Registrar},
    relay_step::{RelayStep, StreamSeen},
    streams::StreamKey,
};
use crate::handoff::{ConsumerStatus, ConsumerView};
use crate::store::{Compare, Op, Revision, SessionId, StoreError, Txn};

impl Handoff {
    /// The record of `consumer`'s active registration with id `registration` on this
    /// instance, with what the Kubernetes view knows of it at this moment (from memory:
    /// never waits on the API; the leader plans with the view's later info anyway).
    fn active_record(&self, consumer: &str, registration: SessionId) -> ConsumerRecord {
        ConsumerRecord {
            v: RECORD_VERSION,
            status: ConsumerStatus::Active,
            session: registration.0,
            instance: self.core.instance_id().to_string(),
            hold_until: None,
            info: self.config.rollout.as_ref().and_then(|view| view.info(consumer)).unwrap_or_default(),
        }
    }
}

#[async_trait]
impl Registrar for Handoff {
    type Cache = Cache;
    type Told = ConsumerView;

    fn core(&self) -> &Core<Cache, ConsumerView> {
        &self.core
    }

    async fn write_registration(
        &self,
        consumer: &str,
        topic: &str,
        registration: SessionId,
        lease: SessionId,
        caller: &Caller,
    ) -> Result<Option<Revision>, CoordinatorError> {
        let core = &self.core;
        let key = core.keys().consumer(topic, consumer);
        let record = self.active_record(consumer, registration);
        // First in a shared transaction, decided from the cache; if that lost, alone,
        // decided from a fresh read. Each decision is made after its read, and only while
        // the caller waits: a caller gone by then has sent its next attempt, which a write
        // decided from what that attempt wrote would replace (docs/design.md §6).
        let cached = {
            let cache = core.mirror().read();
            cache.topics.get(topic).and_then(|t| t.consumers.get(consumer)).map_or(0, |r| r.mod_revision)
        };
        if caller.is_gone() {
            return Ok(None);
        }
        let write = KeyWrite {
            key: key.clone(),
            compares: vec![Compare::ModRevision(key.clone(), cached)],
            ops: vec![Op::put_in(&key, encode(&record), lease)],
        };
        if let Batched::Written(revision) = core.registrations().write(write).await? {
            return Ok(Some(revision));
        }
        for _ in 0..CAS_ATTEMPTS {
            let existing = core.store().get(&key).await?.map_or(0, |kv| kv.mod_revision);
            if caller.is_gone() {
                return Ok(None);
            }
            let txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
                &key,
                encode(&record),
                lease,
            ));
            let outcome = core.store().txn(txn).await?;
            if outcome.succeeded {
                return Ok(Some(outcome.revision));
            }
        }
        Err(CoordinatorError::Contended(format!(
            "consumer '{consumer}' is being registered concurrently elsewhere; retry"
        )))
    }

    async fn rewrite_lost(&self, key: &StreamKey, lease: SessionId) -> Result<Option<Revision>, StoreError> {
        let (topic, consumer, registration) = key;
        let record_key = self.core.keys().consumer(topic, consumer);
        let ours = |bytes: &[u8]| {
            decode::<ConsumerRecord>(&record_key, bytes).is_ok_and(|r| r.session == registration.0)
        };
        let record = encode(&self.active_record(consumer, *registration));
        create_bound(self.core.store(), &record_key, record, lease, ours).await
    }

    fn relay_step(
        &self,
        cache: &Cache,
        topic: &str,
        consumer: &str,
        seen: StreamSeen<'_, ConsumerView>,
    ) -> RelayStep<ConsumerView> {
        let entry = cache.topics.get(topic);
        let view = entry.map(|e| e.view_of(consumer)).unwrap_or_default();
        relay::relay_step(topic, consumer, seen, entry, view, cache.revision)
    }

    fn held(&self, cache: &Cache, key: &StreamKey) -> Held {
        let (topic, consumer, registration) = key;
        match cache.topics.get(topic).and_then(|t| t.consumers.get(consumer)) {
            Some(r) if r.value.session == registration.0 => {
                r.value.hold_until.map_or(Held::ForTtl, Held::Until)
            }
            _ => Held::NotOurs,
        }
    }

    fn registrations_of(&self, cache: &Cache, instance: &str) -> Vec<StreamKey> {
        let mut found = Vec::new();
        for (topic, entry) in &cache.topics {
            for (consumer, record) in entry.consumers.iter().filter(|(_, r)| r.value.instance == instance) {
                found.push((topic.clone(), consumer.clone(), SessionId(record.value.session)));
            }
        }
        found
    }

    async fn unregister(&self, key: &StreamKey) -> Result<bool, StoreError> {
        let (topic, consumer, registration) = key;
        let record_key = self.core.keys().consumer(topic, consumer);
        let ours = |r: &ConsumerRecord| r.session == registration.0;
        let deleted = delete_if(self.core.store(), &record_key, ours, None).await?;
        if deleted {
            tracing::info!(topic, consumer, "registration deleted; its partitions will be reassigned");
        }
        Ok(deleted)
    }
}
