//! `Register` for the handoff backend: the consumer record, and how long it is kept after
//! its stream ended (the TTL, or the restart hold of a `SHUTDOWN_NOW` deregistration).
//!
//! The shared registration ([`crate::coordinator::shared::register`]) binds the consumer
//! record to this instance's lease. When the stream drops, the record is kept for the TTL:
//! a reconnect (to any instance) rewrites it and keeps the partitions. Otherwise the record
//! is deleted and the leader reassigns the partitions.

use super::records::{ConsumerRecord, RECORD_VERSION};
use super::{HandoffConfig, state::Cache};
use crate::coordinator::shared::{departures::Held, streams::StreamKey};
use crate::handoff::ConsumerStatus;
use crate::store::{Revision, SessionId};

/// The record of `consumer`'s active registration with id `registration` on the instance
/// of `config`, with what the Kubernetes view knows of it at this moment (from memory:
/// never waits on the API; the leader plans with the view's later info anyway).
pub(super) fn active_record(
    config: &HandoffConfig,
    consumer: &str,
    registration: SessionId,
    incarnation: u64,
) -> ConsumerRecord {
    ConsumerRecord {
        v: RECORD_VERSION,
        status: ConsumerStatus::Active,
        session: registration.0,
        instance: config.instance_id.clone(),
        hold_until: None,
        info: config.rollout.as_ref().and_then(|view| view.info(consumer)).unwrap_or_default(),
        incarnation,
    }
}

/// How long the registration `key` is kept after its stream ended, as `cache` says (pure).
pub(super) fn held(cache: &Cache, key: &StreamKey) -> Held {
    let (topic, consumer, registration) = key;
    match cache.topics.get(topic).and_then(|t| t.consumers.get(consumer)) {
        Some(r) if r.value.session == registration.0 => r.value.hold_until.map_or(Held::ForTtl, Held::Until),
        _ => Held::NotOurs,
    }
}

/// Every registration in `cache` that names `instance` as the one holding its stream (pure).
pub(super) fn registrations_of(cache: &Cache, instance: &str) -> Vec<StreamKey> {
    let mut found = Vec::new();
    for (topic, entry) in &cache.topics {
        for (consumer, record) in entry.consumers.iter().filter(|(_, r)| r.value.instance == instance) {
            found.push((topic.clone(), consumer.clone(), SessionId(record.value.session)));
        }
    }
    found
}

/// The mod revision of `consumer`'s registration on `topic` in `cache` (0: none): what a
/// registration decided on the cache compares.
pub(super) fn cached_registration(cache: &Cache, topic: &str, consumer: &str) -> Revision {
    cache.topics.get(topic).and_then(|t| t.consumers.get(consumer)).map_or(0, |r| r.mod_revision)
}

/// The client process `consumer`'s registration on `topic` in `cache` was registered by
/// (0: unknown, or no registration).
pub(super) fn cached_incarnation(cache: &Cache, topic: &str, consumer: &str) -> u64 {
    cache.topics.get(topic).and_then(|t| t.consumers.get(consumer)).map_or(0, |r| r.value.incarnation)
}
