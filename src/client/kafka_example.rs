//! The example consumer (`examples/consumer.rs`), as a library so tests run it too: a
//! real Kafka consumer whose partitions come from the assigner, not from Kafka's
//! consumer-group rebalancing.
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

use super::{Handler, Partition, WarmError};

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

/// Flags of `examples/consumer.rs` (each also `KAFKA_ASSIGNER_<FLAG>` in the environment);
/// here so tests (and `docker-compose.yml`'s check) parse them with the same parser.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "consumer", about = "Example Kafka consumer driven by kafka-assigner")]
pub struct ConsumerArgs {
    /// Assigner gRPC endpoints, comma-separated.
    #[arg(long, env = "KAFKA_ASSIGNER_ENDPOINTS", value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// This consumer's name (stable across restarts); default: host name and pid.
    #[arg(long, env = "KAFKA_ASSIGNER_CONSUMER_NAME")]
    pub consumer_name: Option<String>,
    /// The topic to consume.
    #[arg(long, env = "KAFKA_ASSIGNER_TOPIC")]
    pub topic: String,
    /// Touch no broker: only log what the assigner says (warm, assigned, release,
    /// unassigned), for a stack with no Kafka (`docker-compose.local.yml`).
    #[arg(long, env = "KAFKA_ASSIGNER_LOG_ONLY", conflicts_with = "kafka_brokers")]
    pub log_only: bool,
    /// Kafka bootstrap brokers (`host:port,...`); needed unless `--log-only`.
    #[arg(long, env = "KAFKA_ASSIGNER_KAFKA_BROKERS", required_unless_present = "log_only")]
    pub kafka_brokers: Option<String>,
    /// Kafka group id for offset commits (no group rebalancing is used).
    #[arg(long, env = "KAFKA_ASSIGNER_GROUP_ID", default_value = "kafka-assigner-example")]
    pub group_id: String,
    /// The assigner's `--lease-ttl`: the client-side lease is set a margin below it.
    #[arg(long, env = "KAFKA_ASSIGNER_LEASE_TTL", value_parser = crate::duration::parse_duration, default_value = "10s")]
    pub lease_ttl: Duration,
}

/// Called for every message processed: partition, offset, payload.
pub type OnMessage = Arc<dyn Fn(i32, i64, &[u8]) + Send + Sync>;

/// Partitions being processed and the next offset of each.
#[derive(Default)]
struct Owned {
    next: BTreeMap<i32, Option<i64>>,
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

    /// The group's committed offset of `partition` (`None`: nothing committed yet).
    fn committed(&self, partition: i32) -> Result<Option<i64>, ExampleError> {
        let tpl = self.consumer.committed_offsets(self.tpl(partition, None)?, self.settings.timeout)?;
        let offset = tpl.find_partition(&self.settings.topic, partition).map(|e| e.offset());
        Ok(match offset {
            Some(Offset::Offset(o)) if o >= 0 => Some(o),
            _ => None,
        })
    }

    fn warm_blocking(&self, partition: i32) -> Result<u64, ExampleError> {
        let start = self.committed(partition)?;
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

    fn assign_blocking(&self, partition: i32) -> Result<(), ExampleError> {
        let start = self.committed(partition)?;
        let offset = start.map_or(Offset::Beginning, Offset::Offset);
        let mut owned = lock(&self.owned);
        owned.next.insert(partition, start);
        self.consumer.incremental_assign(&self.tpl(partition, Some(offset))?)?;
        tracing::info!(partition, ?start, owned = ?owned.next.keys().collect::<Vec<_>>(), "processing");
        Ok(())
    }

    /// Stops processing `partition` and commits its next offset (under the lock the poller
    /// processes under: nothing is processed after the commit).
    fn stop_blocking(&self, partition: i32) -> Result<(), ExampleError> {
        let mut owned = lock(&self.owned);
        let Some(next) = owned.next.remove(&partition) else { return Ok(()) };
        if let Some(next) = next {
            self.consumer.commit(&self.tpl(partition, Some(Offset::Offset(next)))?, CommitMode::Sync)?;
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
        let Some(next) = owned.next.get_mut(&partition) else { continue };
        if next.is_some_and(|n| offset < n) {
            continue;
        }
        on_message(partition, offset, message.payload().unwrap_or_default());
        let mut tpl = TopicPartitionList::new();
        let committed = tpl
            .add_partition_offset(topic, partition, Offset::Offset(offset + 1))
            .and_then(|()| consumer.commit(&tpl, CommitMode::Sync));
        if let Err(error) = committed {
            tracing::warn!(%error, partition, offset, "commit failed; committed again on release");
        }
        *next = Some(offset + 1);
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
        let partition = p.partition as i32;
        if let Err(error) = self.blocking(move |h| h.assign_blocking(partition)).await {
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
