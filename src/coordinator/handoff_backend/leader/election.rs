//! Leader election: campaign for the leader key with this instance's session, keep the
//! session alive, step down when the key is gone or another election replaced it, and
//! resign on shutdown.

use std::time::Duration;

use super::{Fence, Handoff, Leadership};
use crate::store::{Compare, Op, StoreError, Txn};

/// Grants the instance session if there is none, and keeps it alive every period.
pub(super) async fn keep_session(
    inner: &Handoff,
    me: &mut Leadership,
    next: &mut tokio::time::Instant,
) -> Result<(), StoreError> {
    let core = &inner.core;
    let every: Duration = core.keep_alive_period();
    match me.session {
        None => {
            me.session = Some(core.store.grant_session(core.lease_ttl).await?);
            *next = tokio::time::Instant::now() + every;
        }
        Some(session) if tokio::time::Instant::now() >= *next => {
            *next = tokio::time::Instant::now() + every;
            if let Err(error) = core.store.keep_alive(session).await {
                if matches!(error, StoreError::SessionExpired(_)) {
                    me.session = None;
                    step_down(inner, me, "instance session expired");
                }
                return Err(error);
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// Gives up leadership (if held) and what only a leader keeps.
pub(super) fn step_down(inner: &Handoff, me: &mut Leadership, why: &str) {
    if inner.leadership.send_replace(None).is_some() {
        me.cooldowns.clear();
        if let Some(refresh) = me.refresh.take() {
            refresh.abort();
        }
        tracing::warn!(instance = %inner.config.instance_id, why, "leadership lost");
    }
}

/// Steps down when the cache shows the leader key gone or re-created by someone else.
pub(super) fn check_leadership(inner: &Handoff, me: &mut Leadership) {
    let Some(fence) = inner.fence() else { return };
    let cache = inner.core.mirror.read();
    if cache.revision < fence.revision {
        return; // our own election is not in the cache yet
    }
    let ours = cache.leader.as_ref().is_some_and(|kv| kv.create_revision == fence.revision);
    drop(cache);
    if !ours {
        step_down(inner, me, "leader key changed");
    }
}

/// Creates the leader key bound to our session if nobody holds it.
pub(super) async fn campaign(inner: &Handoff, me: &mut Leadership) {
    let Some(session) = me.session else { return };
    if inner.core.mirror.read().leader.is_some() {
        return;
    }
    let key = inner.core.keys.leader();
    let txn = Txn::new().when(Compare::CreateRevision(key.clone(), 0)).then(Op::put_in(
        &key,
        inner.config.instance_id.as_bytes().to_vec(),
        session,
    ));
    match inner.core.store.txn(txn).await {
        Ok(outcome) if outcome.succeeded => {
            me.written = outcome.revision;
            me.next_refresh = None; // a new leader refreshes at once
            inner.leadership.send_replace(Some(Fence { session, revision: outcome.revision }));
            tracing::info!(instance = %inner.config.instance_id, revision = outcome.revision, "leadership won");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "campaign failed"),
    }
}

/// After a refused transaction: was it a stale read, or were we deposed?
pub(super) async fn still_leading(inner: &Handoff, me: &mut Leadership, fence: Fence) {
    match inner.core.store.get(&inner.core.keys.leader()).await {
        Ok(Some(kv)) if kv.create_revision == fence.revision => {
            tracing::debug!("reconcile raced a concurrent change; will retry on the next revision");
        }
        Ok(_) => step_down(inner, me, "deposed: leader key belongs to another election"),
        Err(error) => tracing::warn!(%error, "cannot check leadership"),
    }
}

/// Gives up leadership on shutdown (deletes our leader key if it is still ours), so
/// another instance takes over at once instead of after the TTL.
pub(in crate::coordinator::handoff_backend) async fn resign(inner: &Handoff) {
    let Some(fence) = inner.leadership.send_replace(None) else { return };
    let key = inner.core.keys.leader();
    let txn = Txn::new().when(Compare::CreateRevision(key.clone(), fence.revision)).then(Op::delete(&key));
    let _ = inner.core.store.txn(txn).await;
    tracing::info!(instance = %inner.config.instance_id, "resigned leadership");
}
