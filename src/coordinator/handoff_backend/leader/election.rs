//! Leader election, per leader group: campaign for the group's leader key with this
//! instance's lease (when [`leader_groups::campaigns`] says so); step down when the lease is
//! fenced or replaced, or the key is gone or belongs to another election; adopt a key that
//! holds our lease after a lost answer; hand a group over to the instance preferred for it;
//! resign every group at a graceful stop.

use std::time::Duration;

use tokio::time::Instant;

use super::{Fence, Handoff, Leadership, Step, settle};
use crate::coordinator::handoff_backend::leader_groups::{self, LeaderGroup};
use crate::coordinator::handoff_backend::{records::Keys, state::Cache};
use crate::coordinator::shared::lease::LeaseState;
use crate::store::{Compare, KeyValue, Op, Revision, SessionId, StoreError, Txn, TxnOutcome};

/// Gives up leadership (if held) and what only a leader keeps (the rest of its pass too).
pub(super) fn step_down(inner: &Handoff, me: &mut Leadership, why: &str) {
    if give_up(inner, me) {
        tracing::warn!(instance = %inner.config.instance_id, group = me.group.group, why, "leadership lost");
    }
}

/// Drops group leadership and what only its leader keeps; whether it was held.
fn give_up(inner: &Handoff, me: &mut Leadership) -> bool {
    let group = me.group.group;
    if !inner.leadership.send_if_modified(|led| led.remove(&group).is_some()) {
        return false;
    }
    me.cooldowns.clear();
    me.placement.clear();
    me.queue.clear();
    me.refresh_due = None;
    if let Some((_, stop)) = me.refresh.take() {
        stop.cancel();
    }
    true
}

/// Steps down when the instance lease is no longer the live one the key is bound to (it is
/// fenced: the key may expire any moment), or the cache shows the leader key gone or
/// re-created by someone else.
pub(super) fn check_leadership(inner: &Handoff, me: &mut Leadership) {
    let Some(fence) = inner.fence(me.group) else { return };
    let lease = *inner.core.lease().borrow();
    let why = steps_down(me.group, fence, lease, &inner.core.mirror().read());
    if let Some(why) = why {
        step_down(inner, me, why);
    }
}

/// Why the leader of `fence` must step down, given the instance `lease` and the `cache`
/// (pure): the lease is no longer the live one the key is bound to (it is fenced: the key
/// may expire any moment), or the cache shows the leader key gone or re-created by
/// someone else. `None`: it goes on leading.
pub(in crate::coordinator::handoff_backend) fn steps_down(
    group: LeaderGroup,
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
    let ours = cache.leader(group).is_some_and(|kv| kv.create_revision == fence.revision);
    (!ours).then_some("leader key changed")
}

/// Creates the group's leader key bound to our lease if nobody holds it (queued as the
/// next step), when this instance campaigns for the group ([`leader_groups::campaigns`]).
/// After an answer that was lost or refused, the key is read ([`adopt`]): one bound to our
/// lease is ours (the write went through), adopted with the fence at its create revision.
pub(super) fn campaign(inner: &Handoff, me: &mut Leadership, now: Instant) {
    let lease = *inner.core.lease().borrow();
    let cache = inner.core.mirror().read();
    let vacant_for = match cache.leader(me.group) {
        Some(_) => {
            me.vacant_since = None;
            Duration::ZERO
        }
        None => now.saturating_duration_since(*me.vacant_since.get_or_insert(now)),
    };
    let mixed = another_count_leads(me.group, &cache);
    if mixed != me.mixed {
        me.mixed = mixed;
        if mixed {
            tracing::error!(
                groups = me.group.groups,
                "a leader key of another --leader-groups count is in the store: not campaigning until it is gone"
            );
        }
    }
    let id = &inner.config.instance_id;
    let Some(why) = campaign_reason(me.group, id, &cache, lease, vacant_for, inner.core.lease_ttl()) else {
        return;
    };
    // Decided now, not when the answer comes: by then another instance's record may make
    // the preferred instance's campaign look like one after the grace.
    me.after_grace = why == leader_groups::Campaign::AfterGrace;
    if let (leader_groups::Campaign::Own, Some(session)) = (why, lease.live()) {
        me.queue.push_back(Step::Adopt(session));
        return;
    }
    let campaign = campaign_txn(inner.core.keys(), me.group, &inner.config.instance_id, lease, &cache);
    if let Some((txn, session)) = campaign {
        me.queue.push_back(Step::Campaign(txn, session));
    }
}

