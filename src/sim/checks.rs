//! The invariants checked after every step (see the module docs of `sim`), from what each
//! consumer was told against what the store holds.

use std::collections::BTreeMap;

use super::cluster::Cluster;
use super::consumer::Phase;
use super::events::BASE;
use super::schedule::Kind;
use super::{Invariant, Violation};
use crate::handoff::Phase as HandoffPhase;

impl Cluster {
    /// Every invariant, now.
    pub(super) fn check(&mut self) -> Result<(), Violation> {
        self.exclusive()?;
        self.orphans()?;
        self.outage_moved_nothing()?;
        if self.fleet.is_none() {
            // The fleet has no handoffs.
            self.handoffs_end_in_time()?;
        }
        self.converging()
    }

    /// Whether consumer `c` acts now (a paused one processes nothing until its pause ends
    /// and it has read what came meanwhile).
    pub(super) fn acting(&self, c: usize) -> bool {
        self.consumers[c].paused_until < self.now
    }

    /// No partition believed owned by two consumers outside a handoff's release window.
    fn exclusive(&mut self) -> Result<(), Violation> {
        let topics = self.config.topic_set();
        let mut claimant = std::mem::take(&mut self.checks.claimant);
        claimant.clear();
        claimant.resize(topics.total() as usize, None);
        let mut contested = Vec::new();
        for c in 0..self.consumers.len() {
            if !self.acting(c) {
                continue;
            }
            let Some(belief) = self.consumers[c].belief() else { continue };
            let t = topics.of_consumer(c);
            for p in belief.claims() {
                match claimant.get_mut(topics.global(t, p) as usize) {
                    Some(slot @ None) => *slot = Some(c),
                    Some(Some(_)) => contested.push(p),
                    None => {}
                }
            }
        }
        self.checks.claimant = claimant;
        contested.sort_unstable();
        contested.dedup();
        for p in contested {
            if self.fleet.is_some() {
                self.fleet_claims_of(p)?;
            } else {
                self.claims_of(p)?;
            }
        }
        Ok(())
    }

    /// Partition `p` (global number) is claimed more than once: all but one claim must be
    /// in a release window.
    fn claims_of(&mut self, p: u32) -> Result<(), Violation> {
        let topics = self.config.topic_set();
        let (t, local) = topics.split(p);
        let believers: Vec<&str> = (0..self.consumers.len())
            .filter(|c| self.acting(*c) && topics.of_consumer(*c) == t)
            .filter(|c| self.consumers[*c].belief().is_some_and(|b| b.claims().any(|q| q == local)))
            .map(|c| self.consumers[c].name.as_str())
            .collect();
        let (now, grace) = (self.now, self.config.ttl.as_micros() as u64);
        let claims: Vec<&str> = believers
            .iter()
            .copied()
            .filter(|name| !self.truth.in_release_window(p, name, now, grace))
            .collect();
        if claims.len() > 1 {
            return Err(Violation::new(
                Invariant::Exclusive,
                format!(
                    "partition {p} is believed owned by {claims:?} outside a release window (store at revision {}: \
                     owner {:?}, handoff {:?})",
                    self.truth.revision,
                    self.truth.owners.get(&p),
                    self.truth.handoffs.get(&p)
                ),
            ));
        }
        self.outcome.in_window += 1;
        Ok(())
    }

    /// No registration without a stream for more than 1.5 TTL (a hold, or an outage of
    /// the store, extends that: nothing can be deleted meanwhile).
    fn orphans(&mut self) -> Result<(), Violation> {
        let ttl = self.config.ttl.as_micros() as u64;
        let n = self.consumers.len();
        self.checks.orphan_since.resize(n, None);
        let mut streaming = std::mem::take(&mut self.checks.streaming);
        streaming.clear();
        streaming.resize(n, false);
        for node in self.nodes.iter().filter(|node| node.machine.is_some()) {
            for c in node.streams.values() {
                streaming[*c] = true;
            }
        }
        let result = self.orphans_among(&streaming, ttl);
        self.checks.streaming = streaming;
        result
    }

