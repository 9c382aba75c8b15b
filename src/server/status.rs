//! Where coordinator errors become gRPC: the status code each cause is answered with,
//! the message the consumer is shown, and the `reason` label of an ended stream. The
//! coordinator names causes ([`CoordinatorError`]); only this module knows gRPC codes.

use tonic::{Code, Status};

use crate::coordinator::CoordinatorError;
use crate::handoff::HandoffError;
use crate::kafka::KafkaError;
use crate::store::StoreError;

/// The gRPC status code a [`CoordinatorError`] is answered with.
pub fn code_of(error: &CoordinatorError) -> Code {
    match error {
        CoordinatorError::InvalidName(_) => Code::InvalidArgument,
        CoordinatorError::UnknownTopic(_) | CoordinatorError::UnknownConsumer(_) => Code::NotFound,
        CoordinatorError::NoHandoffs(_) => Code::FailedPrecondition,
        CoordinatorError::NoEpochs => Code::Unimplemented,
        // Retrying the same call may succeed: the race is over, or the consumer's newer
        // stream is the one to use.
        CoordinatorError::Contended(_) | CoordinatorError::Replaced { .. } => Code::Aborted,
        // Passing: the consumer reconnects (here later, or to another instance).
        CoordinatorError::NoSession(_)
        | CoordinatorError::RegistrationLost { .. }
        | CoordinatorError::ShuttingDown
        | CoordinatorError::StreamEnded(_) => Code::Unavailable,
        CoordinatorError::NotReading(_) => Code::ResourceExhausted,
        // Its caller is gone; the code says so should anything still read it.
        CoordinatorError::Abandoned { .. } => Code::Cancelled,
        CoordinatorError::Handoff { source, .. } => match source {
            HandoffError::PartitionOutOfRange { .. } => Code::InvalidArgument,
            HandoffError::UnknownConsumer(_) => Code::NotFound,
            HandoffError::NotWarmingTarget { .. } | HandoffError::NotReleasing { .. } => {
                Code::FailedPrecondition
            }
        },
        // The instance's lease ended under a write bound to it: passing, as `NoSession`.
        CoordinatorError::Store(
            StoreError::Unavailable(_) | StoreError::Closed | StoreError::SessionExpired(_),
        ) => Code::Unavailable,
        CoordinatorError::Store(_) => Code::Internal,
        CoordinatorError::Kafka { source: KafkaError::UnknownTopic(_), .. } => Code::NotFound,
        CoordinatorError::Kafka { .. } => Code::Unavailable,
    }
}

/// Maps a coordinator error to its gRPC status. Store and Kafka failures are logged in
/// full and shown to the consumer without transport internals
/// ([`CoordinatorError::public_message`]).
pub fn to_status(error: CoordinatorError) -> Status {
    if matches!(error, CoordinatorError::Store(_) | CoordinatorError::Kafka { .. }) {
        tracing::warn!(%error, "call failed");
    }
    Status::new(code_of(&error), error.public_message())
}

