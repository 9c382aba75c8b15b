//! A minimal store-backed backend for the shared core's unit tests: its cache is the raw
//! records under a prefix, a registration is one record, its relay only sends the
//! snapshot (or ends the stream when the registration is gone or replaced), and its loop
//! follows the store, relays and keeps the upkeep.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::time::Instant;

use super::mirror::{Changes, MirrorCache};
use super::outgoing::update;
use super::records::{TopicRecord, decode};
use super::registrar::{Held, Registrar};
use super::relay::{Registration, RelayStep, StreamSeen, Tell};
use super::topics::Topics;
use super::upkeep::{self, Upkeep};
use super::{Core, CoreSettings};
use crate::metrics::Metrics;
use crate::store::{FaultyStore, KeyValue, LeaseStore, MemoryStore, Revision, SessionId};

/// The prefix everything lives under.
pub const PREFIX: &str = "/t/";

/// Every record under [`PREFIX`]: `{prefix}{topic}/...`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Records {
    pub revision: Revision,
    pub kvs: BTreeMap<String, KeyValue>,
}

fn topic_of(key: &str) -> Option<String> {
    key.strip_prefix(PREFIX)?.split('/').next().map(str::to_string)
}

impl MirrorCache for Records {
    type Keys = ();

    fn prefix(_: &()) -> &str {
        PREFIX
    }

    fn put(&mut self, _: &(), kv: KeyValue, changes: &mut Changes) {
        if let Some(topic) = topic_of(&kv.key) {
            changes.topic(&topic);
        }
        self.kvs.insert(kv.key.clone(), kv);
    }

    fn delete(&mut self, _: &(), key: &str, changes: &mut Changes) {
        self.kvs.remove(key);
        if let Some(topic) = topic_of(key) {
            changes.topic(&topic);
        }
    }

    fn differing(&self, other: &Self) -> Changes {
        let keys: BTreeSet<&String> = self.kvs.keys().chain(other.kvs.keys()).collect();
        let mut changes = Changes::default();
        for key in keys.into_iter().filter(|k| self.kvs.get(*k) != other.kvs.get(*k)) {
            if let Some(topic) = topic_of(key) {
                changes.topic(&topic);
            }
        }
        changes
    }

    fn revision(&self) -> Revision {
        self.revision
    }

    fn set_revision(&mut self, revision: Revision) {
        self.revision = revision;
    }

    fn mod_revision(&self, _: &(), key: &str) -> Option<Revision> {
        Some(self.kvs.get(key).map_or(0, |kv| kv.mod_revision))
    }

    fn topic_key(_: &(), topic: &str) -> String {
        format!("{PREFIX}{topic}/config")
    }

    fn topic_count(&self, topic: &str) -> Option<(u32, Revision)> {
        let kv = self.kvs.get(&Self::topic_key(&(), topic))?;
        let record = decode::<TopicRecord>(&kv.key, &kv.value).ok()?;
        Some((record.partition_count, kv.mod_revision))
    }

    fn stored_topics(&self) -> Vec<(String, u32)> {
        let topics: BTreeSet<String> = self.kvs.keys().filter_map(|key| topic_of(key)).collect();
        topics.into_iter().filter_map(|t| Some((t.clone(), self.topic_count(&t)?.0))).collect()
    }
}

/// The registration key of `consumer` on `topic`.
pub fn registration(topic: &str, consumer: &str) -> String {
    format!("{PREFIX}{topic}/consumers/{consumer}")
}

/// The test backend.
pub struct TestBackend {
    pub core: Core<Records, ()>,
}

impl TestBackend {
    /// A backend over a fresh memory store, once its instance lease is live and the record
    /// of topic `events` (4 partitions) is stored and cached. It knows topic `fresh` (2
    /// partitions) too, not stored until a `Register` asks for it.
    pub async fn start(ttl: Duration) -> (Arc<Self>, MemoryStore) {
        let memory = MemoryStore::new();
        let (backend, _) = Self::start_faulty(ttl, memory.clone()).await;
        (backend, memory)
    }

