//! What the consumers do, and the scheduled actions: registering, reading commands,
//! answering warms and releases, crashing, pausing, reconnecting, deregistering; instance
//! crashes and restarts, cut-offs, outages, compaction, early expiry, lossy answers.

use super::cluster::Cluster;
use super::consumer::{Belief, Phase, Todo};
use super::events::{CallKind, Ev};
use super::schedule::{Action, Kind};
use super::{Invariant, Violation};
use crate::coordinator::machine::io::{Call, Input, StreamId};
use crate::proto::v1::{AssignmentCommand, assignment_command::Command};

impl Cluster {
    /// A scheduled action.
    pub(super) fn act(&mut self, action: Action) -> Result<(), Violation> {
        if self.quiet && !matches!(action, Action::Start(_) | Action::InstanceStart(_)) {
            return Ok(());
        }
        let ttl = self.config.ttl.as_micros() as u64;
        match action {
            Action::Start(c) => {
                if self.consumers[c].stream().is_none() {
                    self.consumers[c].wants = true;
                    self.register(c, true)?;
                }
            }
            Action::Crash(c) => {
                if let Some((node, stream)) = self.consumers[c].stream() {
                    self.consumers[c].phase = Phase::Offline;
                    // The instance hears of it late: when its connection times out.
                    let late = self.rng.below(ttl / 2);
                    self.close_stream(node, stream, late);
                    let back = 100_000 + self.rng.below(2 * ttl);
                    self.after(back, Ev::Register { consumer: c, restart: true });
                }
            }
            Action::Reconnect(c) => {
                if let Some((node, stream)) = self.consumers[c].stream()
                    && !self.draining(c)
                {
                    self.consumers[c].phase = Phase::Offline;
                    let delay = self.delay();
                    self.close_stream(node, stream, delay);
                    let back = self.rng.below(100_000);
                    self.after(back, Ev::Register { consumer: c, restart: false });
                }
            }
            Action::Pause(c, length) => {
                let consumer = &mut self.consumers[c];
                consumer.paused_until = consumer.paused_until.max(self.now + length);
            }
            Action::Deregister(c, drain) => {
                if let Phase::Online { instance, stream, draining: false, .. } = self.consumers[c].phase {
                    let body =
                        Call::Deregister { consumer: self.consumers[c].name.clone(), wants_drain: drain };
                    self.call(c, instance, instance, stream, CallKind::Deregister(drain), body);
                }
            }
            Action::InstanceCrash(i) => {
                let running = self.nodes.iter().filter(|n| n.machine.is_some()).count();
                if self.nodes[i].machine.is_some() && running > 1 {
                    self.crash_instance(i);
                    let back = ttl / 2 + self.rng.below(3 * ttl);
                    self.after(back, Ev::Act(Action::InstanceStart(i)));
                    self.disrupted(back + ttl);
                }
            }
            Action::InstanceStart(i) => {
                if self.nodes[i].machine.is_none() {
                    self.start_instance(i);
                }
            }
            Action::Cut(i, length) => {
                self.cut_main(i, length);
                self.nodes[i].keeper_cut_until = self.nodes[i].keeper_cut_until.max(self.now + length);
                self.disrupted(length);
            }
            Action::MainCut(i, length) => {
                // The connection resets: the watch ends with an error, and a new one cannot
                // be started until the cut heals.
                self.cut_main(i, length);
                self.cut_watch(i);
                self.disrupted(length);
            }
            Action::KeeperCut(i, length) => {
                self.nodes[i].keeper_cut_until = self.nodes[i].keeper_cut_until.max(self.now + length);
                self.disrupted(length);
            }
            Action::Outage(length) => {
                if self.kind == Kind::Outage {
                    let moves = self.fleet.as_ref().map_or(self.truth.direct_moves, |fleet| fleet.moves);
                    self.checks.outage_started(moves);
                }
                self.outage_until = self.outage_until.max(self.now + length);
                for node in 0..self.nodes.len() {
                    self.cut_watch(node);
                }
                self.after(length, Ev::OutageEnd);
                self.disrupted(length);
            }
            Action::WatchCut(i) => {
                self.cut_watch(i);
                self.disrupted(0);
            }
            Action::Compact => {
                let revision = (self.revision() - self.rng.below(4) as i64).max(1);
                let _ = self.store.compact(revision);
            }
            Action::Revoke(i) => {
                // Steered around open bug F (a draining registration written again as
                // active): no early expiry under a draining stream.
                let draining = (0..self.consumers.len())
                    .any(|c| self.draining(c) && self.consumers[c].stream().is_some_and(|(n, _)| n == i));
                let session = self.nodes[i].keeper.state().live();
                if let Some(session) = session.filter(|_| !draining && self.reachable(i)) {
                    if self.fleet.is_some() {
                        // Expiries due now first: they are not the early revocation.
                        self.sync_truth(None)?;
                    }
                    let now = std::time::Duration::from_micros(self.now);
                    self.store.revoke_session(now, session);
                    self.revoking = true;
                    let followed = self.sync_truth(None);
                    self.revoking = false;
                    followed?;
                    self.disrupted(ttl);
                }
            }
            Action::RevokeAndMove(i) => {
                self.act(Action::Revoke(i))?;
                for c in 0..self.consumers.len() {
                    if let Some((node, stream)) = self.consumers[c].stream().filter(|(n, _)| *n == i)
                        && !self.draining(c)
                    {
                        self.consumers[c].phase = Phase::Offline;
                        let half_open = ttl / 4 + self.rng.below(ttl / 2);
                        self.close_stream(node, stream, half_open);
                        let soon = self.rng.below(200_000);
                        self.after(soon, Ev::Register { consumer: c, restart: false });
                    }
                }
            }
            Action::Lossy(length) => {
                self.lossy_until = self.lossy_until.max(self.now + length);
                self.disrupted(length);
            }
        }
        Ok(())
    }