/// Why a `Register` stream ended with `error`, for `streams_ended_total`: the cause the
/// coordinator named, never the message text.
pub fn stream_end_reason(error: &CoordinatorError) -> &'static str {
    match error {
        CoordinatorError::StreamEnded(end) => end.cause().as_str(),
        CoordinatorError::Replaced { .. } => "replaced",
        other if code_of(other) == Code::Unavailable => "unavailable",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::causes::{
        BadName, ConsumerUnknown, Contention, EndOfStream, Fence, HandoffFreeBackend, NotReadingStream,
        SessionMissing, TopicUnknown,
    };

    fn named(consumer: &str, topic: &str) -> (String, String) {
        (consumer.to_string(), topic.to_string())
    }

    #[test]
    fn stream_ends_are_told_apart_by_cause_not_by_message() {
        let ended = |end: EndOfStream| stream_end_reason(&CoordinatorError::StreamEnded(end));
        let i1 = || "i1".to_string();
        // The fenced end's message mentions neither "expired" nor "shutting down".
        assert_eq!(ended(EndOfStream::Fenced(Fence::SessionLost { instance: i1() })), "fenced");
        assert_eq!(ended(EndOfStream::Fenced(Fence::CannotFollow { instance: i1() })), "fenced");
        assert_eq!(ended(EndOfStream::Shutdown { instance: i1() }), "shutdown");
        let (consumer, topic) = named("a", "t");
        assert_eq!(ended(EndOfStream::RegistrationExpired { consumer, topic }), "expired");
        assert_eq!(ended(EndOfStream::Crashed), "crashed");
        assert_eq!(stream_end_reason(&SessionMissing::NotLive { instance: i1() }.into()), "unavailable");
        let (consumer, topic) = named("a", "t");
        assert_eq!(stream_end_reason(&CoordinatorError::Replaced { consumer, topic }), "replaced");
        let contended = Contention::Consumer { consumer: "replaced".into() };
        assert_eq!(stream_end_reason(&contended.into()), "error");
        let (consumer, topic) = named("a", "t");
        assert_eq!(stream_end_reason(&NotReadingStream::BufferFull { consumer, topic }.into()), "error");
    }

    #[test]
    fn each_cause_has_the_code_the_contract_promises() {
        let (consumer, topic) = named("a", "t");
        let cases: Vec<(CoordinatorError, Code)> = vec![
            (BadName::EmptyTopic.into(), Code::InvalidArgument),
            (TopicUnknown::NotConfigured { topic: topic.clone() }.into(), Code::NotFound),
            (
                TopicUnknown::NotInKafka {
                    topic: topic.clone(),
                    cluster: "k".into(),
                    source: KafkaError::UnknownTopic(topic.clone()),
                }
                .into(),
                Code::NotFound,
            ),
            (ConsumerUnknown::NotRegistered { consumer: consumer.clone() }.into(), Code::NotFound),
            (HandoffFreeBackend::Fleet.into(), Code::FailedPrecondition),
            (HandoffFreeBackend::Static.into(), Code::FailedPrecondition),
            (CoordinatorError::NoEpochs, Code::Unimplemented),
            (Contention::Partition { topic: topic.clone(), partition: 3 }.into(), Code::Aborted),
            (CoordinatorError::Replaced { consumer: consumer.clone(), topic: topic.clone() }, Code::Aborted),
            (SessionMissing::NotGranted.into(), Code::Unavailable),
            (EndOfStream::Crashed.into(), Code::Unavailable),
            (CoordinatorError::ShuttingDown, Code::Unavailable),
            // Passing: the client retries it until the registration is written again.
            (
                CoordinatorError::RegistrationLost { consumer: consumer.clone(), topic: topic.clone() },
                Code::Unavailable,
            ),
            (
                NotReadingStream::BufferFull { consumer: consumer.clone(), topic }.into(),
                Code::ResourceExhausted,
            ),
            (CoordinatorError::Abandoned { consumer }, Code::Cancelled),
            (CoordinatorError::Store(StoreError::Closed), Code::Unavailable),
            (
                CoordinatorError::Store(StoreError::SessionExpired(crate::store::SessionId(7))),
                Code::Unavailable,
            ),
            (CoordinatorError::Store(StoreError::Invalid(crate::store::Malformed::EmptyKey)), Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(to_status(error).code(), code);
        }
    }

    #[test]
    fn messages_are_built_from_the_causes_fields() {
        let status = to_status(
            ConsumerUnknown::MemberOutOfRange { consumer: "pod-5".into(), member: 5, members: 3 }.into(),
        );
        assert_eq!(
            status.message(),
            "consumer 'pod-5' is member 5, but KAFKA_ASSIGNER_STATIC_MEMBERS=3 (members 0 to 2)"
        );
        let fenced = EndOfStream::Fenced(Fence::SessionLost { instance: "i1".into() });
        assert_eq!(
            to_status(fenced.into()).message(),
            "assigner instance 'i1' lost contact with its store; stop processing and reconnect to another instance"
        );
    }

    #[test]
    fn a_write_on_an_expired_instance_lease_tells_the_consumer_to_reconnect() {
        let status =
            to_status(CoordinatorError::Store(StoreError::SessionExpired(crate::store::SessionId(7))));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("reconnect to another instance"), "{}", status.message());
    }
}
