//! Partition weights learned from Kafka (docs/design.md §11): a [`WeightSource`] that
//! reads each learned topic's latest offsets (and, with a lag group, the group's committed
//! offsets) every refresh, and answers from what it learned last.
//!
//! * [`rates`] — pure: the EWMA produce-rate estimator and the weight formula.
//! * [`model`] — pure: one topic's partitions (rates, lag, leaders) → weights and zones.
//! * `fetch` — the librdkafka client: a bounded number of requests per refresh.
//!
//! **Defaults and why.** Refresh every 10 s: ListOffsets is cheap (one request per leader
//! broker) and 10 s resolves a rate change well within the window. Window (EWMA time
//! constant) 60 s: a burst of a few seconds moves a weight by a few percent, a sustained
//! change is followed within a few minutes — placement moves partitions, so it should react
//! to load that lasts, not to noise. Lag horizon 60 s: a partition 60,000 messages behind
//! weighs as much as one taking 1,000 messages per second more.
//!
//! **Learning starts on demand.** [`WeightSource::weights`] registers the topic and wakes
//! the refresh task; the first refresh gives a baseline, the next one a rate, so a topic's
//! weights are `None` for about one refresh interval. A failed refresh is logged and
//! counted ([`LoadStats`]), and the last good weights stay.
//!
//! **Zones.** librdkafka's metadata (rdkafka 0.39 `MetadataBroker`: id, host, port) carries
//! no broker rack, so the racks come from the operator ([`KafkaLoadSettings::broker_racks`]);
//! a partition's zone is its leader's rack.

mod fetch;
pub mod model;
pub mod rates;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use fetch::Fetcher;
pub use fetch::RequestCounts;
use model::TopicModel;

use crate::weights::WeightSource;

/// Default refresh interval (the default of `--weights-refresh`, shared with the leader).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);
/// Default EWMA time constant of the produce rate (`--weights-window`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// Default time within which a backlog should be drained (`--lag-horizon`).
pub const DEFAULT_LAG_HORIZON: Duration = Duration::from_secs(60);

/// Why the source could not be created or a refresh failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KafkaLoadError {
    /// The client could not be created from the brokers and librdkafka settings.
    #[error("Kafka client configuration (weights): {0}")]
    Config(String),
    /// Kafka gave no usable answer.
    #[error("Kafka is unavailable (weights): {0}")]
    Unavailable(String),
}

/// How weights are learned (see the module docs for the defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaLoadSettings {
    /// Time between refreshes.
    pub refresh: Duration,
    /// EWMA time constant of the produce rate.
    pub window: Duration,
    /// The consumer group whose committed offsets give the lag; `None`: rate only.
    pub lag_group: Option<String>,
    /// A backlog weighs as the rate that drains it in this time.
    pub lag_horizon: Duration,
    /// Broker id → rack (zone), since Kafka's metadata through librdkafka has no rack.
    pub broker_racks: BTreeMap<i32, String>,
    /// librdkafka `statistics.interval.ms`: enables [`KafkaLoad::requests_sent`].
    pub statistics_interval: Option<Duration>,
}

impl Default for KafkaLoadSettings {
    fn default() -> Self {
        Self {
            refresh: DEFAULT_REFRESH,
            window: DEFAULT_WINDOW,
            lag_group: None,
            lag_horizon: DEFAULT_LAG_HORIZON,
            broker_racks: BTreeMap::new(),
            statistics_interval: None,
        }
    }
}

/// Counters of the refresh task, for logs, metrics and `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Refreshes that read offsets.
    pub refreshes: u64,
    /// Failed refreshes, plus topics a refresh could not read (unknown topic, ...), plus
    /// failed reads of the lag group's offsets.
    pub errors: u64,
    /// Topics being learned.
    pub topics: usize,
}

/// Partition weights learned from Kafka (see the module docs).
pub struct KafkaLoad {
    /// `None` only while being dropped.
    fetcher: Option<Arc<Fetcher>>,
    brokers: String,
    settings: KafkaLoadSettings,
    topics: Mutex<BTreeMap<String, TopicModel>>,
    wake: Notify,
    refreshes: AtomicU64,
    errors: AtomicU64,
}

impl std::fmt::Debug for KafkaLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLoad").field("brokers", &self.brokers).field("settings", &self.settings).finish()
    }
}

