use std::time::Duration;

use tokio::time::Instant;

use super::Upkeep;
use crate::store::SessionId;

const TTL: Duration = Duration::from_secs(4);

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
    assert_eq!(swept, vec![orphan.clone()]);
    assert_eq!(at - TTL / 2, first + TTL * 3 / 2);
    // A delete that failed leaves it found: it is swept again at the next look.
    assert_eq!(upkeep.sweep_due(at, found), vec![orphan.clone()]);
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
