//! The fleet backend's [`Registrar`]: what the shared registration calls for a fleet
//! stream (its records in `register.rs`, its relay in `relay.rs`, its claim step in
//! `claim.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::records::MemberRecord;
use super::register::{member_record, unregister, write_registration};
use super::relay::{FleetTold, relay_step};
use super::{Fleet, claim, state::FleetCache};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::{
    Core,
    cas::create_bound,
    records::{decode, encode},
    registrar::{Caller, Held, Registrar},
    relay_step::{RelayStep, StreamSeen},
    streams::StreamKey,
};
use crate::store::{Revision, SessionId, StoreError};

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
        registration: SessionId,
        instance_lease: SessionId,
        caller: &Caller,
    ) -> Result<Option<Revision>, CoordinatorError> {
        write_registration(self, consumer, topic, registration, instance_lease, caller).await
    }

    async fn rewrite_lost(&self, key: &StreamKey, lease: SessionId) -> Result<Option<Revision>, StoreError> {
        // The leases the consumer held went with the lost lease: its claim step claims
        // again, so only the member record is written.
        let (topic, consumer, registration) = key;
        let record_key = self.core.keys().member(topic, consumer);
        let ours = |bytes: &[u8]| {
            decode::<MemberRecord>(&record_key, bytes).is_ok_and(|r| r.session == registration.0)
        };
        let record = encode(&member_record(self, consumer, *registration));
        create_bound(self.core.store(), &record_key, record, lease, ours).await
    }

    fn relay_step(
        &self,
        cache: &FleetCache,
        topic: &str,
        consumer: &str,
        seen: StreamSeen<'_, FleetTold>,
    ) -> RelayStep<FleetTold> {
        relay_step(topic, consumer, seen, cache.topics.get(topic), cache.revision)
    }

    fn held(&self, cache: &FleetCache, key: &StreamKey) -> Held {
        let (topic, consumer, registration) = key;
        match cache.topics.get(topic).and_then(|t| t.members.get(consumer)) {
            Some(r) if r.value.session == registration.0 => Held::ForTtl,
            _ => Held::NotOurs,
        }
    }

    fn registrations_of(&self, cache: &FleetCache, instance: &str) -> Vec<StreamKey> {
        let mut found = Vec::new();
        for (topic, entry) in &cache.topics {
            for (consumer, record) in entry.members.iter().filter(|(_, r)| r.value.instance == instance) {
                found.push((topic.clone(), consumer.clone(), SessionId(record.value.session)));
            }
        }
        found
    }

    async fn unregister(&self, key: &StreamKey) -> Result<bool, StoreError> {
        unregister(self, key).await
    }

    fn spawn_companion(self: &Arc<Self>, key: StreamKey, registered_at: Revision, done: CancellationToken) {
        tokio::spawn(claim::claim_task(self.clone(), key, registered_at, done));
    }
}
