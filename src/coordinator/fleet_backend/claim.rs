//! The claim step that runs beside each local consumer's stream: give back what exceeds
//! its fair share, claim free leases up to it ([`super::share`]), on every change and on a
//! timer. Also the periodic Kafka topic refresh of the fleet backend.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Fleet;
use super::records::LeaseRecord;
use super::share;
use crate::coordinator::shared::{
    records::{RECORD_VERSION, encode},
    streams::StreamKey,
    wire::update,
};
use crate::store::{Compare, Op, Revision, StoreError, Txn};

/// Runs the consumer's claim step on every change and every claim interval, until
/// `done` (the stream's session task ended).
pub(super) async fn claim_task(
    inner: Arc<Fleet>,
    key: StreamKey,
    registered_at: Revision,
    done: CancellationToken,
) {
    let mut claim_timer = tokio::time::interval(inner.config.claim_interval);
    claim_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changed = inner.core.mirror.subscribe();
    // The claim step acts only on a cache that has seen its own last write.
    let mut seen = registered_at;
    loop {
        tokio::select! {
            biased;
            _ = done.cancelled() => return,
            result = changed.changed() => if result.is_err() { return },
            _ = claim_timer.tick() => {}
        }
        match claim_step(&inner, &key, registered_at, &mut seen).await {
            Ok(()) => {}
            // The instance lease ended: the lease task starts a new one (and the stream's
            // registration is written again, `shared/rebind.rs`); the next step claims.
            Err(StoreError::SessionExpired(_)) => {}
            Err(error) => {
                tracing::warn!(%error, topic = %key.0, consumer = %key.1, "claim step failed; retrying")
            }
        }
    }
}

/// Every topic refresh interval, asks Kafka for the counts of the stored topics and grows
/// those that grew (compare-and-swap: growth is monotonic, so any instance may do it).
pub(super) async fn refresh_topics(inner: Arc<Fleet>) {
    if inner.core.topics.source.is_none() {
        return;
    }
    loop {
        tokio::select! {
            _ = inner.core.shutdown.cancelled() => return,
            _ = tokio::time::sleep(inner.config.topic_refresh_interval) => {}
        }
        inner.core.grow_topics(None, || !inner.core.shutdown.is_cancelled()).await;
    }
}

/// One claim step of a local consumer: give back what exceeds its fair share, claim free
/// leases up to it. Acts on the cache, writes with compare-and-swap; a write that loses a
/// race changes nothing, and the watch delivery of whatever won triggers the next step.
async fn claim_step(
    inner: &Arc<Fleet>,
    key: &StreamKey,
    registered_at: Revision,
    seen: &mut Revision,
) -> Result<(), StoreError> {
    let (topic, consumer, registration) = key;
    let Some(instance_lease) = inner.core.lease.borrow().live() else { return Ok(()) };
    let (plan, revisions) = {
        let cache = inner.core.mirror.read();
        if cache.revision < *seen {
            return Ok(()); // our last write is not in the cache yet
        }
        let Some(entry) = cache.topics.get(topic) else { return Ok(()) };
        let ours = entry
            .members
            .get(consumer)
            .is_some_and(|r| r.value.session == registration.0 && !r.value.leaving);
        if !ours || !inner.core.streams.contains(key) {
            return Ok(()); // not registered yet, leaving, or replaced: the relay handles it
        }
        let owners = entry.leases.iter().map(|(p, o)| (*p, o.value.as_str())).collect();
        let live = entry.live();
        let registered = |name: &str| entry.members.contains_key(name);
        let Some(plan) = share::share_of(entry.partition_count(), &live, registered, consumer, &owners)
        else {
            return Ok(());
        };
        let revisions: Vec<(u32, Revision)> =
            plan.give_back.iter().chain(&plan.claim).map(|p| (*p, entry.lease_revision(*p))).collect();
        (plan, revisions)
    };
    let revision_of = |p: u32| revisions.iter().find(|(q, _)| *q == p).map_or(0, |(_, r)| *r);

    if !plan.give_back.is_empty() {
        // Tell the consumer first, then free the leases: it has stopped before anyone can
        // claim them.
        unassign_locally(inner, key, &plan.give_back);
        let batch = |ps: &[u32]| {
            ps.iter().fold(Txn::new(), |txn, p| {
                let lease = inner.core.keys.lease(topic, *p);
                txn.when(Compare::ModRevision(lease.clone(), revision_of(*p))).then(Op::delete(lease))
            })
        };
        let mut kept = Vec::new();
        let outcome = inner.core.store.txn(batch(&plan.give_back)).await?;
        if outcome.succeeded {
            *seen = outcome.revision;
        } else {
            for p in &plan.give_back {
                let outcome = inner.core.store.txn(batch(&[*p])).await?;
                if outcome.succeeded {
                    *seen = outcome.revision;
                } else {
                    kept.push(*p);
                }
            }
        }
        tracing::info!(topic, consumer, partitions = ?plan.give_back, quota = plan.quota, "leases given back");
        if !kept.is_empty() {
            // The lease changed under us (it cannot be ours any more, or it is and the
            // relay will tell the consumer again): stop hiding it from the view.
            inner.core.streams.with(key, |stream| stream.told.releasing.retain(|p| !kept.contains(p)));
            let cache = inner.core.mirror.read();
            let mut changes = super::super::shared::mirror::Changes::default();
            changes.consumers(topic, [consumer.as_str()]);
            super::relay::relay(inner, &cache, &changes);
        }
    }

    if !plan.claim.is_empty() {
        let member = inner.core.keys.member(topic, consumer);
        let record = encode(&LeaseRecord { v: RECORD_VERSION, owner: consumer.clone() });
        let batch = |ps: &[u32]| {
            ps.iter().fold(Txn::new().when(Compare::ModRevision(member.clone(), registered_at)), |txn, p| {
                let lease = inner.core.keys.lease(topic, *p);
                txn.when(Compare::ModRevision(lease.clone(), revision_of(*p))).then(Op::put_in(
                    lease,
                    record.clone(),
                    instance_lease,
                ))
            })
        };
        let mut claimed = Vec::new();
        let outcome = inner.core.store.txn(batch(&plan.claim)).await?;
        if outcome.succeeded {
            *seen = outcome.revision;
            claimed.clone_from(&plan.claim);
        } else {
            // Someone else claimed one of them first: take the others one by one.
            for p in &plan.claim {
                let outcome = inner.core.store.txn(batch(&[*p])).await?;
                if outcome.succeeded {
                    *seen = outcome.revision;
                    claimed.push(*p);
                }
            }
        }
        if !claimed.is_empty() {
            tracing::info!(topic, consumer, partitions = ?claimed, quota = plan.quota, "leases claimed");
        }
    }
    Ok(())
}

/// Sends `unassigned` for `partitions` on the consumer's stream now and hides them from
/// its view until their leases are gone.
fn unassign_locally(inner: &Fleet, key: &StreamKey, partitions: &[u32]) {
    inner.core.streams.with(key, |stream| {
        stream.told.releasing.extend(partitions.iter().copied());
        let told: Vec<u32> = partitions.iter().copied().filter(|p| stream.told.owned.remove(p)).collect();
        if stream.activated && !told.is_empty() {
            stream.send([update(&key.0, [], told)]);
        }
    });
}
