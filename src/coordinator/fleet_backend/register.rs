//! `Register` for the fleet backend, as pure functions of the cache: the member record, how
//! long a registration is kept after its stream ended, and which registrations name an
//! instance. The machine (`machine/register.rs`, `machine/settle.rs`) binds the member
//! record, and every lease the consumer holds, to the consumer's registration; a reconnect
//! moves them to its new registration in one transaction.

use super::records::MemberRecord;
use super::state::FleetCache;
use crate::coordinator::shared::{departures::Held, records::RECORD_VERSION, streams::StreamKey};
use crate::store::SessionId;

/// The member record of the registration `registration` held by `instance`, sent by the
/// client process `incarnation`, with what placement knows of the consumer (pure).
pub(super) fn member_record_of(
    instance: &str,
    registration: SessionId,
    incarnation: u64,
    info: crate::assignment::ConsumerInfo,
) -> MemberRecord {
    MemberRecord {
        v: RECORD_VERSION,
        session: registration.0,
        instance: instance.to_string(),
        leaving: false,
        info,
        incarnation,
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
