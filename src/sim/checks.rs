//! The invariants checked after every step (see the module docs of `sim`), from what each
//! consumer was told against what the store holds.

use std::collections::{BTreeMap, BTreeSet};

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
        self.handoffs_end_in_time()?;
        self.converging()
    }

    /// Whether consumer `c` acts now (a paused one processes nothing until its pause ends
    /// and it has read what came meanwhile).
    fn acting(&self, c: usize) -> bool {
        self.consumers[c].paused_until < self.now
    }

    /// No partition believed owned by two consumers outside a handoff's release window.
    fn exclusive(&mut self) -> Result<(), Violation> {
        let partitions = self.config.partitions as usize;
        let mut claimant = std::mem::take(&mut self.checks.claimant);
        claimant.clear();
        claimant.resize(partitions, None);
        let mut contested = Vec::new();
        for c in 0..self.consumers.len() {
            if !self.acting(c) {
                continue;
            }
            let Some(belief) = self.consumers[c].belief() else { continue };
            for p in belief.claims() {
                match claimant.get_mut(p as usize) {
                    Some(slot @ None) => *slot = Some(c),
                    Some(Some(_)) => contested.push(p),
                    None => {}
                }
            }
        }
        self.checks.claimant = claimant;
        contested.dedup();
        for p in contested {
            self.claims_of(p)?;
        }
        Ok(())
    }

    /// Partition `p` is claimed more than once: all but one claim must be in a release
    /// window.
    fn claims_of(&mut self, p: u32) -> Result<(), Violation> {
        let believers: Vec<&str> = (0..self.consumers.len())
            .filter(|c| self.acting(*c))
            .filter(|c| self.consumers[*c].belief().is_some_and(|b| b.claims().any(|q| q == p)))
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
            let record = self.truth.consumers.get(&self.consumers[c].name);
            let Some(record) = record.filter(|_| !streaming && self.now >= self.outage_until) else {
                self.checks.orphan_since[c] = None;
                continue;
            };
            let since = *self.checks.orphan_since[c].get_or_insert(self.now);
            let held = record.hold_until.map_or(0, |ms| (ms * 1_000).saturating_sub(BASE));
            let limit = (since + ttl * 3 / 2).max(held + ttl * 3 / 2);
            if self.now > limit {
                return Err(Violation::new(
                    Invariant::Orphan,
                    format!(
                        "{}'s registration (instance {}, session {}) has had no stream for {:.3}s",
                        self.consumers[c].name,
                        record.instance,
                        record.session,
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
        if self.now <= end + settle && self.truth.direct_moves > before {
            return Err(Violation::new(
                Invariant::OutageMoved,
                format!(
                    "an outage of {:.3}s (settle period {:.3}s) moved {} partition(s) directly",
                    (end - start) as f64 / 1e6,
                    settle as f64 / 1e6,
                    self.truth.direct_moves - before
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
        match self.settled() {
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

    /// Each instance's lease, leadership, cache and watch, for a failure's message.
    fn describe_nodes(&self) -> String {
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

    /// Every partition owned once by an online consumer, balanced as the assignor places
    /// them (⌊P/N⌋ or ⌈P/N⌉ each), no handoff left, the registrations exactly the online
    /// consumers, and each of them believing exactly what it owns. `Err`: what is not so.
    fn settled(&self) -> Result<(), String> {
        if !self.truth.handoffs.is_empty() {
            return Err(format!("handoffs left: {:?}", self.truth.handoffs));
        }
        let online: BTreeMap<&str, &super::consumer::Belief> = self
            .consumers
            .iter()
            .filter_map(|c| match &c.phase {
                Phase::Online { belief, draining: false, .. } => Some((c.name.as_str(), belief)),
                _ => None,
            })
            .collect();
        if online.is_empty() {
            return Err("no consumer online".into());
        }
        let registered: BTreeSet<&str> = self.truth.consumers.keys().map(String::as_str).collect();
        if !registered.iter().copied().eq(online.keys().copied()) {
            return Err(format!(
                "registrations {registered:?} are not the online consumers {:?}",
                online.keys()
            ));
        }
        let mut counts: BTreeMap<&str, u32> = online.keys().map(|c| (*c, 0)).collect();
        for p in 0..self.config.partitions {
            let owner = self.truth.owners.get(&p).ok_or(format!("partition {p} has no owner"))?;
            *counts
                .get_mut(owner.as_str())
                .ok_or(format!("partition {p} is owned by {owner}, not online"))? += 1;
        }
        let n = online.len() as u32;
        let (low, high) = (self.config.partitions / n, self.config.partitions.div_ceil(n));
        if !counts.values().all(|c| (low..=high).contains(c)) {
            return Err(format!("not balanced ({low}..={high}): {counts:?}"));
        }
        for (name, belief) in &online {
            let owned = self.truth.owners.iter().filter(|(_, o)| o.as_str() == *name).map(|(p, _)| *p);
            if !belief.snapshot
                || !belief.owned.iter().copied().eq(owned)
                || !belief.releasing.is_empty()
                || !belief.warming.is_empty()
            {
                return Err(format!("{name} believes {belief:?}, which is not what it owns"));
            }
        }
        Ok(())
    }
}
