//! The static assignment, parsed from the environment: pure, no I/O.
//!
//! Two sources, read once at start:
//!
//! * [`ASSIGNMENT_VAR`] (`--static-assignment`): explicit lists, one entry per consumer,
//!   entries separated by `;`, items by `,`, ranges inclusive:
//!
//!   ```text
//!   consumer-0=0-5;consumer-1=6,7,8-11            one topic (the only one in --topic-partitions)
//!   a=events:0-5,orders:0;b=events:6-11,orders:1   topic: prefixes
//!   ```
//!
//!   A `topic:` prefix applies to its item and to the unprefixed items after it in the same
//!   entry (`a=events:0-5,7,orders:0` gives `a` events 0-5 and 7, and orders 0). Items with
//!   no prefix before them belong to the only topic of `--topic-partitions`; with several
//!   topics configured, a prefix is required.
//! * [`MEMBERS_VAR`] (`--static-members`), used when [`ASSIGNMENT_VAR`] is unset:
//!   round-robin. Member `m` of `N` gets every partition `p` with `p % N == m`, of every
//!   topic; a consumer is member `m` when its name ends with the number `m` (`pod-3` → 3,
//!   as StatefulSet pods are named).
//!
//! Anything malformed is an error naming the variable and the bad part, so the server
//! stops at start instead of serving a wrong assignment.

use std::collections::{BTreeMap, BTreeSet};

use crate::coordinator::causes::ConsumerUnknown;
use crate::coordinator::{CoordinatorError, validate_consumer_name, validate_topic_name};

pub use crate::coordinator::causes::{ASSIGNMENT_VAR, MEMBERS_VAR};

/// Partitions by consumer by topic.
pub type ExplicitAssignment = BTreeMap<String, BTreeMap<String, BTreeSet<u32>>>;

/// Which partitions each consumer gets, fixed at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StaticAssignment {
    /// Explicit lists from [`ASSIGNMENT_VAR`]: topic → consumer → partitions.
    Explicit(ExplicitAssignment),
    /// Round-robin over `members` members ([`MEMBERS_VAR`]), by the ordinal at the end of
    /// the consumer name.
    RoundRobin {
        /// The member count (at least 1).
        members: u32,
    },
}

impl StaticAssignment {
    /// Builds the assignment from the two settings (`None` or blank: unset) and the
    /// configured partition counts. The error names the variable and the bad part.
    pub fn from_settings(
        assignment: Option<&str>,
        members: Option<&str>,
        topics: &BTreeMap<String, u32>,
    ) -> Result<Self, String> {
        let assignment = assignment.filter(|a| !a.trim().is_empty());
        let members = members.filter(|m| !m.trim().is_empty());
        if topics.is_empty() {
            return Err("the static backend needs partition counts: set --topic-partitions \
                 (KAFKA_ASSIGNER_TOPIC_PARTITIONS), e.g. events=12"
                .into());
        }
        match (assignment, members) {
            (Some(text), _) => parse_assignment(text, topics)
                .map(StaticAssignment::Explicit)
                .map_err(|e| format!("{ASSIGNMENT_VAR} (--static-assignment): {e}")),
            (None, Some(text)) => parse_members(text)
                .map(|members| StaticAssignment::RoundRobin { members })
                .map_err(|e| format!("{MEMBERS_VAR} (--static-members): {e}")),
            (None, None) => Err(format!(
                "the static backend needs {ASSIGNMENT_VAR} (e.g. \"consumer-0=0-5;consumer-1=6-11\") \
                 or {MEMBERS_VAR} (e.g. 3, for round-robin by the ordinal at the end of the consumer name)"
            )),
        }
    }

