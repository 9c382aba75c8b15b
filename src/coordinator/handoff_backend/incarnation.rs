//! A new incarnation of a consumer name (docs/design.md §10), pure: a `Register` that
//! replaces an earlier registration of the same name (a new stream, on any instance) raises
//! the epoch of every partition the name owns or is warming, moving nothing, so that a
//! paused process of the old incarnation writes with epochs below the new one's and a
//! fenced sink refuses it. Kafka's member epoch does the same on a rejoin.
//!
//! The writes join the registration's own transaction (`machine/register.rs`), each
//! compared with the record it replaces, so a raise decided from a stale cache fails instead of lowering an epoch.

use super::records::Keys;
use super::state::TopicEntry;
use crate::coordinator::shared::batch::KeyWrite;
use crate::coordinator::shared::records::next_epoch;
use crate::handoff::{Phase, Write};
use crate::store::{Compare, Revision};

/// The records of `entry` to rewrite for a new incarnation of `consumer`, decided from a
/// cache at `revision` at wall-clock `now_micros`:
/// * a partition it owns: the owner's epoch, raised; and when that partition is being warmed
///   by another consumer, the handoff's epoch too, above the raised one, since the warmer
///   owns it with the handoff's epoch once the handoff completes;
/// * a partition it is warming: the handoff's epoch, raised.
pub fn raise(
    entry: &TopicEntry,
    consumer: &str,
    revision: Revision,
    now_micros: u64,
) -> Vec<(u32, Vec<Write>)> {
    let mut raised = Vec::new();
    let floor = |p: u32| {
        let owner = entry.epochs.get(&p).copied().unwrap_or(0);
        owner.max(entry.handoffs.get(&p).map_or(0, |h| h.value.epoch))
    };
    let mut partitions: Vec<u32> = entry.owned_by(consumer).chain(entry.handoffs_of(consumer)).collect();
    partitions.sort_unstable();
    partitions.dedup();
    for p in partitions {
        let epoch = next_epoch(revision, floor(p), now_micros);
        let owns = entry.owners.get(&p).is_some_and(|o| o.value == consumer);
        let handoff = entry.handoffs.get(&p).map(|h| &h.value).filter(|h| h.phase == Phase::Warming);
        let mut writes = Vec::new();
        if owns {
            writes.push(Write::SetOwner { partition: p, owner: consumer.to_string(), epoch });
        }
        match handoff {
            // Warmed by another: it will own the partition above the raised owner.
            Some(h) if owns && h.from == consumer => {
                let handoff = crate::handoff::Handoff { epoch: epoch.saturating_add(1), ..h.clone() };
                writes.push(Write::PutHandoff { partition: p, handoff });
            }
            Some(h) if h.to == consumer => {
                writes.push(Write::PutHandoff {
                    partition: p,
                    handoff: crate::handoff::Handoff { epoch, ..h.clone() },
                });
            }
            _ => {}
        }
        if !writes.is_empty() {
            raised.push((p, writes));
        }
    }
    raised
}

