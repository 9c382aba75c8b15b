//! The example consumer (the repository's `examples/consumer.rs`, cargo feature
//! `kafka-example`), as a library so tests run it too: a real Kafka consumer whose
//! partitions come from the assigner, not from Kafka's consumer-group rebalancing.
//!
//! * `assigned(p)`: `incremental_assign(p)` from the group's committed offset (or the
//!   beginning).
//! * `warm(p)`: read `p` from the committed offset up to the end offset (high watermark)
//!   with a separate, non-committing consumer: in a real service this builds the state.
//! * `release(p)` / `unassigned(p)`: stop processing `p`, commit the next offset, then
//!   `incremental_unassign(p)`; the client acknowledges the release only after that.
//! * One thread polls the consumer; a message is handed to the callback and its offset
//!   committed (synchronously) under one lock with the owned set, so a release never
//!   commits a position the callback has not seen, and a killed consumer leaves at most
//!   the message it was processing uncommitted.
//! * Epochs (docs/design.md §10): every offset commit carries the partition's epoch in its
//!   metadata (`epoch=<n>`), and `assigned(p)` refuses to resume from a commit whose epoch
//!   is above its own: a newer owner has committed, so this ownership is already superseded
//!   (it logs an error and leaves `p` alone). Kafka does not check the metadata on commit,
//!   so a superseded owner can still commit once more; the check on resume keeps a stale
//!   owner that comes back from starting over someone else's progress. A commit without
//!   the metadata (from before epochs) counts as epoch 0, and so does a partition handed
//!   out by an assigner without epochs: 0 resumes from 0 only, as with [`Fence`](crate::Fence).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use rdkafka::{
    ClientConfig as KafkaClientConfig, Message, Offset, TopicPartitionList,
    consumer::{BaseConsumer, CommitMode, Consumer},
};

use crate::{Handler, Partition, WarmError};

mod run;
pub use run::{ConsumerArgs, run};

/// Errors of the example consumer.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// librdkafka refused the configuration or a call failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A warm did not reach the end offset in time.
    #[error("warming partition {partition} did not reach offset {end} within {timeout:?}")]
    WarmTimeout {
        /// The partition.
        partition: i32,
        /// The end offset when the warm began.
        end: i64,
        /// The bound.
        timeout: Duration,
    },
    /// The group's committed offset carries a greater epoch than this consumer's ownership:
    /// a newer owner committed, this ownership is superseded.
    #[error(
        "partition {partition}: the committed offset is from epoch {committed}, above ours ({ours}): \
         a newer owner has committed; not resuming"
    )]
    NewerOwner {
        /// The partition.
        partition: i32,
        /// The epoch in the committed offset's metadata.
        committed: u64,
        /// The epoch of this consumer's ownership.
        ours: u64,
    },
    /// A blocking task could not run.
    #[error("task: {0}")]
    Task(String),
}

/// What the example consumer connects to.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// Bootstrap brokers (`host:port,...`).
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// Kafka group id, used for offset commits only (no group rebalancing).
    pub group_id: String,
    /// Bound of one metadata / offset request, and of a warm.
    pub timeout: Duration,
}

/// Called for every message processed: partition, offset, payload.
pub type OnMessage = Arc<dyn Fn(i32, i64, &[u8]) + Send + Sync>;

/// Partitions being processed: the next offset of each, and the epoch it is owned with.
#[derive(Default)]
struct Owned {
    next: BTreeMap<i32, Held>,
}

/// One partition being processed.
struct Held {
    /// The next offset (`None`: from the beginning, nothing processed yet).
    next: Option<i64>,
    /// The epoch of the ownership, written into every commit.
    epoch: u64,
}

/// The metadata of an offset commit made with `epoch`.
pub fn commit_metadata(epoch: u64) -> String {
    format!("epoch={epoch}")
}

