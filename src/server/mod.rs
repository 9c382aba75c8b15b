//! Serving: the gRPC API (with health and reflection) and the admin HTTP server.
//!
//! [`AssignerServer::start`] binds both listeners and serves a coordinator; it is also
//! what users start in-process from their own integration tests (memory backend, no
//! Docker): see [`AssignerServer::start_memory`].
//!
//! [`AssignerServer::start_with`] adds TLS / mTLS with certificate reload ([`tls`]), the
//! consumer identity bound to the client certificate ([`identity`]) and the limits
//! ([`limits`]); the admin server stays plaintext on its own address and only reads.

pub mod admin;
mod epochs;
pub mod grpc;
pub mod identity;
pub mod limits;
pub mod status;
pub mod tls;

use std::{net::SocketAddr, sync::Arc};

use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::coordinator::{ConsumerGroupCoordinator, CoordinatorError, HandoffConfig};
use crate::metrics::Metrics;
use crate::proto::v1::{
    kafka_assigner_server::KafkaAssignerServer, ownership_epochs_server::OwnershipEpochsServer,
};
use crate::store::{LeaseStore, MemoryStore, MeteredStore};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The backend could not start (store unreachable, ...).
    #[error("backend failed to start: {0}")]
    Backend(#[from] CoordinatorError),
    /// Reflection could not be built from the descriptor set.
    #[error("reflection: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// A security or limit setting cannot be used (the message names the flag).
    #[error("{0}")]
    Config(String),
}

/// TLS, identity binding and limits of the gRPC server (the defaults: plaintext, no
/// binding, [`limits::Limits::default`]).
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Serve gRPC over TLS (mTLS when it has a client CA).
    pub tls: Option<tls::TlsSettings>,
    /// `--bind-consumer-identity` (requires a client CA).
    pub bind_identity: Option<identity::IdentityRule>,
    /// Limits.
    pub limits: limits::Limits,
}

/// A running assigner: gRPC and admin servers over one coordinator.
pub struct AssignerServer {
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where the admin endpoints are served.
    pub admin_addr: SocketAddr,
    /// The coordinator being served.
    pub coordinator: Arc<dyn ConsumerGroupCoordinator>,
    tls: bool,
    stop: CancellationToken,
    grpc: JoinHandle<()>,
    admin: JoinHandle<()>,
}

/// Keeps gRPC health (the service's and the server's, `""`) equal to the coordinator's
/// readiness until the coordinator is dropped.
async fn follow_readiness(
    mut readiness: tokio::sync::watch::Receiver<bool>,
    reporter: tonic_health::server::HealthReporter,
) {
    loop {
        let ready = *readiness.borrow_and_update();
        let status = if ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        reporter.set_service_status("", status).await;
        let service = <KafkaAssignerServer<grpc::AssignerService> as tonic::server::NamedService>::NAME;
        reporter.set_service_status(service, status).await;
        if readiness.changed().await.is_err() {
            return;
        }
    }
}

impl AssignerServer {
    /// Serves `coordinator` on `grpc_addr` and `admin_addr` (port 0: any free port).
    pub async fn start(
        coordinator: Arc<dyn ConsumerGroupCoordinator>,
        metrics: Arc<Metrics>,
        grpc_addr: SocketAddr,
        admin_addr: SocketAddr,
    ) -> Result<Self, ServerError> {
        Self::start_with(coordinator, metrics, grpc_addr, admin_addr, ServerOptions::default()).await
    }

