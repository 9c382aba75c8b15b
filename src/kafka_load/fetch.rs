//! The librdkafka side of learning weights (docs/design.md §11): one consumer-type client
//! that never subscribes, asked for three things per refresh, each a bounded number of
//! requests whatever the partition count:
//!
//! * partitions and leaders: one Metadata request per learned topic;
//! * latest offsets of every partition of every learned topic: one
//!   `offsets_for_times(latest)` call, which librdkafka sends as one ListOffsets request per
//!   leader broker (`fetch_watermarks` would be one request per partition);
//! * with a lag group: the group's committed offsets of all those partitions, one
//!   `committed_offsets` call, sent as one OffsetFetch to the group coordinator.
//!
//! Every call blocks (bounded by the request timeout): the caller runs [`Fetcher::fetch`]
//! on tokio's blocking pool. Nothing here trusts Kafka's answers to be complete: a missing
//! partition, offset or leader is a gap in the observation, never a panic.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use rdkafka::{
    ClientConfig, ClientContext, Offset, TopicPartitionList,
    config::RDKafkaLogLevel,
    consumer::{BaseConsumer, Consumer, ConsumerContext},
    error::{KafkaError as RdKafkaError, RDKafkaErrorCode},
};

use super::{
    KafkaLoadError,
    model::{PartitionObservation, TopicObservation},
};

/// How long each refresh serves librdkafka's queued events.
const SERVE_EVENTS: Duration = Duration::from_millis(10);

/// Requests sent so far by this client, by Kafka request type (`ListOffsets`, `Metadata`,
/// `OffsetFetch`, ...), summed over brokers: from librdkafka's statistics.
pub type RequestCounts = BTreeMap<String, u64>;

/// What one refresh saw: the time the offsets were read, and each topic's observation or
/// why it has none.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub at: Instant,
    pub topics: BTreeMap<String, Result<TopicObservation, String>>,
    /// Why the lag group's offsets are missing this time, if they are.
    pub lag_error: Option<String>,
}

/// Forwards librdkafka's logs and errors to `tracing` and keeps the last request counts.
struct LoadContext {
    /// Taken just before the client was created: `created + age` of a statistics report is
    /// never later than when librdkafka made it.
    created: Instant,
    /// The last report's counts, and when it was made.
    requests: Mutex<Option<(Instant, RequestCounts)>>,
}

/// The part of librdkafka's statistics JSON read here: with 10,000 partitions a report
/// is megabytes, and decoding all of it (`ClientContext::stats`) would cost far more.
#[derive(serde::Deserialize)]
struct RequestStatistics {
    /// Microseconds since the client was created.
    age: u64,
    brokers: HashMap<String, BrokerRequests>,
}

#[derive(serde::Deserialize)]
struct BrokerRequests {
    req: HashMap<String, i64>,
}

impl ClientContext for LoadContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: RdKafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, reason, "Kafka client error (weights)");
    }

    fn stats_raw(&self, statistics: &[u8]) {
        let report: RequestStatistics = match serde_json::from_slice(statistics) {
            Ok(report) => report,
            Err(error) => {
                tracing::debug!(%error, "librdkafka statistics not understood");
                return;
            }
        };
        let mut counts = RequestCounts::new();
        for broker in report.brokers.values() {
            for (kind, &sent) in &broker.req {
                if let Ok(sent) = u64::try_from(sent)
                    && sent > 0
                {
                    *counts.entry(kind.clone()).or_default() += sent;
                }
            }
        }
        let made = self.created + Duration::from_micros(report.age);
        if let Ok(mut last) = self.requests.lock() {
            *last = Some((made, counts));
        }
    }
}

impl ConsumerContext for LoadContext {}

/// The client (see the module docs).
pub(super) struct Fetcher {
    consumer: BaseConsumer<LoadContext>,
    lag_group: bool,
    timeout: Duration,
}

impl Fetcher {
    /// A client of `brokers` with the operator's librdkafka settings `config` (SASL, TLS:
    /// the same as the metadata client's), `group.id` = `lag_group` when set.
    pub fn new(
        brokers: &str,
        config: &[(String, String)],
        timeout: Duration,
        lag_group: Option<&str>,
        statistics_interval: Option<Duration>,
    ) -> Result<Self, KafkaLoadError> {
        let mut client_config = ClientConfig::new();
        client_config
            .set("bootstrap.servers", brokers)
            .set("client.id", "kafka-assigner-weights")
            // The high watermark, not the last stable offset: every produced message counts.
            .set("isolation.level", "read_uncommitted");
        for (key, value) in config {
            client_config.set(key, value);
        }
        // Never create a topic by asking about it; never commit as the lag group (we only
        // read its offsets; the client never subscribes, so it never joins the group).
        client_config.set("allow.auto.create.topics", "false").set("enable.auto.commit", "false");
        match lag_group {
            Some(group) => client_config.set("group.id", group),
            None => client_config.remove("group.id"),
        };
        if let Some(interval) = statistics_interval {
            let ms = interval.as_millis().max(1).to_string();
            client_config.set("statistics.interval.ms", ms);
        }
        let debug = config.iter().any(|(key, _)| key == "debug");
        client_config.set_log_level(if debug { RDKafkaLogLevel::Debug } else { RDKafkaLogLevel::Warning });
        let context = LoadContext { created: Instant::now(), requests: Mutex::new(None) };
        let consumer = client_config.create_with_context(context).map_err(|e| match e {
            RdKafkaError::ClientConfig(_, description, key, value) => {
                KafkaLoadError::Config(format!("{key}={value}: {description}"))
            }
            other => KafkaLoadError::Config(other.to_string()),
        })?;
        Ok(Self { consumer, lag_group: lag_group.is_some(), timeout })
    }

