//! How the machine's answer to a consumer's call reads when the store lost the consumer's
//! registration while this instance still holds its stream ([`refusal_while_rewritten`]).

use crate::coordinator::CoordinatorError;
use crate::handoff::HandoffError;

/// A call refused because the store has no registration for its consumer, given whether
/// this instance holds the consumer's stream (`held`; pure). While it does, the store lost
/// the registration and it is being written again, so the refusal is passing, not final
/// (a client gives up on `NOT_FOUND`, and the handoff would wait for its time limit).
pub(super) fn refusal_while_rewritten(
    topic: &str,
    consumer: &str,
    held: bool,
    error: CoordinatorError,
) -> CoordinatorError {
    let unknown =
        matches!(&error, CoordinatorError::Handoff { source: HandoffError::UnknownConsumer(_), .. });
    if !unknown || !held {
        return error;
    }
    CoordinatorError::RegistrationLost { consumer: consumer.to_string(), topic: topic.to_string() }
}
