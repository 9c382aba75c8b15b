//! [`CoordinatorError`]: what a coordinator call can fail with, named by cause. The gRPC
//! layer (`server::grpc`) decides which status code each cause is answered with.

use crate::handoff::HandoffError;
use crate::kafka::KafkaError;
use crate::store::StoreError;

/// Why a coordinator call failed. Each variant is one cause; the message is what the
/// consumer is shown ([`CoordinatorError::public_message`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// A consumer or topic name in the request is empty or malformed.
    #[error("{0}")]
    InvalidName(String),
    /// No partition count is known for the topic (none stored, configured, or in Kafka).
    #[error("{0}")]
    UnknownTopic(String),
    /// The consumer is not registered (or not covered by the static assignment).
    #[error("{0}")]
    UnknownConsumer(String),
    /// The backend moves no partitions by handoff, so there is nothing to be ready for or
    /// to release.
    #[error("{0}")]
    NoHandoffs(String),
    /// The backend hands out no ownership epochs (docs/design.md §10).
    #[error("{0}")]
    NoEpochs(String),
    /// A concurrent change kept winning the race for the same records; retrying may
    /// succeed.
    #[error("{0}")]
    Contended(String),
    /// The consumer registered again, and this stream was replaced by the newer one.
    #[error("{0}")]
    Replaced(String),
    /// The caller of a `Register` went away before its registration was written, so none
    /// was (docs/design.md §6). Nobody waits for this answer.
    #[error("{0}")]
    Abandoned(String),
    /// This instance has no live session with its store right now (not granted yet, lost,
    /// or fenced): it serves no registrations until it has one again.
    #[error("{0}")]
    NoSession(String),
    /// The consumer's stream is open here, but the store lost its registration (the
    /// instance lease expired early) and this instance is writing it again
    /// (`shared/rebind.rs`): the call is refused for now, and the same call succeeds once
    /// the registration is back.
    #[error("{0}")]
    RegistrationLost(String),
    /// This instance is shutting down.
    #[error("this assigner instance is shutting down")]
    ShuttingDown,
    /// This instance ended a consumer's stream: why, and the message the consumer is
    /// shown.
    #[error("{1}")]
    StreamEnded(StreamEnd, String),
    /// The consumer stopped reading its stream while commands waited, so the stream was
    /// ended (its partitions are kept for the session TTL).
    #[error("{0}")]
    NotReading(String),
    /// A refused handoff call, with the topic it was about.
    #[error("topic '{topic}': {source}")]
    Handoff {
        /// The topic of the call.
        topic: String,
        /// Why the state machine refused it.
        #[source]
        source: HandoffError,
    },
    /// The store failed: unreachable, or answered something unexpected.
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

/// Why an instance ended a consumer's stream (the `reason` label of
/// `streams_ended_total`, so the metric needs no message text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The instance is shutting down.
    Shutdown,
    /// The consumer's session expired.
    Expired,
    /// The instance stopped as if it had crashed (tests, failover drills).
    Crashed,
    /// The instance lost contact with its store and fenced itself (docs/design.md §6).
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

impl CoordinatorError {
    /// The message a consumer is shown. Store failures name the problem, not the transport
    /// (no endpoint addresses or client internals); the full error is logged instead.
    pub fn public_message(&self) -> String {
        match self {
            CoordinatorError::Store(StoreError::Unavailable(_) | StoreError::Closed) => {
                "the assigner cannot reach its store right now; retry, or reconnect to another instance"
                    .into()
            }
            CoordinatorError::Store(StoreError::SessionExpired(_)) => {
                "this assigner instance's session with its store ended; reconnect to another instance".into()
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
