//! Leader election, per leader group, as pure decisions over the cache: whether to
//! campaign for the group's leader key with this instance's lease (when
//! [`leader_groups::campaigns`] says so) and the campaign's transaction; when to step down
//! (the lease is fenced or replaced, or the key is gone or belongs to another election);
//! adopting a key that holds our lease after a lost answer; and the resignation that
//! deletes our key.

use std::time::Duration;

use super::Fence;
use crate::coordinator::handoff_backend::leader_groups::{self, LeaderGroup};
use crate::coordinator::handoff_backend::{records::Keys, state::Cache};
use crate::coordinator::shared::lease::LeaseState;
use crate::store::{Compare, KeyValue, Op, Revision, SessionId, StoreError, Txn};

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
