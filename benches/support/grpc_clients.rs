//! The bench consumers' gRPC clients: a few HTTP/2 connections that thousands of streams
//! share, as a real fleet's clients would multiplex theirs.

use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use tonic::transport::{Channel, Endpoint};

use super::error::BenchError;

/// Opens `connections` (at least one) connections to `url`, one client on each.
pub async fn connect(url: &str, connections: usize) -> Result<Vec<KafkaAssignerClient<Channel>>, BenchError> {
    let mut clients = Vec::with_capacity(connections.max(1));
    for _ in 0..connections.max(1) {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| BenchError::Client(format!("bad url {url}: {e}")))?
            .tcp_nodelay(true);
        let channel =
            endpoint.connect().await.map_err(|e| BenchError::Client(format!("connect {url}: {e}")))?;
        // Large snapshots (10,000 partitions) fit the default 4 MiB decode limit.
        clients.push(KafkaAssignerClient::new(channel));
    }
    Ok(clients)
}
