//! The invariants checked after every step of the simulation (see the crate docs): what
//! the writes of `step` must be, that every delivered command agrees with the state and
//! every client's belief with what it owns, the shape of the state, what a leader tick
//! must have done, and what a settled fleet looks like.

use std::collections::{BTreeMap, BTreeSet};

use kafka_assigner::handoff::{
    Command, ConsumerStatus, ConsumerView, Event, HandoffError, Millis, Phase, TopicState, Write,
};

use crate::driver::Sim;
use crate::model::{Refusal, UNKNOWN, apply, expected};

impl Sim {
    /// A refused call changes nothing; applying the writes of an accepted one to the old
    /// state gives exactly the new one, each write changes something, and a membership
    /// event writes nothing.
    pub(crate) fn check_writes(
        &self,
        before: &TopicState,
        event: &Event,
        result: &Result<Vec<Write>, HandoffError>,
    ) -> Result<(), String> {
        match result {
            Err(_) => ensure!(self.state == *before, "a refused call changed the state"),
            Ok(writes) => {
                let mut applied = before.clone();
                applied.consumers = self.state.consumers.clone();
                for (i, w) in writes.iter().enumerate() {
                    let p = w.partition();
                    ensure!(
                        i == 0 || writes[i - 1].partition() <= p,
                        "writes not in partition order: {writes:?}"
                    );
                    let changes = match w {
                        Write::SetOwner { owner, .. } => applied.owners.get(&p) != Some(owner),
                        Write::ClearOwner { .. } => applied.owners.contains_key(&p),
                        Write::PutHandoff { handoff, .. } => applied.handoffs.get(&p) != Some(handoff),
                        Write::DeleteHandoff { .. } => applied.handoffs.contains_key(&p),
                    };
                    ensure!(changes, "write {w:?} changes nothing");
                    apply(&mut applied, w);
                }
                ensure!(
                    applied == self.state,
                    "the writes {writes:?} applied to the old state do not give the new state"
                );
                if !matches!(event, Event::Tick(_) | Event::Ready(..) | Event::Released(..)) {
                    ensure!(writes.is_empty(), "a membership event wrote {writes:?}");
                }
            }
        }
        Ok(())
    }

    /// The call or membership event did what the reference model expects.
    pub(crate) fn check_model(
        &self,
        before: &TopicState,
        event: &Event,
        result: &Result<Vec<Write>, HandoffError>,
    ) -> Result<(), String> {
        if let Some(expected) = expected(before, event, self.now) {
            match (expected, result) {
                (Ok(s), Ok(_)) => ensure!(s == self.state, "expected state {s:#?}"),
                (Err(r), Err(e)) => ensure!(r == Refusal::of(e), "expected refusal {r:?}, got {e:?}"),
                (Ok(_), Err(e)) => return Err(format!("expected the call to be accepted, got {e:?}")),
                (Err(r), Ok(_)) => return Err(format!("expected refusal {r:?}, the call was accepted")),
            }
        }
        Ok(())
    }

    /// The relay sends only to live consumers, and the test agrees with the state on who is
    /// live. Returns whether `name` is live.
    pub(crate) fn check_relayed(
        &self,
        name: &str,
        view: &ConsumerView,
        cmds: &[Command],
    ) -> Result<bool, String> {
        let client = &self.clients[name];
        ensure!(
            client.live == self.state.is_live(name),
            "{name}: test thinks live={}, state disagrees",
            client.live
        );
        if !client.live {
            ensure!(*view == ConsumerView::default(), "{name} is not live but has a view {view:?}");
            ensure!(cmds.is_empty(), "{cmds:?} sent to {name}, which is not live");
        }
        Ok(client.live)
    }

