//! This instance's own record, `{prefix}instances/{instance}`, bound to the instance lease.
//!
//! The store deletes it in the same revision as every registration bound to that lease, so
//! its deletion tells the leader that an instance's lease ended: an operator revoked it, a
//! store outage outlived it, or the instance died. In the first two cases the instance is
//! still there and writes its consumers' registrations again on a new lease (`rebind.rs`),
//! or its consumers register again within moments; so the leader treats the registrations
//! that vanished with it as interrupted, not departed, and settles before it moves their
//! partitions (the handoff backend's leader).

use std::time::Duration;

use super::Core;
use super::mirror::MirrorCache;
use crate::store::{Op, SessionId, Txn};

/// The key of `instance`'s record under a backend's `prefix` (which ends with `/`).
pub fn instance_key(prefix: &str, instance: &str) -> String {
    format!("{prefix}instances/{instance}")
}

/// Keeps this instance's record bound to the live instance lease, writing it again each
/// time a new lease is granted, until the instance stops.
pub async fn keep_instance_record<C: MirrorCache, T>(core: &Core<C, T>) {
    let key = instance_key(C::prefix(&core.keys), &core.instance_id);
    let mut lease = core.lease.subscribe();
    let mut written: Option<SessionId> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        let live = lease.borrow_and_update().live();
        if let Some(session) = live.filter(|session| written != Some(*session)) {
            let record = format!("{{\"v\":1,\"instance\":\"{}\"}}", core.instance_id);
            match core.store.txn(Txn::new().then(Op::put_in(&key, record, session))).await {
                Ok(_) => {
                    written = Some(session);
                    backoff = Duration::from_millis(50);
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot write this instance's record; retrying");
                    tokio::select! {
                        _ = core.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                        _ = lease.changed() => {}
                    }
                    backoff = (backoff * 2).min(core.lease_ttl / 4);
                    continue;
                }
            }
        }
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            changed = lease.changed() => if changed.is_err() { return },
        }
    }
}
