//! Which weights the weights refresh stores (docs/design.md §11): every
//! `weights_refresh`, the leader asks the weight source for the weights of each stored
//! topic and writes those that changed meaningfully into the topic record, fenced by its
//! leadership and compare-and-swap on the record's mod revision (the partition count is
//! kept as stored; the writes are the machine's, `machine/weights.rs`). Placement reads the
//! weights from the records only, so every leader, and every instance's status, plans from
//! the same weights, and a new leader starts from the stored ones.
//!
//! A change is meaningful when a partition gained or lost its weight, or a weight moved by
//! more than [`CHANGE_PERCENT`] % of the larger of its old and new values: a learned rate
//! that jitters by a percent or two does not write etcd at every refresh, and placement
//! (whose tolerance is 10 % by default) would not act on such a change anyway.

use std::collections::BTreeMap;

/// A stored weight is rewritten when the new one differs by more than this percentage.
pub(super) const CHANGE_PERCENT: u64 = 5;

/// The weights to store for a topic of `partition_count` partitions whose record holds
/// `stored`, given what the source says now (`wanted`; partitions beyond the count are
/// dropped); `None` when the change is not meaningful (module docs).
pub(in crate::coordinator::handoff_backend) fn to_store(
    stored: &BTreeMap<u32, u64>,
    wanted: &BTreeMap<u32, u64>,
    partition_count: u32,
) -> Option<BTreeMap<u32, u64>> {
    let wanted: BTreeMap<u32, u64> = wanted.range(..partition_count).map(|(p, w)| (*p, *w)).collect();
    let same_partitions = stored.len() == wanted.len() && stored.keys().eq(wanted.keys());
    let moved = |(old, new): (&u64, &u64)| {
        let (old, new) = (u128::from(*old), u128::from(*new));
        old.abs_diff(new) * 100 > old.max(new) * u128::from(CHANGE_PERCENT)
    };
    let changed = !same_partitions || stored.values().zip(wanted.values()).any(moved);
    changed.then_some(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(u32, u64)]) -> BTreeMap<u32, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn only_meaningful_changes_are_written() {
        let stored = map(&[(0, 100), (1, 20)]);
        assert_eq!(to_store(&stored, &stored, 4), None, "unchanged");
        assert_eq!(to_store(&stored, &map(&[(0, 105), (1, 20)]), 4), None, "5 % is jitter");
        assert_eq!(
            to_store(&stored, &map(&[(0, 106), (1, 20)]), 4),
            Some(map(&[(0, 106), (1, 20)])),
            "more than 5 % is a change"
        );
        assert_eq!(
            to_store(&stored, &map(&[(0, 100), (1, 20), (2, 1)]), 4),
            Some(map(&[(0, 100), (1, 20), (2, 1)]))
        );
        assert_eq!(
            to_store(&stored, &map(&[(0, 100)]), 4),
            Some(map(&[(0, 100)])),
            "a partition lost its weight"
        );
        assert_eq!(to_store(&stored, &map(&[]), 4), Some(map(&[])), "every weight back to the default");
        assert_eq!(to_store(&map(&[]), &map(&[(7, 3)]), 4), None, "partitions beyond the count are dropped");
        assert_eq!(to_store(&map(&[(0, 0)]), &map(&[(0, 1)]), 4), Some(map(&[(0, 1)])), "from zero");
    }
}
