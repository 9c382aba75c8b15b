//! The tonic service: the wire contract over a [`ConsumerGroupCoordinator`].
//!
//! This layer validates the shape of requests (required fields), maps
//! [`CoordinatorError`]s to gRPC status codes, and talks to nothing but the coordinator.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::coordinator::{ConsumerGroupCoordinator, CoordinatorError, ErrorCode};
use crate::metrics::{Metrics, grpc::MeteredStream};
use crate::proto::v1::{
    AssignmentCommand, DeregisterRequest, DeregisterResponse, PartitionReadyRequest, PartitionReadyResponse,
    PartitionReleasedRequest, PartitionReleasedResponse, RegisterRequest, TopicPartition,
    kafka_assigner_server::KafkaAssigner,
};

/// The gRPC service.
#[derive(Clone)]
pub struct AssignerService {
    coordinator: Arc<dyn ConsumerGroupCoordinator>,
    metrics: Arc<Metrics>,
}

impl AssignerService {
    /// A service answering from `coordinator`, counting calls into `metrics`.
    pub fn new(coordinator: Arc<dyn ConsumerGroupCoordinator>, metrics: Arc<Metrics>) -> Self {
        Self { coordinator, metrics }
    }

    /// Runs one call and counts it by method and status code.
    async fn counted<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let result = call.await;
        self.metrics.observe_grpc(method, &result);
        result
    }
}

/// Maps a coordinator error to its gRPC status. Store failures are logged in full and
/// shown to the consumer without transport internals ([`CoordinatorError::public_message`]).
pub fn to_status(error: CoordinatorError) -> Status {
    let message = error.public_message();
    if matches!(error, CoordinatorError::Store(_) | CoordinatorError::Kafka { .. }) {
        tracing::warn!(%error, "call failed");
    }
    match error.code() {
        ErrorCode::InvalidArgument => Status::invalid_argument(message),
        ErrorCode::NotFound => Status::not_found(message),
        ErrorCode::FailedPrecondition => Status::failed_precondition(message),
        ErrorCode::Aborted => Status::aborted(message),
        ErrorCode::Unavailable => Status::unavailable(message),
        ErrorCode::ResourceExhausted => Status::resource_exhausted(message),
        ErrorCode::Internal => Status::internal(message),
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
        let RegisterRequest { consumer_name, topic } = request.into_inner();
        let register = async { self.coordinator.register(&consumer_name, &topic).await.map_err(to_status) };
        let stream = self.counted("Register", register).await?;
        let stream = MeteredStream::new(stream.map(|item| item.map_err(to_status)), self.metrics.clone());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn partition_ready(
        &self,
        request: Request<PartitionReadyRequest>,
    ) -> Result<Response<PartitionReadyResponse>, Status> {
        let PartitionReadyRequest { consumer_name, partition } = request.into_inner();
        let call = async {
            let tp = required(partition)?;
            self.coordinator.partition_ready(&consumer_name, &tp.topic, tp.partition).await.map_err(to_status)
        };
        self.counted("PartitionReady", call).await?;
        Ok(Response::new(PartitionReadyResponse {}))
    }

    async fn partition_released(
        &self,
        request: Request<PartitionReleasedRequest>,
    ) -> Result<Response<PartitionReleasedResponse>, Status> {
        let PartitionReleasedRequest { consumer_name, partition } = request.into_inner();
        let call = async {
            let tp = required(partition)?;
            self.coordinator
                .partition_released(&consumer_name, &tp.topic, tp.partition)
                .await
                .map_err(to_status)
        };
        self.counted("PartitionReleased", call).await?;
        Ok(Response::new(PartitionReleasedResponse {}))
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        let DeregisterRequest { consumer_name } = request.into_inner();
        let call = async { self.coordinator.deregister(&consumer_name).await.map_err(to_status) };
        let action = self.counted("Deregister", call).await?;
        Ok(Response::new(DeregisterResponse { action: action.into() }))
    }
}
