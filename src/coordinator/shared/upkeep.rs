//! The sweep, a safety net both machines keep: it ends registrations of this instance that
//! no stream holds. Every path that writes a registration also settles it (a stream that
//! ends, a write whose answer was lost, a stream refused after a fence). Should one path
//! still miss a record, it would keep its partitions, and draw warms, until the instance
//! died. So every half TTL the sweep looks for registration records naming this instance
//! whose registration no local stream holds; one still found a TTL and a half later is
//! deleted (compare-and-swap on its registration id) and counted in
//! `kafka_assigner_registrations_swept_total`. A restart hold (`SHUTDOWN_NOW`) is left to
//! its own timer, and nothing is swept while the cache does not follow the store.
//!
//! **An instance that cannot relay fences its streams** ([`stale_fence_due`]), as when it
//! loses its lease: its consumers would hear nothing of what the others decide. So when
//! the cache has not followed the store for [`fence_after`] (three quarters of the TTL, the
//! lease's own fencing margin), every stream is fenced (told `unassigned` for everything,
//! ended `UNAVAILABLE`) and no stream is admitted until it follows again.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

use super::lease::fence_after;
use super::streams::StreamKey;

/// The sweep's state (see the module docs). Pure: the machine hands it the time.
#[derive(Debug)]
pub struct Upkeep {
    ttl: Duration,
    /// Since when the cache has not followed the store; `None` while it follows.
    stale_since: Option<Instant>,
    /// When the sweep looks next.
    next_sweep: Instant,
    /// Registrations no stream held at the last looks, since when.
    /// Ordered, so that a sweep finds them in one order on every run (the simulation
    /// replays a seed exactly).
    orphans: BTreeMap<StreamKey, Instant>,
}

impl Upkeep {
    /// The sweep of an instance with consumer TTL `ttl`, started at `now` with a cache
    /// that follows its store.
    pub fn new(ttl: Duration, now: Instant) -> Self {
        Self { ttl, stale_since: None, next_sweep: now + ttl / 2, orphans: BTreeMap::new() }
    }

    /// The cache's health is now `following`.
    pub fn health(&mut self, following: bool, now: Instant) {
        if following {
            self.stale_since = None;
        } else {
            self.stale_since.get_or_insert(now);
        }
    }

    /// When the sweep looks next.
    pub fn next_sweep(&self) -> Instant {
        self.next_sweep
    }

    /// The registrations to delete, if the sweep is due: `found` lists the registrations
    /// no local stream holds.
    pub fn sweep_due(&mut self, now: Instant, found: impl FnOnce() -> Vec<StreamKey>) -> Vec<StreamKey> {
        if now < self.next_sweep {
            return Vec::new();
        }
        self.next_sweep = now + self.ttl / 2;
        if self.stale_since.is_some() {
            return Vec::new();
        }
        let seen = std::mem::take(&mut self.orphans);
        let mut swept = Vec::new();
        for key in found() {
            let since = seen.get(&key).copied().unwrap_or(now);
            // Past the TTL and a half: the after-disconnect path, due at one TTL, goes
            // first. One whose delete failed is still found, and tried again next time.
            if now.duration_since(since) >= self.ttl * 3 / 2 {
                swept.push(key.clone());
            }
            self.orphans.insert(key, since);
        }
        swept
    }
}

/// Whether an instance whose cache has not followed the store since `since` fences its
/// streams at `now` (pure): once that lasted the lease's fencing margin, [`fence_after`].
pub fn stale_fence_due<At: Copy + Ord + std::ops::Add<Duration, Output = At>>(
    since: At,
    now: At,
    ttl: Duration,
) -> bool {
    if crate::mutation::is_active(crate::mutation::Mutation::StaleRelayNotFenced) {
        return false;
    }
    now >= since + fence_after(ttl)
}

#[cfg(test)]
#[path = "upkeep_tests.rs"]
mod tests;
