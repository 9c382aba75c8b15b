//! [`CoordinatorError`]: what a coordinator call can fail with, one gRPC status code each.

use crate::handoff::HandoffError;
use crate::kafka::KafkaError;
use crate::store::StoreError;

/// Errors of a coordinator, each mapping to one gRPC status code ([`CoordinatorError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The request is malformed (empty or invalid name, partition out of range).
    #[error("{0}")]
    InvalidArgument(String),
    /// A named thing does not exist (unknown topic, unknown consumer).
    #[error("{0}")]
    NotFound(String),
    /// The call is valid but not in the current state (not warming, not releasing).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The operation lost a race with a concurrent change; retrying may succeed.
    #[error("{0}")]
    Aborted(String),
    /// This instance cannot serve the call right now (shutting down, fenced, stream ended).
    #[error("{0}")]
    Unavailable(String),
    /// This instance ended a consumer's stream (`UNAVAILABLE`): why, and the message the
    /// consumer is shown.
    #[error("{1}")]
    StreamEnded(StreamEnd, String),
    /// A limit was hit (a consumer not reading its stream).
    #[error("{0}")]
    ResourceExhausted(String),
    /// A refused handoff call, with the topic it was about.
    #[error("topic '{topic}': {source}")]
    Handoff {
        /// The topic of the call.
        topic: String,
        /// Why the state machine refused it.
        #[source]
        source: HandoffError,
    },
    /// The store failed: unreachable (`UNAVAILABLE`) or answered something unexpected.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Kafka could not tell a topic's partition count.
    #[error("{context}: {source}")]
    Kafka {
        /// What was being asked (names the topic).
        context: String,
        /// Kafka's answer.
        #[source]
        source: KafkaError,
    },
}

/// Why an instance ended a consumer's stream with `UNAVAILABLE` (the `reason` label of
/// `streams_ended_total`, so the metric needs no message text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The instance is shutting down.
    Shutdown,
    /// The consumer's session expired.
    Expired,
    /// The instance stopped as if it had crashed (tests, failover drills).
    Crashed,
    /// The instance lost contact with its store and fenced itself (DESIGN.md §6).
    Fenced,
}

impl StreamEnd {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamEnd::Shutdown => "shutdown",
            StreamEnd::Expired => "expired",
            StreamEnd::Crashed => "crashed",
            StreamEnd::Fenced => "fenced",
        }
    }
}

/// The gRPC status code class of a [`CoordinatorError`], without depending on tonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// `INVALID_ARGUMENT`.
    InvalidArgument,
    /// `NOT_FOUND`.
    NotFound,
    /// `FAILED_PRECONDITION`.
    FailedPrecondition,
    /// `ABORTED`.
    Aborted,
    /// `UNAVAILABLE`.
    Unavailable,
    /// `RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// `INTERNAL`.
    Internal,
}

impl CoordinatorError {
    /// The status code this error is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            CoordinatorError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            CoordinatorError::NotFound(_) => ErrorCode::NotFound,
            CoordinatorError::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            CoordinatorError::Aborted(_) => ErrorCode::Aborted,
            CoordinatorError::Unavailable(_) | CoordinatorError::StreamEnded(..) => ErrorCode::Unavailable,
            CoordinatorError::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            CoordinatorError::Handoff { source, .. } => match source {
                HandoffError::PartitionOutOfRange { .. } => ErrorCode::InvalidArgument,
                HandoffError::UnknownConsumer(_) => ErrorCode::NotFound,
                HandoffError::NotWarmingTarget { .. } | HandoffError::NotReleasing { .. } => {
                    ErrorCode::FailedPrecondition
                }
            },
            CoordinatorError::Store(StoreError::Unavailable(_) | StoreError::Closed) => {
                ErrorCode::Unavailable
            }
            CoordinatorError::Store(_) => ErrorCode::Internal,
            CoordinatorError::Kafka { source: KafkaError::UnknownTopic(_), .. } => ErrorCode::NotFound,
            CoordinatorError::Kafka { .. } => ErrorCode::Unavailable,
        }
    }

    /// The message a consumer is shown. Store failures name the problem, not the transport
    /// (no endpoint addresses or client internals); the full error is logged instead.
    pub fn public_message(&self) -> String {
        match self {
            CoordinatorError::Store(StoreError::Unavailable(_) | StoreError::Closed) => {
                "the assigner cannot reach its store right now; retry, or reconnect to another instance"
                    .into()
            }
            CoordinatorError::Store(_) => "the assigner's store answered something unexpected".into(),
            other => other.to_string(),
        }
    }

    /// Maps a refused handoff call, naming the topic in the message.
    pub fn from_handoff(topic: &str, source: HandoffError) -> Self {
        CoordinatorError::Handoff { topic: topic.to_string(), source }
    }
}
