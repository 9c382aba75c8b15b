//! The status view of the handoff backend.

use super::Handoff;
use crate::coordinator::{ConsumerStatusView, HandoffStatusView, StatusView, TopicStatus};

/// The read-only status view.
pub(super) fn status(inner: &Handoff) -> StatusView {
    let cache = inner.core.mirror().read();
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
        instance: inner.config.instance_id.clone(),
        backend: inner.config.backend.clone(),
        // With leader groups, every instance leading one (there is no single leader).
        leader: Some(cache.leader_names().join(", ")).filter(|names| !names.is_empty()),
        ready: inner.core.readiness().get(),
        topics,
    }
}
