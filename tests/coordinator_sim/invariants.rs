//! The invariants, checked from what each consumer was told (its [`Belief`]) against the
//! store's history ([`Truth`]).

use std::collections::BTreeMap;

use kafka_assigner::coordinator::StatusView;

use crate::model::{Belief, Truth};

/// No two consumers believe they own a partition outside a handoff's release window.
///
/// A consumer *claims* `p` when it was told it owns `p` and was not told to release it.
/// Its claim is still legitimate, though it may be stale, while it is in the release window
/// of a handoff: the store flipped `p` away from it with a `Releasing` handoff since it
/// last became the owner (its instance may relay that revision later than the new owner's
/// instance does). Any other overlap is double ownership: at most one claim per partition
/// may be outside a release window.
pub fn exclusive<'a>(
    truth: &Truth,
    partitions: u32,
    beliefs: impl Iterator<Item = (&'a str, &'a Belief)> + Clone,
) -> Result<u64, String> {
    // Overlaps that a release window allowed: the check is not vacuous.
    let mut in_window = 0;
    for p in 0..partitions {
        let believers: Vec<&str> =
            beliefs.clone().filter(|(_, b)| b.claims().any(|q| q == p)).map(|(name, _)| name).collect();
        let claims: Vec<&str> =
            believers.iter().copied().filter(|name| !truth.in_release_window(p, name)).collect();
        if believers.len() > 1 && claims.len() <= 1 {
            in_window += 1;
        }
        ensure!(
            claims.len() <= 1,
            "partition {p} is believed owned by {claims:?} outside a release window \
             (store at revision {}: owner {:?}, handoff {:?})",
            truth.revision,
            truth.owners.get(&p),
            truth.handoffs.get(&p)
        );
    }
    Ok(in_window)
}

/// What the fleet looks like once the faults stopped and it had time to settle.
pub struct Settled<'a> {
    pub partitions: u32,
    pub truth: &'a Truth,
    /// Consumers with an open stream: name → belief.
    pub online: BTreeMap<&'a str, &'a Belief>,
    /// The status view of every running instance.
    pub statuses: Vec<StatusView>,
    pub topic: &'a str,
}

/// Every partition is owned exactly once, by an online consumer, balanced; no handoff is
/// left; every instance's status shows that; every consumer believes exactly what it owns.
/// `Err` says what is not so yet.
pub fn settled(s: &Settled<'_>) -> Result<(), String> {
    let n = s.online.len() as u32;
    ensure!(n > 0, "no consumer online");
    ensure!(s.truth.handoffs.is_empty(), "handoffs left: {:?}", s.truth.handoffs);
    let registered: Vec<&String> = s.truth.consumers.keys().collect();
    let online: Vec<&str> = s.online.keys().copied().collect();
    ensure!(
        registered.iter().map(|r| r.as_str()).eq(online.iter().copied()),
        "registrations {registered:?} are not the online consumers {online:?}"
    );
    let mut counts: BTreeMap<&str, u32> = online.iter().map(|c| (*c, 0)).collect();
    for p in 0..s.partitions {
        let owner = s.truth.owners.get(&p).ok_or(format!("partition {p} has no owner"))?;
        let count =
            counts.get_mut(owner.as_str()).ok_or(format!("partition {p} is owned by {owner}, not online"))?;
        *count += 1;
    }
    let (low, high) = (s.partitions / n, s.partitions.div_ceil(n));
    ensure!(counts.values().all(|c| (low..=high).contains(c)), "not balanced ({low}..={high}): {counts:?}");
    for (name, belief) in &s.online {
        let owned: Vec<u32> =
            s.truth.owners.iter().filter(|(_, o)| o.as_str() == *name).map(|(p, _)| *p).collect();
        ensure!(belief.snapshot, "{name} has no snapshot yet");
        ensure!(
            belief.owned.iter().copied().eq(owned.iter().copied())
                && belief.releasing.is_empty()
                && belief.warming.is_empty(),
            "{name} believes {belief:?} but owns {owned:?}"
        );
    }
    for status in &s.statuses {
        let topic = status.topics.iter().find(|t| t.topic == s.topic);
        let topic = topic.ok_or(format!("{} does not show the topic", status.instance))?;
        ensure!(topic.handoffs.is_empty(), "{} shows handoffs {:?}", status.instance, topic.handoffs);
        let owners: Vec<Option<&String>> = (0..s.partitions).map(|p| s.truth.owners.get(&p)).collect();
        ensure!(
            topic.owners.iter().map(Option::as_ref).eq(owners.iter().copied()),
            "{} shows owners {:?}, the store {owners:?}",
            status.instance,
            topic.owners
        );
    }
    Ok(())
}
