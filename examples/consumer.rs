//! Example consumer: consumes a Kafka topic with rdkafka, with partitions handed out by
//! kafka-assigner (warm handoffs) instead of Kafka's consumer-group rebalancing.
//!
//! ```text
//! cargo run --example consumer -- --endpoints http://127.0.0.1:50051 \
//!     --consumer-name pod-0 --topic events --kafka-brokers 127.0.0.1:9092
//! ```
//!
//! With `--log-only` it touches no broker and only logs what the assigner says (warm,
//! assigned, release, unassigned): the protocol alone, for a stack with no Kafka
//! (`docker-compose.local.yml`).
//!
//! The logic lives in `kafka_assigner::client::kafka_example` (tests run it in-process).
#![forbid(unsafe_code)]

use std::{sync::Arc, time::Duration};

use clap::Parser;
use kafka_assigner::client::{
    AssignerClient, ClientConfig, Handler, Partition, WarmError,
    kafka_example::{ConsumerArgs, ExampleError, KafkaHandler, KafkaSettings},
};
use kafka_assigner::config::default_instance_id;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let args = ConsumerArgs::parse();
    let name = args.consumer_name.clone().unwrap_or_else(default_instance_id);
    let kafka = match args.kafka_brokers.clone().filter(|_| !args.log_only) {
        Some(brokers) => match start_kafka(&args, brokers) {
            Ok(kafka) => Some(kafka),
            Err(error) => {
                eprintln!("consumer: {error}");
                return std::process::ExitCode::FAILURE;
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
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut owned = client.owned();
    let log_owned = tokio::spawn(async move {
        while owned.changed().await.is_ok() {
            tracing::info!(partitions = ?*owned.borrow(), "owned partitions");
        }
    });
    kafka_assigner::signal::shutdown_signal().await;
    tracing::info!(consumer = %name, "shutting down");
    let outcome = client.shutdown().await;
    log_owned.abort();
    if let Some(kafka) = kafka {
        kafka.stop();
    }
    match outcome {
        Ok(outcome) => {
            tracing::info!(?outcome, "stopped");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("consumer: {error}");
            std::process::ExitCode::FAILURE
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