    /// The partitions of `topic` (of `count` partitions) that `consumer` gets, or
    /// `NOT_FOUND` naming the consumer when the configuration does not cover it.
    pub fn partitions(
        &self,
        topic: &str,
        consumer: &str,
        count: u32,
    ) -> Result<BTreeSet<u32>, CoordinatorError> {
        match self {
            StaticAssignment::Explicit(topics) => {
                topics.get(topic).and_then(|c| c.get(consumer)).cloned().ok_or_else(|| {
                    CoordinatorError::UnknownConsumer(ConsumerUnknown::NoStaticPartitions {
                        consumer: consumer.to_string(),
                        topic: topic.to_string(),
                    })
                })
            }
            StaticAssignment::RoundRobin { members } => {
                let Some(member) = ordinal(consumer) else {
                    return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::NoOrdinal {
                        consumer: consumer.to_string(),
                        members: *members,
                    }));
                };
                if member >= *members {
                    return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::MemberOutOfRange {
                        consumer: consumer.to_string(),
                        member,
                        members: *members,
                    }));
                }
                Ok((member..count).step_by(*members as usize).collect())
            }
        }
    }

    /// Whether the configuration gives `consumer` partitions of some topic (or could, for
    /// round-robin).
    pub fn covers(&self, consumer: &str) -> bool {
        match self {
            StaticAssignment::Explicit(topics) => topics.values().any(|c| c.contains_key(consumer)),
            StaticAssignment::RoundRobin { members } => ordinal(consumer).is_some_and(|m| m < *members),
        }
    }
}

/// The number at the end of a consumer name (`pod-3` → 3); `None` without one (or when it
/// does not fit a `u32`).
pub fn ordinal(name: &str) -> Option<u32> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    name[name.len() - digits..].parse().ok()
}

fn parse_members(text: &str) -> Result<u32, String> {
    let members: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{}' is not a member count (a positive integer)", text.trim()))?;
    if members == 0 {
        return Err("'0': there must be at least one member".into());
    }
    Ok(members)
}

/// Parses [`ASSIGNMENT_VAR`] (see the module docs); errors name the bad entry or item.
fn parse_assignment(text: &str, topics: &BTreeMap<String, u32>) -> Result<ExplicitAssignment, String> {
    let default_topic = match topics.keys().collect::<Vec<_>>().as_slice() {
        [only] => Some(only.as_str()),
        _ => None,
    };
    let mut result = ExplicitAssignment::new();
    // Who holds each partition already, to refuse overlaps.
    let mut holder: BTreeMap<(&str, u32), &str> = BTreeMap::new();
    let mut consumers = BTreeSet::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, list)) = entry.split_once('=') else {
            return Err(format!("'{entry}' is not consumer=partitions (e.g. consumer-0=0-5)"));
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("'{entry}' has no consumer name before '='"));
        }
        validate_consumer_name(name).map_err(|e| format!("in '{entry}': {e}"))?;
        if !consumers.insert(name) {
            return Err(format!(
                "consumer '{name}' is listed twice (in '{entry}'); give each consumer one entry"
            ));
        }
        if list.trim().is_empty() {
            return Err(format!("'{entry}': consumer '{name}' has no partitions; list some or leave it out"));
        }
        let mut topic: Option<&str> = None;
        for item in list.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(format!("'{entry}' has an empty item (a stray ',')"));
            }
            let range = match item.split_once(':') {
                Some((prefix, range)) => {
                    let prefix = prefix.trim();
                    validate_topic_name(prefix).map_err(|e| format!("in '{entry}', item '{item}': {e}"))?;
                    topic = Some(prefix);
                    range.trim()
                }
                None => item,
            };
            let Some(topic) = topic.or(default_topic) else {
                return Err(format!(
                    "in '{entry}', item '{item}' has no topic: prefix, and --topic-partitions names {} \
                     topics ({}); write e.g. {}:{item}",
                    topics.len(),
                    topics.keys().cloned().collect::<Vec<_>>().join(", "),
                    topics.keys().next().map_or("events", String::as_str),
                ));
            };
            let Some(&count) = topics.get(topic) else {
                return Err(format!(
                    "in '{entry}': topic '{topic}' is not in --topic-partitions \
                     (KAFKA_ASSIGNER_TOPIC_PARTITIONS), so its partition count is unknown"
                ));
            };
            let (first, last) = parse_range(range).map_err(|e| format!("in '{entry}': {e}"))?;
            if last >= count {
                return Err(format!(
                    "in '{entry}': partition {last} is beyond topic '{topic}', which has {count} \
                     partitions (0-{})",
                    count - 1
                ));
            }
            let owned = result.entry(topic.to_string()).or_default().entry(name.to_string()).or_default();
            for partition in first..=last {
                if let Some(other) = holder.insert((topic, partition), name) {
                    return Err(if other == name {
                        format!("in '{entry}': partition {partition} of topic '{topic}' is listed twice")
                    } else {
                        format!(
                            "in '{entry}': partition {partition} of topic '{topic}' is already given to \
                             '{other}' (ranges overlap)"
                        )
                    });
                }
                owned.insert(partition);
            }
        }
    }
    if result.is_empty() {
        return Err(format!("'{text}' lists no consumer (e.g. consumer-0=0-5;consumer-1=6-11)"));
    }
    Ok(result)
}