/// The epoch in an offset commit's metadata ([`commit_metadata`]); `0` for a commit without
/// one (empty metadata, or anything else: from before epochs, or from another tool).
pub fn epoch_of_metadata(metadata: &str) -> u64 {
    metadata.trim().strip_prefix("epoch=").and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// `offset` of `topic`/`partition`, committed with `epoch` in the metadata.
fn commit_list(
    topic: &str,
    partition: i32,
    offset: i64,
    epoch: u64,
) -> Result<TopicPartitionList, ExampleError> {
    let mut tpl = TopicPartitionList::new();
    {
        let mut element = tpl.add_partition(topic, partition);
        element.set_offset(Offset::Offset(offset))?;
        element.set_metadata(commit_metadata(epoch));
    }
    Ok(tpl)
}

/// The example consumer's [`Handler`] (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct KafkaHandler {
    inner: Arc<Inner>,
}

struct Inner {
    settings: KafkaSettings,
    consumer: Arc<BaseConsumer>,
    owned: Arc<Mutex<Owned>>,
    stop: Arc<AtomicBool>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

fn lock(owned: &Mutex<Owned>) -> MutexGuard<'_, Owned> {
    owned.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn consumer_config(settings: &KafkaSettings, group: &str) -> KafkaClientConfig {
    let mut config = KafkaClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    config
}

impl KafkaHandler {
    /// Creates the consumer and starts its polling thread; `on_message` sees every
    /// message of an owned partition.
    pub fn start(settings: KafkaSettings, on_message: OnMessage) -> Result<Self, ExampleError> {
        let consumer: Arc<BaseConsumer> = Arc::new(consumer_config(&settings, &settings.group_id).create()?);
        let owned = Arc::new(Mutex::new(Owned::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (consumer, owned, stop, topic) =
                (consumer.clone(), owned.clone(), stop.clone(), settings.topic.clone());
            std::thread::spawn(move || poll_loop(&consumer, &topic, &owned, &stop, &on_message))
        };
        let inner = Inner { settings, consumer, owned, stop, poller: Mutex::new(Some(poller)) };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Partitions being processed.
    pub fn owned(&self) -> BTreeSet<i32> {
        lock(&self.inner.owned).next.keys().copied().collect()
    }

    /// Stops processing at once, committing nothing more (what a killed process does).
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let poller = self.inner.poller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(poller) = poller {
            let _ = poller.join();
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, ExampleError> + Send + 'static,
    ) -> Result<T, ExampleError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner)).await.map_err(|e| ExampleError::Task(e.to_string()))?
    }
}

impl Inner {
    fn tpl(&self, partition: i32, offset: Option<Offset>) -> Result<TopicPartitionList, ExampleError> {
        let mut tpl = TopicPartitionList::new();
        match offset {
            Some(offset) => tpl.add_partition_offset(&self.settings.topic, partition, offset)?,
            None => {
                tpl.add_partition(&self.settings.topic, partition);
            }
        }
        Ok(tpl)
    }

    /// The group's committed offset of `partition` and the epoch it was committed with
    /// (`None`: nothing committed yet).
    fn committed(&self, partition: i32) -> Result<Option<(i64, u64)>, ExampleError> {
        let tpl = self.consumer.committed_offsets(self.tpl(partition, None)?, self.settings.timeout)?;
        let element = tpl.find_partition(&self.settings.topic, partition);
        Ok(element.and_then(|e| match e.offset() {
            Offset::Offset(o) if o >= 0 => Some((o, epoch_of_metadata(e.metadata()))),
            _ => None,
        }))
    }

    fn warm_blocking(&self, partition: i32) -> Result<u64, ExampleError> {
        let start = self.committed(partition)?.map(|(offset, _)| offset);
        let (low, end) =
            self.consumer.fetch_watermarks(&self.settings.topic, partition, self.settings.timeout)?;
        let start = start.unwrap_or(low);
        if start >= end {
            return Ok(0);
        }
        // A separate consumer that never commits: warming must not move the group's offsets.
        let reader: BaseConsumer =
            consumer_config(&self.settings, &format!("{}-warm", self.settings.group_id)).create()?;
        reader.assign(&self.tpl(partition, Some(Offset::Offset(start)))?)?;
        let give_up = Instant::now() + self.settings.timeout;
        let mut read = 0u64;
        let mut position = start;
        while position < end {
            if Instant::now() >= give_up {
                return Err(ExampleError::WarmTimeout { partition, end, timeout: self.settings.timeout });
            }
            if let Some(Ok(message)) = reader.poll(Duration::from_millis(100)) {
                position = message.offset() + 1;
                read += 1;
            }
        }
        Ok(read)
    }

