//! A safety net: registrations of this instance that nobody holds a stream for are ended.
//!
//! Every path that writes a registration also settles it (`register.rs`: a stream that
//! ends, a write whose answer was lost, a stream refused after a fence). Should one path
//! still miss a record, it would keep its partitions, and draw warms, until the instance
//! died. So every half TTL the sweep looks for registration records naming this instance
//! whose registration no local stream holds; one still found a TTL and a half later is deleted
//! (compare-and-swap on its registration id) and counted in
//! `kafka_assigner_registrations_swept_total`. A restart hold (`SHUTDOWN_NOW`) is left to
//! its own timer, and nothing is swept while the cache does not follow the store.

use std::{collections::HashMap, sync::Arc};

use tokio::time::Instant;

use super::registrar::{Held, Registrar};
use super::streams::StreamKey;

/// Sweeps `backend`'s orphaned registrations until the instance stops (module docs).
pub async fn sweep_orphans<R: Registrar>(backend: Arc<R>) {
    let core = backend.core();
    let period = core.lease_ttl / 2;
    let mut orphans: HashMap<StreamKey, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        if !core.mirror.health().borrow().following {
            continue;
        }
        let found: Vec<StreamKey> = {
            let cache = core.mirror.read();
            backend
                .registrations_of(&cache, &core.instance_id)
                .into_iter()
                .filter(|key| !core.streams.holds(key) && backend.held(&cache, key) == Held::ForTtl)
                .collect()
        };
        let now = Instant::now();
        let mut kept = HashMap::with_capacity(found.len());
        for key in found {
            let since = orphans.get(&key).copied().unwrap_or(now);
            // Past the TTL and a half: the after-disconnect path, due at one TTL, goes first.
            if now.duration_since(since) < core.lease_ttl * 3 / 2 {
                kept.insert(key, since);
                continue;
            }
            match super::registration::delete(&*backend, &key).await {
                Ok(true) => {
                    tracing::warn!(topic = %key.0, consumer = %key.1, "swept a registration no stream held");
                    core.metrics.registrations_swept.inc();
                }
                // Its own path ended it meanwhile.
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, topic = %key.0, consumer = %key.1, "cannot sweep a registration; later");
                    kept.insert(key, since);
                }
            }
        }
        orphans = kept;
    }
}
