//! For users' integration tests: the assigner in-process, on the memory backend.
//!
//! ```no_run
//! # async fn t() {
//! use kafka_assigner::testing::InProcessAssigner;
//! let assigner = InProcessAssigner::start(&[("events", 4)]).await.expect("assigner");
//! let config = assigner.client_config("consumer-0", "events");
//! // ... AssignerClient::start(config, handler, None) ...
//! drop(assigner); // stops it
//! # }
//! ```
//!
//! For a container instead (Docker): `kafka_assigner_client::testing::containers`, cargo
//! feature `testcontainers` of the client crate; a consumer's suite needs only that crate.
//! This crate's feature of the same name turns it on and re-exports it here.

/// The client crate's `testing::containers` (the assigner and etcd images as
/// testcontainers), re-exported for suites that already depend on the server.
#[cfg(feature = "testcontainers")]
pub use kafka_assigner_client::testing::containers;

use std::{net::SocketAddr, time::Duration};

use crate::client::ClientConfig;
use crate::coordinator::{HandoffConfig, StatusView};
use crate::server::{AssignerServer, ServerError};

/// An assigner on free loopback ports, serving the memory backend; stopped when dropped
/// (or, awaiting the end, by [`stop`](Self::stop)). No Docker, no etcd.
pub struct InProcessAssigner {
    server: Option<AssignerServer>,
    lease_ttl: Duration,
}

impl InProcessAssigner {
    /// Starts one with these topics (name, partition count) and test-friendly timings:
    /// a 2 s session TTL and a 100 ms reconcile interval.
    pub async fn start(topics: &[(&str, u32)]) -> Result<Self, ServerError> {
        let mut config = HandoffConfig {
            instance_id: "in-process".into(),
            lease_ttl: Duration::from_secs(2),
            reconcile_interval: Duration::from_millis(100),
            ..HandoffConfig::default()
        };
        config.topic_partitions.extend(topics.iter().map(|(t, n)| (t.to_string(), *n)));
        Self::start_with(config).await
    }

    /// Starts one with a full coordinator configuration (drain policy, time limits, ...).
    pub async fn start_with(config: HandoffConfig) -> Result<Self, ServerError> {
        let lease_ttl = config.lease_ttl;
        let server = AssignerServer::start_memory(config).await?;
        Ok(Self { server: Some(server), lease_ttl })
    }

    fn server(&self) -> &AssignerServer {
        // Only `stop` and `drop` take the server, and both consume `self`.
        self.server.as_ref().expect("the in-process assigner is running")
    }

    /// `http://127.0.0.1:port` of its gRPC API.
    pub fn grpc_url(&self) -> String {
        self.server().grpc_url()
    }

    /// Its admin HTTP address (`/ready`, `/status`, `/metrics`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.server().admin_addr
    }

    /// A client configuration for `consumer` on `topic`, pointed at this assigner, with
    /// the session timeout matched to its TTL.
    pub fn client_config(&self, consumer: &str, topic: &str) -> ClientConfig {
        ClientConfig::new([self.grpc_url()], consumer, topic).with_server_lease_ttl(self.lease_ttl)
    }

    /// Who owns what, and the handoffs in flight.
    pub async fn status(&self) -> StatusView {
        self.server().coordinator.status().await
    }

    /// Stops it and waits until both listeners are closed.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }
}

impl Drop for InProcessAssigner {
    fn drop(&mut self) {
        // Drop cannot wait: the stop runs on the current runtime, if one is still up (at
        // the end of a #[tokio::test] the runtime's shutdown stops everything anyway).
        if let Some(server) = self.server.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(server.stop());
        }
    }
}