    /// One refresh of `topics` (blocking; see the module docs). `Err` when no offset at all
    /// could be read; per-topic failures are in the snapshot.
    pub fn fetch(&self, topics: &[String]) -> Result<Snapshot, KafkaLoadError> {
        let mut observed: BTreeMap<String, Result<TopicObservation, String>> = BTreeMap::new();
        let mut wanted = TopicPartitionList::new();
        for topic in topics {
            let partitions = if valid_topic_name(topic) {
                self.partitions(topic)
            } else {
                Err("not a valid Kafka topic name".to_string())
            };
            if let Ok(partitions) = &partitions {
                for &partition in partitions.keys() {
                    let Ok(partition) = i32::try_from(partition) else { continue };
                    // Set on the element: `add_partition_offset` searches the whole list
                    // for it, quadratic at 10,000 partitions.
                    wanted
                        .add_partition(topic, partition)
                        .set_offset(Offset::End)
                        .map_err(|e| KafkaLoadError::Unavailable(format!("offset list: {e}")))?;
                }
            }
            observed.insert(topic.clone(), partitions);
        }
        self.serve_events();
        if wanted.count() == 0 {
            return Ok(Snapshot { at: Instant::now(), topics: observed, lag_error: None });
        }
        let latest = self
            .consumer
            .offsets_for_times(wanted.clone(), self.timeout)
            .map_err(|e| KafkaLoadError::Unavailable(format!("latest offsets: {e}")))?;
        let at = Instant::now();
        for element in latest.elements() {
            if let (Ok(()), Offset::Offset(end)) = (element.error(), element.offset()) {
                set(&mut observed, element.topic(), element.partition(), |p| p.end_offset = Some(end));
            }
        }
        let mut lag_error = None;
        if self.lag_group {
            let mut unset = wanted;
            if let Err(e) = unset.set_all_offsets(Offset::Invalid) {
                lag_error = Some(e.to_string());
            } else {
                match self.consumer.committed_offsets(unset, self.timeout) {
                    Ok(committed) => {
                        for element in committed.elements() {
                            if let (Ok(()), Offset::Offset(offset)) = (element.error(), element.offset()) {
                                set(&mut observed, element.topic(), element.partition(), |p| {
                                    p.committed = Some(offset);
                                });
                            }
                        }
                    }
                    Err(e) => lag_error = Some(format!("committed offsets: {e}")),
                }
            }
        }
        self.serve_events();
        Ok(Snapshot { at, topics: observed, lag_error })
    }

    /// `topic`'s partitions and their leaders (one Metadata request).
    fn partitions(&self, topic: &str) -> Result<TopicObservation, String> {
        let metadata = self.consumer.fetch_metadata(Some(topic), self.timeout).map_err(|e| e.to_string())?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err("not in Kafka's metadata answer".into());
        };
        match found.error().map(RDKafkaErrorCode::from) {
            None | Some(RDKafkaErrorCode::LeaderNotAvailable) => {}
            Some(code) => return Err(code.to_string()),
        }
        let mut partitions = TopicObservation::new();
        for partition in found.partitions() {
            let Ok(id) = u32::try_from(partition.id()) else { continue };
            let leader = (partition.leader() >= 0).then_some(partition.leader());
            partitions.insert(id, PartitionObservation { leader, ..Default::default() });
        }
        if partitions.is_empty() {
            return Err("no partitions".into());
        }
        Ok(partitions)
    }

    /// Serves queued librdkafka events (statistics, errors): this client is only polled
    /// here. `poll` serves events until its timeout, so a backlog is served within a bound.
    fn serve_events(&self) {
        let _ = self.consumer.poll(SERVE_EVENTS);
    }

    /// Request counts from a statistics report made after this call began, waiting up to
    /// `wait` for one; `None` without statistics or when none came in time.
    pub fn requests_sent(&self, wait: Duration) -> Option<RequestCounts> {
        let asked = Instant::now();
        let deadline = asked + wait;
        loop {
            if let Ok(last) = self.consumer.context().requests.lock()
                && let Some((made, counts)) = last.as_ref()
                && *made >= asked
            {
                return Some(counts.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            // Serves queued events (older reports first) until a report or the timeout.
            let _ = self.consumer.poll(left.min(Duration::from_millis(50)));
        }
    }
}

/// Kafka's rule for topic names (1 to 249 of `[a-zA-Z0-9._-]`); librdkafka's client
/// panics on a name with a NUL byte, and the names come from consumers.
fn valid_topic_name(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Applies `change` to the observation of `topic`'s `partition`, if it was listed.
fn set(
    observed: &mut BTreeMap<String, Result<TopicObservation, String>>,
    topic: &str,
    partition: i32,
    change: impl FnOnce(&mut PartitionObservation),
) {
    let Ok(partition) = u32::try_from(partition) else { return };
    if let Some(Ok(partitions)) = observed.get_mut(topic)
        && let Some(seen) = partitions.get_mut(&partition)
    {
        change(seen);
    }
}
