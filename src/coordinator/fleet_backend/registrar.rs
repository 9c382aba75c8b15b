//! The fleet backend's [`Registrar`]: what the shared registration calls for a fleet
//! stream (its records in `register.rs`, its relay in `relay.rs`, its claim steps run by
//! the loop, `driver.rs`).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::records::{LeaseRecord, MemberRecord};
use super::register::member_record;
use super::relay::{FleetTold, relay_step};
use super::{Fleet, state::FleetCache};
use crate::coordinator::shared::{
    Core,
    batch::KeyWrite,
    records::{decode, encode},
    registrar::{Held, Registrar},
    relay::{RelayStep, StreamSeen},
    streams::StreamKey,
};
use crate::store::{KeyValue, Revision, SessionId};

impl Registrar for Fleet {
    type Cache = FleetCache;
    type Told = FleetTold;

    fn core(&self) -> &Core<FleetCache, FleetTold> {
        &self.core
    }

    fn registration_key(&self, topic: &str, consumer: &str) -> String {
        self.core.keys().member(topic, consumer)
    }

    fn registration_record(&self, consumer: &str, registration: SessionId, incarnation: u64) -> Vec<u8> {
        encode(&member_record(self, consumer, registration, incarnation))
    }

    fn registration_in(&self, key: &str, value: &[u8]) -> Option<SessionId> {
        decode::<MemberRecord>(key, value).ok().map(|r| SessionId(r.session))
    }

    fn incarnation_in(&self, key: &str, value: &[u8]) -> u64 {
        decode::<MemberRecord>(key, value).map_or(0, |r| r.incarnation)
    }

    fn bound_prefix(&self, topic: &str) -> Option<String> {
        // The consumer's leases: a reconnect within the TTL moves them to its new
        // registration (no partition moves), and they are free the moment it is deleted.
        Some(self.core.keys().leases(topic))
    }

    fn is_bound_to(&self, consumer: &str, kv: &KeyValue) -> bool {
        decode::<LeaseRecord>(&kv.key, &kv.value).is_ok_and(|lease| lease.owner == consumer)
    }

    fn epoch_prefixes(&self, topic: &str) -> Vec<String> {
        vec![self.core.keys().leases(topic), self.core.keys().epochs(topic)]
    }

    fn raise_epochs(
        &self,
        cache: &FleetCache,
        topic: &str,
        consumer: &str,
        lease: SessionId,
        now_micros: u64,
    ) -> Vec<KeyWrite> {
        let Some(entry) = cache.topics.get(topic) else { return Vec::new() };
        super::claim_decide::raise_txns(
            self.core.keys(),
            entry,
            topic,
            consumer,
            lease,
            cache.revision,
            now_micros,
        )
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
        held(cache, key)
    }

    fn registrations_of(&self, cache: &FleetCache, instance: &str) -> Vec<StreamKey> {
        registrations_of(cache, instance)
    }

    fn spawn_companion(self: &Arc<Self>, key: StreamKey, registered_at: Revision, done: CancellationToken) {
        self.claims.start(key, registered_at, done);
    }
}

/// How long the fleet registration `key` is kept after its stream ended: for the TTL
/// while the cache holds it as that registration (pure).
pub(super) fn held(cache: &FleetCache, key: &StreamKey) -> Held {
    let (topic, consumer, registration) = key;
    match cache.topics.get(topic).and_then(|t| t.members.get(consumer)) {
        Some(r) if r.value.session == registration.0 => Held::ForTtl,
        _ => Held::NotOurs,
    }
}

/// Every member record in `cache` that names `instance` as the one holding its stream.
pub(super) fn registrations_of(cache: &FleetCache, instance: &str) -> Vec<StreamKey> {
    let mut found = Vec::new();
    for (topic, entry) in &cache.topics {
        for (consumer, record) in entry.members.iter().filter(|(_, r)| r.value.instance == instance) {
            found.push((topic.clone(), consumer.clone(), SessionId(record.value.session)));
        }
    }
    found
}
