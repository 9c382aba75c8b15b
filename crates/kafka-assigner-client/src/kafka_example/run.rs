//! The example consumer's `main`: flags, the handler and the client, until SIGTERM.

use std::{process::ExitCode, sync::Arc, time::Duration};

use super::{ExampleError, KafkaHandler, KafkaSettings};
use crate::{AssignerClient, ClientConfig, Handler, Partition, WarmError};

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
    #[arg(long, env = "KAFKA_ASSIGNER_LEASE_TTL", value_parser = parse_ttl, default_value = "10s")]
    pub lease_ttl: Duration,
}

/// A nonzero duration (`10s`, `500ms`: humantime syntax), like the assigner's own flags.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(ttl) if ttl.is_zero() => Err(format!("'{text}' must be greater than zero")),
        Ok(ttl) => Ok(ttl),
        Err(e) => Err(format!("'{text}' is not a duration ({e}); use e.g. 500ms, 10s, 5m")),
    }
}

/// The default consumer name: host name and process id (as the assigner names its
/// instances), so two consumers on one host differ.
fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "consumer".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

/// Runs the example consumer until SIGTERM or Ctrl-C, then deregisters (serving the
/// releases a drain asks for) and stops. Errors are printed; the exit code says whether
/// it started and stopped cleanly. Logging is the caller's (`examples/consumer.rs`).
pub async fn run(args: ConsumerArgs) -> ExitCode {
    let name = args.consumer_name.clone().unwrap_or_else(default_consumer_name);
    let kafka = match args.kafka_brokers.clone().filter(|_| !args.log_only) {
        Some(brokers) => match start_kafka(&args, brokers) {
            Ok(kafka) => Some(kafka),
            Err(error) => {
                eprintln!("consumer: {error}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let config = ClientConfig::new(args.endpoints.clone(), name.clone(), args.topic.clone())
        .with_server_lease_ttl(args.lease_ttl);
    let started = match &kafka {
        Some(kafka) => AssignerClient::start(config, Arc::new(kafka.clone()), None),
        None => AssignerClient::start(config, Arc::new(LogHandler), None),
    };
    let client = match started {
        Ok(client) => client,
        Err(error) => {
            eprintln!("consumer: {error}");
            if let Some(kafka) = &kafka {
                kafka.stop();
            }
            return ExitCode::FAILURE;
        }
    };
    let mut owned = client.owned();
    let log_owned = tokio::spawn(async move {
        while owned.changed().await.is_ok() {
            tracing::info!(partitions = ?*owned.borrow(), "owned partitions");
        }
    });
    crate::signal::shutdown_signal().await;
    tracing::info!(consumer = %name, "shutting down");
    let outcome = client.shutdown().await;
    log_owned.abort();
    if let Some(kafka) = kafka {
        kafka.stop();
    }
    match outcome {
        Ok(outcome) => {
            tracing::info!(?outcome, "stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("consumer: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The Kafka consumer (without `--log-only`).
fn start_kafka(args: &ConsumerArgs, brokers: String) -> Result<KafkaHandler, ExampleError> {
    let settings = KafkaSettings {
        brokers,
        topic: args.topic.clone(),
        group_id: args.group_id.clone(),
        timeout: Duration::from_secs(30),
    };
    let on_message = Arc::new(|partition: i32, offset: i64, payload: &[u8]| {
        tracing::debug!(partition, offset, bytes = payload.len(), "processed");
    });
    KafkaHandler::start(settings, on_message)
}

/// `--log-only`: every call logged, warms ready at once.
struct LogHandler;

#[async_trait::async_trait]
impl Handler for LogHandler {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        tracing::info!(%p, "warm: ready at once (no state to build)");
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        tracing::info!(%p, "assigned: processing");
    }

    async fn release(&self, p: Partition) {
        tracing::info!(%p, "release: stopped processing");
    }

    async fn unassigned(&self, p: Partition) {
        tracing::info!(%p, "unassigned: stopped processing");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_ttl_flag_is_a_nonzero_duration() {
        assert_eq!(parse_ttl("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_ttl(" 500ms "), Ok(Duration::from_millis(500)));
        assert!(parse_ttl("0s").is_err_and(|e| e.contains("greater than zero")));
        assert!(parse_ttl("ten").is_err_and(|e| e.contains("'ten' is not a duration")));
    }
}