    /// [`start`](Self::start) over `memory` behind a [`FaultyStore`] the test steers (to
    /// cut the instance off).
    pub async fn start_faulty(ttl: Duration, memory: MemoryStore) -> (Arc<Self>, FaultyStore) {
        let cut = FaultyStore::new(Arc::new(memory), 1);
        let configured = [("events".to_string(), 4), ("fresh".to_string(), 2)].into_iter().collect();
        let topics = Topics { configured, source: None };
        let settings = CoreSettings::new("test", ttl, topics);
        let shared: Arc<dyn LeaseStore> = Arc::new(cut.clone());
        let core = Core::load(shared, (), Arc::new(Metrics::new()), settings, "test").await.expect("loads");
        let backend = Arc::new(TestBackend { core });
        tokio::spawn(run(backend.clone()));
        super::register::start_lease(&backend).await.expect("the store grants a lease");
        let mut readiness = backend.core.readiness.subscribe();
        readiness.wait_for(|ready| *ready).await.expect("becomes ready");
        backend.core.ensure_topic("events").await.expect("stores the topic");
        let mut changed = backend.core.mirror.subscribe();
        while !backend.core.topic_stored(&backend.core.mirror.read(), "events") {
            changed.changed().await.expect("the mirror follows the store");
        }
        (backend, cut)
    }
}

/// The test backend's loop: follows the store, relays, keeps the upkeep.
async fn run(backend: Arc<TestBackend>) {
    let core = &backend.core;
    let mut follower = core.follower(Duration::from_secs(300));
    let mut upkeep = Upkeep::new(core.lease_ttl, Instant::now());
    let mut upkept = upkeep::Inputs::new(&*backend);
    let mut works = FuturesUnordered::new();
    loop {
        works.extend(upkeep::run_due(&mut upkeep, &backend, Instant::now()));
        tokio::select! {
            changes = follower.next() => {
                let Some(changes) = changes else { return };
                let cache = core.mirror.read();
                let mut pass = core.streams.pass(&changes);
                while let Some(visit) = pass.next() {
                    let step = backend.relay_step(&cache, visit.topic(), visit.consumer(), visit.seen());
                    visit.apply(step);
                }
                pass.finish();
                core.mirror.announce(&cache);
            }
            (_, work) = upkept.next(&mut upkeep, &backend) => works.extend(work),
            Some(worked) = works.next(), if !works.is_empty() => upkeep.worked(worked),
        }
    }
}

impl Registrar for TestBackend {
    type Cache = Records;
    type Told = ();

    fn core(&self) -> &Core<Records, ()> {
        &self.core
    }

    fn registration_key(&self, topic: &str, consumer: &str) -> String {
        registration(topic, consumer)
    }

    fn registration_record(&self, _consumer: &str, id: SessionId, _incarnation: u64) -> Vec<u8> {
        id.0.to_string().into_bytes()
    }

    fn registration_in(&self, _key: &str, value: &[u8]) -> Option<SessionId> {
        std::str::from_utf8(value).ok()?.parse().ok().map(SessionId)
    }

    fn cached_registration(&self, cache: &Records, topic: &str, consumer: &str) -> Option<Revision> {
        // As the handoff backend: decided on the cache and written in a shared transaction
        // (a lost batch is decided again on the store's state).
        Some(cache.kvs.get(&registration(topic, consumer)).map_or(0, |kv| kv.mod_revision))
    }

    fn held(&self, cache: &Records, key: &(String, String, SessionId)) -> Held {
        match cache.kvs.get(&registration(&key.0, &key.1)) {
            Some(kv) if kv.value == key.2.0.to_string().into_bytes() => Held::ForTtl,
            _ => Held::NotOurs,
        }
    }

    fn registrations_of(&self, cache: &Records, _instance: &str) -> Vec<(String, String, SessionId)> {
        // One instance only: every registration is its own.
        cache
            .kvs
            .iter()
            .filter_map(|(key, kv)| {
                let (topic, consumer) = key.strip_prefix(PREFIX)?.split_once("/consumers/")?;
                let id = std::str::from_utf8(&kv.value).ok()?.parse().ok()?;
                Some((topic.to_string(), consumer.to_string(), SessionId(id)))
            })
            .collect()
    }

    fn relay_step(
        &self,
        cache: &Records,
        topic: &str,
        consumer: &str,
        seen: StreamSeen<'_, ()>,
    ) -> RelayStep<()> {
        let record = cache.kvs.get(&registration(topic, consumer));
        let session = record.and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse().ok());
        // A record that does not parse is someone else's.
        let session = record.map(|_| session.unwrap_or(i64::MIN));
        let registration = seen.registration(session, cache.revision);
        if let Some(step) = RelayStep::not_relayed(registration) {
            return step;
        }
        let gains = if seen.activated { vec![] } else { vec![update(topic, [], [])] };
        let lost = registration == Registration::Lost;
        RelayStep::Tell(Tell { gains, losses: vec![], told: (), within: None, lost, end: None })
    }
}