    fn orphans_among(&mut self, streaming: &[bool], ttl: u64) -> Result<(), Violation> {
        for (c, streaming) in streaming.iter().copied().enumerate() {
            if streaming {
                self.checks.orphan_since[c] = None;
                continue;
            }
            // While the store is out nothing can be deleted: known without a look-up.
            let record = if self.now >= self.outage_until { self.registration_of(c) } else { None };
            let Some(held) = record.map(|(_, held)| held) else {
                self.checks.orphan_since[c] = None;
                continue;
            };
            let since = *self.checks.orphan_since[c].get_or_insert(self.now);
            let mut limit = (since + ttl * 3 / 2).max(held + ttl * 3 / 2);
            if self.now <= limit {
                continue; // what befell its instance only extends the limit
            }
            // Its instance could not write the store meanwhile (its node's connection cut):
            // it deletes the registration once the cut heals, or its session lapses first
            // (¾ TTL to notice it cannot follow, then the TTL: `LeaseHolder::renews`), also
            // when it crashed meanwhile (its last renewal came before the cut).
            let holder = self.registration_of(c).and_then(|(instance, _)| Cluster::node_of(instance));
            let holder = holder.and_then(|n| self.nodes.get(n));
            if let Some(node) = holder
                && node.cut_until > since
            {
                let healed = node.cut_until + ttl * 3 / 2;
                let lapsed = node.cut_from + ttl * 5 / 2;
                limit = limit.max(healed.min(lapsed));
            }
            // Its instance crashed meanwhile, before it deleted the registration: the
            // registration goes with that instance's session, within a TTL of the crash.
            if let Some(node) = holder
                && node.crashed_at > since
            {
                limit = limit.max(node.crashed_at + ttl * 3 / 2);
            }
            if self.now > limit {
                return Err(Violation::new(
                    Invariant::Orphan,
                    format!(
                        "{}'s registration ({}) has had no stream for {:.3}s",
                        self.consumers[c].name,
                        self.describe_registration(c),
                        (self.now - since) as f64 / 1e6
                    ),
                ));
            }
        }
        Ok(())
    }

    /// An outage shorter than the settle period moves no partition, until the settle
    /// period after it has passed (consumers come straight back).
    fn outage_moved_nothing(&mut self) -> Result<(), Violation> {
        let (Kind::Outage, Some(before), Some((start, end))) =
            (self.kind, self.checks.outage_moves, self.schedule.outage)
        else {
            return Ok(());
        };
        let settle = self.config.settle.unwrap_or(self.config.ttl).as_micros() as u64;
        let moves = self.fleet.as_ref().map_or(self.truth.direct_moves, |fleet| fleet.moves);
        if self.now <= end + settle && moves > before {
            return Err(Violation::new(
                Invariant::OutageMoved,
                format!(
                    "an outage of {:.3}s (settle period {:.3}s) moved {} partition(s) directly",
                    (end - start) as f64 / 1e6,
                    settle as f64 / 1e6,
                    moves - before
                ),
            ));
        }
        Ok(())
    }

