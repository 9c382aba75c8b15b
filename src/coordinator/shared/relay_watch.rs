//! An instance that cannot relay fences its streams, as when it loses its lease.
//!
//! The instance lease is kept on a connection of its own (`lease.rs`), so the lease can
//! stay alive while the watch, or the re-read that closes its gap, fails. The consumers of
//! this instance would then hear nothing of what the others decide: a `PartitionReady`
//! elsewhere flips an owner, and the old owner here is never told `ReleasePartition`.
//! So when the mirror has not followed the store for [`fence_after`] (three quarters of the
//! TTL, the lease's own fencing margin), every stream is fenced (told `unassigned` for
//! everything, ended `UNAVAILABLE`) and no stream is admitted until it follows again.

use std::sync::atomic::Ordering;

use super::Core;
use super::lease::fence_after;
use super::mirror::MirrorCache;
use super::streams::Told;

/// Fences every stream while the relay cannot follow the store for longer than the
/// fencing margin (see the module docs), until the instance stops.
pub async fn fence_while_not_following<C: MirrorCache, T: Told>(core: &Core<C, T>) {
    let mut health = core.mirror.health();
    loop {
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            stale = health.wait_for(|h| !h.following) => if stale.is_err() { return },
        }
        let margin = fence_after(core.lease_ttl);
        let back = tokio::select! {
            _ = core.shutdown.cancelled() => return,
            back = tokio::time::timeout(margin, health.wait_for(|h| h.following)) => back.map(|r| r.is_ok()),
        };
        match back {
            Ok(true) => continue,
            Ok(false) => return,
            Err(_) => {}
        }
        tracing::error!(
            ?margin,
            "this instance cannot follow its store: fencing its consumers (they are told to stop)"
        );
        core.relay_fenced.store(true, Ordering::SeqCst);
        core.streams.fence_all(&format!(
            "assigner instance '{}' lost contact with its store (it cannot follow it: its watch and reads fail)",
            core.instance_id
        ));
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            _ = health.wait_for(|h| h.following) => {}
        }
        core.relay_fenced.store(false, Ordering::SeqCst);
        tracing::info!("this instance follows its store again: it admits streams again");
    }
}
