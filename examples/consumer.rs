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
//! The logic lives in the client crate, `kafka_assigner_client::kafka_example` (cargo
//! feature `kafka-example`; tests run it in-process). This file only sets up logging.
#![forbid(unsafe_code)]

use clap::Parser;
use kafka_assigner_client::kafka_example::{ConsumerArgs, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Colours only on a terminal: `docker logs` and log files get plain text.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    run(ConsumerArgs::parse()).await
}