impl KafkaLoad {
    /// A source reading `brokers` (`host:port`, at least one) with the operator's extra
    /// librdkafka settings `config` (the `--kafka-config` ones: SASL, TLS), each request
    /// bounded by `timeout`. Connects lazily; learns nothing until [`spawn`](Self::spawn)ed
    /// (or [`refresh`](Self::refresh)ed).
    pub fn new(
        brokers: &[String],
        config: &[(String, String)],
        timeout: Duration,
        settings: KafkaLoadSettings,
    ) -> Result<Self, KafkaLoadError> {
        let brokers =
            brokers.iter().map(|b| b.trim()).filter(|b| !b.is_empty()).collect::<Vec<_>>().join(",");
        if brokers.is_empty() {
            return Err(KafkaLoadError::Config("no Kafka broker given".into()));
        }
        if timeout.is_zero() || settings.refresh.is_zero() {
            return Err(KafkaLoadError::Config("the timeout and refresh interval must be > 0".into()));
        }
        let fetcher = Fetcher::new(
            &brokers,
            config,
            timeout,
            settings.lag_group.as_deref(),
            settings.statistics_interval,
        )?;
        Ok(Self {
            fetcher: Some(Arc::new(fetcher)),
            brokers,
            settings,
            topics: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            refreshes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    /// Starts the refresh task: a refresh every [`KafkaLoadSettings::refresh`], and one at
    /// once when a new topic is asked for. Ends when `stop` is cancelled (a refresh in
    /// flight is abandoned; its blocking call ends within the request timeout).
    pub fn spawn(self: &Arc<Self>, stop: CancellationToken) -> JoinHandle<()> {
        let source = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(source.settings.refresh);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = ticks.tick() => {}
                    () = source.wake.notified() => ticks.reset(),
                }
                if source.lock().is_empty() {
                    continue;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    result = source.refresh() => if let Err(error) = result {
                        tracing::warn!(%error, "partition weights not refreshed; the last ones stay");
                    },
                }
            }
        })
    }

    /// One refresh of every learned topic now (the task calls it; tests may too).
    pub async fn refresh(&self) -> Result<(), KafkaLoadError> {
        let Some(fetcher) = self.fetcher.clone() else {
            return Err(KafkaLoadError::Unavailable("the Kafka client is closed".into()));
        };
        let topics: Vec<String> = self.lock().keys().cloned().collect();
        let fetched = tokio::task::spawn_blocking(move || fetcher.fetch(&topics))
            .await
            .map_err(|e| KafkaLoadError::Unavailable(format!("the refresh failed: {e}")))
            .and_then(|fetched| fetched);
        let snapshot = match fetched {
            Ok(snapshot) => snapshot,
            Err(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                return Err(error);
            }
        };
        if let Some(error) = &snapshot.lag_error {
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = ?self.settings.lag_group, %error, "lag not read; weights from rates only");
        }
        let mut topics = self.lock();
        for (topic, observed) in &snapshot.topics {
            match observed {
                Ok(observed) => {
                    if let Some(model) = topics.get_mut(topic) {
                        model.observe(snapshot.at, observed, self.settings.window);
                    }
                }
                Err(error) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(topic, %error, "partition weights: topic not read; its last weights stay");
                }
            }
        }
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The refresh counters.
    pub fn stats(&self) -> LoadStats {
        LoadStats {
            refreshes: self.refreshes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            topics: self.lock().len(),
        }
    }

    /// Requests this source's client has sent so far, by type, from a librdkafka
    /// statistics report made after the call (waiting up to `wait`); `None` unless
    /// [`KafkaLoadSettings::statistics_interval`] is set, or when no report came in time.
    pub async fn requests_sent(&self, wait: Duration) -> Option<RequestCounts> {
        let fetcher = self.fetcher.clone()?;
        tokio::task::spawn_blocking(move || fetcher.requests_sent(wait)).await.ok().flatten()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, TopicModel>> {
        // The models stay consistent at every await-free step: a panic elsewhere while
        // holding the lock leaves nothing half-written worth refusing.
        self.topics.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `topic`'s model; a topic not learned yet is registered (and the task woken), and
    /// answers `None`.
    fn learned<T>(&self, topic: &str, answer: impl FnOnce(&TopicModel) -> Option<T>) -> Option<T> {
        let mut topics = self.lock();
        if let Some(model) = topics.get(topic) {
            return answer(model);
        }
        topics.insert(topic.to_string(), TopicModel::default());
        drop(topics);
        tracing::debug!(topic, "partition weights: learning a new topic");
        self.wake.notify_one();
        None
    }
}

impl WeightSource for KafkaLoad {
    fn weights(&self, topic: &str) -> Option<BTreeMap<u32, u64>> {
        self.learned(topic, |model| model.weights(self.settings.lag_horizon))
    }

    fn zones(&self, topic: &str) -> Option<BTreeMap<u32, String>> {
        self.learned(topic, |model| model.zones(&self.settings.broker_racks))
    }

    fn describe(&self) -> String {
        match &self.settings.lag_group {
            Some(group) => format!("Kafka at {} (produce rate, lag of group '{group}')", self.brokers),
            None => format!("Kafka at {} (produce rate)", self.brokers),
        }
    }
}

/// A [`KafkaLoad`] with its refresh task running for as long as this value lives: what the
/// server hands the coordinator, so dropping the coordinator's weights stops the task.
pub struct Learning {
    load: Arc<KafkaLoad>,
    _stop: tokio_util::sync::DropGuard,
}

impl Learning {
    /// Spawns `load`'s refresh task (inside a runtime) and keeps it running while the
    /// returned value lives.
    pub fn start(load: KafkaLoad) -> Self {
        let load = Arc::new(load);
        let stop = CancellationToken::new();
        load.spawn(stop.clone());
        Self { load, _stop: stop.drop_guard() }
    }

    /// The source, for its counters.
    pub fn load(&self) -> &Arc<KafkaLoad> {
        &self.load
    }
}

impl WeightSource for Learning {
    fn weights(&self, topic: &str) -> Option<BTreeMap<u32, u64>> {
        self.load.weights(topic)
    }

    fn zones(&self, topic: &str) -> Option<BTreeMap<u32, String>> {
        self.load.zones(topic)
    }

    fn describe(&self) -> String {
        self.load.describe()
    }
}

impl Drop for KafkaLoad {
    /// Closing librdkafka blocks (threads are joined): done on the blocking pool when
    /// dropped inside a runtime.
    fn drop(&mut self) {
        let Some(fetcher) = self.fetcher.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || drop(fetcher));
            }
            Err(_) => drop(fetcher),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(settings: KafkaLoadSettings) -> Result<KafkaLoad, KafkaLoadError> {
        // Port 9: nothing listens; the client connects lazily.
        KafkaLoad::new(&["127.0.0.1:9".into()], &[], Duration::from_millis(200), settings)
    }

    #[tokio::test]
    async fn needs_brokers_and_valid_settings() {
        let timeout = Duration::from_secs(1);
        let settings = KafkaLoadSettings::default();
        assert!(matches!(
            KafkaLoad::new(&[], &[], timeout, settings.clone()),
            Err(KafkaLoadError::Config(_))
        ));
        let zero = KafkaLoadSettings { refresh: Duration::ZERO, ..settings.clone() };
        assert!(matches!(closed(zero), Err(KafkaLoadError::Config(_))));
        let bad = [("no.such.property".to_string(), "1".to_string())];
        let error = KafkaLoad::new(&["127.0.0.1:9".into()], &bad, timeout, settings).unwrap_err();
        assert!(error.to_string().contains("no.such.property"), "{error}");
    }

    #[tokio::test]
    async fn asking_registers_the_topic_and_answers_none() {
        let source = closed(KafkaLoadSettings::default()).unwrap();
        assert_eq!(source.stats().topics, 0);
        assert_eq!(source.weights("orders"), None);
        assert_eq!(source.zones("events"), None);
        assert_eq!(source.weights("orders"), None);
        assert_eq!(source.stats(), LoadStats { refreshes: 0, errors: 0, topics: 2 });
        assert_eq!(source.describe(), "Kafka at 127.0.0.1:9 (produce rate)");
        let grouped = KafkaLoadSettings { lag_group: Some("g".into()), ..KafkaLoadSettings::default() };
        assert!(closed(grouped).unwrap().describe().contains("lag of group 'g'"));
    }

    #[tokio::test]
    async fn a_name_kafka_would_refuse_is_an_error_not_a_panic() {
        let source = closed(KafkaLoadSettings::default()).unwrap();
        assert_eq!(source.weights("bad\0name"), None);
        assert_eq!(source.weights(&"x".repeat(250)), None);
        // Neither reaches librdkafka: the refresh succeeds with both counted as errors.
        source.refresh().await.unwrap();
        assert_eq!(source.stats(), LoadStats { refreshes: 1, errors: 2, topics: 2 });
        assert_eq!(source.weights("bad\0name"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_stops_when_cancelled() {
        let source = Arc::new(closed(KafkaLoadSettings::default()).unwrap());
        let stop = CancellationToken::new();
        let task = source.spawn(stop.clone());
        tokio::time::sleep(DEFAULT_REFRESH * 3).await;
        assert_eq!(source.stats().refreshes, 0, "nothing to learn, nothing asked");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(1), task).await.unwrap().unwrap();
    }
}
