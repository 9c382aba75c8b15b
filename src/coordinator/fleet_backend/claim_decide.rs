//! The claim step's decision, pure: from the cached topic, the consumer's registration and
//! what its stream hides (partitions it was told to give back), what to show it again, give
//! back and claim, each with the lease revision its compare-and-swap is conditioned on (and,
//! for a claim, the partition's epoch floor: docs/design.md §10); and the transactions that
//! do it. No I/O, no clock: `claim.rs` reads the cache and the time, calls [`decide`], tells
//! and writes.

use std::collections::BTreeSet;

use super::records::{EpochRecord, FleetKeys, LeaseRecord, MemberRecord};
use super::share;
use super::state::FleetTopic;
use crate::assignment::Balanced;
use crate::coordinator::shared::batch::KeyWrite;
use crate::coordinator::shared::mirror::Versioned;
use crate::coordinator::shared::records::{RECORD_VERSION, encode, next_epoch};
use crate::mutation::{Mutation, is_active};
use crate::store::{Compare, Op, Revision, SessionId, Txn};

/// A partition and the mod revision of its lease as the cache holds it (0: no lease).
pub type AtRevision = (u32, Revision);

/// A partition's lease and epoch floor as the cache holds them: what a claim (of a free
/// partition) or a raise (of a held one) is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseAt {
    /// The partition.
    pub partition: u32,
    /// The mod revision of its lease (0: none, which a claim needs still).
    pub lease_at: Revision,
    /// The highest epoch known for it: the new epoch is above it.
    pub floor: u64,
    /// The mod revision of its epoch floor record (0: none): the write holds only while no
    /// other claim or raise has written it since.
    pub floor_at: Revision,
}

impl LeaseAt {
    /// `partition`'s lease and floor as `entry` holds them.
    pub fn of(entry: &FleetTopic, partition: u32) -> Self {
        let (floor, floor_at) = entry.floor(partition);
        LeaseAt { partition, lease_at: entry.lease_revision(partition), floor, floor_at }
    }
}

/// What one claim step does for one consumer (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimDecision {
    /// The consumer's member record as cached, with its mod revision: a claim is written
    /// only while the record is still that one, and writes it again (see [`claim_txn`]).
    pub member: Versioned<MemberRecord>,
    /// The consumer's quota.
    pub quota: usize,
    /// Hidden partitions the cache still shows leased to the consumer and the plan no
    /// longer gives back (a give-back called off, or whose delete failed its compare):
    /// shown again once the store confirms the lease is the one cached.
    pub show: Vec<AtRevision>,
    /// Leases beyond the quota, to give back (the consumer is told first).
    pub give_back: Vec<AtRevision>,
    /// Free leases to claim, up to the quota.
    pub claim: Vec<LeaseAt>,
}

/// The claim step of `consumer` with registration `session` over the cached `entry`, its
/// stream hiding `hidden`. `None` when there is nothing to decide: the consumer is not
/// registered under this session (not yet, or replaced), is leaving, or the count is not
/// stored yet.
pub fn decide(
    entry: &FleetTopic,
    consumer: &str,
    session: SessionId,
    hidden: &BTreeSet<u32>,
) -> Option<ClaimDecision> {
    let member = entry.members.get(consumer).filter(|r| r.value.session == session.0 && !r.value.leaving)?;
    let owners = entry.leases.iter().map(|(p, o)| (*p, o.value.as_str())).collect();
    let registered = |name: &str| entry.members.contains_key(name);
    let plan =
        share::share_of(&Balanced, entry.partition_count(), &entry.live(), registered, consumer, &owners)?;
    let at = |p: &u32| (*p, entry.lease_revision(*p));
    let free = |p: &u32| LeaseAt::of(entry, *p);
    let show = hidden
        .iter()
        .filter(|p| owners.get(p) == Some(&consumer) && !plan.give_back.contains(p))
        .map(at)
        .collect();
    Some(ClaimDecision {
        member: member.clone(),
        quota: plan.quota,
        show,
        give_back: plan.give_back.iter().map(at).collect(),
        claim: plan.claim.iter().map(free).collect(),
    })
}