    /// One consumer receives its commands; each is checked against the state.
    pub(crate) fn deliver(&mut self, name: &str, cmds: &[Command]) -> Result<(), String> {
        let state = &self.state;
        let client = self.clients.get_mut(name).expect("pool name");
        let owner = |p: &u32| state.owners.get(p).map(String::as_str);
        for (i, cmd) in cmds.iter().enumerate() {
            match cmd {
                Command::Assignment { assigned, unassigned } => {
                    ensure!(i == 0, "{name}: Assignment is not the first command: {cmds:?}");
                    ensure!(!assigned.is_empty() || !unassigned.is_empty(), "{name}: empty Assignment");
                    ensure!(
                        assigned.windows(2).all(|w| w[0] < w[1]),
                        "{name}: assigned not sorted: {cmds:?}"
                    );
                    ensure!(
                        unassigned.windows(2).all(|w| w[0] < w[1]),
                        "{name}: unassigned not sorted: {cmds:?}"
                    );
                    for p in assigned {
                        ensure!(owner(p) == Some(name), "{name} assigned {p}, owned by {:?}", owner(p));
                        ensure!(!client.belief.contains(p), "{name} assigned {p}, which it already had");
                        client.belief.insert(*p);
                        client.warms.remove(p);
                    }
                    for p in unassigned {
                        ensure!(!assigned.contains(p), "{name}: {p} both assigned and unassigned");
                        ensure!(owner(p) != Some(name), "{name} unassigned {p}, which it owns");
                        let warming =
                            state.handoffs.get(p).is_some_and(|h| h.phase == Phase::Warming && h.to == name);
                        ensure!(!warming, "{name} unassigned {p}, which it is warming");
                        ensure!(
                            client.belief.contains(p) || client.warms.contains_key(p),
                            "{name} unassigned {p}, which it neither owned nor warmed"
                        );
                        client.belief.remove(p);
                        client.warms.remove(p);
                    }
                }
                Command::Warm { partition, current_owner } => {
                    let ok = state.handoffs.get(partition).is_some_and(|h| {
                        h.phase == Phase::Warming && h.to == name && h.from == *current_owner
                    });
                    ensure!(
                        ok,
                        "{name} told to warm {partition} from {current_owner}: no such warming handoff"
                    );
                    ensure!(owner(partition) == Some(current_owner.as_str()), "Warm names a non-owner");
                    client.warms.insert(*partition, current_owner.clone());
                }
                Command::Release { partition, new_owner } => {
                    let ok = state
                        .handoffs
                        .get(partition)
                        .is_some_and(|h| h.phase == Phase::Releasing && h.from == name && h.to == *new_owner);
                    ensure!(
                        ok,
                        "{name} told to release {partition} to {new_owner}: no such releasing handoff"
                    );
                    ensure!(owner(partition) == Some(new_owner.as_str()), "Release names a non-owner");
                    client.belief.remove(partition);
                    client.releases.insert(*partition, new_owner.clone());
                }
            }
        }
        Ok(())
    }

    /// After its delivery, a client believes it owns exactly what it was told, warms what it
    /// was told, and was asked for every release it is told of.
    pub(crate) fn check_beliefs(&self, name: &str) -> Result<(), String> {
        let client = &self.clients[name];
        ensure!(
            client.belief == client.told.owned,
            "{name} believes it owns {:?} but owns {:?}",
            client.belief,
            client.told.owned
        );
        ensure!(
            client.warms == client.told.warming,
            "{name} was asked to warm {:?} but is warming {:?}",
            client.warms,
            client.told.warming
        );
        for (p, to) in &client.told.releasing {
            ensure!(client.releases.get(p) == Some(to), "{name} was never asked to release {p} to {to}");
        }
        Ok(())
    }

    /// No name that never joins has a view, and the ownership invariant of docs/design.md §5:
    /// every partition is believed owned by at most one live consumer.
    pub(crate) fn check_ownership(&self) -> Result<(), String> {
        for name in UNKNOWN {
            ensure!(ConsumerView::of(&self.state, name) == ConsumerView::default(), "'{name}' has a view");
        }
        // The ownership invariant of docs/design.md §5.
        let mut believer: Vec<Option<&str>> = vec![None; self.p() as usize];
        for (name, client) in self.clients.iter().filter(|(_, c)| c.live) {
            for &p in &client.belief {
                let slot = believer
                    .get_mut(p as usize)
                    .ok_or_else(|| format!("{name} believes it owns {p} >= P"))?;
                if let Some(other) = slot {
                    return Err(format!("partition {p} is believed owned by {other} and {name}"));
                }
                *slot = Some(name);
            }
        }
        Ok(())
    }

