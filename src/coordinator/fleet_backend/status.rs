//! The status view of the fleet backend.

use super::state::FleetCache;
use crate::coordinator::{ConsumerStatusView, StatusView, TopicStatus};
use crate::handoff::ConsumerStatus;

/// The status view of `cache`, as instance `instance` of backend `backend` sees it
/// (pure).
pub(crate) fn view(cache: &FleetCache, instance: &str, backend: &str, ready: bool) -> StatusView {
    let topics = cache
        .topics
        .iter()
        .filter(|(_, e)| e.count.is_some())
        .map(|(topic, entry)| {
            let count = entry.partition_count();
            TopicStatus {
                topic: topic.clone(),
                partition_count: count,
                consumers: entry
                    .members
                    .iter()
                    .map(|(name, r)| ConsumerStatusView {
                        name: name.clone(),
                        status: if r.value.leaving {
                            ConsumerStatus::Draining
                        } else {
                            ConsumerStatus::Active
                        },
                        instance: r.value.instance.clone(),
                        partitions: entry.held_by(name).len(),
                        zone: r.value.info.zone.clone(),
                        capacity: r.value.info.capacity,
                    })
                    .collect(),
                owners: (0..count).map(|p| entry.leases.get(&p).map(|o| o.value.clone())).collect(),
                handoffs: vec![],
            }
        })
        .collect();
    StatusView { instance: instance.to_string(), backend: backend.to_string(), leader: None, ready, topics }
}
