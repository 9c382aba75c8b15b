//! The status view of the static backend: the configured assignment, and who is connected.

use super::{Static, StaticAssignment};
use crate::coordinator::{ConsumerStatusView, StatusView, TopicStatus};
use crate::handoff::ConsumerStatus;

/// The read-only status view.
pub(super) fn status(inner: &Static) -> StatusView {
    let config = &inner.config;
    let names = inner.streams.names();
    let topics = config
        .topic_partitions
        .iter()
        .map(|(topic, &count)| {
            let connected: Vec<&str> =
                names.iter().filter(|(t, _)| t == topic).map(|(_, c)| c.as_str()).collect();
            let mut owners: Vec<Option<String>> = vec![None; count as usize];
            match &config.assignment {
                StaticAssignment::Explicit(topics) => {
                    for (consumer, partitions) in topics.get(topic).into_iter().flatten() {
                        for &p in partitions {
                            owners[p as usize] = Some(consumer.clone());
                        }
                    }
                }
                // Round-robin knows members by ordinal only: show the connected ones.
                StaticAssignment::RoundRobin { .. } => {
                    for consumer in &connected {
                        for p in config.assignment.partitions(topic, consumer, count).unwrap_or_default() {
                            owners[p as usize].get_or_insert_with(|| consumer.to_string());
                        }
                    }
                }
            }
            let consumers = connected
                .iter()
                .map(|consumer| ConsumerStatusView {
                    name: consumer.to_string(),
                    status: ConsumerStatus::Active,
                    instance: config.instance_id.clone(),
                    partitions: config.assignment.partitions(topic, consumer, count).map_or(0, |p| p.len()),
                    // No records, so no attributes.
                    zone: None,
                    capacity: 1,
                })
                .collect();
            TopicStatus { topic: topic.clone(), partition_count: count, consumers, owners, handoffs: vec![] }
        })
        .collect();
    StatusView {
        instance: config.instance_id.clone(),
        backend: "static".into(),
        leader: None,
        ready: inner.readiness.get(),
        topics,
    }
}
