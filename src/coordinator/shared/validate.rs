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
        assert!(validate_topic_name("events.v1_x-y").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_consumer_name("pod-0").is_ok());
        for bad in ["", "a/b", "a b", "a\n", &"x".repeat(254)] {
            assert!(validate_consumer_name(bad).is_err(), "{bad:?}");
        }
    }
}