/// Deletes the leases of `partitions`, each only if it is still at its revision.
pub fn give_back_txn(keys: &FleetKeys, topic: &str, partitions: &[AtRevision]) -> Txn {
    partitions.iter().fold(Txn::new(), |txn, (p, revision)| {
        let lease = keys.lease(topic, *p);
        txn.when(Compare::ModRevision(lease.clone(), *revision)).then(Op::delete(lease))
    })
}

/// What a claim writes (see [`claim_txn`]).
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The claiming consumer.
    pub consumer: &'a str,
    /// Its member record as the claim was decided on it (`ClaimDecision::member`): the
    /// claim holds only while the record is still that one, and writes it again.
    pub member: &'a Versioned<MemberRecord>,
    /// The instance lease the leases are bound to.
    pub instance_lease: SessionId,
    /// The revision of the cache the claim was decided from.
    pub decided_at: Revision,
    /// The wall clock when it was decided, in microseconds since the Unix epoch.
    pub now_micros: u64,
}

/// Writes the consumer's leases of `partitions` under the instance lease, each only if it
/// is still at its revision (0: still absent) and its epoch floor too, and all only while
/// the consumer's member record is still the one the claim was decided on; that record is
/// written again in the same transaction. That write is what keeps a registration of the
/// same name decided on the store's state from missing the claim: it moves the leases of
/// the name it read to its own session with a compare on the member record as read, so a
/// claim between its read and its write makes it fail and read again, instead of leaving
/// the claimed lease bound to the session it replaces (a lease and its owner's member
/// record must go together). Each lease's epoch is
/// above its floor, the cache's revision and the clock ([`next_epoch`], docs/design.md
/// §10), and is written as the partition's new floor, a record no session takes away: a
/// claim from a cache that missed another consumer's claim (and give-back) of the
/// partition fails on the floor's compare instead of repeating or lowering that epoch.
pub fn claim_txn(keys: &FleetKeys, claim: Claim<'_>, partitions: &[LeaseAt]) -> Txn {
    let Claim { topic, consumer, member, instance_lease, decided_at, now_micros } = claim;
    let member_key = keys.member(topic, consumer);
    let still = Compare::ModRevision(member_key.clone(), member.mod_revision);
    let again = Op::put_in(member_key, encode(&member.value), instance_lease);
    partitions.iter().fold(Txn::new().when(still).then(again), |mut txn, free| {
        let write = lease_above_floor(keys, topic, consumer, *free, instance_lease, decided_at, now_micros);
        txn.compares.extend(write.compares);
        txn.ops.extend(write.ops);
        txn
    })
}

/// A new incarnation of `consumer` (docs/design.md §10): each lease it holds in `entry`
/// rewritten bound to `lease` (its new registration's instance lease) with an epoch above
/// its floor, the cache's `revision` and `now_micros`, and that epoch written as the new
/// floor; each compared with the lease and the floor it replaces. Moves nothing.
pub fn raise_txns(
    keys: &FleetKeys,
    entry: &FleetTopic,
    topic: &str,
    consumer: &str,
    lease: SessionId,
    revision: Revision,
    now_micros: u64,
) -> Vec<KeyWrite> {
    let held = entry.leases.iter().filter(|(_, owner)| owner.value == consumer).map(|(p, _)| *p);
    held.map(|p| lease_above_floor(keys, topic, consumer, LeaseAt::of(entry, p), lease, revision, now_micros))
        .collect()
}

