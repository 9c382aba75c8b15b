//! The cluster's side of the store: requests reaching the store model and their answers
//! (delayed, lost, or refused while cut off), the watches' pumps and progress marks, and the
//! lease keepers' requests. Methods of [`Cluster`], kept apart from the run loop.

use std::time::Duration;

use super::Violation;
use super::cluster::{CALL_BUDGET, Cluster};
use super::events::Ev;
use super::instance::Machine;
use super::lease::KeeperAsk;
use crate::coordinator::machine::io::{Input, RequestId, StoreReply, StoreRequest};
use crate::store::{InjectedFault, Revision, StoreError, Unreachable, WatchBatch};

impl Cluster {
    /// A store request reaches the store: applied, and its answer sent back (or lost).
    pub(super) fn arrive(
        &mut self,
        node: usize,
        life: u32,
        request: RequestId,
        op: StoreRequest,
    ) -> Result<(), Violation> {
        if self.nodes[node].life != life {
            return Ok(());
        }
        let answer = if self.reachable(node) {
            self.sync_truth(None)?;
            let now = self.store_now();
            let answer = match op {
                StoreRequest::Txn(txn) => {
                    self.counts.txns += 1;
                    self.store.txn(now, &txn).map(StoreReply::Txn)
                }
                StoreRequest::Get(keys) => {
                    self.counts.gets += 1;
                    Ok(StoreReply::Values(keys.iter().map(|key| self.store.get(now, key)).collect()))
                }
                StoreRequest::GetPrefix(prefix) => {
                    let read = self.store.get_prefix(now, &prefix);
                    self.counts.prefix_reads += 1;
                    self.counts.prefix_read_keys += read.kvs.len() as u64;
                    Ok(StoreReply::Prefix(read))
                }
                StoreRequest::Watch { prefix, from } => match self.store.watch(&prefix, from) {
                    Ok(cursor) => {
                        self.nodes[node].watch = Some((request, cursor));
                        self.nodes[node].pump_pending = false;
                        self.schedule_pump(node);
                        Ok(StoreReply::Watching)
                    }
                    Err(error) => Err(error),
                },
            };
            self.sync_truth(Some(node))?;
            answer
        } else {
            Err(StoreError::Unavailable(InjectedFault::CutOff { what: "request" }.into()))
        };
        if !self.lost() {
            let mut at = self.now + self.delay();
            if !self.config.answers_reorder {
                at = at.max(self.nodes[node].answer_clock);
                self.nodes[node].answer_clock = at;
            }
            let input = Input::StoreAnswer { request, answer };
            self.push(at, Ev::Input { node, life, input });
        } else if !self.config.lost_answers_vanish {
            // The driver's call budget runs out: the instance hears a timeout, whether or
            // not the request took effect.
            let error =
                StoreError::Unavailable(Unreachable::NoAnswer { within: Duration::from_micros(CALL_BUDGET) });
            let input = Input::StoreAnswer { request, answer: Err(error) };
            self.after(CALL_BUDGET, Ev::Input { node, life, input });
        }
        Ok(())
    }

    /// Follows the store's new revisions in the truth (`writer`: whose write they are),
    /// and tells the watches there is something new.
    pub(super) fn sync_truth(&mut self, writer: Option<usize>) -> Result<(), Violation> {
        let now = self.store_now();
        if writer.is_none() && self.now >= self.outage_until {
            self.store.expire_due(now);
        }
        self.schedule_store_tick();
        if self.truth_cursor.next > self.store.revision() {
            return Ok(());
        }
        let batches = self.store.poll(&mut self.truth_cursor).map_err(|error| {
            Violation::new(super::Invariant::LegalMove, format!("the truth's own watch failed: {error}"))
        })?;
        let id = writer.map(|w| self.nodes[w].id.clone());
        let (moves, keys) = (self.truth.plan_moves, self.truth.keys_changed);
        for batch in &batches {
            self.trace.mix(&[batch.revision as u64, batch.events.len() as u64]);
            self.truth.apply(&self.keys, batch, id.as_deref(), self.now)?;
            if let Some(fleet) = &mut self.fleet {
                fleet.apply(batch, self.revoking, self.now)?;
            }
        }
        let counts = &mut self.counts;
        counts.keys_changed += self.truth.keys_changed - keys;
        counts.owner_changes = self.truth.owner_changes;
        if let Some(by) = writer.and_then(|w| counts.plan_moves_by_node.get_mut(w)) {
            *by += self.truth.plan_moves - moves;
        }
        self.wake_watches();
        Ok(())
    }

    /// A store tick at the next session deadline, unless one comes earlier.
    pub(super) fn schedule_store_tick(&mut self) {
        if let Some(deadline) = self.store.next_deadline() {
            let at = deadline.as_micros() as u64;
            if self.store_tick_at.is_none_or(|t| at < t || t < self.now) {
                self.store_tick_at = Some(at);
                self.push(at, Ev::StoreTick);
            }
        }
    }

    /// Every watch that may have something new gets a pump.
    pub(super) fn wake_watches(&mut self) {
        for node in 0..self.nodes.len() {
            self.schedule_pump(node);
        }
    }

