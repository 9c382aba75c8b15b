//! Leader election: campaign for the leader key with this instance's lease; step down when
//! the lease is fenced or replaced, or the key is gone or belongs to another election;
//! adopt a key that holds our lease after a lost answer; resign at a graceful stop.

use super::{Fence, Handoff, Leadership, Step, settle};
use crate::coordinator::handoff_backend::{records::Keys, state::Cache};
use crate::coordinator::shared::lease::LeaseState;
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
    let lease = *inner.core.lease().borrow();
    let why = steps_down(fence, lease, &inner.core.mirror().read());
    if let Some(why) = why {
        step_down(inner, me, why);
    }
}

/// Why the leader of `fence` must step down, given the instance `lease` and the `cache`
/// (pure): the lease is no longer the live one the key is bound to (it is fenced: the key
/// may expire any moment), or the cache shows the leader key gone or re-created by
/// someone else. `None`: it goes on leading.
pub(in crate::coordinator::handoff_backend) fn steps_down(
    fence: Fence,
    lease: LeaseState,
    cache: &Cache,
) -> Option<&'static str> {
    if lease.live() != Some(fence.session) {
        return Some("the instance session is fenced or was replaced");
    }
    if cache.revision < fence.revision {
        return None; // our own election is not in the cache yet
    }
    let ours = cache.leader.as_ref().is_some_and(|kv| kv.create_revision == fence.revision);
    (!ours).then_some("leader key changed")
}

/// Creates the leader key bound to our lease if nobody holds it (queued as the next step).
/// After an answer that was lost or refused, the key is read ([`adopt`]): one bound to our
/// lease is ours (the write went through), adopted with the fence at its create revision.
pub(super) fn campaign(inner: &Handoff, me: &mut Leadership) {
    let lease = *inner.core.lease().borrow();
    let campaign =
        campaign_txn(inner.core.keys(), &inner.config.instance_id, lease, &inner.core.mirror().read());
    if let Some((txn, session)) = campaign {
        me.queue.push_back(Step::Campaign(txn, session));
    }
}

/// The campaign of `instance` (pure): the transaction that creates the leader key bound to
/// the live `lease`, only where no key is (compare on absence), and that session; `None`
/// while the lease is not live or `cache` shows another session's key.
pub(in crate::coordinator::handoff_backend) fn campaign_txn(
    keys: &Keys,
    instance: &str,
    lease: LeaseState,
    cache: &Cache,
) -> Option<(Txn, SessionId)> {
    let session = lease.live()?;
    if cache.leader.as_ref().is_some_and(|kv| kv.session != Some(session)) {
        return None;
    }
    let key = keys.leader();
    let txn = Txn::new().when(Compare::CreateRevision(key.clone(), 0)).then(Op::put_in(
        &key,
        instance.as_bytes().to_vec(),
        session,
    ));
    Some((txn, session))
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
    if let Err(error) = &read {
        tracing::warn!(%error, "cannot read the leader key");
    }
    if let Some(revision) = adopted(session, &read) {
        tracing::info!("the leader key holds our session: adopting it");
        won(inner, me, session, revision);
    }
}

/// The fence to adopt, from the leader key as read after a campaign that did not say it
/// won (pure): its create revision, when the key holds our `session`.
pub(in crate::coordinator::handoff_backend) fn adopted(
    session: SessionId,
    read: &Result<Option<KeyValue>, StoreError>,
) -> Option<Revision> {
    match read {
        Ok(Some(kv)) if kv.session == Some(session) => Some(kv.create_revision),
        _ => None,
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
    match deposed(fence, &read) {
        Some(true) => step_down(inner, me, "deposed: leader key belongs to another election"),
        Some(false) => {
            tracing::debug!("reconcile raced a concurrent change; will retry on the next revision")
        }
        None => {
            if let Err(error) = read {
                tracing::warn!(%error, "cannot check leadership");
            }
        }
    }
}

/// After a refused transaction, whether the leader key as read says the leader of `fence`
/// was deposed (pure): `Some(false)` when it is still its election (a stale read), `None`
/// when the read failed.
pub(in crate::coordinator::handoff_backend) fn deposed(
    fence: Fence,
    read: &Result<Option<KeyValue>, StoreError>,
) -> Option<bool> {
    match read {
        Ok(Some(kv)) => Some(kv.create_revision != fence.revision),
        Ok(None) => Some(true),
        Err(_) => None,
    }
}

/// The transaction that gives up leadership at a graceful stop (deletes our leader key if
/// it is still ours, so another instance takes over at once instead of after the TTL);
/// `None` when this instance does not lead. The loop runs it as its last store call.
pub(in crate::coordinator::handoff_backend) fn resignation(inner: &Handoff) -> Option<Txn> {
    let fence = inner.leadership.send_replace(None)?;
    Some(resignation_txn(inner.core.keys(), fence))
}

/// The transaction that deletes the leader key of `fence` if it is still that election's.
pub(in crate::coordinator::handoff_backend) fn resignation_txn(keys: &Keys, fence: Fence) -> Txn {
    let key = keys.leader();
    Txn::new().when(Compare::CreateRevision(key.clone(), fence.revision)).then(Op::delete(&key))
}
