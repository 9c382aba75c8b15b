//! The detailed causes inside a [`CoordinatorError`](super::CoordinatorError) variant: the
//! variant decides the gRPC code (`server::status`), these say which of its causes it was,
//! with the names and numbers involved as typed fields. Each message is built here from
//! those fields, so no caller formats one and nothing needs to read one back.

use std::time::Duration;

use crate::coordinator::shared::outgoing::STREAM_BUFFER;
use crate::kafka::KafkaError;

/// The static backend's explicit assignment variable (also `--static-assignment`). Defined
/// here, beside the errors that name it, so the causes import no backend.
pub const ASSIGNMENT_VAR: &str = "KAFKA_ASSIGNER_STATIC_ASSIGNMENT";
/// The static backend's round-robin member count variable (also `--static-members`).
pub const MEMBERS_VAR: &str = "KAFKA_ASSIGNER_STATIC_MEMBERS";

/// Why a topic or consumer name from a request is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadName {
    /// The topic name is empty.
    #[error("topic must not be empty")]
    EmptyTopic,
    /// The topic name is longer than Kafka allows.
    #[error("topic name is {length} characters long; Kafka allows at most 249")]
    TopicTooLong {
        /// Its length in bytes.
        length: usize,
    },
    /// The topic is `.` or `..`.
    #[error("'{topic}' is not a valid Kafka topic name")]
    DotTopic {
        /// The name.
        topic: String,
    },
    /// The topic name holds a character Kafka does not allow.
    #[error("topic '{topic}' contains {bad:?}; Kafka topic names use only letters, digits, '.', '_' and '-'")]
    TopicCharacter {
        /// The name.
        topic: String,
        /// The first character not allowed.
        bad: char,
    },
    /// The consumer name is empty.
    #[error("consumer_name must not be empty")]
    EmptyConsumer,
    /// The consumer name is longer than a store key allows.
    #[error("consumer_name is {length} characters long; at most 253 are allowed")]
    ConsumerTooLong {
        /// Its length in bytes.
        length: usize,
    },
    /// The consumer name holds `/`, a space or a control character.
    #[error(
        "consumer_name {consumer:?} contains {bad:?}; use a name without '/', spaces or control characters"
    )]
    ConsumerCharacter {
        /// The name.
        consumer: String,
        /// The first character not allowed.
        bad: char,
    },
}

/// Why no partition count is known for a topic.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TopicUnknown {
    /// Nothing is stored or configured for it, and there is no Kafka to ask.
    #[error(
        "topic '{topic}' is unknown: no partition count is stored or configured for it \
         (configure it with --topic-partitions {topic}=<count>, or set --kafka-brokers)"
    )]
    NotConfigured {
        /// The topic.
        topic: String,
    },
    /// Kafka says the topic does not exist.
    #[error("topic '{topic}' is unknown: it does not exist in {cluster}")]
    NotInKafka {
        /// The topic.
        topic: String,
        /// The Kafka cluster asked (its brokers).
        cluster: String,
        /// Kafka's answer.
        #[source]
        source: KafkaError,
    },
    /// The static backend has no partition count configured for it.
    #[error(
        "topic '{topic}' is unknown to the static backend: configure its partition count with \
         --topic-partitions {topic}=<count>"
    )]
    NotInStaticConfig {
        /// The topic.
        topic: String,
    },
    /// The store holds no record of the topic: no consumer ever registered for it.
    #[error("topic '{topic}' is unknown: no consumer registered for it")]
    NoConsumers {
        /// The topic.
        topic: String,
    },
}

/// Why a consumer is unknown to the call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConsumerUnknown {
    /// No registration of the consumer exists, in any topic.
    #[error("consumer '{consumer}' is not registered")]
    NotRegistered {
        /// The consumer.
        consumer: String,
    },
    /// `WatchEpochs` on an instance where the consumer has no stream for the topic.
    #[error(
        "consumer '{consumer}' has no registration for topic '{topic}' on this assigner instance: \
         call Register first, on the instance you ask for its epochs"
    )]
    NotRegisteredHere {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// `WatchEpochs` on the static backend without an open registration for the topic.
    #[error(
        "consumer '{consumer}' has no registration for topic '{topic}' on this assigner instance: \
         call Register first"
    )]
    NotRegisteredStatic {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// The consumer's registration for the topic ended while the call was starting.
    #[error("consumer '{consumer}' of topic '{topic}' just left this assigner instance; register again")]
    JustLeft {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// The static assignment has no entry for the consumer.
    #[error("consumer '{consumer}' is not covered by the static assignment")]
    NotInStaticAssignment {
        /// The consumer.
        consumer: String,
    },
    /// The explicit static assignment gives the consumer no partition of the topic.
    #[error("consumer '{consumer}' has no partitions of topic '{topic}' in {var}", var = ASSIGNMENT_VAR)]
    NoStaticPartitions {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// A round-robin member's name must end in its number.
    #[error(
        "consumer '{consumer}' has no number at the end of its name, so it is no member \
         of the round-robin assignment ({var}={members}); name consumers like pod-0 .. pod-{last}",
        var = MEMBERS_VAR,
        last = .members - 1
    )]
    NoOrdinal {
        /// The consumer.
        consumer: String,
        /// The configured member count (at least 1).
        members: u32,
    },
    /// The consumer's number is past the round-robin member count.
    #[error(
        "consumer '{consumer}' is member {member}, but {var}={members} (members 0 to {last})",
        var = MEMBERS_VAR,
        last = .members - 1
    )]
    MemberOutOfRange {
        /// The consumer.
        consumer: String,
        /// The number its name ends in.
        member: u32,
        /// The configured member count (at least 1).
        members: u32,
    },
}