    pub(super) fn schedule_pump(&mut self, node: usize) {
        let n = &self.nodes[node];
        let Some((watch, _)) = n.watch.as_ref() else { return };
        if n.pump_pending || n.machine.is_none() {
            return;
        }
        let (watch, life) = (*watch, n.life);
        self.nodes[node].pump_pending = true;
        // Watches lag: mostly a little, sometimes much (a slow connection).
        let lag = if self.rng.percent(90) { 100 + self.rng.below(3_000) } else { self.rng.below(200_000) };
        self.after(lag, Ev::Pump { node, life, watch });
    }

    /// A watch's pending revisions reach its instance, one step each.
    pub(super) fn pump(&mut self, node: usize, life: u32, watch: RequestId) -> Result<(), Violation> {
        let n = &mut self.nodes[node];
        if n.life != life || n.watch.as_ref().is_none_or(|(id, _)| *id != watch) {
            return Ok(());
        }
        n.pump_pending = false;
        if !self.reachable(node) {
            return Ok(()); // a hung connection: nothing, not even an error
        }
        let Some((_, cursor)) = self.nodes[node].watch.as_mut() else { return Ok(()) };
        match self.store.poll(cursor) {
            Ok(batches) => {
                for batch in batches {
                    self.counts.watch_events += batch.events.len() as u64;
                    self.counts.watch_bytes += batch.events.iter().map(event_bytes).sum::<u64>();
                    self.step(node, Input::Watched { watch, batch })?;
                    if self.nodes[node].watch.as_ref().is_none_or(|(id, _)| *id != watch) {
                        break; // the instance replaced its watch meanwhile
                    }
                }
            }
            Err(error) => {
                self.nodes[node].watch = None;
                self.step(node, Input::WatchEnded { watch, error })?;
            }
        }
        Ok(())
    }

    /// A quiet, caught-up watch says it is alive.
    pub(super) fn progress(&mut self, node: usize, life: u32) -> Result<(), Violation> {
        if self.nodes[node].life != life {
            return Ok(());
        }
        let every = self.config.ttl.as_micros() as u64 / 4;
        self.after(every, Ev::Progress { node, life });
        let revision = self.store.revision();
        let caught_up =
            self.nodes[node].watch.as_ref().filter(|(_, cursor)| cursor.next > revision).map(|(id, _)| *id);
        if let Some(watch) = caught_up
            && self.reachable(node)
            && !self.nodes[node].pump_pending
        {
            self.step(node, Input::Watched { watch, batch: WatchBatch { revision, events: Vec::new() } })?;
        }
        Ok(())
    }

    /// Ends every watch at once (the store went out, or the watch was cut).
    pub fn cut_watch(&mut self, node: usize) {
        let life = self.nodes[node].life;
        if let Some((watch, _)) = self.nodes[node].watch.take() {
            let error = StoreError::Unavailable(InjectedFault::CutOff { what: "watch" }.into());
            let delay = self.delay();
            self.after(delay, Ev::Input { node, life, input: Input::WatchEnded { watch, error } });
        }
    }

    pub(super) fn keeper_wake(&mut self, node: usize) -> Result<(), Violation> {
        if self.nodes[node].machine.is_none() {
            return Ok(());
        }
        let wall = self.wall(node);
        let renews = self.nodes[node].machine.as_ref().is_none_or(Machine::renews);
        let (report, send) = self.nodes[node].keeper.wake(wall, renews);
        if let Some(state) = report {
            self.step(node, Input::Lease(state))?;
        }
        if let Some((token, ask)) = send {
            let (life, delay) = (self.nodes[node].life, self.delay());
            self.after(delay, Ev::KeeperArrive { node, life, token, ask });
        }
        self.schedule_keeper(node);
        Ok(())
    }

    pub fn schedule_keeper(&mut self, node: usize) {
        let n = &self.nodes[node];
        if n.machine.is_none() {
            return;
        }
        let at = self.virtual_at(node, n.keeper.next_wake()).max(self.now);
        if n.keeper_wake_at.is_some_and(|t| t <= at) {
            return;
        }
        let life = n.life;
        self.nodes[node].keeper_wake_at = Some(at);
        self.push(at, Ev::KeeperWake { node, life, at });
    }

    pub(super) fn keeper_arrive(
        &mut self,
        node: usize,
        life: u32,
        token: u64,
        ask: KeeperAsk,
    ) -> Result<(), Violation> {
        if self.nodes[node].life != life {
            return Ok(());
        }
        let now = self.store_now();
        if self.keeper_reachable(node) {
            // Expiries first, so the truth sees them as the store's own revisions.
            self.sync_truth(None)?;
        }
        self.counts.keeper_requests += 1;
        let answer = if !self.keeper_reachable(node) {
            Err(StoreError::Unavailable(InjectedFault::CutOff { what: "request" }.into()))
        } else {
            match ask {
                KeeperAsk::Grant => self.store.grant_session(now, self.config.ttl).map(Some),
                KeeperAsk::KeepAlive(session) => self.store.keep_alive(now, session).map(|()| None),
            }
        };
        self.schedule_store_tick();
        if !self.lost() {
            let delay = self.delay();
            self.after(delay, Ev::KeeperAnswer { node, life, token, answer });
        }
        Ok(())
    }

    /// The store's current revision.
    pub fn revision(&self) -> Revision {
        self.store.revision()
    }
}

/// The key and value bytes of a watch event.
fn event_bytes(event: &crate::store::WatchEvent) -> u64 {
    let value = match &event.kind {
        crate::store::WatchEventKind::Put(kv) => kv.value.len(),
        crate::store::WatchEventKind::Delete => 0,
    };
    (event.key.len() + value) as u64
}
