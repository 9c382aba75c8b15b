//! `PartitionReady` / `PartitionReleased` (refused), `Deregister` and the status view.

use super::{
    Inner,
    state::{FleetKey, MemberRecord},
};
use crate::coordinator::{
    ConsumerStatusView, CoordinatorError, StatusView, TopicStatus,
    cas::{Rewrite, rewrite_bound},
    validate_consumer_name, validate_topic_name,
};
use crate::proto::v1::DeregisterAction;
use crate::store::StoreError;

/// The fleet moves partitions without handoffs, so there is nothing to be ready for or to
/// release: `FAILED_PRECONDITION` (after the names are checked).
pub(super) fn no_handoffs(consumer: &str, topic: &str, _partition: u32) -> Result<(), CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    Err(CoordinatorError::FailedPrecondition(
        "fleet backend performs no handoffs: partitions are claimed and given back directly \
         (AssignmentUpdate), so there is nothing to be ready for or to release"
            .into(),
    ))
}

/// `Deregister`: marks every registration of `consumer` as leaving. It leaves the fair
/// share at once; the instance holding its stream tells it `unassigned` for everything,
/// ends the stream cleanly and revokes its session, so its leases are free right away.
/// There is nothing to drain: the answer is `SHUTDOWN_NOW`.
pub(super) async fn deregister(inner: &Inner, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
    validate_consumer_name(consumer)?;
    // The store, not the cache: the registration may have been made a moment ago elsewhere.
    let members = inner.store.get_prefix(&inner.keys.all_members()).await?;
    let registrations: Vec<String> = members
        .kvs
        .iter()
        .filter_map(|kv| match inner.keys.parse(&kv.key) {
            Some(FleetKey::Member(_, name)) if name == consumer => Some(kv.key.clone()),
            _ => None,
        })
        .collect();
    if registrations.is_empty() {
        return Err(CoordinatorError::NotFound(format!("consumer '{consumer}' is not registered")));
    }
    for key in registrations {
        mark_leaving(inner, &key, consumer).await?;
    }
    tracing::info!(consumer, "consumer deregistered; its leases are given back");
    Ok(DeregisterAction::ShutdownNow)
}

/// Rewrites one member record with `leaving` set (keeping its session) with compare-and-swap.
async fn mark_leaving(inner: &Inner, key: &str, consumer: &str) -> Result<(), CoordinatorError> {
    let leave = |r: &mut MemberRecord| !std::mem::replace(&mut r.leaving, true);
    match rewrite_bound(&*inner.store, key, |r: &MemberRecord| r.session, leave).await {
        Ok(Rewrite::Written(_) | Rewrite::Unchanged | Rewrite::Gone) => Ok(()),
        Ok(Rewrite::Contended) => {
            Err(CoordinatorError::Aborted(format!("consumer '{consumer}' kept changing; retry")))
        }
        // The session ended meanwhile: its record and leases are gone already.
        Err(StoreError::SessionExpired(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The read-only status view.
pub(super) fn status(inner: &Inner) -> StatusView {
    let cache = inner.mirror.read();
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
                        status: if r.value.leaving { "Leaving" } else { "Active" }.into(),
                        instance: r.value.instance.clone(),
                        partitions: entry.held_by(name).len(),
                    })
                    .collect(),
                owners: (0..count).map(|p| entry.leases.get(&p).map(|o| o.value.clone())).collect(),
                handoffs: vec![],
            }
        })
        .collect();
    StatusView {
        instance: inner.config.instance_id.clone(),
        backend: inner.config.backend.clone(),
        leader: None,
        // `start` returns only once the first snapshot is loaded.
        ready: !inner.shutdown.is_cancelled(),
        topics,
    }
}