/// Whether a leader key of another group count than `group`'s is in `cache` (pure):
/// instances configured so would plan the same topics under other keys.
fn another_count_leads(group: LeaderGroup, cache: &Cache) -> bool {
    cache.leaders.keys().any(|other| other.groups != group.groups)
}

/// Whether `instance` campaigns for `group` now, and why (pure): [`leader_groups::campaigns`]
/// over the instances of `cache` under the same group count, and never while a leader key
/// of another count is there ([`another_count_leads`]); else, if the key is bound to its
/// live `lease`, [`Campaign::Own`](leader_groups::Campaign::Own) (left alone, that key
/// would keep the group without a leader for as long as the session lives: found by the
/// leader groups' schedules, seed 180). `vacant_for`: how long the group has been seen
/// without a key.
pub(in crate::coordinator::handoff_backend) fn campaign_reason(
    group: LeaderGroup,
    instance: &str,
    cache: &Cache,
    lease: LeaseState,
    vacant_for: Duration,
    grace: Duration,
) -> Option<leader_groups::Campaign> {
    if another_count_leads(group, cache) {
        return None;
    }
    leader_groups::campaigns(group, instance, cache.preferences(group.groups), vacant_for, grace).or_else(
        || {
            let session = lease.live()?;
            let own = cache.leader(group).is_some_and(|kv| kv.session == Some(session));
            own.then_some(leader_groups::Campaign::Own)
        },
    )
}