    /// [`start`](Self::start) with TLS, identity binding and limits.
    pub async fn start_with(
        coordinator: Arc<dyn ConsumerGroupCoordinator>,
        metrics: Arc<Metrics>,
        grpc_addr: SocketAddr,
        admin_addr: SocketAddr,
        options: ServerOptions,
    ) -> Result<Self, ServerError> {
        options.limits.validate().map_err(|e| ServerError::Config(e.to_string()))?;
        if options.bind_identity.is_some() && options.tls.as_ref().is_none_or(|t| t.client_ca.is_none()) {
            return Err(ServerError::Config(
                "--bind-consumer-identity needs mTLS: set --tls-cert, --tls-key and --tls-client-ca".into(),
            ));
        }
        let tls = options
            .tls
            .clone()
            .map(tls::ReloadingTls::load)
            .transpose()
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })
        };
        let grpc_listener = bind(grpc_addr).await?;
        let admin_listener = bind(admin_addr).await?;
        let grpc_addr =
            grpc_listener.local_addr().map_err(|source| ServerError::Bind { addr: grpc_addr, source })?;
        let admin_addr =
            admin_listener.local_addr().map_err(|source| ServerError::Bind { addr: admin_addr, source })?;
        let stop = CancellationToken::new();

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        tokio::spawn(follow_readiness(coordinator.readiness(), health_reporter));
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(ServerError::Reflection)?;
        // Older grpcurl and grpcui builds ask for v1alpha only.
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(ServerError::Reflection)?;
        let limits = &options.limits;
        let policy = grpc::Policy {
            identity: options.bind_identity.clone(),
            gate: limits::StreamGate::new(limits),
            unary_timeout: limits.unary_timeout,
        };
        let assigner = grpc::AssignerService::with_policy(coordinator.clone(), metrics.clone(), policy);
        // The epochs companion (docs/design.md §10) shares the contract's checks.
        let epochs =
            OwnershipEpochsServer::new(assigner.clone()).max_decoding_message_size(limits.max_request_bytes);
        let service = KafkaAssignerServer::new(assigner).max_decoding_message_size(limits.max_request_bytes);
        let grpc_stop = stop.clone();
        let incoming = tls::incoming(grpc_listener, tls, stop.clone(), metrics.clone());
        let (keepalive_interval, keepalive_timeout) = (limits.keepalive_interval, limits.keepalive_timeout);
        let grpc = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                // A burst of calls on one connection must not trip h2's small-frame guard:
                // see `limits::HTTP2_CONNECTION_WINDOW`.
                .max_concurrent_streams(limits::HTTP2_MAX_CONCURRENT_STREAMS)
                .initial_connection_window_size(limits::HTTP2_CONNECTION_WINDOW)
                .http2_keepalive_interval(Some(keepalive_interval))
                .http2_keepalive_timeout(Some(keepalive_timeout))
                .add_service(health_service)
                .add_service(reflection)
                .add_service(reflection_v1alpha)
                .add_service(service)
                .add_service(epochs)
                .serve_with_incoming_shutdown(incoming, grpc_stop.cancelled_owned())
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "gRPC server failed");
            }
        });
        let admin_stop = stop.clone();
        let router = admin::router(coordinator.clone(), metrics);
        let admin = tokio::spawn(async move {
            let result = axum::serve(admin_listener, router)
                .with_graceful_shutdown(admin_stop.cancelled_owned())
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "admin server failed");
            }
        });
        tracing::info!(%grpc_addr, %admin_addr, "serving");
        Ok(Self { grpc_addr, admin_addr, coordinator, tls: options.tls.is_some(), stop, grpc, admin })
    }

    /// An in-process server on the memory backend with the given partition counts, on
    /// free loopback ports: what a user's integration test starts instead of a container.
    pub async fn start_memory(config: HandoffConfig) -> Result<Self, ServerError> {
        let metrics = Arc::new(Metrics::new());
        let store: Arc<dyn LeaseStore> =
            Arc::new(MeteredStore::new(Arc::new(MemoryStore::new()), metrics.clone()));
        let coordinator = Arc::new(
            crate::coordinator::handoff_backend::machine::start_driven(store, config, metrics.clone())
                .await?,
        );
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start(coordinator, metrics, any, any).await
    }

    /// `http://{grpc_addr}` (`https://` with TLS), for a tonic client.
    pub fn grpc_url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.grpc_addr)
    }

    /// Graceful stop: the coordinator ends every stream with `UNAVAILABLE` (sessions stay
    /// alive for their TTL so consumers can reconnect elsewhere) and resigns leadership;
    /// then both servers stop.
    pub async fn stop(self) {
        self.coordinator.shutdown().await;
        self.stop.cancel();
        let _ = self.grpc.await;
        let _ = self.admin.await;
    }
}