/// `consumer`'s lease of `at.partition`, bound to `lease`, with an epoch above the floor,
/// the cache's `revision` and the clock ([`next_epoch`]), and that epoch as the partition's
/// new floor: both only if the lease and the floor are still as `at` read them. What a
/// claim and a raise write alike.
fn lease_above_floor(
    keys: &FleetKeys,
    topic: &str,
    consumer: &str,
    at: LeaseAt,
    lease: SessionId,
    revision: Revision,
    now_micros: u64,
) -> KeyWrite {
    let epoch = next_epoch(revision, at.floor, now_micros);
    let (lease_key, floor_key) = (keys.lease(topic, at.partition), keys.epoch(topic, at.partition));
    let record = encode(&LeaseRecord { v: RECORD_VERSION, owner: consumer.to_string(), epoch });
    KeyWrite {
        key: lease_key.clone(),
        compares: if is_active(Mutation::FleetClaimCompareDropped) {
            Vec::new()
        } else {
            vec![
                Compare::ModRevision(lease_key.clone(), at.lease_at),
                Compare::ModRevision(floor_key.clone(), at.floor_at),
            ]
        },
        ops: vec![
            Op::put_in(lease_key, record, lease),
            Op::put(floor_key, encode(&EpochRecord { v: RECORD_VERSION, epoch })),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::fleet_backend::MemberRecord;
    use crate::coordinator::shared::mirror::Versioned;

    fn versioned<T>(value: T, mod_revision: Revision) -> Versioned<T> {
        Versioned { value, mod_revision }
    }

    /// The member record of registration `session` on instance `i`.
    fn member(session: i64) -> MemberRecord {
        MemberRecord {
            v: RECORD_VERSION,
            session,
            instance: "i".into(),
            leaving: false,
            info: Default::default(),
            incarnation: 0,
        }
    }

    /// Four partitions; `a` (session 1) holds all four at revisions 11..=14, `b` (session
    /// 2) has just registered.
    fn topic() -> FleetTopic {
        let mut entry = FleetTopic { count: Some(versioned(4, 1)), ..FleetTopic::default() };
        entry.members.insert("a".into(), versioned(member(1), 2));
        entry.members.insert("b".into(), versioned(member(2), 3));
        for p in 0..4 {
            entry.leases.insert(p, versioned("a".to_string(), 11 + Revision::from(p)));
        }
        entry
    }

    #[test]
    fn over_its_quota_a_consumer_gives_back_its_highest_partitions_at_their_revisions() {
        let decision = decide(&topic(), "a", SessionId(1), &BTreeSet::new()).expect("a is registered");
        assert_eq!(decision.quota, 2);
        assert_eq!(decision.give_back, vec![(3, 14), (2, 13)]);
        assert!(decision.claim.is_empty() && decision.show.is_empty());
        let b = decide(&topic(), "b", SessionId(2), &BTreeSet::new()).expect("b is registered");
        assert!(b.claim.is_empty(), "a's leases are not free while a is registered: {b:?}");
    }

    #[test]
    fn hidden_partitions_are_shown_only_while_cached_as_ours_and_not_given_back() {
        let mut entry = topic();
        // `b` left: `a`'s quota is 4 again, so partitions it hid are shown, at their revision.
        entry.members.remove("b");
        let hidden = BTreeSet::from([2, 3]);
        let decision = decide(&entry, "a", SessionId(1), &hidden).expect("a is registered");
        assert_eq!(decision.show, vec![(2, 13), (3, 14)]);
        // A hidden partition whose lease is gone from the cache is not shown, and is free.
        entry.leases.remove(&3);
        let decision = decide(&entry, "a", SessionId(1), &hidden).expect("a is registered");
        assert_eq!(decision.show, vec![(2, 13)]);
        let free = LeaseAt { partition: 3, lease_at: 0, floor: 0, floor_at: 0 };
        assert_eq!(decision.claim, vec![free], "claimed only if still absent");
        // Still over the quota: what is given back is not shown.
        let decision = decide(&topic(), "a", SessionId(1), &hidden).expect("a is registered");
        assert!(decision.show.is_empty(), "{decision:?}");
    }

    #[test]
    fn nothing_is_decided_for_another_registration_or_a_leaving_one() {
        let mut entry = topic();
        assert_eq!(decide(&entry, "a", SessionId(9), &BTreeSet::new()), None, "replaced");
        assert_eq!(decide(&entry, "c", SessionId(1), &BTreeSet::new()), None, "not registered");
        if let Some(a) = entry.members.get_mut("a") {
            a.value.leaving = true;
        }
        assert_eq!(decide(&entry, "a", SessionId(1), &BTreeSet::new()), None, "leaving");
    }

    #[test]
    fn transactions_compare_every_lease_and_the_claimers_registration() {
        let keys = FleetKeys::new("/p/");
        let txn = give_back_txn(&keys, "t", &[(3, 14)]);
        assert_eq!(txn.compares, vec![Compare::ModRevision(keys.lease("t", 3), 14)]);
        assert_eq!(txn.ops, vec![Op::delete(keys.lease("t", 3))]);
        let b = versioned(member(2), 3);
        let claim = Claim {
            topic: "t",
            consumer: "b",
            member: &b,
            instance_lease: SessionId(7),
            decided_at: 20,
            now_micros: 5,
        };
        let free = LeaseAt { partition: 2, lease_at: 0, floor: 30, floor_at: 12 };
        let txn = claim_txn(&keys, claim, &[free]);
        assert_eq!(
            txn.compares,
            vec![
                Compare::ModRevision(keys.member("t", "b"), 3),
                Compare::ModRevision(keys.lease("t", 2), 0),
                Compare::ModRevision(keys.epoch("t", 2), 12),
            ]
        );
        let [
            Op::Put { key: member_key, session: Some(SessionId(7)), value: member_again },
            Op::Put { session: Some(SessionId(7)), value, .. },
            Op::Put { key, session: None, value: floor },
        ] = &txn.ops[..]
        else {
            panic!("{:?}", txn.ops)
        };
        let again: MemberRecord =
            crate::coordinator::shared::records::decode("member", member_again).expect("member");
        assert_eq!(
            (member_key.as_str(), again),
            (keys.member("t", "b").as_str(), member(2)),
            "written again"
        );
        let record: LeaseRecord = crate::coordinator::shared::records::decode("lease", value).expect("lease");
        assert_eq!((record.owner.as_str(), record.epoch), ("b", 31), "above the floor");
        let floor: EpochRecord = crate::coordinator::shared::records::decode("floor", floor).expect("floor");
        assert_eq!((key.as_str(), floor.epoch), (keys.epoch("t", 2).as_str(), 31), "the new floor");
        // Above the clock when it is ahead, and above the cache's revision.
        let txn = claim_txn(&keys, Claim { now_micros: 1_000, ..claim }, &[free]);
        let Op::Put { value, .. } = &txn.ops[1] else { panic!("{:?}", txn.ops) };
        let record: LeaseRecord = crate::coordinator::shared::records::decode("lease", value).expect("lease");
        assert_eq!(record.epoch, 1_000);
        let txn = claim_txn(&keys, claim, &[LeaseAt { floor: 0, ..free }]);
        let Op::Put { value, .. } = &txn.ops[1] else { panic!("{:?}", txn.ops) };
        let record: LeaseRecord = crate::coordinator::shared::records::decode("lease", value).expect("lease");
        assert_eq!(record.epoch, 21, "one above the cache it was decided from");
    }

    /// The lagging-cache claim (issue: a claim's epoch was one above its cache's revision,
    /// and its only compare on a free partition was "no lease"): `b` claims partition 0 and
    /// gives it back, both after `a`'s cache was read; `a`'s claim from that cache must fail
    /// instead of writing an epoch at or below `b`'s. The clock is held at 0 here so that the
    /// floor's compare alone has to refuse it.
    #[tokio::test]
    async fn a_claim_from_a_cache_that_missed_a_claim_and_give_back_fails_on_the_floor() {
        use crate::store::{LeaseStore, MemoryStore};
        let store = MemoryStore::starting_at(1);
        let keys = FleetKeys::new("/p/");
        let lease = store.grant_session(std::time::Duration::from_secs(10)).await.expect("session");
        let a_at = store.put(&keys.member("t", "a"), encode(&member(1)), Some(lease)).await.expect("a");
        let b_at = store.put(&keys.member("t", "b"), encode(&member(2)), Some(lease)).await.expect("b");
        let (a_member, b_member) = (versioned(member(1), a_at), versioned(member(2), b_at));
        // `a`'s cache: partition 0 free, no floor, at revision `b_at`.
        let stale = LeaseAt { partition: 0, lease_at: 0, floor: 0, floor_at: 0 };
        let claim = |consumer, member| Claim {
            topic: "t",
            consumer,
            member,
            instance_lease: lease,
            decided_at: b_at,
            now_micros: 0,
        };
        let b = store.txn(claim_txn(&keys, claim("b", &b_member), &[stale])).await.expect("b claims");
        assert!(b.succeeded);
        let b_epoch = store.get(&keys.lease("t", 0)).await.expect("read").map(|kv| {
            crate::coordinator::shared::records::decode::<LeaseRecord>("lease", &kv.value)
                .expect("lease")
                .epoch
        });
        let gave_back = store.txn(give_back_txn(&keys, "t", &[(0, b.revision)])).await.expect("gives back");
        assert!(gave_back.succeeded);

        let a = store.txn(claim_txn(&keys, claim("a", &a_member), &[stale])).await.expect("answered");
        assert!(
            !a.succeeded,
            "a claimed partition 0 from a cache older than b's claim (b's epoch {b_epoch:?})"
        );
        // From a cache that saw the floor, the claim succeeds above b's epoch.
        let floor = store.get(&keys.epoch("t", 0)).await.expect("read").expect("the floor stays");
        let seen: EpochRecord =
            crate::coordinator::shared::records::decode("floor", &floor.value).expect("floor");
        let fresh = LeaseAt { floor: seen.epoch, floor_at: floor.mod_revision, ..stale };
        let a = store.txn(claim_txn(&keys, claim("a", &a_member), &[fresh])).await.expect("answered");
        assert!(a.succeeded);
        let a_epoch = store.get(&keys.lease("t", 0)).await.expect("read").map(|kv| {
            crate::coordinator::shared::records::decode::<LeaseRecord>("lease", &kv.value)
                .expect("lease")
                .epoch
        });
        assert!(a_epoch > b_epoch, "a's epoch {a_epoch:?} is above b's {b_epoch:?}");
    }

    /// A registration of the same name decided on the store's state (`registration::write`:
    /// the member record read, then the leases of the name, then one transaction that moves
    /// them to the new session with a compare on the member record as read) must not miss
    /// a claim made between its read and its write: the claim writes the member record
    /// again, so the registration's compare fails and it reads again. Before, it succeeded
    /// and left the claimed lease bound to the replaced session (the simulation's fleet
    /// seed 259).
    #[tokio::test]
    async fn a_claim_between_a_registrations_read_and_write_makes_the_registration_read_again() {
        use crate::store::{LeaseStore, MemoryStore};
        let store = MemoryStore::starting_at(1);
        let keys = FleetKeys::new("/p/");
        let ttl = std::time::Duration::from_secs(10);
        let (old, new) =
            (store.grant_session(ttl).await.expect("a"), store.grant_session(ttl).await.expect("b"));
        let at = store.put(&keys.member("t", "c"), encode(&member(1)), Some(old)).await.expect("c");
        // The new registration's read of the member record.
        let read = store.get(&keys.member("t", "c")).await.expect("read").expect("c is registered");
        // The old registration's claim step claims partition 0 meanwhile.
        let cached = versioned(member(1), at);
        let claim = Claim {
            topic: "t",
            consumer: "c",
            member: &cached,
            instance_lease: old,
            decided_at: at,
            now_micros: 0,
        };
        let free = LeaseAt { partition: 0, lease_at: 0, floor: 0, floor_at: 0 };
        assert!(store.txn(claim_txn(&keys, claim, &[free])).await.expect("claims").succeeded);
        // The registration's write, decided on what it read (no lease of the name then).
        let register = Txn::new()
            .when(Compare::ModRevision(keys.member("t", "c"), read.mod_revision))
            .then(Op::put_in(keys.member("t", "c"), encode(&member(2)), new));
        let written = store.txn(register).await.expect("answered");
        assert!(!written.succeeded, "the registration missed the claim of partition 0");
        let lease = store.get(&keys.lease("t", 0)).await.expect("read").expect("leased");
        assert_eq!(lease.session, Some(old), "the lease and its owner's member record go together");
    }
}
