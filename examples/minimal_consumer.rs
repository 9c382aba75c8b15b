//! The smallest complete consumer: the example of docs/protocol.md, "Writing a consumer".
//!
//! ```text
//! cargo run --example minimal_consumer   # needs assigners at the endpoints below
//! ```
#![forbid(unsafe_code)]

use kafka_assigner_client::{AssignerClient, ClientConfig, Handler, Partition, WarmError};
use std::sync::Arc;

/// Prints what it is told.
struct MyConsumer;

#[async_trait::async_trait]
impl Handler for MyConsumer {
    // Load state for p (catch up a cache, a RocksDB...) without processing it.
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        println!("warm {p}");
        Ok(())
    }
    // p is ours: start processing it.
    async fn assigned(&self, p: Partition) {
        println!("assigned {p}")
    }
    // p moved to another consumer: stop, commit offsets, then return.
    async fn release(&self, p: Partition) {
        println!("release {p}")
    }
    // p is not ours any more (or a warm was cancelled, or we were cut off): stop.
    async fn unassigned(&self, p: Partition) {
        println!("unassigned {p}")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = ["http://assigner-0:50051", "http://assigner-1:50051"];
    let config = ClientConfig::new(endpoints, "pod-0", "events")
        .with_server_lease_ttl(std::time::Duration::from_secs(10)); // the server's --lease-ttl
    let mut registry = prometheus_client::registry::Registry::default(); // your registry
    let client = AssignerClient::start(config, Arc::new(MyConsumer), Some(&mut registry))?;
    let mut owned = client.owned(); // tokio::sync::watch of the partitions held
    tokio::select! {
        _ = async { while owned.changed().await.is_ok() { println!("owning {:?}", *owned.borrow()) } } => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("{:?}", client.shutdown().await?); // Deregister; on WAIT_FOR_DRAIN, serve releases
    Ok(())
}