    /// Notes a fault that lasts `length` µs from now (the overdue check waits it out).
    fn disrupted(&mut self, length: u64) {
        self.checks.last_disruption = self.checks.last_disruption.max(self.now + length);
    }

    /// The faults stop: the store is back, cut-offs heal, pauses end, every instance runs
    /// and every consumer comes back and answers what it was asked.
    /// Cuts instance `i`'s own connection off the store for `length`, noting when a cut
    /// began.
    fn cut_main(&mut self, i: usize, length: u64) {
        let node = &mut self.nodes[i];
        if self.now >= node.cut_until {
            node.cut_from = self.now;
        }
        node.cut_until = node.cut_until.max(self.now + length);
    }

    pub(super) fn go_quiet(&mut self) -> Result<(), Violation> {
        self.quiet = true;
        self.checks.quiet_at = Some(self.now);
        if self.outage_until > self.now {
            self.outage_until = self.now;
            self.push(self.now, Ev::OutageEnd);
        }
        self.lossy_until = 0;
        for node in 0..self.nodes.len() {
            // Healed now (the orphan check counts from when a cut healed).
            self.nodes[node].cut_until = self.nodes[node].cut_until.min(self.now);
            self.nodes[node].keeper_cut_until = 0;
            if self.nodes[node].machine.is_none() {
                self.start_instance(node);
            }
        }
        for c in 0..self.consumers.len() {
            self.consumers[c].paused_until = 0;
            if !self.consumers[c].inbox.is_empty() {
                // What reached it while paused is handled now, in order, before anything
                // new: a consumer acting again acts on all it was told (a stream that
                // ended while it was paused ends now, not when the pause would have).
                self.resume(c)?;
            }
            self.consumers[c].wants = true;
            match &self.consumers[c].phase {
                Phase::Offline => {
                    let delay = self.rng.below(100_000);
                    self.after(delay, Ev::Register { consumer: c, restart: false });
                }
                Phase::Registering { .. } => {}
                Phase::Online { instance, stream, belief, .. } => {
                    let (node, stream) = (*instance, *stream);
                    let todos: Vec<Todo> = belief
                        .warming
                        .keys()
                        .map(|p| Todo::Ready(*p))
                        .chain(belief.releasing.keys().map(|p| Todo::Release(*p)))
                        .collect();
                    for todo in todos {
                        let delay = self.rng.below(100_000);
                        self.after(delay, Ev::Answer { consumer: c, node, stream, todo });
                    }
                }
            }
        }
        Ok(())
    }

    /// The name of consumer `c`'s topic.
    pub(super) fn topic_of(&self, c: usize) -> String {
        let topics = self.config.topic_set();
        topics.name(topics.of_consumer(c))
    }

    /// Whether consumer `c` deregistered and is draining.
    fn draining(&self, c: usize) -> bool {
        matches!(self.consumers[c].phase, Phase::Online { draining: true, .. })
    }

    /// Defers an event for a paused consumer to the end of its pause; `true` if it did.
    /// Events wait in the consumer's inbox, in order, while it is paused (and behind the
    /// ones already waiting); a `Resume` at the pause's end hands them over.
    fn deferred(&mut self, c: usize, event: impl FnOnce() -> Ev) -> bool {
        let until = self.consumers[c].paused_until;
        if until <= self.now && self.consumers[c].inbox.is_empty() {
            return false;
        }
        if self.consumers[c].inbox.is_empty() {
            self.push(until, Ev::Resume { consumer: c });
        }
        self.consumers[c].inbox.push_back(event());
        true
    }