    fn assign_blocking(&self, partition: i32, epoch: u64) -> Result<(), ExampleError> {
        let committed = self.committed(partition)?;
        if let Some((_, committed)) = committed
            && committed > epoch
        {
            return Err(ExampleError::NewerOwner { partition, committed, ours: epoch });
        }
        let start = committed.map(|(offset, _)| offset);
        let offset = start.map_or(Offset::Beginning, Offset::Offset);
        let mut owned = lock(&self.owned);
        owned.next.insert(partition, Held { next: start, epoch });
        self.consumer.incremental_assign(&self.tpl(partition, Some(offset))?)?;
        tracing::info!(partition, epoch, ?start, owned = ?owned.next.keys().collect::<Vec<_>>(), "processing");
        Ok(())
    }

    /// Stops processing `partition` and commits its next offset (under the lock the poller
    /// processes under: nothing is processed after the commit).
    fn stop_blocking(&self, partition: i32) -> Result<(), ExampleError> {
        let mut owned = lock(&self.owned);
        let Some(held) = owned.next.remove(&partition) else { return Ok(()) };
        let next = held.next;
        if let Some(next) = next {
            let commit = commit_list(&self.settings.topic, partition, next, held.epoch)?;
            self.consumer.commit(&commit, CommitMode::Sync)?;
        }
        self.consumer.incremental_unassign(&self.tpl(partition, None)?)?;
        tracing::info!(partition, ?next, owned = ?owned.next.keys().collect::<Vec<_>>(), "stopped");
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn poll_loop(
    consumer: &BaseConsumer,
    topic: &str,
    owned: &Mutex<Owned>,
    stop: &AtomicBool,
    on_message: &OnMessage,
) {
    while !stop.load(Ordering::SeqCst) {
        let message = match consumer.poll(Duration::from_millis(50)) {
            None => continue,
            Some(Err(error)) => {
                tracing::warn!(%error, "kafka poll");
                continue;
            }
            Some(Ok(message)) => message,
        };
        let (partition, offset) = (message.partition(), message.offset());
        let mut owned = lock(owned);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Not ours (any more), or older than where we (re)started: skip.
        let Some(held) = owned.next.get_mut(&partition) else { continue };
        if held.next.is_some_and(|n| offset < n) {
            continue;
        }
        on_message(partition, offset, message.payload().unwrap_or_default());
        let committed = commit_list(topic, partition, offset + 1, held.epoch)
            .and_then(|tpl| consumer.commit(&tpl, CommitMode::Sync).map_err(ExampleError::from));
        if let Err(error) = committed {
            tracing::warn!(%error, partition, offset, "commit failed; committed again on release");
        }
        held.next = Some(offset + 1);
    }
}

#[async_trait]
impl Handler for KafkaHandler {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        let partition = p.partition as i32;
        let read = self.blocking(move |h| h.warm_blocking(partition)).await?;
        tracing::info!(%p, read, "warmed: read up to the end offset");
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        let (partition, epoch) = (p.partition as i32, p.epoch);
        if let Err(error) = self.blocking(move |h| h.assign_blocking(partition, epoch)).await {
            tracing::error!(%p, %error, "cannot start processing");
        }
    }

    async fn release(&self, p: Partition) {
        let partition = p.partition as i32;
        if let Err(error) = self.blocking(move |h| h.stop_blocking(partition)).await {
            tracing::error!(%p, %error, "release: commit or unassign failed");
        }
    }

    async fn unassigned(&self, p: Partition) {
        self.release(p).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_rides_in_the_commit_metadata() {
        assert_eq!(commit_metadata(42), "epoch=42");
        assert_eq!(epoch_of_metadata(&commit_metadata(42)), 42);
        assert_eq!(epoch_of_metadata(&commit_metadata(u64::MAX)), u64::MAX);
        for other in ["", "epoch=", "epoch=x", "something else", "epoch=-1"] {
            assert_eq!(epoch_of_metadata(other), 0, "{other:?}");
        }
        let tpl = commit_list("orders", 3, 17, 9).expect("list");
        let element = tpl.find_partition("orders", 3).expect("element");
        assert_eq!((element.offset(), element.metadata()), (Offset::Offset(17), "epoch=9"));
    }
}
