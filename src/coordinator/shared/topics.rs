//! Topics: the stored partition count of each topic (`ensure_topic`) and where counts come
//! from when none is stored ([`PartitionCounts`]: Kafka's metadata in production).
//!
//! Order of authority: a count configured with `--topic-partitions` (it creates the
//! record, or grows it); a stored count; the [`PartitionCounts`] source; otherwise
//! `NOT_FOUND`. Records are written with compare-and-swap on what was read, so concurrent
//! instances agree on one value. [`Topics::grow`] stores a larger count seen later
//! (Kafka partitions can be added, never removed).

use std::{collections::BTreeMap, sync::Arc};

use async_trait::async_trait;

use super::cas::CAS_ATTEMPTS;
use super::records::{TopicRecord, decode, encode};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{Contention, TopicUnknown};
use crate::kafka::{KafkaError, KafkaMetadata};
use crate::store::{Compare, LeaseStore, Op, Revision, Txn};

/// Where partition counts of topics nobody configured come from.
#[async_trait]
pub trait PartitionCounts: Send + Sync + 'static {
    /// The topic's partition count now.
    async fn partition_count(&self, topic: &str) -> Result<u32, KafkaError>;

    /// Names the source in messages (e.g. the brokers).
    fn describe(&self) -> String;
}

#[async_trait]
impl PartitionCounts for KafkaMetadata {
    async fn partition_count(&self, topic: &str) -> Result<u32, KafkaError> {
        KafkaMetadata::partition_count(self, topic).await
    }

    fn describe(&self) -> String {
        format!("Kafka at {}", self.brokers())
    }
}

impl std::fmt::Debug for dyn PartitionCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// What [`count_to_store`] decides for a topic's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// The stored count stands.
    Stored(u32),
    /// Store this count over the record at this mod revision (0: none).
    Write(u32, Revision),
    /// Nothing is stored or configured: ask the source.
    AskSource,
}

/// What the topic record should hold (pure): a configured count creates or grows it, a
/// stored count otherwise stands, and the source's count (`from_source`, once asked)
/// creates it.
pub fn count_to_store(
    stored: Option<(u32, Revision)>,
    configured: Option<u32>,
    from_source: Option<u32>,
) -> Counted {
    match (stored, configured) {
        (Some((stored, _)), Some(c)) if c <= stored => Counted::Stored(stored),
        (Some((stored, _)), None) => Counted::Stored(stored),
        (Some((_, rev)), Some(c)) => Counted::Write(c, rev),
        (None, Some(c)) => Counted::Write(c, 0),
        (None, None) => from_source.map_or(Counted::AskSource, |count| Counted::Write(count, 0)),
    }
}

/// The transaction that stores `count` at the topic record `key`, over the record at mod
/// revision `revision` (0: none), keeping what else `kept` (that record) holds.
pub fn topic_txn(key: &str, count: u32, revision: Revision, kept: Option<TopicRecord>) -> Txn {
    let record = TopicRecord { partition_count: count, ..kept.unwrap_or_else(|| TopicRecord::new(count)) };
    Txn::new().when(Compare::ModRevision(key.to_string(), revision)).then(Op::put(key, encode(&record)))
}

/// The answer for a topic whose count is nowhere to be had.
pub fn no_count(topic: &str) -> CoordinatorError {
    CoordinatorError::UnknownTopic(TopicUnknown::NotConfigured { topic: topic.to_string() })
}

/// The partition counts a backend knows: configured ones and an optional source.
#[derive(Clone, Debug, Default)]
pub struct Topics {
    /// Counts from `--topic-partitions`; they override the source.
    pub configured: BTreeMap<String, u32>,
    /// Where other topics' counts come from (`--kafka-brokers`); `None`: nowhere.
    pub source: Option<Arc<dyn PartitionCounts>>,
}

impl Topics {
    /// Makes sure `topic` has a stored count at `key` and returns it. `cached` is the
    /// count and mod revision the caller's cache holds, if any (saves a read).
    pub async fn ensure(
        &self,
        store: &dyn LeaseStore,
        key: &str,
        topic: &str,
        cached: Option<(u32, Revision)>,
    ) -> Result<u32, CoordinatorError> {
        let configured = self.configured.get(topic).copied();
        let mut from_source = None;
        let mut cached = cached;
        for _ in 0..CAS_ATTEMPTS {
            let stored = match cached.take() {
                Some(c) => Some(c),
                None => match store.get(key).await? {
                    Some(kv) => {
                        Some((decode::<TopicRecord>(key, &kv.value)?.partition_count, kv.mod_revision))
                    }
                    None => None,
                },
            };
            let (count, revision) = match count_to_store(stored, configured, from_source) {
                Counted::Stored(count) => return Ok(count),
                Counted::Write(count, revision) => (count, revision),
                Counted::AskSource => (*from_source.insert(self.ask_source(topic).await?), 0),
            };
            // A grown count keeps what else the stored record holds (its weights).
            let kept = match revision {
                0 => None,
                _ => store.get(key).await?.map(|kv| decode::<TopicRecord>(key, &kv.value)).transpose()?,
            };
            if store.txn(topic_txn(key, count, revision, kept)).await?.succeeded {
                let source = if configured.is_some() { "--topic-partitions" } else { "Kafka" };
                tracing::info!(topic, partitions = count, source, "topic config stored");
                return Ok(count);
            }
        }
        Err(CoordinatorError::Contended(Contention::TopicConfig { topic: topic.to_string() }))
    }

