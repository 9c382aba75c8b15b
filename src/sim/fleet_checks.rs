//! The whole-cluster checks of a fleet run (`checks.rs` calls them in place of the
//! handoff's): exclusive ownership, where the fleet's promise is that a giver was *sent*
//! `unassigned` before its lease is deleted, and convergence to the fair share.

use std::collections::BTreeMap;

use super::cluster::Cluster;
use super::consumer::{Belief, Phase};
use super::{Invariant, Violation};
use crate::assignment::{Balanced, ConsumerInfo};
use crate::coordinator::fleet_backend::share::share_of;

impl Cluster {
    /// Partition `p` (global number) is believed owned by more than one acting consumer:
    /// all but one must have been sent an `unassigned` of it that has not reached them yet,
    /// or have lost its lease to an early revocation of their session within a TTL (a fault
    /// beyond what a keeper can fence ahead of: their instance tells them once its watch
    /// shows the revocation, or fences), or have had the registration of the stream they
    /// read replaced by another of their name within a TTL (a `Register` of theirs that
    /// reached an instance after they had gone on, which no instance can tell from a
    /// reconnect: the stream they read is told it was replaced once its instance's watch
    /// shows it, or its instance fences).
    pub(super) fn fleet_claims_of(&mut self, p: u32) -> Result<(), Violation> {
        let Some(fleet) = &self.fleet else { return Ok(()) };
        let topics = self.config.topic_set();
        let (t, local) = topics.split(p);
        let (now, grace) = (self.now, self.config.ttl.as_micros() as u64);
        let mut claims = Vec::new();
        for c in (0..self.consumers.len()).filter(|c| self.acting(*c) && topics.of_consumer(*c) == t) {
            let consumer = &self.consumers[c];
            let (Some(belief), Some((node, stream))) = (consumer.belief(), consumer.stream()) else {
                continue;
            };
            if !belief.claims().any(|q| q == local) {
                continue;
            }
            let told_to_stop = self.checks.unassigned_pending(node, stream, local);
            let since = self.checks.online_since.get(&(node, stream)).copied().unwrap_or(now);
            let replaced = fleet.replaced_lately(&consumer.name, since, now, grace);
            if !told_to_stop && !replaced && !fleet.revoked_lately(p, &consumer.name, now, grace) {
                claims.push(consumer.name.as_str());
            }
        }
        if claims.len() > 1 {
            return Err(Violation::new(
                Invariant::Exclusive,
                format!(
                    "partition {p} is believed owned by {claims:?}, none of them sent `unassigned` of it \
                     (store at revision {}: leased to {:?})",
                    fleet.revision,
                    fleet.leases.get(&p)
                ),
            ));
        }
        self.outcome.in_window += 1;
        Ok(())
    }

    /// Every partition of a topic with an online consumer leased by one of them, each
    /// holding exactly its fair share (`fleet_backend::share`: ⌊P/N⌋ or ⌈P/N⌉, the extra
    /// ones to the first names), the member records exactly the online consumers (none
    /// leaving), and each believing exactly its leases. `Err`: what is not so, in words
    /// only when `words` (most steps of the quiet phase are not settled yet, and only an
    /// overdue one is reported: the words would be thrown away).
    pub(super) fn fleet_settled(&self, words: bool) -> Result<(), String> {
        let why = |text: &dyn Fn() -> String| if words { text() } else { String::new() };
        let Some(fleet) = &self.fleet else { return Err("not a fleet run".into()) };
        if !words {
            // The cheap signs first, none of which the settled state lacks: as many member
            // records as online consumers, each of those with its snapshot.
            let mut online = 0;
            for consumer in &self.consumers {
                if let Phase::Online { belief, draining: false, .. } = &consumer.phase {
                    if !belief.snapshot {
                        return Err(String::new());
                    }
                    online += 1;
                }
            }
            if online == 0 || online != fleet.members.len() {
                return Err(String::new());
            }
        }
        let topics = self.config.topic_set();
        let online: BTreeMap<&str, (u32, &Belief)> = (0..self.consumers.len())
            .filter_map(|c| match &self.consumers[c].phase {
                Phase::Online { belief, draining: false, .. } => {
                    Some((self.consumers[c].name.as_str(), (topics.of_consumer(c), belief)))
                }
                _ => None,
            })
            .collect();
        if online.is_empty() {
            return Err(why(&|| "no consumer online".into()));
        }
        if let Some((name, member)) =
            fleet.members.iter().find(|(n, m)| m.record.leaving || !online.contains_key(n.as_str()))
        {
            return Err(why(&|| {
                format!("{name} has a member record ({:?}) but is not online", member.record)
            }));
        }
        if let Some(odd) = online.keys().find(|name| !fleet.members.contains_key(**name)) {
            return Err(why(&|| format!("{odd} is online but has no member record")));
        }
        for t in 0..topics.count {
            // The topic's live members in name order, as every instance ranks them.
            let live: BTreeMap<String, ConsumerInfo> = online
                .iter()
                .filter(|(_, (topic, _))| *topic == t)
                .map(|(name, _)| (name.to_string(), ConsumerInfo::default()))
                .collect();
            if live.is_empty() {
                continue; // its leases stay with their last owners
            }
            let mut owners: BTreeMap<u32, &str> = BTreeMap::new();
            for p in 0..topics.partitions {
                let owner = fleet.owner(topics.global(t, p));
                match owner.filter(|o| live.contains_key(*o)) {
                    Some(o) => owners.insert(p, o),
                    None => {
                        return Err(why(&|| {
                            format!(
                                "partition {}/{p} is leased to {owner:?}, not online for it",
                                topics.name(t)
                            )
                        }));
                    }
                };
            }
            for name in live.keys() {
                let registered = |n: &str| live.contains_key(n);
                let share = share_of(&Balanced, topics.partitions, &live, registered, name, &owners)
                    .ok_or_else(|| why(&|| format!("{name} has no share")))?;
                let held = || owners.iter().filter(|(_, o)| **o == name).map(|(p, _)| *p);
                let count = held().count();
                if count != share.quota {
                    return Err(why(&|| {
                        format!(
                            "{name} holds {count} of {}'s partitions, its share is {} (not balanced)",
                            topics.name(t),
                            share.quota
                        )
                    }));
                }
                let belief = online[name.as_str()].1;
                if !belief.snapshot || !belief.owned.iter().copied().eq(held()) {
                    return Err(why(&|| {
                        let held: Vec<u32> = held().collect();
                        format!("{name} believes {belief:?}, which is not what it holds ({held:?})")
                    }));
                }
            }
        }
        Ok(())
    }
}
