//! The status view of the handoff backend.

use super::state::Cache;
use crate::coordinator::{ConsumerStatusView, HandoffStatusView, StatusView, TopicStatus};

/// The status view of `cache`, as instance `instance` of backend `backend` sees it
/// (pure).
pub(crate) fn view(cache: &Cache, instance: &str, backend: &str, ready: bool) -> StatusView {
    let topics = cache
        .topics
        .iter()
        .filter(|(_, e)| e.config.is_some())
        .map(|(topic, entry)| {
            let state = entry.state();
            TopicStatus {
                topic: topic.clone(),
                partition_count: state.partition_count,
                consumers: entry
                    .consumers
                    .iter()
                    .map(|(name, r)| ConsumerStatusView {
                        name: name.clone(),
                        status: r.value.status,
                        instance: r.value.instance.clone(),
                        partitions: state.owners.values().filter(|o| *o == name).count(),
                        zone: r.value.info.zone.clone(),
                        capacity: r.value.info.capacity,
                    })
                    .collect(),
                owners: (0..state.partition_count).map(|p| state.owners.get(&p).cloned()).collect(),
                handoffs: state
                    .handoffs
                    .iter()
                    .map(|(p, h)| HandoffStatusView {
                        partition: *p,
                        from: h.from.clone(),
                        to: h.to.clone(),
                        phase: h.phase,
                        since: h.since,
                    })
                    .collect(),
            }
        })
        .collect();
    StatusView {
        instance: instance.to_string(),
        backend: backend.to_string(),
        // With leader groups, every instance leading one (there is no single leader).
        leader: Some(cache.leader_names().join(", ")).filter(|names| !names.is_empty()),
        ready,
        topics,
    }
}