    /// Consumer `c`'s pause ended (or was extended): what waited is handled in order.
    pub(super) fn resume(&mut self, c: usize) -> Result<(), Violation> {
        let until = self.consumers[c].paused_until;
        if until > self.now {
            self.push(until, Ev::Resume { consumer: c });
            return Ok(());
        }
        let waiting = std::mem::take(&mut self.consumers[c].inbox);
        for event in waiting {
            self.handle_for_consumer(event)?;
        }
        Ok(())
    }

    /// The consumer closes its stream; the instance hears of it after `delay` µs.
    pub(super) fn close_stream(&mut self, node: usize, stream: StreamId, delay: u64) {
        let life = self.nodes[node].life;
        if self.nodes[node].streams.contains_key(&stream) {
            self.after(delay, Ev::Input { node, life, input: Input::StreamClosed { stream } });
        }
    }

    /// Consumer `c` registers on a random running instance (a new incarnation when
    /// `restart`), unless it has a stream or does not want one.
    pub(super) fn register(&mut self, c: usize, restart: bool) -> Result<(), Violation> {
        if self.deferred(c, || Ev::Register { consumer: c, restart }) {
            return Ok(());
        }
        if self.consumers[c].stream().is_some() || !self.consumers[c].wants {
            return Ok(());
        }
        let running: Vec<usize> =
            (0..self.nodes.len()).filter(|n| self.nodes[*n].machine.is_some()).collect();
        if running.is_empty() {
            self.after(200_000, Ev::Register { consumer: c, restart });
            return Ok(());
        }
        let node = running[self.rng.index(running.len())];
        self.counts.registers += 1;
        if restart {
            self.consumers[c].incarnation += 1;
        }
        let n = &mut self.nodes[node];
        let stream = n.next_stream;
        n.next_stream += 1;
        n.streams.insert(stream, c);
        self.consumers[c].phase = Phase::Registering { instance: node, stream };
        let consumer = &self.consumers[c];
        let body = Call::Register {
            stream,
            consumer: consumer.name.clone(),
            topic: self.topic_of(c),
            incarnation: 1_000 * (c as u64 + 1) + consumer.incarnation,
        };
        self.call(c, node, node, stream, CallKind::Register, body);
        Ok(())
    }

    /// Consumer `c`, reading `stream` on `own`, calls `to`.
    fn call(&mut self, c: usize, own: usize, to: usize, stream: StreamId, kind: CallKind, body: Call) {
        let n = &mut self.nodes[to];
        if n.machine.is_none() {
            return;
        }
        let call = n.next_call;
        n.next_call += 1;
        n.calls.insert(call, (c, own, stream, kind));
        let (life, delay) = (n.life, self.delay());
        self.after(delay, Ev::Input { node: to, life, input: Input::Call { call, body } });
    }

    /// A command of `stream` reaches consumer `c`.
    pub(super) fn told(
        &mut self,
        c: usize,
        node: usize,
        stream: StreamId,
        command: AssignmentCommand,
    ) -> Result<(), Violation> {
        let deferred = self.consumers[c].paused_until > self.now || !self.consumers[c].inbox.is_empty();
        if deferred {
            let _ = self.deferred(c, || Ev::Told { consumer: c, node, stream, command });
            return Ok(());
        }
        if self.fleet.is_some() {
            self.checks.unassigned_delivered(node, stream, super::cluster::unassigned(&command));
            if !matches!(command.command, Some(Command::Assignment(_))) {
                let name = &self.consumers[c].name;
                let detail = format!("{name} (stream {stream} on i{node}): the fleet sent {command:?}");
                return Err(Violation::new(Invariant::Contradiction, detail));
            }
        }
        if self.consumers[c].stream() != Some((node, stream)) {
            return Ok(()); // a stream it no longer reads
        }
        if let Phase::Registering { instance, stream } = self.consumers[c].phase {
            self.consumers[c].phase =
                Phase::Online { instance, stream, belief: Belief::default(), draining: false };
            self.checks.online_since.insert((instance, stream), self.now);
        }
        let (partitions, topic) = (self.config.partitions, self.topic_of(c));
        let name = self.consumers[c].name.clone();
        let Phase::Online { belief, .. } = &mut self.consumers[c].phase else { return Ok(()) };
        let todos = belief.apply(&command, &topic, partitions).map_err(|e| {
            Violation::new(Invariant::Contradiction, format!("{name} (stream {stream} on i{node}): {e}"))
        })?;
        self.outcome.commands += 1;
        self.counts.commands += 1;
        for todo in todos {
            self.plan_answer(c, node, stream, todo);
        }
        Ok(())
    }

    /// When (and whether) a consumer acts on a warm or a release: one in eight never does
    /// while the faults last.
    fn plan_answer(&mut self, c: usize, node: usize, stream: StreamId, todo: Todo) {
        // A scenario has no faults but its own: its consumers answer, and soon.
        let calm = self.quiet || self.kind == Kind::Scenario;
        if !calm && self.rng.below(8) == 0 {
            return;
        }
        let wait = if calm { self.rng.below(100_000) } else { self.rng.below(1_500_000) };
        self.after(wait, Ev::Answer { consumer: c, node, stream, todo });
    }

