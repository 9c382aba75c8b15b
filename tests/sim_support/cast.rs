//! What consumers and instances do the same way in both simulations: a consumer
//! registers, deregisters, takes the answers, loses its stream (and reconnects); an
//! instance is cut off and restored, restarts, and is held to its fence. Only what the
//! client sees drives the consumers: they act on their streams and on the answers to
//! their calls, as a real client would.

use std::future::Future;
use std::time::Duration;

use kafka_assigner::coordinator::causes::EndOfStream;
use kafka_assigner::coordinator::{CommandStream, ConsumerGroupCoordinator, CoordinatorError};
use kafka_assigner::server::status::code_of;
use kafka_assigner::store::FaultyStore;
use tokio::time::Instant;
use tonic::Code;

use super::run::Item;
use super::world::{Backend, Phase, World};

/// How late (in TTLs after a cut-off) an instance may end its streams: its fence is due
/// 3/4 TTL after its last renewal, which was before the cut (docs/design.md §6); a little
/// slack for the watch of the lease state.
pub const FENCE_BOUND: f64 = 0.8;

/// Stops every fault of a wrapper: the fleet is left to settle.
pub fn calm(faulty: &FaultyStore) {
    faulty.restore();
    faulty.end_stall();
    faulty.lose_answers(0.0);
    faulty.lose_next_answers(0);
    faulty.lose_next_txn_answers(0);
    faulty.delay(Duration::ZERO, Duration::ZERO);
    faulty.lag_watch(Duration::ZERO);
}