/// The campaign of `instance` (pure): the transaction that creates the leader key bound to
/// the live `lease`, only where no key is (compare on absence), and that session; `None`
/// while the lease is not live or `cache` shows another session's key.
pub(in crate::coordinator::handoff_backend) fn campaign_txn(
    keys: &Keys,
    group: LeaderGroup,
    instance: &str,
    lease: LeaseState,
    cache: &Cache,
) -> Option<(Txn, SessionId)> {
    let session = lease.live()?;
    if cache.leader(group).is_some_and(|kv| kv.session != Some(session)) {
        return None;
    }
    let key = keys.leader(group);
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
    // Won after the vacancy grace, not as the preferred instance: kept a while.
    let keep = inner.core.lease_ttl() * leader_groups::KEEP_AFTER_GRACE_TTLS;
    me.keep_until = me.after_grace.then(|| Instant::now() + keep);
    let group = me.group.group;
    inner.leadership.send_modify(|led| {
        led.insert(group, Fence { session, revision });
    });
    tracing::info!(instance = %inner.config.instance_id, group, revision, "leadership won");
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

/// Hands the group over when another live instance is preferred for it
/// ([`leader_groups::hands_over`]): steps down, and queues the deletion of our key so the
/// preferred instance campaigns at once. Returns whether it did.
pub(super) fn hand_over(inner: &Handoff, me: &mut Leadership) -> bool {
    let Some(fence) = inner.fence(me.group) else { return false };
    if me.keep_until.is_some_and(|until| Instant::now() < until) {
        return false;
    }
    let cache = inner.core.mirror().read();
    let preferences = cache.preferences(me.group.groups);
    if !leader_groups::hands_over(me.group, &inner.config.instance_id, preferences) {
        return false;
    }
    drop(cache);
    // A hand-over is routine (an instance joined), not a loss: logged at info.
    give_up(inner, me);
    let group = me.group.group;
    tracing::info!(instance = %inner.config.instance_id, group, "handing the leader group over to the instance preferred for it");
    me.queue.push_back(Step::Resign(resignation_txn(inner.core.keys(), me.group, fence)));
    true
}

/// The answer to the deletion of a group's key handed over: if it failed, the key ends
/// with our lease, or when it is found no longer ours.
pub(super) fn resigned(inner: &Handoff, me: &Leadership, outcome: Result<TxnOutcome, StoreError>) {
    let group = me.group.group;
    match outcome {
        Ok(outcome) if outcome.succeeded => {
            tracing::info!(instance = %inner.config.instance_id, group, "handed the leader group over")
        }
        Ok(_) => tracing::debug!(group, "the leader key handed over was no longer ours"),
        Err(error) => tracing::warn!(%error, group, "could not delete the leader key handed over"),
    }
}

/// The transactions that give up leadership at a graceful stop, one per group led (each
/// deletes our leader key if it is still ours, so another instance takes over at once
/// instead of after the TTL); empty when this instance leads nothing. The loop runs them as
/// its last store calls.
pub(in crate::coordinator::handoff_backend) fn resignation(inner: &Handoff) -> Vec<Txn> {
    let groups = inner.config.leader_groups;
    let led = inner.leadership.send_replace(Default::default());
    led.into_iter()
        .map(|(group, fence)| resignation_txn(inner.core.keys(), LeaderGroup { groups, group }, fence))
        .collect()
}

/// The transaction that deletes the leader key of `group` if it is still `fence`'s election.
pub(in crate::coordinator::handoff_backend) fn resignation_txn(
    keys: &Keys,
    group: LeaderGroup,
    fence: Fence,
) -> Txn {
    let key = keys.leader(group);
    Txn::new().when(Compare::CreateRevision(key.clone(), fence.revision)).then(Op::delete(&key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::shared::instance_record::{instance_key, instance_record_txn};
    use crate::coordinator::shared::mirror::MirrorCache;
    use crate::store::PrefixSnapshot;

    /// A group that fenced its leader out while the leader's session lived on: the key,
    /// bound to that session, is adopted by its holder even where another instance is
    /// preferred (nobody else can take it), and by nobody once the lease is fenced.
    #[test]
    fn a_key_bound_to_our_live_session_is_ours_to_adopt_even_where_another_is_preferred() {
        let keys = Keys::new("/p/");
        let (groups, grace) = (4, Duration::from_secs(2));
        let sessions = [("i0", SessionId(10)), ("i1", SessionId(11))];
        let record = |instance: &str, session| {
            let txn = instance_record_txn(&instance_key("/p/", instance), instance, groups, session);
            let Some(Op::Put { key, value, session }) = txn.ops.into_iter().next() else { panic!("a put") };
            KeyValue { key, value, create_revision: 1, mod_revision: 1, session }
        };
        let base: Vec<KeyValue> = sessions.iter().map(|(i, s)| record(i, *s)).collect();
        let preferences = Cache::from_snapshot(&keys, PrefixSnapshot { kvs: base.clone(), revision: 1 });
        let chosen = preferences.preferences(groups).expect("preferences").clone();
        // A group i0 is preferred for, whose key i1's session holds.
        let group = LeaderGroup::all(groups).find(|g| chosen[&g.group] == "i0").expect("a group for i0");
        let mut kvs = base;
        let leader = KeyValue {
            key: keys.leader(group),
            value: b"i1".to_vec(),
            create_revision: 2,
            mod_revision: 2,
            session: Some(SessionId(11)),
        };
        kvs.push(leader);
        let cache = Cache::from_snapshot(&keys, PrefixSnapshot { kvs, revision: 2 });
        let reason = |instance, lease| campaign_reason(group, instance, &cache, lease, Duration::ZERO, grace);
        use leader_groups::Campaign;
        assert_eq!(reason("i1", LeaseState::Live(SessionId(11))), Some(Campaign::Own));
        assert_eq!(reason("i1", LeaseState::Fenced(SessionId(11))), None, "not while fenced");
        assert_eq!(reason("i1", LeaseState::Live(SessionId(12))), None, "another session's key");
        assert_eq!(reason("i0", LeaseState::Live(SessionId(10))), Some(Campaign::Preferred));
    }
}