    /// Consumer `c` acts on a warm (calls `PartitionReady`) or a release (stops processing,
    /// calls `PartitionReleased`), mostly through its own instance.
    pub(super) fn answer(
        &mut self,
        c: usize,
        node: usize,
        stream: StreamId,
        todo: Todo,
    ) -> Result<(), Violation> {
        if self.deferred(c, || Ev::Answer { consumer: c, node, stream, todo }) {
            return Ok(());
        }
        let (name, topic) = (self.consumers[c].name.clone(), self.topic_of(c));
        let Phase::Online { instance, stream: current, belief, .. } = &mut self.consumers[c].phase else {
            return Ok(());
        };
        if (*instance, *current) != (node, stream) {
            return Ok(());
        }
        let body = match todo {
            Todo::Ready(p) if belief.warming.contains_key(&p) => {
                Call::PartitionReady { consumer: name, topic, partition: p }
            }
            Todo::Release(p) if belief.releasing.contains_key(&p) || !belief.owned.contains(&p) => {
                belief.releasing.remove(&p);
                belief.owned.remove(&p);
                Call::PartitionReleased { consumer: name, topic, partition: p }
            }
            _ => return Ok(()),
        };
        let to = if self.rng.percent(25) { self.rng.index(self.nodes.len()) } else { node };
        self.call(c, node, to, stream, CallKind::Answer(todo), body);
        Ok(())
    }

    /// A call's answer reaches consumer `c` (reading `stream` on `node`).
    pub(super) fn replied(
        &mut self,
        c: usize,
        node: usize,
        stream: StreamId,
        call: CallKind,
        ok: Result<bool, ()>,
    ) -> Result<(), Violation> {
        if self.deferred(c, || Ev::Replied { consumer: c, node, stream, call, ok }) {
            return Ok(());
        }
        if self.consumers[c].stream() != Some((node, stream)) {
            return Ok(());
        }
        match (call, ok) {
            (CallKind::Register, Ok(_)) => {
                if let Phase::Registering { instance, stream } = self.consumers[c].phase {
                    let belief = Belief::default();
                    self.consumers[c].phase = Phase::Online { instance, stream, belief, draining: false };
                    self.checks.online_since.insert((instance, stream), self.now);
                }
            }
            (CallKind::Register, Err(())) => {
                self.consumers[c].phase = Phase::Offline;
                self.close_stream(node, stream, 0);
                let back = 100_000 + self.rng.below(400_000);
                self.after(back, Ev::Register { consumer: c, restart: false });
            }
            (CallKind::Answer(todo), Err(())) => {
                // A client tries again while its stream is open.
                let back = 100_000 + self.rng.below(200_000);
                self.after(back, Ev::Answer { consumer: c, node, stream, todo });
            }
            (CallKind::Answer(_), Ok(_)) => {}
            (CallKind::Deregister(_), Ok(true)) => {
                if let Phase::Online { draining, .. } = &mut self.consumers[c].phase {
                    *draining = true;
                }
            }
            (CallKind::Deregister(_), Ok(false)) => {
                // Shutting down: it closes its stream and stays away (until a start).
                self.consumers[c].phase = Phase::Offline;
                self.consumers[c].wants = self.quiet;
                let delay = self.delay();
                self.close_stream(node, stream, delay);
            }
            (CallKind::Deregister(_), Err(())) => {}
        }
        Ok(())
    }

    /// Consumer `c`'s stream ended: it stops processing at once, and comes back later
    /// unless it drained away.
    pub(super) fn ended(
        &mut self,
        c: usize,
        node: usize,
        stream: StreamId,
        clean: bool,
    ) -> Result<(), Violation> {
        if self.deferred(c, || Ev::Ended { consumer: c, node, stream, clean }) {
            return Ok(());
        }
        if self.consumers[c].stream() != Some((node, stream)) {
            return Ok(());
        }
        self.consumers[c].phase = Phase::Offline;
        let ttl = self.config.ttl.as_micros() as u64;
        // In a scenario a drained consumer is a process restarted: it comes back as a new one.
        if clean && !self.quiet && self.kind != Kind::Scenario {
            self.consumers[c].wants = false;
            return Ok(());
        }
        let back = if self.quiet || matches!(self.kind, Kind::Outage | Kind::Scenario) {
            50_000 + self.rng.below(250_000)
        } else {
            50_000 + self.rng.below(ttl * 3 / 2)
        };
        self.after(back, Ev::Register { consumer: c, restart: clean });
        Ok(())
    }
}