    pub(crate) async fn ask_source(&self, topic: &str) -> Result<u32, CoordinatorError> {
        let Some(source) = &self.source else { return Err(no_count(topic)) };
        source.partition_count(topic).await.map_err(|error| match error {
            error @ KafkaError::UnknownTopic(_) => CoordinatorError::UnknownTopic(TopicUnknown::NotInKafka {
                topic: topic.to_string(),
                cluster: source.describe(),
                source: error,
            }),
            other => CoordinatorError::Kafka { topic: topic.to_string(), source: other },
        })
    }

    /// Asks the source for the count of each topic in `stored` (name, key, stored count)
    /// that is not configured, and stores the counts that grew, each write also guarded
    /// by `guard` (the leader's fence, if any). Gives up the round at the first
    /// unreachable answer; stops early when `go_on` turns false.
    pub async fn grow(
        &self,
        store: &dyn LeaseStore,
        stored: Vec<(String, String, u32)>,
        guard: Option<Compare>,
        go_on: impl Fn() -> bool,
    ) {
        let Some(source) = &self.source else { return };
        for (topic, key, cached) in stored {
            if !go_on() {
                return;
            }
            if self.configured.contains_key(&topic) {
                continue;
            }
            match source.partition_count(&topic).await {
                Ok(count) if count == cached => {}
                Ok(count) => grow_one(store, &key, &topic, count, guard.clone()).await,
                Err(KafkaError::UnknownTopic(_)) => tracing::warn!(
                    topic,
                    "topic refresh: the topic no longer exists in Kafka; its partition count is kept"
                ),
                Err(error) => {
                    tracing::warn!(%error, "topic refresh: Kafka unavailable; trying again at the next refresh");
                    return;
                }
            }
        }
    }
}

/// Stores `count` for `topic` if it is larger than the stored one (compare-and-swap on
/// the record). A smaller count is logged and ignored: Kafka cannot shrink a topic.
async fn grow_one(store: &dyn LeaseStore, key: &str, topic: &str, count: u32, guard: Option<Compare>) {
    let stored = match store.get(key).await {
        Ok(stored) => stored,
        Err(error) => return tracing::warn!(%error, topic, "topic refresh: cannot read the topic record"),
    };
    let Some(txn) = grown_txn(key, topic, stored.as_ref(), count, guard) else { return };
    grown(topic, count, store.txn(txn).await.map(|outcome| outcome.succeeded));
}

/// The transaction that grows `topic`'s record (`stored`, as read from `key`) to Kafka's
/// `count`, guarded by `guard` too (the leader's fence, if any); `None` when there is
/// nothing to grow (no record, an unreadable one, or a count not larger: a smaller one is
/// logged, Kafka cannot shrink a topic). Pure: the running refresh and the state
/// machines' refresh (`coordinator/machine/refresh.rs`) write the same transaction.
pub fn grown_txn(
    key: &str,
    topic: &str,
    stored: Option<&crate::store::KeyValue>,
    count: u32,
    guard: Option<Compare>,
) -> Option<Txn> {
    let stored_kv = stored?;
    let stored_record = match decode::<TopicRecord>(key, &stored_kv.value) {
        Ok(record) => record,
        Err(error) => {
            tracing::warn!(%error, topic, "topic refresh: unreadable topic record");
            return None;
        }
    };
    let stored = stored_record.partition_count;
    if count < stored {
        tracing::warn!(
            topic,
            stored,
            kafka = count,
            "Kafka reports fewer partitions than stored; ignored (Kafka cannot shrink a topic)"
        );
        return None;
    }
    if count == stored {
        return None;
    }
    let record = TopicRecord { partition_count: count, ..stored_record };
    let mut txn = Txn::new()
        .when(Compare::ModRevision(key.to_string(), stored_kv.mod_revision))
        .then(Op::put(key, encode(&record)));
    if let Some(guard) = guard {
        txn = txn.when(guard);
    }
    Some(txn)
}

