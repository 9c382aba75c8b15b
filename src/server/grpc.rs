//! The tonic service: the wire contract over a [`ConsumerGroupCoordinator`].
//!
//! This layer checks what the server enforces (the caller's identity, stream limits, the
//! unary deadline), validates the shape of requests (required fields), maps
//! coordinator errors to gRPC statuses ([`super::status`]), counts calls, and talks to nothing but the
//! coordinator.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::status::{stream_end_reason, to_status};
use crate::coordinator::ConsumerGroupCoordinator;
use crate::metrics::{Metrics, grpc::MeteredStream};
use crate::proto::v1::{
    AssignmentCommand, DeregisterRequest, DeregisterResponse, PartitionReadyRequest, PartitionReadyResponse,
    PartitionReleasedRequest, PartitionReleasedResponse, RegisterRequest, TopicPartition,
    kafka_assigner_server::KafkaAssigner,
};

/// Response header of `Register` with the session TTL (defined beside the contract, for
/// the client to read).
pub use crate::proto::{INCARNATION_HEADER, SESSION_TTL_HEADER};

/// The gRPC service.
#[derive(Clone)]
pub struct AssignerService {
    pub(super) coordinator: Arc<dyn ConsumerGroupCoordinator>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) policy: Policy,
}

/// What the server layer enforces before a call reaches the coordinator (see `limits`
/// and `identity`).
#[derive(Clone)]
pub struct Policy {
    /// `--bind-consumer-identity`: the rule, when on.
    pub identity: Option<super::identity::IdentityRule>,
    /// Stream counts.
    pub gate: super::limits::StreamGate,
    /// Bound on unary calls.
    pub unary_timeout: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        let limits = super::limits::Limits::default();
        Self {
            identity: None,
            gate: super::limits::StreamGate::new(&limits),
            unary_timeout: limits.unary_timeout,
        }
    }
}

impl AssignerService {
    /// A service answering from `coordinator`, counting calls into `metrics`.
    pub fn new(coordinator: Arc<dyn ConsumerGroupCoordinator>, metrics: Arc<Metrics>) -> Self {
        Self::with_policy(coordinator, metrics, Policy::default())
    }

    /// A service answering from `coordinator` under `policy`.
    pub fn with_policy(
        coordinator: Arc<dyn ConsumerGroupCoordinator>,
        metrics: Arc<Metrics>,
        policy: Policy,
    ) -> Self {
        Self { coordinator, metrics, policy }
    }

    /// Refuses a consumer name the connection's certificate does not carry (when bound).
    pub(super) fn authorize<T>(&self, request: &Request<T>, consumer: &str, rpc: &str) -> Result<(), Status> {
        match &self.policy.identity {
            None => Ok(()),
            Some(rule) => rule.check(request.extensions().get::<super::tls::ConnInfo>(), consumer, rpc),
        }
    }

    /// Runs one call and counts it by method and status code.
    pub(super) async fn counted<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let result = call.await;
        self.metrics.observe_grpc(method, &result);
        result
    }

    /// Runs a unary call within `--unary-timeout`, counted.
    async fn bounded<T>(
        &self,
        rpc: &'static str,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let limit = self.policy.unary_timeout;
        let bounded = async {
            tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "{rpc} did not complete within {limit:?} (--unary-timeout)"
                )))
            })
        };
        self.counted(rpc, bounded).await
    }
}

fn required(partition: Option<TopicPartition>) -> Result<TopicPartition, Status> {
    partition.ok_or_else(|| Status::invalid_argument("partition is required (topic and partition number)"))
}

type CommandStream = Pin<Box<dyn Stream<Item = Result<AssignmentCommand, Status>> + Send>>;

/// The client process a `Register` comes from ([`INCARNATION_HEADER`]); 0 when the header is
/// absent or not a number, which makes the registration a new incarnation: the safe side.
fn incarnation_of(metadata: &tonic::metadata::MetadataMap) -> u64 {
    let value = metadata.get(INCARNATION_HEADER).and_then(|v| v.to_str().ok());
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[tonic::async_trait]
impl KafkaAssigner for AssignerService {
    type RegisterStream = CommandStream;

    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<CommandStream>, Status> {
        let register = async {
            self.authorize(&request, &request.get_ref().consumer_name, "Register")?;
            let ip = request.extensions().get::<super::tls::ConnInfo>().map(|info| info.remote_addr.ip());
            // Held by the stream: dropped when the stream ends or the client goes away.
            let permit = self.policy.gate.acquire(ip, &self.metrics)?;
            let incarnation = incarnation_of(request.metadata());
            let RegisterRequest { consumer_name, topic } = request.into_inner();
            let stream =
                self.coordinator.register_as(&consumer_name, &topic, incarnation).await.map_err(to_status)?;
            Ok((stream, permit))
        };
        let (stream, permit) = self.counted("Register", register).await?;
        let stream = MeteredStream::new(stream, self.metrics.clone(), stream_end_reason).map(move |item| {
            let _held = &permit;
            item.map_err(to_status)
        });
        let mut response = Response::new(Box::pin(stream) as CommandStream);
        if let Some(ttl) = self.coordinator.session_ttl() {
            // In the response headers, which reach the client before the snapshot: the
            // client never runs a session longer than the server keeps it.
            let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            response.metadata_mut().insert(SESSION_TTL_HEADER, ms.into());
        }
        Ok(response)
    }

    async fn partition_ready(
        &self,
        request: Request<PartitionReadyRequest>,
    ) -> Result<Response<PartitionReadyResponse>, Status> {
        let call = async {
            self.authorize(&request, &request.get_ref().consumer_name, "PartitionReady")?;
            let PartitionReadyRequest { consumer_name, partition } = request.into_inner();
            let tp = required(partition)?;
            self.coordinator.partition_ready(&consumer_name, &tp.topic, tp.partition).await.map_err(to_status)
        };
        self.bounded("PartitionReady", call).await?;
        Ok(Response::new(PartitionReadyResponse {}))
    }

    async fn partition_released(
        &self,
        request: Request<PartitionReleasedRequest>,
    ) -> Result<Response<PartitionReleasedResponse>, Status> {
        let call = async {
            self.authorize(&request, &request.get_ref().consumer_name, "PartitionReleased")?;
            let PartitionReleasedRequest { consumer_name, partition } = request.into_inner();
            let tp = required(partition)?;
            self.coordinator
                .partition_released(&consumer_name, &tp.topic, tp.partition)
                .await
                .map_err(to_status)
        };
        self.bounded("PartitionReleased", call).await?;
        Ok(Response::new(PartitionReleasedResponse {}))
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        let call = async {
            self.authorize(&request, &request.get_ref().consumer_name, "Deregister")?;
            let DeregisterRequest { consumer_name } = request.into_inner();
            self.coordinator.deregister(&consumer_name).await.map_err(to_status)
        };
        let action = self.bounded("Deregister", call).await?;
        Ok(Response::new(DeregisterResponse { action: action.into() }))
    }
}
