use std::time::Duration;

use tokio::time::Instant;

use super::{Chore, Upkeep};
use crate::coordinator::shared::lease::fence_after;
use crate::store::SessionId;

const TTL: Duration = Duration::from_secs(4);

#[test]
fn a_mirror_that_does_not_follow_for_the_margin_fences_once_and_unfences_when_it_follows() {
    let start = Instant::now();
    let mut upkeep = Upkeep::new(TTL, start);
    assert_eq!(upkeep.health(false, start), None);
    // Noted once: a second report does not move the deadline.
    assert_eq!(upkeep.health(false, start + TTL / 8), None);
    let fence_at = start + fence_after(TTL);
    assert_eq!(upkeep.wake_at(), fence_at.min(start + TTL / 2));
    assert_eq!(upkeep.fence_due(fence_at - Duration::from_millis(1)), None);
    assert_eq!(upkeep.fence_due(fence_at), Some(Chore::Fence));
    assert_eq!(upkeep.fence_due(fence_at + TTL), None, "fenced once");
    assert_eq!(upkeep.wake_at(), start + TTL / 2, "then only the sweep wakes it");
    assert_eq!(upkeep.health(true, fence_at + TTL), Some(Chore::Unfence));
    assert_eq!(upkeep.health(true, fence_at + TTL), None, "unfenced once");
}

#[test]
fn a_mirror_back_within_the_margin_fences_nothing() {
    let start = Instant::now();
    let mut upkeep = Upkeep::new(TTL, start);
    upkeep.health(false, start);
    assert_eq!(upkeep.health(true, start + fence_after(TTL) / 2), None);
    assert_eq!(upkeep.fence_due(start + TTL), None);
    assert_eq!(upkeep.wake_at(), start + TTL / 2, "only the sweep is due");
}

#[test]
fn an_orphan_is_swept_a_ttl_and_a_half_after_it_was_first_found_and_not_while_stale() {
    let start = Instant::now();
    let mut upkeep = Upkeep::new(TTL, start);
    let orphan = ("t".to_string(), "c".to_string(), SessionId(7));
    let found = || vec![orphan.clone()];
    assert!(upkeep.sweep_due(start, found).is_empty(), "not due before half a TTL");
    let mut at = start + TTL / 2;
    let first = at;
    let mut swept = Vec::new();
    while swept.is_empty() {
        swept = upkeep.sweep_due(at, found);
        assert_eq!(upkeep.next_sweep, at + TTL / 2);
        at += TTL / 2;
    }
    assert_eq!(swept, vec![Chore::Sweep(orphan.clone())]);
    assert_eq!(at - TTL / 2, first + TTL * 3 / 2);
    // A delete that failed leaves it found: it is swept again at the next look.
    assert_eq!(upkeep.sweep_due(at, found), vec![Chore::Sweep(orphan.clone())]);
    // One no longer found is forgotten; found again, it waits from the start.
    at += TTL / 2;
    assert!(upkeep.sweep_due(at, Vec::new).is_empty());
    at += TTL / 2;
    assert!(upkeep.sweep_due(at, found).is_empty());
    // While the mirror does not follow, nothing is swept.
    upkeep.health(false, at);
    at += TTL * 2;
    assert!(upkeep.sweep_due(at, found).is_empty());
}