/// Logs what the write of a grown count (to `count`) came to: written, lost its compare,
/// or failed.
pub fn grown(topic: &str, count: u32, written: Result<bool, crate::store::StoreError>) {
    match written {
        Ok(true) => {
            tracing::info!(topic, to = count, "topic grew in Kafka; its new partitions will be assigned")
        }
        Ok(false) => tracing::debug!(
            topic,
            "topic refresh raced a change (or leadership was lost); next refresh retries"
        ),
        Err(error) => tracing::warn!(%error, topic, "topic refresh: cannot store the new partition count"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    };

    use async_trait::async_trait;

    use super::{PartitionCounts, Topics};
    use crate::coordinator::CoordinatorError;
    use crate::coordinator::causes::TopicUnknown;
    use crate::coordinator::shared::records::{TopicRecord, decode};
    use crate::kafka::KafkaError;
    use crate::store::{Compare, LeaseStore, MemoryStore};

    /// Partition counts as a broker would answer them, without a broker.
    #[derive(Default)]
    struct Answers {
        counts: Mutex<std::collections::BTreeMap<String, Result<u32, &'static str>>>,
        asked: AtomicUsize,
    }

    impl Answers {
        fn set(&self, topic: &str, answer: Result<u32, &'static str>) {
            self.counts.lock().expect("lock").insert(topic.to_string(), answer);
        }
    }

    #[async_trait]
    impl PartitionCounts for Answers {
        async fn partition_count(&self, topic: &str) -> Result<u32, KafkaError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            match self.counts.lock().expect("lock").get(topic) {
                Some(Ok(count)) => Ok(*count),
                Some(Err(why)) => Err(KafkaError::Unavailable((*why).into())),
                None => Err(KafkaError::UnknownTopic(topic.into())),
            }
        }

        fn describe(&self) -> String {
            "the test's answers".into()
        }
    }

    async fn stored(store: &MemoryStore, key: &str) -> Option<u32> {
        let kv = store.get(key).await.expect("read")?;
        Some(decode::<TopicRecord>(key, &kv.value).expect("topic record").partition_count)
    }

    #[tokio::test]
    async fn configured_stored_asked_or_not_found() {
        let store = MemoryStore::new();
        let answers = Arc::new(Answers::default());
        answers.set("asked", Ok(6));
        answers.set("down", Err("no broker answers"));
        let topics = Topics {
            configured: [("configured".to_string(), 3)].into_iter().collect(),
            source: Some(answers.clone()),
        };
        assert_eq!(topics.ensure(&store, "/t/configured", "configured", None).await.expect("configured"), 3);
        assert_eq!(answers.asked.load(Ordering::SeqCst), 0, "a configured count needs no broker");
        assert_eq!(topics.ensure(&store, "/t/asked", "asked", None).await.expect("from the source"), 6);
        assert_eq!(stored(&store, "/t/asked").await, Some(6));
        assert_eq!(topics.ensure(&store, "/t/asked", "asked", None).await.expect("stored"), 6);
        assert_eq!(answers.asked.load(Ordering::SeqCst), 1, "a stored count is not asked again");
        let unknown = topics.ensure(&store, "/t/unknown", "unknown", None).await.expect_err("unknown");
        let not_in_kafka = matches!(&unknown,
            CoordinatorError::UnknownTopic(TopicUnknown::NotInKafka { topic, source: KafkaError::UnknownTopic(_), .. })
                if topic == "unknown");
        assert!(not_in_kafka, "{unknown}");
        let down = topics.ensure(&store, "/t/down", "down", None).await.expect_err("source down");
        assert!(matches!(&down, CoordinatorError::Kafka { topic, .. } if topic == "down"), "{down}");
        assert_eq!(stored(&store, "/t/down").await, None, "nothing stored when the source cannot answer");
        let nowhere = Topics::default().ensure(&store, "/t/x", "x", None).await.expect_err("no source");
        let not_configured = matches!(&nowhere, CoordinatorError::UnknownTopic(TopicUnknown::NotConfigured { topic }) if topic == "x");
        assert!(not_configured, "{nowhere}");
        // The message tells the operator how to configure it.
        assert!(nowhere.to_string().contains("--topic-partitions x="), "{nowhere}");
    }

    #[tokio::test]
    async fn growth_is_stored_shrinking_is_ignored_and_a_guard_applies() {
        let store = MemoryStore::new();
        let answers = Arc::new(Answers::default());
        let topics = Topics { configured: Default::default(), source: Some(answers.clone()) };
        answers.set("t", Ok(4));
        topics.ensure(&store, "/t/t", "t", None).await.expect("stored");
        answers.set("t", Ok(2));
        topics.grow(&store, vec![("t".into(), "/t/t".into(), 4)], None, || true).await;
        assert_eq!(stored(&store, "/t/t").await, Some(4), "Kafka cannot shrink a topic");
        answers.set("t", Ok(8));
        let deposed = Compare::CreateRevision("/t/leader".into(), 99);
        topics.grow(&store, vec![("t".into(), "/t/t".into(), 4)], Some(deposed), || true).await;
        assert_eq!(stored(&store, "/t/t").await, Some(4), "a failed guard writes nothing");
        topics.grow(&store, vec![("t".into(), "/t/t".into(), 4)], None, || true).await;
        assert_eq!(stored(&store, "/t/t").await, Some(8), "growth is stored");
    }
}