    /// Invariants of the state after any step.
    /// Ownership epochs (docs/design.md §10): every owned partition has one; a partition's
    /// epoch never decreases, and grows whenever its owner changes, so two owners never
    /// share one; a warming handoff carries an epoch above its source's.
    pub(crate) fn check_epochs(&mut self) -> Result<(), String> {
        let s = &self.state;
        for (p, owner) in &s.owners {
            let Some(&epoch) = s.epochs.get(p) else {
                return Err(format!("partition {p} has an owner, no epoch"));
            };
            ensure!(epoch > 0, "partition {p} owned by '{owner}' at epoch 0");
            if let Some((before, seen)) = self.epochs_seen.get(p) {
                ensure!(
                    epoch >= *seen,
                    "partition {p}: epoch went back from {seen} ({before}) to {epoch} ({owner})"
                );
                ensure!(
                    before == owner || epoch > *seen,
                    "partition {p}: '{before}' and '{owner}' share epoch {epoch}"
                );
            }
            if let Some(h) = s.handoffs.get(p).filter(|h| h.phase == Phase::Warming) {
                ensure!(
                    h.epoch > epoch,
                    "warming handoff of {p} at epoch {} is not above its owner's {epoch}",
                    h.epoch
                );
            }
        }
        for (p, owner) in &s.owners {
            let epoch = s.epochs.get(p).copied().unwrap_or(0);
            self.epochs_seen.insert(*p, (owner.clone(), epoch));
        }
        Ok(())
    }

    pub(crate) fn check_state(&self) -> Result<(), String> {
        let s = &self.state;
        for name in s.consumers.keys() {
            ensure!(self.clients.get(name).is_some_and(|c| c.live), "'{name}' is live in the state only");
        }
        for (p, o) in &s.owners {
            ensure!(*p < self.p(), "owner record for partition {p} >= P");
            ensure!(self.ever_joined.contains(o), "partition {p} owned by '{o}', which never joined");
        }
        let mut warming: BTreeMap<&str, usize> = BTreeMap::new();
        for (p, h) in &s.handoffs {
            ensure!(*p < self.p(), "handoff for partition {p} >= P");
            ensure!(h.from != h.to, "handoff of {p} from {} to itself", h.from);
            ensure!(
                self.ever_joined.contains(&h.from) && self.ever_joined.contains(&h.to),
                "handoff of {p} names a consumer that never joined: {h:?}"
            );
            ensure!(h.since <= self.now, "handoff of {p} starts in the future: {h:?}");
            let owner = s.owners.get(p);
            match h.phase {
                Phase::Warming => {
                    ensure!(
                        owner == Some(&h.from),
                        "warming handoff of {p} {h:?}, but the owner is {owner:?}"
                    );
                    *warming.entry(h.to.as_str()).or_default() += 1;
                }
                Phase::Releasing => {
                    ensure!(
                        owner == Some(&h.to),
                        "releasing handoff of {p} {h:?}, but the owner is {owner:?}"
                    )
                }
            }
        }
        for (to, n) in warming {
            ensure!(
                n <= self.config.max_warming_per_consumer,
                "{to} warms {n} partitions, more than {}",
                self.config.max_warming_per_consumer
            );
        }
        Ok(())
    }

