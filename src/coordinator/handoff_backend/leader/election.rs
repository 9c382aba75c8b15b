//! Leader election: campaign for the leader key with this instance's lease; step down when
//! the lease is fenced or replaced, or the key is gone or belongs to another election;
//! adopt a key that holds our lease after a lost answer; resign at a graceful stop.

use super::{Fence, Handoff, Leadership, Step, settle};
use crate::store::{Compare, KeyValue, Op, Revision, SessionId, StoreError, Txn, TxnOutcome};

/// Gives up leadership (if held) and what only a leader keeps (the rest of its pass too).
pub(super) fn step_down(inner: &Handoff, me: &mut Leadership, why: &str) {
    if inner.leadership.send_replace(None).is_some() {
        me.cooldowns.clear();
        me.placement.clear();
        me.queue.clear();
        me.refresh_due = None;
        if let Some((_, stop)) = me.refresh.take() {
            stop.cancel();
        }
        tracing::warn!(instance = %inner.config.instance_id, why, "leadership lost");
    }
}

/// Steps down when the instance lease is no longer the live one the key is bound to (it is
/// fenced: the key may expire any moment), or the cache shows the leader key gone or
/// re-created by someone else.
pub(super) fn check_leadership(inner: &Handoff, me: &mut Leadership) {
    let Some(fence) = inner.fence() else { return };
    if inner.core.lease().borrow().live() != Some(fence.session) {
        step_down(inner, me, "the instance session is fenced or was replaced");
        return;
    }
    let cache = inner.core.mirror().read();
    if cache.revision < fence.revision {
        return; // our own election is not in the cache yet
    }
    let ours = cache.leader.as_ref().is_some_and(|kv| kv.create_revision == fence.revision);
    drop(cache);
    if !ours {
        step_down(inner, me, "leader key changed");
    }
}

/// Creates the leader key bound to our lease if nobody holds it (queued as the next step).
/// After an answer that was lost or refused, the key is read ([`adopt`]): one bound to our
/// lease is ours (the write went through), adopted with the fence at its create revision.
pub(super) fn campaign(inner: &Handoff, me: &mut Leadership) {
    let Some(session) = inner.core.lease().borrow().live() else { return };
    if inner.core.mirror().read().leader.as_ref().is_some_and(|kv| kv.session != Some(session)) {
        return;
    }
    let key = inner.core.keys().leader();
    let txn = Txn::new().when(Compare::CreateRevision(key.clone(), 0)).then(Op::put_in(
        &key,
        inner.config.instance_id.as_bytes().to_vec(),
        session,
    ));
    me.queue.push_back(Step::Campaign(txn, session));
}

/// The campaign's answer: won, or read the key to see ([`adopt`]).
pub(super) fn campaigned(
    inner: &Handoff,
    me: &mut Leadership,
    session: SessionId,
    outcome: Result<TxnOutcome, StoreError>,
) {
    match outcome {
        Ok(outcome) if outcome.succeeded => won(inner, me, session, outcome.revision),
        Ok(_) => me.queue.push_front(Step::Adopt(session)),
        Err(error) => {
            tracing::warn!(%error, "campaign failed; checking whether it went through");
            me.queue.push_front(Step::Adopt(session));
        }
    }
}

/// The leader key as read after a campaign that did not say it won: ours if it holds our
/// session.
pub(super) fn adopt(
    inner: &Handoff,
    me: &mut Leadership,
    session: SessionId,
    read: Result<Option<KeyValue>, StoreError>,
) {
    match read {
        Ok(Some(kv)) if kv.session == Some(session) => {
            tracing::info!("the leader key holds our session: adopting it");
            won(inner, me, session, kv.create_revision);
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the leader key"),
    }
}

/// We lead from `revision` on.
fn won(inner: &Handoff, me: &mut Leadership, session: SessionId, revision: Revision) {
    me.written = me.written.max(revision);
    me.next_refresh = None; // a new leader refreshes at once
    me.next_weights = None;
    settle(inner, me, "leadership won");
    inner.leadership.send_replace(Some(Fence { session, revision }));
    tracing::info!(instance = %inner.config.instance_id, revision, "leadership won");
}

/// After a refused transaction, the leader key as read: was it a stale read, or were we
/// deposed?
pub(super) fn still_leading(
    inner: &Handoff,
    me: &mut Leadership,
    fence: Fence,
    read: Result<Option<KeyValue>, StoreError>,
) {
    match read {
        Ok(Some(kv)) if kv.create_revision == fence.revision => {
            tracing::debug!("reconcile raced a concurrent change; will retry on the next revision");
        }
        Ok(_) => step_down(inner, me, "deposed: leader key belongs to another election"),
        Err(error) => tracing::warn!(%error, "cannot check leadership"),
    }
}

/// The transaction that gives up leadership at a graceful stop (deletes our leader key if
/// it is still ours, so another instance takes over at once instead of after the TTL);
/// `None` when this instance does not lead. The loop runs it as its last store call.
pub(in crate::coordinator::handoff_backend) fn resignation(inner: &Handoff) -> Option<Txn> {
    let fence = inner.leadership.send_replace(None)?;
    let key = inner.core.keys().leader();
    Some(Txn::new().when(Compare::CreateRevision(key.clone(), fence.revision)).then(Op::delete(&key)))
}