/// `7` or an inclusive range `0-5`.
fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let number = |s: &str| -> Result<u32, String> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("'{text}' is not a partition number or an inclusive range like 0-5"));
        }
        s.parse().map_err(|_| format!("'{text}': partition number '{s}' is too large"))
    };
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None => {
            let p = number(text)?;
            (p, p)
        }
    };
    if first > last {
        return Err(format!("range '{text}' is reversed; write {last}-{first}"));
    }
    Ok((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(spec: &[(&str, u32)]) -> BTreeMap<String, u32> {
        spec.iter().map(|(t, c)| (t.to_string(), *c)).collect()
    }

    fn explicit(text: &str, spec: &[(&str, u32)]) -> Result<StaticAssignment, String> {
        StaticAssignment::from_settings(Some(text), None, &topics(spec))
    }

    fn set(parts: impl IntoIterator<Item = u32>) -> BTreeSet<u32> {
        parts.into_iter().collect()
    }

    /// Asserts the error names the variable and every one of `mentions`.
    fn refused(result: Result<StaticAssignment, String>, var: &str, mentions: &[&str]) {
        let error = result.expect_err("expected a refusal");
        assert!(error.starts_with(var), "the error must name {var}: {error}");
        for needle in mentions {
            assert!(error.contains(needle), "the error should mention {needle:?}: {error}");
        }
    }

    #[test]
    fn one_topic_lists_and_ranges() {
        let parsed = explicit("consumer-0=0-5;consumer-1=6,7,8-11", &[("events", 12)]).unwrap();
        assert_eq!(parsed.partitions("events", "consumer-0", 12).unwrap(), set(0..=5));
        assert_eq!(parsed.partitions("events", "consumer-1", 12).unwrap(), set(6..=11));
        // Whitespace and a trailing ';' are fine.
        let spaced = explicit(" consumer-0 = 0 - 5 ; consumer-1 = 6, 7,8-11 ;", &[("events", 12)]).unwrap();
        assert_eq!(spaced, parsed);
        assert!(parsed.covers("consumer-1"));
        assert!(!parsed.covers("consumer-2"));
    }

    #[test]
    fn topic_prefixes() {
        let spec = [("events", 12), ("orders", 2)];
        let parsed = explicit("a=events:0-5,7,orders:0;b=events:6,8-11,orders:1", &spec).unwrap();
        assert_eq!(parsed.partitions("events", "a", 12).unwrap(), set([0, 1, 2, 3, 4, 5, 7]));
        assert_eq!(parsed.partitions("orders", "a", 2).unwrap(), set([0]));
        assert_eq!(parsed.partitions("events", "b", 12).unwrap(), set([6, 8, 9, 10, 11]));
        assert_eq!(parsed.partitions("orders", "b", 2).unwrap(), set([1]));
        // A consumer with partitions of one topic only is not found on the other.
        let parsed = explicit("a=events:0-11;b=orders:0-1", &spec).unwrap();
        let err = parsed.partitions("orders", "a", 2).unwrap_err();
        let expected = ConsumerUnknown::NoStaticPartitions { consumer: "a".into(), topic: "orders".into() };
        assert!(matches!(&err, CoordinatorError::UnknownConsumer(cause) if *cause == expected), "{err:?}");
        // With one topic configured, the prefix is optional.
        assert_eq!(explicit("a=events:0-1", &[("events", 2)]), explicit("a=0-1", &[("events", 2)]));
    }

    #[test]
    fn bad_assignments_name_the_variable_and_the_bad_part() {
        let one = [("events", 12)];
        let v = ASSIGNMENT_VAR;
        // Overlapping ranges, across consumers and within one.
        refused(explicit("a=0-5;b=5-11", &one), v, &["b=5-11", "partition 5", "'a'", "overlap"]);
        refused(explicit("a=0-5,3", &one), v, &["a=0-5,3", "partition 3", "listed twice"]);
        // A partition beyond the topic's count.
        refused(explicit("a=0-5;b=6-12", &one), v, &["b=6-12", "partition 12", "12 partitions", "0-11"]);
        refused(explicit("a=12", &one), v, &["partition 12"]);
        // Garbage.
        for garbage in ["a=x", "a=0-", "a=-3", "a=1-2-3", "a=0..5", "a=+1", "a=5 6"] {
            let item = garbage.trim_start_matches("a=");
            refused(explicit(garbage, &one), v, &[item, "not a partition number"]);
        }
        refused(explicit("hello", &one), v, &["'hello'", "consumer=partitions"]);
        refused(explicit("a=0-99999999999", &one), v, &["too large"]);
        refused(explicit(";;", &one), v, &["lists no consumer"]);
        // Empty consumer name, empty list, empty item.
        refused(explicit("=0-5", &one), v, &["'=0-5'", "no consumer name"]);
        refused(explicit("a=", &one), v, &["'a='", "no partitions"]);
        refused(explicit("a=0,,1", &one), v, &["'a=0,,1'", "empty item"]);
        // A consumer listed twice.
        refused(explicit("a=0-5;a=6-11", &one), v, &["'a'", "listed twice"]);
        // A reversed range.
        refused(explicit("a=5-3", &one), v, &["'5-3'", "reversed", "3-5"]);
        // A bad consumer or topic name.
        refused(explicit("a b=0", &one), v, &["consumer_name"]);
        refused(explicit("a=ev/ents:0", &one), v, &["ev/ents"]);
        // A topic without a partition count, and a missing prefix with several topics.
        refused(explicit("a=orders:0", &one), v, &["'orders'", "--topic-partitions"]);
        refused(explicit("a=0-1", &[("events", 2), ("orders", 2)]), v, &["'0-1'", "no topic: prefix"]);
    }

    #[test]
    fn round_robin_by_ordinal() {
        let spec = topics(&[("events", 12)]);
        let parsed = StaticAssignment::from_settings(None, Some("3"), &spec).unwrap();
        assert_eq!(parsed, StaticAssignment::RoundRobin { members: 3 });
        assert_eq!(parsed.partitions("events", "pod-0", 12).unwrap(), set([0, 3, 6, 9]));
        assert_eq!(parsed.partitions("events", "consumer-2", 12).unwrap(), set([2, 5, 8, 11]));
        assert_eq!(parsed.partitions("events", "pod-1", 2).unwrap(), set([1]));
        assert!(parsed.partitions("events", "pod-2", 2).unwrap().is_empty());
        // Beyond the member count, and no ordinal at all: NOT_FOUND naming the consumer.
        for name in ["pod-3", "pod", "pod-99999999999"] {
            let err = parsed.partitions("events", name, 12).unwrap_err();
            let named = matches!(&err,
                CoordinatorError::UnknownConsumer(
                    ConsumerUnknown::NoOrdinal { consumer, members: 3 }
                    | ConsumerUnknown::MemberOutOfRange { consumer, members: 3, .. }
                ) if consumer == name);
            assert!(named, "{name}: {err:?}");
        }
        assert!(parsed.covers("pod-2") && !parsed.covers("pod-3") && !parsed.covers("pod"));
        assert_eq!(ordinal("web-12"), Some(12));
        assert_eq!(ordinal("web12"), Some(12));
        assert_eq!(ordinal("web-"), None);
    }

    #[test]
    fn bad_members_and_missing_settings() {
        let spec = topics(&[("events", 12)]);
        let members = |text: &str| StaticAssignment::from_settings(None, Some(text), &spec);
        refused(members("0"), MEMBERS_VAR, &["'0'", "at least one"]);
        refused(members("three"), MEMBERS_VAR, &["'three'", "not a member count"]);
        refused(members("-1"), MEMBERS_VAR, &["'-1'"]);
        let err = StaticAssignment::from_settings(None, None, &spec).unwrap_err();
        assert!(err.contains(ASSIGNMENT_VAR) && err.contains(MEMBERS_VAR), "{err}");
        // Blank counts as unset: the other setting is used.
        assert_eq!(
            StaticAssignment::from_settings(Some("  "), Some("2"), &spec).unwrap(),
            StaticAssignment::RoundRobin { members: 2 }
        );
        // The explicit assignment wins over the member count.
        assert!(matches!(
            StaticAssignment::from_settings(Some("a=0"), Some("2"), &spec).unwrap(),
            StaticAssignment::Explicit(_)
        ));
        let err = StaticAssignment::from_settings(Some("a=0"), None, &BTreeMap::new()).unwrap_err();
        assert!(err.contains("--topic-partitions"), "{err}");
    }
}
