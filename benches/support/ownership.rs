//! Who owns a partition in the bench consumers' views, and the figures its changes make:
//! moves, overlaps (two or more owners at once) and gaps (an owned partition left with none).
//! Shared by the scale bench's `World` and the cluster bench's `Views`.

use std::time::{Duration, Instant};

/// One partition's owners as the consumers were told them.
#[derive(Default)]
pub struct PartitionOwners {
    /// Owners told they own it and not yet told to stop.
    owners: Vec<u32>,
    /// The last owner told it owns it (to tell a move from a first assignment).
    last_owner: Option<u32>,
    /// When the owner count last changed (start of the current overlap or gap); `None`
    /// until it first had an owner.
    since: Option<Instant>,
}

/// A change of one partition's owner count.
pub struct OwnerChange {
    before: usize,
    after: usize,
    /// When the count reached `before`.
    since: Option<Instant>,
    /// The partition was given to an owner other than the one that owned it last.
    pub moved: bool,
}

impl PartitionOwners {
    /// Whether `owner` is told it owns the partition.
    pub fn holds(&self, owner: u32) -> bool {
        self.owners.contains(&owner)
    }

    /// Whether no one is told it owns the partition.
    pub fn is_unowned(&self) -> bool {
        self.owners.is_empty()
    }

    /// `owner` was told it owns the partition at `at`; `None` if it already did.
    pub fn add(&mut self, owner: u32, at: Instant) -> Option<OwnerChange> {
        if self.holds(owner) {
            return None;
        }
        let before = self.owners.len();
        self.owners.push(owner);
        let moved = self.last_owner.is_some_and(|last| last != owner);
        self.last_owner = Some(owner);
        let since = self.since.replace(at);
        Some(OwnerChange { before, after: before + 1, since, moved })
    }

    /// `owner` was told to stop owning the partition at `at`; `None` if it did not own it.
    pub fn remove(&mut self, owner: u32, at: Instant) -> Option<OwnerChange> {
        let position = self.owners.iter().position(|o| *o == owner)?;
        let before = self.owners.len();
        self.owners.swap_remove(position);
        let since = self.since.replace(at);
        Some(OwnerChange { before, after: before - 1, since, moved: false })
    }
}

/// Overlap and gap figures of a measured phase.
#[derive(Default, Clone, Debug)]
pub struct OwnershipFigures {
    /// Longest time a partition had two or more owners in the consumers' views.
    pub max_overlap: Duration,
    /// Longest time a partition that had an owner had none in the consumers' views.
    pub max_gap: Duration,
    /// Ownership changes that left a partition without any owner for a while.
    pub gaps: u64,
}

impl OwnerChange {
    /// Keeps `single_owned` (partitions with exactly one owner) and, when measuring
    /// (`figures` given), the overlap or gap this change ends, at `at`.
    pub fn count(&self, at: Instant, single_owned: &mut usize, figures: Option<&mut OwnershipFigures>) {
        if self.before == 1 {
            *single_owned -= 1;
        }
        if self.after == 1 {
            *single_owned += 1;
        }
        let (Some(since), Some(figures)) = (self.since, figures) else { return };
        let lasted = at.saturating_duration_since(since);
        if self.before == 0 {
            // `since` is set only once a partition has had an owner: this ends a gap.
            figures.max_gap = figures.max_gap.max(lasted);
            figures.gaps += 1;
        } else if self.before >= 2 && self.after < 2 {
            figures.max_overlap = figures.max_overlap.max(lasted);
        }
    }
}
