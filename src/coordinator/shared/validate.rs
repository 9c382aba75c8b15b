//! Validation of names that arrive from the network, before they reach a store key.

use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::BadName;

/// Kafka's own rules: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(topic: &str) -> Result<(), CoordinatorError> {
    if topic.is_empty() {
        return Err(BadName::EmptyTopic.into());
    }
    if topic.len() > 249 {
        return Err(BadName::TopicTooLong { length: topic.len() }.into());
    }
    if topic == "." || topic == ".." {
        return Err(BadName::DotTopic { topic: topic.to_string() }.into());
    }
    if let Some(bad) = topic.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(BadName::TopicCharacter { topic: topic.to_string(), bad }.into());
    }
    Ok(())
}

/// A consumer name becomes part of a store key: non-empty, at most 253 characters
/// (a Kubernetes pod name fits), printable, no `/`.
pub fn validate_consumer_name(name: &str) -> Result<(), CoordinatorError> {
    if name.is_empty() {
        return Err(BadName::EmptyConsumer.into());
    }
    if name.len() > 253 {
        return Err(BadName::ConsumerTooLong { length: name.len() }.into());
    }
    if let Some(bad) = name.chars().find(|c| *c == '/' || c.is_control() || c.is_whitespace()) {
        return Err(BadName::ConsumerCharacter { consumer: name.to_string(), bad }.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let refused = |result: Result<(), CoordinatorError>| match result {
            Err(CoordinatorError::InvalidName(cause)) => cause,
            other => panic!("expected InvalidName, got {other:?}"),
        };
        assert!(validate_topic_name("events.v1_x-y").is_ok());
        let dot = |topic: &str| BadName::DotTopic { topic: topic.into() };
        let character = |topic: &str, bad| BadName::TopicCharacter { topic: topic.into(), bad };
        let topics = [
            ("", BadName::EmptyTopic),
            (".", dot(".")),
            ("..", dot("..")),
            ("a/b", character("a/b", '/')),
            ("a b", character("a b", ' ')),
            (&"x".repeat(250), BadName::TopicTooLong { length: 250 }),
        ];
        for (bad, cause) in topics {
            assert_eq!(refused(validate_topic_name(bad)), cause, "{bad:?}");
        }
        assert!(validate_consumer_name("pod-0").is_ok());
        let character = |consumer: &str, bad| BadName::ConsumerCharacter { consumer: consumer.into(), bad };
        let consumers = [
            ("", BadName::EmptyConsumer),
            ("a/b", character("a/b", '/')),
            ("a b", character("a b", ' ')),
            ("a\n", character("a\n", '\n')),
            (&"x".repeat(254), BadName::ConsumerTooLong { length: 254 }),
        ];
        for (bad, cause) in consumers {
            assert_eq!(refused(validate_consumer_name(bad)), cause, "{bad:?}");
        }
    }
}