    /// What the leader's reconcile at `at` must have done (docs/design.md §5.1, §5.5, §5.6).
    pub(crate) fn check_tick(&mut self, before: &TopicState, at: Millis) -> Result<(), String> {
        let s = &self.state;
        let any_active = s.consumers.values().any(|st| *st == ConsumerStatus::Active);
        for (p, h) in &before.handoffs {
            if s.handoffs.get(p) == Some(h) {
                continue;
            }
            let age = at.saturating_sub(h.since);
            let live = s.is_live(&h.from) && s.is_live(&h.to);
            match h.phase {
                Phase::Warming if live && age >= self.config.warm_timeout_ms => self.stats.warm_timeouts += 1,
                Phase::Releasing if live && age >= self.config.release_timeout_ms => {
                    self.stats.release_timeouts += 1
                }
                _ => {}
            }
        }
        for (p, h) in &s.handoffs {
            let age = at - h.since;
            match h.phase {
                Phase::Warming => {
                    ensure!(s.is_live(&h.from), "after a tick, warming handoff of {p} from dead {}", h.from);
                    ensure!(
                        s.is_active(&h.to),
                        "after a tick, warming handoff of {p} to non-active {}",
                        h.to
                    );
                    ensure!(age < self.config.warm_timeout_ms, "after a tick, warm of {p} is past its limit");
                }
                Phase::Releasing => {
                    ensure!(
                        s.is_live(&h.from),
                        "after a tick, releasing handoff of {p} from dead {}",
                        h.from
                    );
                    ensure!(
                        age < self.config.release_timeout_ms,
                        "after a tick, release of {p} is past its limit"
                    );
                }
            }
            if before.handoffs.get(p) != Some(h) {
                ensure!(
                    h.phase == Phase::Warming && h.since == at,
                    "a tick created a handoff that is not a new warm: {h:?}"
                );
                self.stats.handoffs_started += 1;
            }
        }
        for p in 0..self.p() {
            let (old, new) = (before.owners.get(&p), s.owners.get(&p));
            if old != new {
                ensure!(
                    old.is_none_or(|o| !before.is_live(o)),
                    "a tick took {p} from live owner {old:?} without a handoff (now {new:?})"
                );
                ensure!(new.is_some_and(|o| s.is_active(o)), "a tick gave {p} to non-active {new:?}");
                self.stats.direct_assignments += 1;
            }
            if any_active {
                let live_owner = new.is_some_and(|o| s.is_live(o));
                let releasing = s.handoffs.get(&p).is_some_and(|h| h.phase == Phase::Releasing);
                ensure!(
                    live_owner || releasing,
                    "after a tick, {p} has no live owner ({new:?}) though a consumer is active"
                );
            }
        }
        Ok(())
    }

    /// The settled fleet (see the crate docs), after [`Sim::quiesce`].
    pub(crate) fn check_settled(&mut self) -> Result<(), String> {
        let s = &self.state;
        self.step_no += 1;
        ensure!(s.handoffs.is_empty(), "settled with handoffs left: {:?}", s.handoffs);
        let active: Vec<&String> =
            s.consumers.iter().filter(|(_, st)| **st == ConsumerStatus::Active).map(|(n, _)| n).collect();
        if !active.is_empty() {
            self.stats.settled_with_active += 1;
            ensure!(
                s.consumers.len() == active.len(),
                "settled with draining consumers that did not leave: {:?}",
                s.consumers
            );
            let mut counts: BTreeMap<&str, u32> = active.iter().map(|n| (n.as_str(), 0)).collect();
            for p in 0..self.p() {
                let owner = s.owners.get(&p);
                ensure!(owner.is_some_and(|o| s.is_active(o)), "settled: partition {p} owned by {owner:?}");
                *counts.get_mut(owner.expect("checked").as_str()).expect("active") += 1;
            }
            ensure!(s.owners.len() as u32 == self.p(), "settled with extra owner records");
            let n = active.len() as u32;
            let (lo, hi) = (self.p() / n, self.p().div_ceil(n));
            for (c, k) in &counts {
                ensure!(*k >= lo && *k <= hi, "unbalanced: {c} owns {k}, expected {lo}..={hi} ({counts:?})");
            }
        }
        for (name, client) in self.clients.iter().filter(|(_, c)| c.live) {
            let owned: BTreeSet<u32> = s.owners.iter().filter(|(_, o)| *o == name).map(|(p, _)| *p).collect();
            ensure!(client.belief == owned, "settled: {name} believes {:?}, owns {owned:?}", client.belief);
            ensure!(client.warms.is_empty(), "settled: {name} still asked to warm {:?}", client.warms);
            ensure!(
                client.releases.is_empty(),
                "settled: {name} still asked to release {:?}",
                client.releases
            );
        }
        Ok(())
    }
}
