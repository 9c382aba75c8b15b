//! Partition counts from Kafka: topic metadata through librdkafka (docs/design.md §3).
//!
//! [`KafkaMetadata`] holds one long-lived librdkafka client (a producer that never
//! produces: its polling thread serves librdkafka's log and error events). librdkafka's
//! calls block, so every metadata request runs on tokio's blocking pool, and is bounded
//! twice: by librdkafka's own timeout and by a tokio timeout over the whole call
//! (including the wait for one of a few concurrent-call permits). Whatever happens, the
//! answer is a count, [`KafkaError::UnknownTopic`], or [`KafkaError::Unavailable`] within
//! the timeout: never a hang, never a guess.

use std::{fmt, sync::Arc, time::Duration};

use rdkafka::{
    ClientConfig, ClientContext,
    config::RDKafkaLogLevel,
    error::{KafkaError as RdKafkaError, RDKafkaErrorCode},
    producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer},
};
use tokio::sync::Semaphore;

/// Default bound of one metadata request (`--kafka-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Metadata requests in flight at once; further callers wait (within their timeout).
const CONCURRENT_REQUESTS: usize = 4;

/// Why a partition count could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KafkaError {
    /// Kafka answered: the topic does not exist.
    #[error("topic '{0}' does not exist in Kafka")]
    UnknownTopic(String),
    /// No usable answer within the timeout (brokers down, unreachable, refusing us).
    #[error("Kafka is unavailable: {0}")]
    Unavailable(String),
    /// The client could not be created from the brokers and `--kafka-config`.
    #[error("Kafka client configuration: {0}")]
    Config(String),
}

/// Forwards librdkafka's log lines and errors to `tracing`.
struct TracingContext;

impl ClientContext for TracingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: RdKafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, reason, "Kafka client error");
    }
}

impl ProducerContext for TracingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

type Client = ThreadedProducer<TracingContext>;

/// Asks Kafka for topics' partition counts (see the module docs).
pub struct KafkaMetadata {
    /// `None` only while being dropped.
    client: Option<Arc<Client>>,
    brokers: String,
    timeout: Duration,
    permits: Semaphore,
}

impl fmt::Debug for KafkaMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaMetadata")
            .field("brokers", &self.brokers)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl KafkaMetadata {
    /// A client of `brokers` (`host:port`, at least one) with extra librdkafka settings
    /// `config` (SASL, TLS, ...: they override ours, except `allow.auto.create.topics`,
    /// always `false`), whose requests give up after `timeout`. Connects lazily: an
    /// unreachable cluster is not an error here.
    pub fn new(
        brokers: &[String],
        config: &[(String, String)],
        timeout: Duration,
    ) -> Result<Self, KafkaError> {
        let brokers =
            brokers.iter().map(|b| b.trim()).filter(|b| !b.is_empty()).collect::<Vec<_>>().join(",");
        if brokers.is_empty() {
            return Err(KafkaError::Config("no Kafka broker given".into()));
        }
        if timeout.is_zero() {
            return Err(KafkaError::Config("the metadata timeout must be greater than zero".into()));
        }
        let mut client_config = ClientConfig::new();
        client_config.set("bootstrap.servers", &brokers).set("client.id", "kafka-assigner");
        for (key, value) in config {
            client_config.set(key, value);
        }
        // Asking about a topic must never create it (a producer-type client, like this
        // one, would by default; the mock cluster then creates a 4-partition topic).
        client_config.set("allow.auto.create.topics", "false");
        let debug = config.iter().any(|(key, _)| key == "debug");
        client_config.set_log_level(if debug { RDKafkaLogLevel::Debug } else { RDKafkaLogLevel::Warning });
        let client: Client = client_config.create_with_context(TracingContext).map_err(|e| match e {
            RdKafkaError::ClientConfig(_, description, key, value) => {
                KafkaError::Config(format!("{key}={value}: {description}"))
            }
            other => KafkaError::Config(other.to_string()),
        })?;
        Ok(Self {
            client: Some(Arc::new(client)),
            brokers,
            timeout,
            permits: Semaphore::new(CONCURRENT_REQUESTS),
        })
    }

    /// The bootstrap brokers, comma-separated.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// How long one request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The topic's partition count, as Kafka says now (a fresh metadata request, not a
    /// cached answer). Answers within [`timeout`](Self::timeout), and never blocks the
    /// async runtime.
    pub async fn partition_count(&self, topic: &str) -> Result<u32, KafkaError> {
        let Some(client) = self.client.clone() else {
            return Err(KafkaError::Unavailable("the Kafka client is closed".into()));
        };
        let timeout = self.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let unavailable = || {
            KafkaError::Unavailable(format!(
                "no answer from Kafka ({}) about topic '{topic}' within {}",
                self.brokers,
                humantime::format_duration(timeout)
            ))
        };
        let _permit = tokio::time::timeout_at(deadline, self.permits.acquire())
            .await
            .map_err(|_| unavailable())?
            .map_err(|_| KafkaError::Unavailable("the Kafka client is closed".into()))?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let name = topic.to_string();
        let brokers = self.brokers.clone();
        let call = tokio::task::spawn_blocking(move || fetch_partition_count(&client, &brokers, &name, left));
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(join)) => Err(KafkaError::Unavailable(format!("the metadata request failed: {join}"))),
            Err(_) => Err(unavailable()),
        }
    }
}