/// [`raise`]'s writes as store writes of `topic`, each compared with the records of its
/// partition as `entry` holds them.
pub fn raise_writes(
    keys: &Keys,
    entry: &TopicEntry,
    topic: &str,
    raised: Vec<(u32, Vec<Write>)>,
) -> Vec<KeyWrite> {
    raised
        .into_iter()
        .map(|(p, writes)| KeyWrite {
            key: keys.assignment(topic, p),
            compares: vec![
                Compare::ModRevision(keys.assignment(topic, p), entry.owner_revision(p)),
                Compare::ModRevision(keys.handoff(topic, p), entry.handoff_revision(p)),
            ],
            ops: keys.write_ops(topic, &writes),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::shared::mirror::Versioned;
    use crate::handoff::Handoff;

    /// `a` owns 0 (epoch 10) and 1 (epoch 11), and warms 1 towards `b` (epoch 12); `b`
    /// warms 2 from `c` (owner epoch 20, coming epoch 21).
    fn entry() -> TopicEntry {
        let mut entry = TopicEntry::default();
        let owner = |o: &str, rev| Versioned { value: o.to_string(), mod_revision: rev };
        let handoff = |from: &str, to: &str, epoch| Handoff {
            from: from.into(),
            to: to.into(),
            phase: Phase::Warming,
            since: 0,
            epoch,
        };
        for (p, o, rev, epoch) in [(0, "a", 3, 10), (1, "a", 4, 11), (2, "c", 5, 20)] {
            entry.set_owner(p, Some(owner(o, rev)));
            entry.epochs.insert(p, epoch);
        }
        entry.set_handoff(1, Some(Versioned { value: handoff("a", "b", 12), mod_revision: 6 }));
        entry.set_handoff(2, Some(Versioned { value: handoff("c", "b", 21), mod_revision: 7 }));
        entry
    }

    #[test]
    fn an_owner_is_raised_above_everything_and_its_warmer_above_it() {
        let raised = raise(&entry(), "a", 8, 1);
        let epochs: Vec<(u32, Vec<u64>)> = raised
            .iter()
            .map(|(p, writes)| {
                let epochs = writes.iter().map(|w| match w {
                    Write::SetOwner { epoch, .. } => *epoch,
                    Write::PutHandoff { handoff, .. } => handoff.epoch,
                    other => panic!("{other:?}"),
                });
                (*p, epochs.collect())
            })
            .collect();
        // 0: above the cache's revision (8) and its own 10; 1: above the warm's 12, and the
        // warm above that.
        assert_eq!(epochs, vec![(0, vec![11]), (1, vec![13, 14])]);
        assert!(raise(&entry(), "a", 8, 1_000).iter().all(|(_, w)| matches!(
            &w[0],
            Write::SetOwner { epoch, owner, .. } if *epoch >= 1_000 && owner == "a"
        )));
    }

    #[test]
    fn a_warmer_is_raised_and_a_stranger_holds_nothing() {
        let raised = raise(&entry(), "b", 8, 1);
        let [(1, w1), (2, w2)] = &raised[..] else { panic!("{raised:?}") };
        assert!(
            matches!(&w1[..], [Write::PutHandoff { handoff, .. }] if handoff.epoch == 13 && handoff.to == "b")
        );
        assert!(
            matches!(&w2[..], [Write::PutHandoff { handoff, .. }] if handoff.epoch == 22 && handoff.from == "c")
        );
        assert!(raise(&entry(), "z", 8, 1).is_empty());
    }

    #[test]
    fn every_write_compares_both_records_of_its_partition() {
        let keys = Keys::new("/p/");
        let entry = entry();
        let writes = raise_writes(&keys, &entry, "t", raise(&entry, "a", 8, 1));
        assert_eq!(writes.len(), 2);
        assert_eq!(
            writes[1].compares,
            vec![
                Compare::ModRevision(keys.assignment("t", 1), 4),
                Compare::ModRevision(keys.handoff("t", 1), 6)
            ]
        );
        assert_eq!(writes[1].ops.len(), 2, "the owner and the handoff");
    }

    #[test]
    fn a_record_older_than_the_registration_is_not_told_until_raised() {
        let entry = entry();
        let told =
            |since| entry.epochs_of("a", since).iter().map(|e| (e.partition, e.epoch)).collect::<Vec<_>>();
        assert_eq!(told(0), vec![(0, 10), (1, 11)]);
        // Registered at revision 4: partition 0's record (revision 3) is the earlier
        // incarnation's; partition 1's (revision 4) is not older than the registration.
        assert_eq!(told(4), vec![(1, 11)]);
        let warmed = |since| entry.epochs_of("b", since).iter().map(|e| e.partition).collect::<Vec<_>>();
        assert_eq!(warmed(6), vec![1, 2]);
        assert_eq!(warmed(7), vec![2], "the warm of 1 was written at 6");
    }
}