/// A backend that moves no partitions by handoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandoffFreeBackend {
    /// The fleet backend: consumers claim and give back partitions themselves.
    #[error(
        "fleet backend performs no handoffs: partitions are claimed and given back directly \
         (AssignmentUpdate), so there is nothing to be ready for or to release"
    )]
    Fleet,
    /// The static backend: partitions never move.
    #[error(
        "static backend performs no handoffs: partitions never move, so there is nothing to be ready \
         for or to release"
    )]
    Static,
}

/// What kept changing under a call until it gave up (retrying may succeed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Contention {
    /// The consumer's ownerships changed while a registration raised their epochs.
    #[error("consumer '{consumer}' changed ownership while its epochs were raised; retry")]
    EpochsRaised {
        /// The consumer.
        consumer: String,
    },
    /// Another instance kept writing the consumer's registration at the same time.
    #[error("consumer '{consumer}' is being registered concurrently elsewhere; retry")]
    RegisteredElsewhere {
        /// The consumer.
        consumer: String,
    },
    /// The topic's record kept changing.
    #[error("topic '{topic}' config kept changing; retry")]
    TopicConfig {
        /// The topic.
        topic: String,
    },
    /// The consumer's records kept changing (a Deregister).
    #[error("consumer '{consumer}' kept changing; retry")]
    Consumer {
        /// The consumer.
        consumer: String,
    },
    /// The partition's records kept changing while a handoff call was applied.
    #[error("partition {partition} of topic '{topic}' kept changing while applying the call; retry")]
    Partition {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
}

/// Why this instance has no live store session to serve a call with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionMissing {
    /// The store granted none within one TTL of the call.
    #[error("the store did not grant this instance a session within one TTL")]
    NotGranted,
    /// The session is lost or fenced.
    #[error(
        "assigner instance '{instance}' has no live session with its store right now; reconnect to another instance"
    )]
    NotLive {
        /// This instance's id.
        instance: String,
    },
    /// The session ended while the consumer's registration was being written.
    #[error(
        "assigner instance '{instance}' lost contact with its store while registering consumer '{consumer}'; \
         reconnect to another instance"
    )]
    LostWhileRegistering {
        /// This instance's id.
        instance: String,
        /// The consumer.
        consumer: String,
    },
}

/// How a consumer's stream was ended by this instance; [`cause`](Self::cause) is the
/// metric's label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndOfStream {
    /// The instance is shutting down.
    #[error("assigner instance '{instance}' is shutting down; reconnect to another instance")]
    Shutdown {
        /// This instance's id.
        instance: String,
    },
    /// The store lost the registration and it could not be written again.
    #[error(
        "the registration of consumer '{consumer}' on topic '{topic}' was lost and could not be written \
         again; register again"
    )]
    RegistrationExpired {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// The instance stopped as if it had crashed.
    #[error("assigner instance crashed")]
    Crashed,
    /// The instance fenced itself.
    #[error("{0}; stop processing and reconnect to another instance")]
    Fenced(Fence),
}

impl EndOfStream {
    /// Which kind of end this is.
    pub fn cause(&self) -> super::StreamEnd {
        use super::StreamEnd;
        match self {
            EndOfStream::Shutdown { .. } => StreamEnd::Shutdown,
            EndOfStream::RegistrationExpired { .. } => StreamEnd::Expired,
            EndOfStream::Crashed => StreamEnd::Crashed,
            EndOfStream::Fenced(_) => StreamEnd::Fenced,
        }
    }
}

/// Why an instance fenced its streams (docs/design.md §6).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fence {
    /// Its store session (the instance lease) could not be kept alive.
    #[error("assigner instance '{instance}' lost contact with its store")]
    SessionLost {
        /// This instance's id.
        instance: String,
    },
    /// Its relay cannot follow the store (`shared/upkeep.rs`).
    #[error(
        "assigner instance '{instance}' lost contact with its store (it cannot follow it: its watch and reads fail)"
    )]
    CannotFollow {
        /// This instance's id.
        instance: String,
    },
}

/// How a consumer was seen not to read its stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReadingStream {
    /// Its command buffer filled up.
    #[error(
        "consumer '{consumer}' of topic '{topic}' is not reading its stream ({buffer} commands \
         waiting): the stream is ended; its partitions are kept for the session TTL, reconnect to resume",
        buffer = STREAM_BUFFER
    )]
    BufferFull {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
    /// It did not take the command to give partitions back (fleet backend).
    #[error(
        "consumer '{consumer}' of topic '{topic}' is not reading its stream ({stall}) while it must be told to stop \
         partitions {partitions:?}: the stream is ended; its partitions are kept for the session TTL, reconnect to resume"
    )]
    GivingBack {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// The partitions it had to give back.
        partitions: Vec<u32>,
        /// What it failed to do.
        stall: GiveBackStall,
    },
}

/// What a consumer failed to do with a give-back command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GiveBackStall {
    /// The command did not fit in its stream's buffer.
    #[error("its stream buffer is full")]
    BufferFull,
    /// The command was not taken within the bound.
    #[error("it did not take a command for {waited:?}")]
    NotTaken {
        /// How long it was given.
        waited: Duration,
    },
}