/// One blocking metadata request for `topic`.
fn fetch_partition_count(
    client: &Client,
    brokers: &str,
    topic: &str,
    timeout: Duration,
) -> Result<u32, KafkaError> {
    let metadata = client.client().fetch_metadata(Some(topic), timeout).map_err(|error| {
        let why = match error {
            RdKafkaError::MetadataFetch(
                RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::BrokerTransportFailure,
            ) => {
                format!("no answer from Kafka ({brokers}) within {}", humantime::format_duration(timeout))
            }
            other => format!("metadata request to Kafka ({brokers}) failed: {other}"),
        };
        KafkaError::Unavailable(format!("topic '{topic}': {why}"))
    })?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err(KafkaError::Unavailable(format!(
            "Kafka's metadata answer does not mention topic '{topic}'"
        )));
    };
    let partitions = found.partitions().len();
    match found.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::InvalidTopic,
        ) => return Err(KafkaError::UnknownTopic(topic.to_string())),
        // The partitions are listed even while some have no leader: the count is known.
        Some(RDKafkaErrorCode::LeaderNotAvailable) if partitions > 0 => {}
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
            return Err(KafkaError::Unavailable(format!(
                "not authorized to describe topic '{topic}' (check the --kafka-config credentials)"
            )));
        }
        Some(code) => {
            return Err(KafkaError::Unavailable(format!("Kafka answered {code} for topic '{topic}'")));
        }
    }
    if partitions == 0 {
        return Err(KafkaError::Unavailable(format!(
            "topic '{topic}' has no partitions yet (being created?)"
        )));
    }
    u32::try_from(partitions)
        .map_err(|_| KafkaError::Unavailable(format!("topic '{topic}': {partitions} partitions")))
}

impl Drop for KafkaMetadata {
    /// Closing librdkafka blocks (threads are joined): done on the blocking pool when
    /// dropped inside a runtime.
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || drop(client));
            }
            Err(_) => drop(client),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_brokers_and_valid_settings() {
        let timeout = Duration::from_secs(1);
        assert!(matches!(KafkaMetadata::new(&[], &[], timeout), Err(KafkaError::Config(_))));
        assert!(matches!(KafkaMetadata::new(&[" ".into()], &[], timeout), Err(KafkaError::Config(_))));
        let bad = [("no.such.property".to_string(), "1".to_string())];
        let error = KafkaMetadata::new(&["127.0.0.1:9".into()], &bad, timeout).unwrap_err();
        assert!(error.to_string().contains("no.such.property"), "{error}");
        let client =
            KafkaMetadata::new(&["127.0.0.1:9".into(), "127.0.0.1:10".into()], &[], timeout).unwrap();
        assert_eq!(client.brokers(), "127.0.0.1:9,127.0.0.1:10");
        let create = |settings: &[(&str, &str)]| {
            let settings: Vec<(String, String)> =
                settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            KafkaMetadata::new(&["127.0.0.1:9".into()], &settings, timeout).map(|_| ())
        };
        let plain = [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ];
        assert_eq!(create(&plain), Ok(()));
        let tls = [("security.protocol", "SASL_SSL"), ("sasl.mechanism", "PLAIN"), ("sasl.username", "u")];
        let tls = create(&[tls.as_slice(), &[("sasl.password", "p")]].concat());
        if cfg!(feature = "kafka-tls") {
            assert_eq!(tls, Ok(()));
        } else {
            // Refused at start, explicitly: this build has no OpenSSL.
            let error = tls.unwrap_err().to_string();
            assert!(error.contains("SASL_SSL") && error.contains("OpenSSL"), "{error}");
        }
    }
}