impl<K: Backend> World<K> {
    /// Consumer `c` registers on `instance` (or the next running one), if it wants to and
    /// is offline; with no instance running it tries again later.
    pub fn join(&mut self, c: usize, instance: usize) {
        if !self.consumers[c].want || !matches!(self.consumers[c].phase, Phase::Offline) {
            return;
        }
        let Some(i) = self.running(instance) else {
            self.after(Duration::from_millis(300), K::reconnect(c));
            return;
        };
        let consumer = &mut self.consumers[c];
        // The attempt names the instance in its high half (the reply needs it).
        consumer.attempt = ((i as u64) << 32) | ((consumer.attempt + 1) & 0xFFFF_FFFF);
        consumer.phase = Phase::Registering;
        let (attempt, name) = (consumer.attempt, consumer.name.clone());
        let (coordinator, generation) = (self.instances[i].coordinator.clone(), self.instances[i].generation);
        self.note(format!("{name} registers via i{i}"));
        let (replies, topic) = (self.replies_tx.clone(), self.topic);
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.register(&name, topic).await;
            let _ = replies.send(K::registered(c, attempt, generation, result));
        });
    }

    /// The answer to consumer `c`'s registration `attempt`; true if a stream opened. An
    /// answer from before its instance crashed never reached the client.
    pub fn registered(
        &mut self,
        c: usize,
        attempt: u64,
        generation: u64,
        result: Result<CommandStream, CoordinatorError>,
    ) -> bool {
        let instance = (attempt >> 32) as usize;
        let result = if self.instances[instance].generation == generation {
            result
        } else {
            Err(CoordinatorError::StreamEnded(EndOfStream::Crashed))
        };
        let consumer = &self.consumers[c];
        let current = consumer.attempt == attempt && matches!(consumer.phase, Phase::Registering);
        let name = consumer.name.clone();
        match result {
            Ok(stream) if current && consumer.want => {
                self.next_inc += 1;
                let inc = self.next_inc;
                self.note(format!("{name}#{inc}@i{instance} registered"));
                self.consumers[c].phase =
                    Phase::Online { inc, instance, belief: K::Belief::default(), leaving: false };
                self.open.push((inc, c, stream));
                return true;
            }
            Ok(_) => {
                // An abandoned attempt: the stream is dropped as the client's connection would be.
                self.note(format!("{name}: late registration via i{instance} dropped"));
                if current {
                    self.consumers[c].phase = Phase::Offline;
                }
            }
            Err(error) => {
                self.note(format!("{name}: register via i{instance} failed: {:?} {error}", code_of(&error)));
                if current {
                    self.consumers[c].phase = Phase::Offline;
                    if self.consumers[c].want {
                        let wait = self.draw(&[2, attempt]).millis(100, 600);
                        self.after(wait, K::reconnect(c));
                    }
                }
            }
        }
        false
    }

    /// Consumer `c` (stream `inc`) deregisters through `instance` (or the next running
    /// one). From now on it is leaving: it acts on its stream until the stream ends.
    pub fn deregister(&mut self, c: usize, inc: u64, instance: usize) {
        let Some(i) = self.running(instance) else { return };
        let Phase::Online { inc: current, leaving, .. } = &mut self.consumers[c].phase else { return };
        if *current != inc {
            return;
        }
        *leaving = true;
        self.consumers[c].want = false;
        let (name, coordinator, replies) =
            (self.consumers[c].name.clone(), self.instances[i].coordinator.clone(), self.replies_tx.clone());
        self.note(format!("{name}#{inc} deregisters via i{i}"));
        tokio::spawn(async move {
            let Some(coordinator) = coordinator else { return };
            let result = coordinator.deregister(&name).await;
            let _ = replies.send(K::deregistered(c, inc, result));
        });
    }

    /// A `Deregister` of consumer `c` (stream `inc`) failed: on `NOT_FOUND` it believes it
    /// is not registered and exits; otherwise (the lost answer may have been a drain) it
    /// asks again.
    pub fn deregister_failed(&mut self, c: usize, inc: u64, error: CoordinatorError) {
        let name = self.consumers[c].name.clone();
        self.note(format!("{name}#{inc}: deregister failed: {:?} {error}", code_of(&error)));
        if code_of(&error) == Code::NotFound {
            self.drop_stream(c, inc);
        } else {
            let wait = self.draw(&[7, inc, self.seq]).millis(100, 500);
            self.after(wait, K::deregister_again(c, inc));
        }
    }

    /// Forgets stream `inc` of consumer `c`: the consumer stops processing at once.
    pub fn drop_stream(&mut self, c: usize, inc: u64) {
        self.open.retain(|(i, _, _)| *i != inc);
        if let Phase::Online { inc: i, instance, .. } = self.consumers[c].phase
            && i == inc
        {
            K::stream_dropped(&mut self.instances[instance].ext);
            self.consumers[c].phase = Phase::Offline;
        }
    }

    /// Consumer `c`'s stream `inc` on `instance` ended with `error`: it stops at once and,
    /// if it wants to be online, reconnects after 50 ms–1.5 TTL. A live consumer registers
    /// only once it has no stream, so the stream is never ended as replaced (`ABORTED`);
    /// one its instance ended while cut off must end within [`FENCE_BOUND`] of the cut.
    /// Returns how late after the cut it ended, in TTLs, if it was cut off.
    pub fn stream_failed(
        &mut self,
        c: usize,
        inc: u64,
        instance: usize,
        error: CoordinatorError,
        ttl: Duration,
    ) -> Result<Option<f64>, String> {
        let name = self.consumers[c].name.clone();
        self.note(format!("{name}#{inc}@i{instance} stream ended: {:?} {error}", code_of(&error)));
        ensure!(
            code_of(&error) != Code::Aborted,
            "{name}#{inc}: its stream on i{instance} was ended as replaced, but {name} made no later \
             registration: {error}"
        );
        self.drop_stream(c, inc);
        let mut late = None;
        if let Some((_, since)) = self.instances[instance].cut {
            let fraction = (Instant::now() - since).as_secs_f64() / ttl.as_secs_f64();
            late = Some(fraction);
            ensure!(
                fraction.total_cmp(&FENCE_BOUND).is_le(),
                "{name}#{inc}: i{instance} ended its stream {fraction:.2} TTL after it was cut off \
                 (the fence is due within {FENCE_BOUND} TTL)"
            );
        }
        if self.consumers[c].want {
            let wait = self.draw(&[1, inc]).millis(50, ttl.as_millis() as u64 * 3 / 2);
            self.after(wait, K::reconnect(c));
        }
        Ok(late)
    }

    /// An item of consumer `c`'s half-open stream `inc`: nobody acts on it; its end is
    /// noted. Returns whether it ended as replaced (`ABORTED`).
    pub fn zombie_item(&mut self, inc: u64, c: usize, item: Item) -> bool {
        let (ended, replaced) = match item {
            Some(Ok(_)) => return false,
            Some(Err(error)) => (format!("{:?} {error}", code_of(&error)), code_of(&error) == Code::Aborted),
            None => ("cleanly".to_string(), false),
        };
        self.zombies.retain(|(i, _, _)| *i != inc);
        self.note(format!("{}#{inc} (half-open) ended: {ended}", self.consumers[c].name));
        replaced
    }

    /// Records a cut-off (or stall) of instance `i` for `period`, with its fence deadline a
    /// TTL in; the id of the cut, or `None` if one is in force.
    pub fn begin_cut(&mut self, i: usize, period: Duration, ttl: Duration) -> Option<u64> {
        if self.instances[i].cut.is_some() {
            return None;
        }
        self.seq += 1;
        let cut = self.seq;
        self.instances[i].cut = Some((cut, Instant::now()));
        self.after(period, K::restore(i, cut));
        self.after(ttl, K::fence_deadline(i, cut));
        Some(cut)
    }

    /// Cut-off `cut` of the instance ends, if it is still in force.
    pub fn restore(&mut self, instance: usize, cut: u64) {
        if self.instances[instance].cut.is_some_and(|(id, _)| id == cut) {
            self.note(format!("i{instance} back in touch with the store"));
            self.instances[instance].faulty.restore();
            self.instances[instance].cut = None;
        }
    }

    /// An instance out of touch for a whole TTL (its session may have expired) holds no
    /// open stream: every consumer of it was told to stop and its stream ended.
    pub fn fence_deadline(&self, instance: usize, cut: u64) -> Result<(), String> {
        if self.instances[instance].cut.is_none_or(|(id, _)| id != cut) {
            return Ok(());
        }
        for c in &self.consumers {
            if let Phase::Online { inc, instance: i, belief, .. } = &c.phase {
                ensure!(
                    *i != instance,
                    "{}#{inc} still has an open stream on i{instance} (believing it owns {:?}) a whole TTL \
                     after i{instance} was cut off from (or stalled on) the store",
                    c.name,
                    K::owned(belief)
                );
            }
        }
        Ok(())
    }

    /// Instance `i` starts again (`start` runs it over its wrapper), unless it runs or is
    /// starting; the answer comes back as a reply.
    pub fn restart<F>(&mut self, i: usize, start: impl FnOnce(FaultyStore) -> F)
    where
        F: Future<Output = Result<K::Coordinator, CoordinatorError>> + Send + 'static,
    {
        if self.instances[i].coordinator.is_some() || self.instances[i].starting {
            return;
        }
        self.instances[i].starting = true;
        let (starting, replies) = (start(self.instances[i].faulty.clone()), self.replies_tx.clone());
        tokio::spawn(async move {
            let _ = replies.send(K::started(i, starting.await));
        });
    }

    /// The answer to a restart of instance `i`: it runs, or it tries again in 500 ms.
    pub fn started(&mut self, i: usize, result: Result<K::Coordinator, CoordinatorError>) {
        self.instances[i].starting = false;
        match result {
            Ok(coordinator) => {
                self.note(format!("i{i} restarted"));
                self.instances[i].coordinator = Some(coordinator);
            }
            Err(error) => {
                self.note(format!("i{i} cannot start: {error}; retrying"));
                self.after(Duration::from_millis(500), K::restart(i));
            }
        }
    }

    /// Whether the run is over after a settle check that gave `result`, `active` after its
    /// start: `Ok(Some(waited))` once settled, `Ok(None)` to check again (the caller lets
    /// consumers rejoin), `Err` once 20 TTL + 10 s passed since the faults stopped.
    pub fn settled(
        &mut self,
        result: Result<(), String>,
        active: Duration,
        ttl: Duration,
    ) -> Result<Option<Duration>, String> {
        let waited = Instant::now() - (self.start + active);
        match result {
            Ok(()) => {
                self.note(format!("settled {waited:?} after the faults stopped"));
                self.done = true;
                Ok(Some(waited))
            }
            Err(why) if waited > ttl * 20 + Duration::from_secs(10) => {
                Err(format!("not settled {waited:?} after the faults stopped: {why}"))
            }
            Err(_) => Ok(None),
        }
    }
}
