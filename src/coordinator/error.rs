//! [`CoordinatorError`]: what a coordinator call can fail with, named by cause. The gRPC
//! layer (`server::grpc`) decides which status code each cause is answered with.

use super::causes::{
    BadName, ConsumerUnknown, Contention, EndOfStream, HandoffFreeBackend, NotReadingStream, SessionMissing,
    TopicUnknown,
};
use crate::handoff::HandoffError;
use crate::kafka::KafkaError;
use crate::store::StoreError;

/// Why a coordinator call failed. Each variant is one cause, and decides the gRPC code
/// (`server::status`); the detailed cause and the names involved are typed fields
/// ([`super::causes`]), from which the message the consumer is shown is built
/// ([`CoordinatorError::public_message`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// A consumer or topic name in the request is empty or malformed.
    #[error(transparent)]
    InvalidName(#[from] BadName),
    /// No partition count is known for the topic (none stored, configured, or in Kafka).
    #[error(transparent)]
    UnknownTopic(#[from] TopicUnknown),
    /// The consumer is not registered (or not covered by the static assignment).
    #[error(transparent)]
    UnknownConsumer(#[from] ConsumerUnknown),
    /// The backend moves no partitions by handoff, so there is nothing to be ready for or
    /// to release.
    #[error(transparent)]
    NoHandoffs(#[from] HandoffFreeBackend),
    /// The backend hands out no ownership epochs (docs/design.md §10).
    #[error("this assigner's backend hands out no ownership epochs")]
    NoEpochs,
    /// A concurrent change kept winning the race for the same records; retrying may
    /// succeed.
    #[error(transparent)]
    Contended(#[from] Contention),
    /// The consumer registered again, and this stream was replaced by the newer one.
    #[error("consumer '{consumer}' registered again for topic '{topic}'; this stream was replaced")]
    Replaced {
        /// The consumer.
        consumer: String,
        /// The topic of the replaced stream.
        topic: String,
    },
    /// The caller of a `Register` went away before its registration was written, so none
    /// was (docs/design.md §6). Nobody waits for this answer.
    #[error("the caller of this Register of consumer '{consumer}' went away before it was written")]
    Abandoned {
        /// The consumer.
        consumer: String,
    },
    /// This instance has no live session with its store right now (not granted yet, lost,
    /// or fenced): it serves no registrations until it has one again.
    #[error(transparent)]
    NoSession(#[from] SessionMissing),
    /// The consumer's stream is open here, but the store lost its registration (the
    /// instance lease expired early) and this instance is writing it again
    /// (`shared/rebind.rs`): the call is refused for now, and the same call succeeds once
    /// the registration is back.
    #[error(
        "the registration of consumer '{consumer}' on topic '{topic}' is being written again after the \
         store lost it; retry"
    )]
    RegistrationLost {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// This instance is shutting down.
    #[error("this assigner instance is shutting down")]
    ShuttingDown,
    /// This instance ended a consumer's stream ([`EndOfStream::cause`] says which kind of
    /// end, for the metric).
    #[error(transparent)]
    StreamEnded(#[from] EndOfStream),
    /// The consumer stopped reading its stream while commands waited, so the stream was
    /// ended (its partitions are kept for the session TTL).
    #[error(transparent)]
    NotReading(#[from] NotReadingStream),
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
    #[error("cannot learn the partition count of topic '{topic}': {source}")]
    Kafka {
        /// The topic asked about.
        topic: String,
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
