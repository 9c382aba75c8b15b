//! Registrations the store lost while their streams are open are written again.
//!
//! The store deletes every registration bound to the instance lease when that lease
//! expires. Normally this instance has fenced itself before (`lease.rs`), ending those
//! streams. If the store expires the lease early (an operator revoked it, the store's clock
//! ran ahead, a restore from a backup), the streams are still open. The relay then marks
//! each of them lost (the relay model's [`Registration::Lost`]) and keeps relaying it, and the
//! instance's loop writes its registration again, with the same registration id, bound to the
//! instance's new lease, only where no other registration took the name meanwhile
//! (compare-and-swap on absence), as the record said when this instance last saw it (a
//! draining consumer still drains). The stream does not end and the consumer is told nothing
//! for it: the relay's diff tells it only what really changed (a partition the leader gave
//! away meanwhile is `unassigned`). A stream whose registration could not be written again
//! within one TTL ends with `UNAVAILABLE`.
//!
//! [`Registration::Lost`]: super::relay::Registration::Lost

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream};

use super::Core;
use super::mirror::MirrorCache;
use super::registrar::Registrar;
use super::streams::{EndReason, StreamKey, replaced_error};
use crate::coordinator::CoordinatorError;
use crate::store::{SessionId, StoreError};

/// Lost registrations written again at once.
const REWRITES_IN_FLIGHT: usize = 32;

/// Rewrites every lost stream's registration, retrying with backoff, until none is lost.
/// The instance's loop runs it when its relay found some (`upkeep.rs`).
pub async fn rewrite_all<R: Registrar>(backend: &Arc<R>) {
    let core = backend.core();
    let mut backoff = Duration::from_millis(50);
    loop {
        let lost = expire_the_oldest(core);
        if lost.is_empty() || core.shutdown.is_cancelled() {
            return;
        }
        let Some(lease) = live_lease(core).await else { continue };
        let written = stream::iter(lost)
            .map(|key| async move {
                let kept = core.streams.with(&key, |s| s.kept.as_ref().map(|kept| kept.1.clone()));
                let kept = kept.flatten();
                let result = super::registration::rewrite_lost(&**backend, &key, kept, lease).await;
                (key, result)
            })
            .buffer_unordered(REWRITES_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        let mut failed = None;
        for (key, result) in written {
            match result {
                Ok(Some(revision)) => rebound(backend, key, revision),
                Ok(None) => {
                    // Registered again elsewhere meanwhile: that registration wins.
                    core.streams.with(&key, |s| s.farewell(&key.0));
                    core.streams.end(&key, EndReason::Replaced, Some(replaced_error(&key.0, &key.1)));
                }
                Err(error) => failed = Some(error),
            }
        }
        let Some(error) = failed else { continue };
        if let StoreError::SessionExpired(_) = error {
            // The lease task has not noticed yet: make it look now, and wait for the next.
            core.lease_check.notify_one();
            wait_for_another_lease(core, lease).await;
        } else {
            tracing::warn!(%error, "cannot write lost registrations again; retrying");
            tokio::select! {
                _ = core.shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(core.lease_ttl / 4);
        }
    }
}

/// Ends the lost streams that could not be written again within one TTL; returns the rest.
fn expire_the_oldest<C: MirrorCache, T: super::streams::Told>(core: &Core<C, T>) -> Vec<StreamKey> {
    let mut left = Vec::new();
    for (key, since) in core.streams.lost() {
        if since.elapsed() < core.lease_ttl {
            left.push(key);
            continue;
        }
        let (topic, consumer) = (&key.0, &key.1);
        tracing::warn!(topic, consumer, "the lost registration could not be written again within a TTL");
        let error =
            CoordinatorError::StreamEnded(crate::coordinator::causes::EndOfStream::RegistrationExpired {
                consumer: consumer.to_string(),
                topic: topic.to_string(),
            });
        core.streams.with(&key, |s| s.farewell(topic));
        core.streams.end(&key, EndReason::Expired, Some(error));
    }
    left
}

/// The lost stream `key` has its registration again, written at `revision`, unless the
/// mirror already saw that record deleted (the new session revoked too, its watch events
/// ahead of this answer): then it stays lost and is written again on the next turn.
fn rebound<R: Registrar>(backend: &Arc<R>, key: StreamKey, revision: crate::store::Revision) {
    let core = backend.core();
    let gone_again = {
        let cache = core.mirror.read();
        cache.revision() >= revision && backend.cached_registration(&cache, &key.0, &key.1) == Some(0)
    };
    if gone_again && core.streams.contains(&key) {
        tracing::info!(topic = %key.0, consumer = %key.1, revision, "lost registration written again, and lost again");
        return;
    }
    let held = core.streams.with(&key, |s| {
        s.lost_since = None;
        s.registered_at = revision;
    });
    if held.is_some() {
        tracing::info!(topic = %key.0, consumer = %key.1, revision, "lost registration written again");
        return;
    }
    // The consumer went away meanwhile: settle the record as after any disconnect.
    core.depart(key, revision);
}

/// The live instance lease, waiting up to a quarter TTL for one (`None` if there is none
/// by then, or the instance stops).
async fn live_lease<C: MirrorCache, T>(core: &Core<C, T>) -> Option<SessionId> {
    let mut lease = core.lease.subscribe();
    let wait = lease.wait_for(|s| s.live().is_some());
    tokio::select! {
        _ = core.shutdown.cancelled() => None,
        live = tokio::time::timeout(core.lease_ttl / 4, wait) => live.ok()?.ok()?.live(),
    }
}

/// Waits (up to a quarter TTL) until the instance lease is no longer `lease`.
async fn wait_for_another_lease<C: MirrorCache, T>(core: &Core<C, T>, lease: SessionId) {
    let mut state = core.lease.subscribe();
    let wait = state.wait_for(|s| s.live() != Some(lease));
    tokio::select! {
        _ = core.shutdown.cancelled() => {}
        _ = tokio::time::timeout(core.lease_ttl / 4, wait) => {}
    }
}
