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
        CoordinatorError::NoEpochs(_) => Code::Unimplemented,
        // Retrying the same call may succeed: the race is over, or the consumer's newer
        // stream is the one to use.
        CoordinatorError::Contended(_) | CoordinatorError::Replaced(_) => Code::Aborted,
        // Passing: the consumer reconnects (here later, or to another instance).
        CoordinatorError::NoSession(_)
        | CoordinatorError::RegistrationLost(_)
        | CoordinatorError::ShuttingDown
        | CoordinatorError::StreamEnded(..) => Code::Unavailable,
        CoordinatorError::NotReading(_) => Code::ResourceExhausted,
        // Its caller is gone; the code says so should anything still read it.
        CoordinatorError::Abandoned(_) => Code::Cancelled,
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
        CoordinatorError::StreamEnded(why, _) => why.as_str(),
        CoordinatorError::Replaced(_) => "replaced",
        other if code_of(other) == Code::Unavailable => "unavailable",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::StreamEnd;

    #[test]
    fn stream_ends_are_told_apart_by_cause_not_by_message() {
        let ended = |why, text: &str| stream_end_reason(&CoordinatorError::StreamEnded(why, text.into()));
        // The fenced end's message mentions neither "expired" nor "shutting down".
        assert_eq!(ended(StreamEnd::Fenced, "lost contact with its store"), "fenced");
        assert_eq!(ended(StreamEnd::Shutdown, "x"), "shutdown");
        assert_eq!(ended(StreamEnd::Expired, "x"), "expired");
        assert_eq!(ended(StreamEnd::Crashed, "x"), "crashed");
        // A message alone decides nothing.
        assert_eq!(stream_end_reason(&CoordinatorError::NoSession("session expired".into())), "unavailable");
        assert_eq!(stream_end_reason(&CoordinatorError::Replaced("x".into())), "replaced");
        assert_eq!(stream_end_reason(&CoordinatorError::Contended("replaced".into())), "error");
        assert_eq!(stream_end_reason(&CoordinatorError::NotReading("slow".into())), "error");
    }

    #[test]
    fn each_cause_has_the_code_the_contract_promises() {
        let cases = [
            (CoordinatorError::InvalidName("x".into()), Code::InvalidArgument),
            (CoordinatorError::UnknownTopic("x".into()), Code::NotFound),
            (CoordinatorError::UnknownConsumer("x".into()), Code::NotFound),
            (CoordinatorError::NoHandoffs("x".into()), Code::FailedPrecondition),
            (CoordinatorError::NoEpochs("x".into()), Code::Unimplemented),
            (CoordinatorError::Contended("x".into()), Code::Aborted),
            (CoordinatorError::ShuttingDown, Code::Unavailable),
            // Passing: the client retries it until the registration is written again.
            (CoordinatorError::RegistrationLost("x".into()), Code::Unavailable),
            (CoordinatorError::NotReading("x".into()), Code::ResourceExhausted),
            (CoordinatorError::Store(StoreError::Closed), Code::Unavailable),
            (
                CoordinatorError::Store(StoreError::SessionExpired(crate::store::SessionId(7))),
                Code::Unavailable,
            ),
            (CoordinatorError::Store(StoreError::Invalid("x".into())), Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(to_status(error).code(), code);
        }
    }

    #[test]
    fn a_write_on_an_expired_instance_lease_tells_the_consumer_to_reconnect() {
        let status =
            to_status(CoordinatorError::Store(StoreError::SessionExpired(crate::store::SessionId(7))));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("reconnect to another instance"), "{}", status.message());
    }
}