    /// Every handoff's phase ends within its time limit, plus a reconcile pass, a failover
    /// (2 TTL) and the settle period, once no fault has lasted for as long.
    fn handoffs_end_in_time(&mut self) -> Result<(), Violation> {
        let ttl = self.config.ttl.as_micros() as u64;
        let settle = self.config.settle.unwrap_or(self.config.ttl).as_micros() as u64;
        let slack = self.config.reconcile.as_micros() as u64 + 2 * ttl + settle;
        if self.now < self.checks.last_disruption + slack || self.now < self.outage_until + slack {
            return Ok(());
        }
        for (p, handoff) in &self.truth.handoffs {
            let limit = match handoff.phase {
                HandoffPhase::Warming => self.config.warm_timeout,
                HandoffPhase::Releasing => self.config.release_timeout,
            };
            let since = (handoff.since * 1_000).saturating_sub(BASE);
            let age = self.now.saturating_sub(since);
            if age > limit.as_micros() as u64 + slack {
                return Err(Violation::new(
                    Invariant::HandoffOverdue,
                    format!(
                        "partition {p}'s handoff {handoff:?} is {:.3}s in its phase (limit {:.3}s + {:.3}s)",
                        age as f64 / 1e6,
                        limit.as_secs_f64(),
                        slack as f64 / 1e6
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Once the faults stopped: converged within the bound, or a violation.
    fn converging(&mut self) -> Result<(), Violation> {
        let Some(quiet_at) = self.checks.quiet_at else { return Ok(()) };
        let overdue = self.now > quiet_at + self.config.converge_within.as_micros() as u64;
        // Most steps of the quiet phase are not settled yet: the cheap signs first, the
        // words only for a failure.
        if !overdue && !self.truth.handoffs.is_empty() {
            return Ok(());
        }
        let settled = if self.fleet.is_some() { self.fleet_settled(overdue) } else { self.settled() };
        match settled {
            Ok(()) => {
                self.checks.converged_at = Some(self.now);
                self.outcome.converged_after = self.now - quiet_at;
                Ok(())
            }
            Err(why) if overdue => Err(Violation::new(
                Invariant::Converged,
                format!(
                    "{:.1}s after the faults stopped: {why}; instances: {}",
                    (self.now - quiet_at) as f64 / 1e6,
                    self.describe_nodes()
                ),
            )),
            Err(_) => Ok(()),
        }
    }

    /// Consumer `c`'s registration in the store, if it has one: the id of the instance
    /// holding it, and until when (virtual µs) a restart hold keeps it (0: none).
    fn registration_of(&self, c: usize) -> Option<(&str, u64)> {
        let name = &self.consumers[c].name;
        if let Some(fleet) = &self.fleet {
            let member = fleet.members.get(name)?;
            return Some((&member.record.instance, 0));
        }
        let record = self.truth.consumers.get(name)?;
        let held = record.hold_until.map_or(0, |ms| (ms * 1_000).saturating_sub(BASE));
        Some((&record.instance, held))
    }

    /// Consumer `c`'s registration, for a failure's message.
    fn describe_registration(&self, c: usize) -> String {
        let name = &self.consumers[c].name;
        let fleet = self.fleet.as_ref().and_then(|fleet| fleet.members.get(name));
        match (fleet, self.truth.consumers.get(name)) {
            (Some(m), _) => format!("instance {}, session {}", m.record.instance, m.record.session),
            (None, Some(r)) => format!("instance {}, session {}", r.instance, r.session),
            (None, None) => "gone".into(),
        }
    }

    /// Each instance's lease, leadership, cache and watch, for a failure's message.
    pub(super) fn describe_nodes(&self) -> String {
        let nodes = self.nodes.iter().map(|n| {
            let loaded = n.machine.as_ref().is_some_and(|m| m.loaded());
            format!(
                "{} (lease {:?}, leading {}, loaded {loaded}, watch {:?}, streams {})",
                n.id,
                n.keeper.state(),
                n.leading,
                n.watch.as_ref().map(|(id, cursor)| (id, cursor.next)),
                n.streams.len()
            )
        });
        nodes.collect::<Vec<_>>().join(", ")
    }

    /// Every partition owned once by an online consumer of its topic, balanced as the
    /// assignor places them (⌊P/N⌋ or ⌈P/N⌉ each over the topic's N online consumers), no
    /// handoff left, the registrations exactly the online consumers, and each of them
    /// believing exactly what it owns. A topic none of whose consumers is online is left
    /// out (its partitions stay with their last owner, docs/design.md §6). `Err`: what is
    /// not so (the first few of each).
    pub(super) fn settled(&self) -> Result<(), String> {
        if let Some((p, handoff)) = self.truth.handoffs.iter().next() {
            return Err(format!(
                "{} handoff(s) left, first of partition {p}: {handoff:?}",
                self.truth.handoffs.len()
            ));
        }
        let topics = self.config.topic_set();
        // Online consumers by name: (topic, belief).
        let online: BTreeMap<&str, (u32, &super::consumer::Belief)> = (0..self.consumers.len())
            .filter_map(|c| match &self.consumers[c].phase {
                Phase::Online { belief, draining: false, .. } => {
                    Some((self.consumers[c].name.as_str(), (topics.of_consumer(c), belief)))
                }
                _ => None,
            })
            .collect();
        if online.is_empty() {
            return Err("no consumer online".into());
        }
        if let Some(odd) =
            self.truth.consumers.keys().map(String::as_str).find(|name| !online.contains_key(name))
        {
            return Err(format!("{odd} is registered but not online"));
        }
        if let Some(odd) = online.keys().find(|name| !self.truth.consumers.contains_key(**name)) {
            return Err(format!("{odd} is online but not registered"));
        }
        let mut per_topic = vec![0u32; topics.count as usize];
        online.values().for_each(|(t, _)| per_topic[*t as usize] += 1);
        // Each online consumer's partitions, in order (global numbers are in topic order).
        let mut owned: BTreeMap<&str, Vec<u32>> = online.keys().map(|c| (*c, Vec::new())).collect();
        for g in 0..topics.total() {
            let (t, p) = topics.split(g);
            if per_topic[t as usize] == 0 {
                continue;
            }
            let owner =
                self.truth.owners.get(&g).ok_or(format!("partition {}/{p} has no owner", topics.name(t)))?;
            match (owned.get_mut(owner.as_str()), online.get(owner.as_str())) {
                (Some(list), Some((topic, _))) if *topic == t => list.push(p),
                _ => {
                    return Err(format!(
                        "partition {}/{p} is owned by {owner}, not online for it",
                        topics.name(t)
                    ));
                }
            }
        }
        for (name, (t, belief)) in &online {
            let n = per_topic[*t as usize];
            let (low, high) = (topics.partitions / n, topics.partitions.div_ceil(n));
            let mine = &owned[name];
            if !(low..=high).contains(&(mine.len() as u32)) {
                return Err(format!(
                    "{name} owns {} of {}'s partitions, not {low}..={high} (not balanced)",
                    mine.len(),
                    topics.name(*t)
                ));
            }
            if !belief.snapshot
                || !belief.owned.iter().copied().eq(mine.iter().copied())
                || !belief.releasing.is_empty()
                || !belief.warming.is_empty()
            {
                return Err(format!("{name} believes {belief:?}, which is not what it owns ({mine:?})"));
            }
        }
        Ok(())
    }
}
