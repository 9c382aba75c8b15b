//! The tonic service: the wire contract over a [`ConsumerGroupCoordinator`].
//!
//! This layer validates the shape of requests (required fields), maps
//! [`CoordinatorError`]s to gRPC status codes, and talks to nothing but the coordinator.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::coordinator::{ConsumerGroupCoordinator, CoordinatorError};
use crate::proto::v1::{
    AssignmentCommand, DeregisterRequest, DeregisterResponse, PartitionReadyRequest, PartitionReadyResponse,
    PartitionReleasedRequest, PartitionReleasedResponse, RegisterRequest, TopicPartition,
    kafka_assigner_server::KafkaAssigner,
};

/// The gRPC service.
#[derive(Clone)]
pub struct AssignerService {
    coordinator: Arc<dyn ConsumerGroupCoordinator>,
    policy: Policy,
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
    /// A service answering from `coordinator`.
    pub fn new(coordinator: Arc<dyn ConsumerGroupCoordinator>) -> Self {
        Self::with_policy(coordinator, Policy::default())
    }

    /// A service answering from `coordinator` under `policy`.
    pub fn with_policy(coordinator: Arc<dyn ConsumerGroupCoordinator>, policy: Policy) -> Self {
        Self { coordinator, policy }
    }

    /// Refuses a consumer name the connection's certificate does not carry (when bound).
    fn authorize<T>(&self, request: &Request<T>, consumer: &str, rpc: &str) -> Result<(), Status> {
        match &self.policy.identity {
            None => Ok(()),
            Some(rule) => rule.check(request.extensions().get::<super::tls::ConnInfo>(), consumer, rpc),
        }
    }

    /// Runs a unary call within `--unary-timeout`.
    async fn bounded<T>(
        &self,
        rpc: &str,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let limit = self.policy.unary_timeout;
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "{rpc} did not complete within {limit:?} (--unary-timeout)"
            )))
        })
    }
}

/// Maps a coordinator error to its gRPC status.
pub fn to_status(error: CoordinatorError) -> Status {
    let message = error.to_string();
    match error {
        CoordinatorError::InvalidArgument(_) => Status::invalid_argument(message),
        CoordinatorError::NotFound(_) => Status::not_found(message),
        CoordinatorError::FailedPrecondition(_) => Status::failed_precondition(message),
        CoordinatorError::Aborted(_) => Status::aborted(message),
        CoordinatorError::Unavailable(_) => Status::unavailable(message),
        CoordinatorError::Internal(_) => Status::internal(message),
    }
}

fn required(partition: Option<TopicPartition>) -> Result<TopicPartition, Status> {
    partition.ok_or_else(|| Status::invalid_argument("partition is required (topic and partition number)"))
}

type CommandStream = Pin<Box<dyn Stream<Item = Result<AssignmentCommand, Status>> + Send>>;

#[tonic::async_trait]
impl KafkaAssigner for AssignerService {
    type RegisterStream = CommandStream;

    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<CommandStream>, Status> {
        self.authorize(&request, &request.get_ref().consumer_name, "Register")?;
        let ip = request.extensions().get::<super::tls::ConnInfo>().map(|info| info.remote_addr.ip());
        // Held by the stream: dropped when the stream ends or the client goes away.
        let permit = self.policy.gate.acquire(ip)?;
        let RegisterRequest { consumer_name, topic } = request.into_inner();
        let stream = self.coordinator.register(&consumer_name, &topic).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(stream.map(move |item| {
            let _held = &permit;
            item.map_err(to_status)
        }))))
    }

    async fn partition_ready(
        &self,
        request: Request<PartitionReadyRequest>,
    ) -> Result<Response<PartitionReadyResponse>, Status> {
        self.authorize(&request, &request.get_ref().consumer_name, "PartitionReady")?;
        let PartitionReadyRequest { consumer_name, partition } = request.into_inner();
        let tp = required(partition)?;
        let call = self.coordinator.partition_ready(&consumer_name, &tp.topic, tp.partition);
        self.bounded("PartitionReady", async { call.await.map_err(to_status) }).await?;
        Ok(Response::new(PartitionReadyResponse {}))
    }

    async fn partition_released(
        &self,
        request: Request<PartitionReleasedRequest>,
    ) -> Result<Response<PartitionReleasedResponse>, Status> {
        self.authorize(&request, &request.get_ref().consumer_name, "PartitionReleased")?;
        let PartitionReleasedRequest { consumer_name, partition } = request.into_inner();
        let tp = required(partition)?;
        let call = self.coordinator.partition_released(&consumer_name, &tp.topic, tp.partition);
        self.bounded("PartitionReleased", async { call.await.map_err(to_status) }).await?;
        Ok(Response::new(PartitionReleasedResponse {}))
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        self.authorize(&request, &request.get_ref().consumer_name, "Deregister")?;
        let DeregisterRequest { consumer_name } = request.into_inner();
        let call = self.coordinator.deregister(&consumer_name);
        let action = self.bounded("Deregister", async { call.await.map_err(to_status) }).await?;
        Ok(Response::new(DeregisterResponse { action: action.into() }))
    }
}
