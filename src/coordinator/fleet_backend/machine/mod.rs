//! The fleet backend's instance as one state with one step (issue 40, stage 3):
//! [`Instance::step`]`(now, input) -> effects`, over the inputs and effects of
//! [`crate::coordinator::machine::io`].
//!
//! The state is everything a fleet instance keeps: the store mirror ([`FleetCache`]), the
//! streams with what each was told and its claim step, the registrations waiting to be
//! settled, the lease as last reported, and the calls and store requests in flight. The
//! step decides with the backend's pure functions: the claim decision
//! and its transactions (`claim_decide.rs`, with the epoch floor's compare), the relay
//! model (`relay.rs`, applied by the shared [`Book::apply`]), the fair share
//! (`share.rs`), the member record, the registration's move of the leases bound to it and
//! the raise of a new incarnation's epochs (`claim_decide::raise_txns`), the departures
//! and the sweep, the rebind's compare on absence, the mirror's stale-snapshot rule and
//! the watch's silence bound (a silence or a request deadline noticed late, the instance
//! and not the store being slow, starts a fresh bound instead: `machine/watchdog.rs`, as
//! in the handoff machine). What the step adds is the bookkeeping between them.
//!
//! **Giving back.** A give-back's `unassigned` is an effect listed before the delete's
//! request, and the driver holds the request until the giver's transport took it
//! (`coordinator/machine/driver/told.rs`: a giver that does not take it within a TTL, or
//! whose buffer is full, is ended and nothing is freed); the registration's raise goes in
//! one transaction however many leases the name holds. The Kafka topic refresh is
//! `topic_refresh.rs`. The production driver runs this machine for `--backend fleet`.
//!
//! **Metrics and logs** are said, not recorded, as in the handoff machine: a swept
//! registration, leases given back, leases claimed are [`Effect::Observe`]s
//! (`coordinator/machine/observe.rs`) the production driver records and logs.
//!
//! Files: `follow.rs` (the first read, the watch, the lease, the watchdog), `streams.rs`
//! (the streams and the relay pass), `register.rs` (`Register`), `claim.rs` (the claim
//! step), `settle.rs` (`Deregister`, the registrations of ended streams, the sweep and the
//! rebind of lost registrations).
//!
//! [`Book::apply`]: crate::coordinator::shared::streams::Book

mod claim;
mod follow;
mod register;
mod settle;
mod streams;
mod topic_refresh;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::coordinator::machine::expect;

use super::FleetConfig;
use super::records::FleetKeys;
use super::state::FleetCache;
use crate::coordinator::CoordinatorError;
use crate::coordinator::machine::Start;
use crate::coordinator::machine::io::{
    CallId, Effect, Input, LeaseState, Micros, Replied, RequestId, Stop, StoreReply, StoreRequest, StreamId,
};
use crate::coordinator::machine::watchdog::Watchdog;
use crate::coordinator::shared::departures::Departures;
use crate::coordinator::shared::streams::StreamKey;
use crate::coordinator::shared::upkeep::Upkeep;
use crate::store::StoreError;

use claim::ClaimWait;
use register::Enrolling;
use settle::{LeaveWait, Unregistering};
use streams::Stream;

/// What a store request of the instance is for: where its answer goes.
#[derive(Debug)]
enum Waiting {
    /// The first read of the prefix, or a re-read after the watch broke.
    Reread,
    /// The watch (its batches come as [`Input::Watched`]).
    Watch,
    /// A `Register`'s store call.
    Register(Box<Enrolling>),
    /// A batch of `Register`s' first writes (`machine/batching.rs`).
    Registers(Vec<Enrolling>),
    /// A stream's claim step.
    Claim(Box<ClaimWait>),
    /// A `Deregister`'s store call.
    Leave(Box<LeaveWait>),
    /// The registration of an ended stream, being deleted.
    Unregister(StreamKey, Unregistering),
    /// A lost registration written again.
    Rebind(StreamKey),
    /// The instance record bound to this lease.
    Record(crate::store::SessionId),
    /// The topic refresh, in its round.
    Refresh(u64),
}

/// One instance of the fleet backend (see the module docs).
pub struct Instance {
    config: FleetConfig,
    keys: FleetKeys,
    /// Where the monotonic time of the shared pieces starts.
    origin: Instant,
    /// The `now` of the step under way.
    now: Micros,
    /// The store's state as followed (`None` until the first read answered).
    cache: Option<FleetCache>,
    /// The watch in use.
    watch: Option<RequestId>,
    /// Since when the mirror has not followed the store (`None`: it follows).
    stale_since: Option<Micros>,
    /// The streams were fenced because the mirror did not follow.
    stale_fenced: bool,
    /// When a failed re-read is tried again.
    reread_at: Option<Micros>,
    /// The instance lease, as last reported.
    lease: LeaseState,
    /// The lease the instance record was written for.
    recorded: Option<crate::store::SessionId>,
    /// Stopping gracefully: no new work, only answers of what is in flight.
    stopping: bool,
    /// Crashed: nothing comes out any more.
    crashed: bool,
    next_request: RequestId,
    /// Registration ids handed out so far.
    registrations: u64,
    /// This life's random bits ([`Start::nonce`]).
    nonce: u64,
    /// The requests' deadlines and the watch's silence.
    watchdog: Watchdog,
    waiting: BTreeMap<RequestId, Waiting>,
    /// Command streams by (topic, consumer).
    streams: BTreeMap<(String, String), Stream>,
    /// The streams whose registration the store lost (being written again).
    lost: BTreeSet<(String, String)>,
    /// Streams that closed before their `Register` admitted them.
    closed: BTreeSet<StreamId>,
    /// Registrations whose streams ended, until settled.
    departures: Departures,
    /// Deletes of ended streams' registrations that failed: when each is tried again, and
    /// its backoff.
    unregistering: BTreeMap<StreamKey, (Micros, Micros)>,
    /// The registrations the sweep is deleting (counted once deleted).
    sweeping: BTreeSet<StreamKey>,
    /// The sweep of registrations of this instance no stream holds (a safety net).
    sweeper: Upkeep,
    /// `Register`s' first writes waiting for their batch, and the batches in flight
    /// (`machine/batching.rs`).
    register_batches: crate::coordinator::machine::batching::TxnBatches<Enrolling>,
    /// `Register`s waiting for their topic's record (`machine/topic_wait.rs`).
    topic_waits: crate::coordinator::machine::topic_wait::TopicWaits<Enrolling>,
    /// When every stream's claim step runs again without a change (the safety net).
    claim_tick: Micros,
    /// The Kafka topic refresh (with Kafka configured; every instance runs one).
    refresh: crate::coordinator::machine::refresh::TopicRefresh,
    /// What was last said of readiness and of the timer.
    ready: Option<bool>,
    wake: Option<Micros>,
    /// The effects of the step under way.
    out: Vec<Effect>,
}

impl Instance {
    /// A new instance of `config` at `now` (wall-clock µs), in the life `start`, and its
    /// first effects (the read of the prefix).
    pub fn new(config: FleetConfig, start: Start, now: Micros) -> (Self, Vec<Effect>) {
        let Start { origin, nonce, watch_progress_every, .. } = start;
        let keys = FleetKeys::new(&config.prefix);
        let mut instance = Instance {
            keys,
            origin,
            now,
            cache: None,
            watch: None,
            stale_since: None,
            stale_fenced: false,
            reread_at: None,
            lease: LeaseState::Pending,
            recorded: None,
            stopping: false,
            crashed: false,
            next_request: 1,
            registrations: 0,
            nonce,
            watchdog: Watchdog::new(now, config.lease_ttl, watch_progress_every),
            waiting: BTreeMap::new(),
            streams: BTreeMap::new(),
            lost: BTreeSet::new(),
            closed: BTreeSet::new(),
            departures: Departures::new(config.lease_ttl),
            unregistering: BTreeMap::new(),
            sweeping: BTreeSet::new(),
            sweeper: Upkeep::new(config.lease_ttl, origin + Duration::from_micros(now)),
            register_batches: Default::default(),
            topic_waits: Default::default(),
            claim_tick: now + config.claim_interval.as_micros() as Micros,
            refresh: crate::coordinator::machine::refresh::TopicRefresh::new(
                config.topic_refresh_interval,
                now + config.topic_refresh_interval.as_micros() as Micros,
            ),
            ready: None,
            wake: None,
            out: Vec::new(),
            config,
        };
        instance.reread();
        instance.settle_outputs();
        let effects = std::mem::take(&mut instance.out);
        (instance, effects)
    }

    /// Takes `input` in at `now` and returns what to do, in order (see
    /// [`crate::coordinator::machine::io`]).
    pub fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        if self.crashed {
            return Vec::new();
        }
        self.now = self.now.max(now);
        match input {
            Input::StoreAnswer { request, answer } => self.answered(request, answer),
            Input::Watched { watch, batch } => self.watched(watch, batch),
            Input::WatchEnded { watch, error } => self.watch_ended(watch, error),
            Input::Call { call, body } => self.call(call, body),
            Input::StreamClosed { stream } => self.stream_closed(stream),
            Input::TimerFired => {}
            // No planning budget: the fleet has no leader that plans.
            Input::PlanningTook { .. } => {}
            Input::Lease(state) => self.lease_reported(state),
            Input::PartitionCount { request, answer } => self.partition_count(request, answer),
            // The fleet places by count: it asks for no weights.
            Input::Weights { .. } => {}
            Input::Stop(Stop::Crash) => {
                self.crashed = true;
                self.out.clear();
                return Vec::new();
            }
            Input::Stop(Stop::Graceful) => self.stop(),
        }
        if !self.stopping {
            self.upkeep();
            self.run_claims();
            self.refresh_topics();
        }
        let refusal = self.live_lease().err();
        self.send_register_batches(refusal.as_ref());
        self.settle_outputs();
        std::mem::take(&mut self.out)
    }

    /// Whether its lease may be kept alive now (the flag its keeper reads,
    /// `LeaseHolder::renews`): not while it cannot follow its store.
    pub fn renews(&self) -> bool {
        !self.stale_fenced
    }

    /// The cache, once the first read answered (for a simulation's checks).
    pub fn cache(&self) -> Option<&FleetCache> {
        self.cache.as_ref()
    }

    /// The (topic, consumer) of every command stream open here.
    pub fn stream_names(&self) -> Vec<(String, String)> {
        self.streams.keys().cloned().collect()
    }

    /// The instant the shared pieces read for `now`.
    fn instant(&self, now: Micros) -> Instant {
        self.origin + Duration::from_micros(now)
    }

    /// The lease TTL in µs.
    fn ttl_micros(&self) -> Micros {
        self.config.lease_ttl.as_micros() as Micros
    }

    /// Sends `op` to the store, answered to `waiting`.
    fn request(&mut self, op: StoreRequest, waiting: Waiting) -> RequestId {
        let request = self.next_request;
        self.next_request += 1;
        self.waiting.insert(request, waiting);
        self.watchdog.sent(request, self.now);
        self.out.push(Effect::Store { request, op });
        request
    }

    /// Answers the call `call`.
    fn reply(&mut self, call: CallId, reply: Result<Replied, CoordinatorError>) {
        self.out.push(Effect::Reply { call, reply });
    }

    /// The live session, or the refusal of a call while there is none (or the instance
    /// stops).
    fn live_lease(&self) -> Result<crate::store::SessionId, CoordinatorError> {
        if self.stopping {
            return Err(CoordinatorError::ShuttingDown);
        }
        self.lease.live().ok_or_else(|| {
            CoordinatorError::NoSession(crate::coordinator::causes::SessionMissing::NotLive {
                instance: self.config.instance_id.clone(),
            })
        })
    }

    /// A consumer call arrived.
    fn call(&mut self, id: CallId, body: crate::coordinator::machine::io::Call) {
        use crate::coordinator::machine::io::Call;
        match body {
            Call::Register { stream, consumer, topic, incarnation } => {
                self.register(id, stream, consumer, topic, incarnation)
            }
            // No handoffs in the fleet: nothing to be ready for or to release.
            Call::PartitionReady { .. } | Call::PartitionReleased { .. } => {
                self.reply(id, Err(super::calls::no_handoffs()))
            }
            Call::Deregister { consumer, .. } => self.deregister(id, consumer),
            Call::WatchEpochs { stream, consumer, topic } => self.watch_epochs(id, stream, consumer, topic),
        }
    }

    /// What the store answered `request`.
    fn answered(&mut self, request: RequestId, answer: Result<StoreReply, StoreError>) {
        self.watchdog.settled(request);
        // Gone: answered already, or past its deadline (then failed already).
        let Some(waiting) = self.waiting.remove(&request) else { return };
        if let Err(StoreError::SessionExpired(_)) = &answer {
            // The lease keeper may not have noticed yet: it should look now.
            self.out.push(Effect::KeepLeaseAliveNow);
        }
        match waiting {
            Waiting::Reread => self.reread_answered(answer),
            Waiting::Watch => self.watch_answered(request, answer),
            Waiting::Register(enrolling) => self.register_answered(*enrolling, answer),
            Waiting::Registers(writers) => self.registers_answered(writers, answer),
            Waiting::Claim(claim) => self.claim_answered(*claim, answer),
            Waiting::Leave(leave) => self.leave_answered(*leave, answer),
            Waiting::Unregister(key, txn) => self.unregister_answered(key, txn, answer),
            Waiting::Rebind(key) => self.rebind_answered(key, answer),
            Waiting::Refresh(round) => {
                if round == self.refresh.round() {
                    let ask = self.refresh.stored(answer, None);
                    self.refresh_ask(ask);
                }
            }
            Waiting::Record(session) => {
                if matches!(answer, Ok(StoreReply::Txn(_))) {
                    self.recorded = Some(session);
                }
            }
        }
    }

    /// Says readiness and the timer when they changed.
    fn settle_outputs(&mut self) {
        let ready = !self.stopping && self.lease.live().is_some() && self.follows();
        if self.ready != Some(ready) {
            self.ready = Some(ready);
            self.out.push(Effect::Ready(ready));
        }
        let wake = if self.stopping { None } else { self.next_wake() };
        if let Some(at) = wake
            && self.wake != Some(at)
        {
            self.out.push(Effect::WakeAt(at));
        }
        self.wake = wake;
    }

    /// Whether the mirror follows the store.
    fn follows(&self) -> bool {
        self.cache.is_some() && self.stale_since.is_none()
    }
}

/// A transaction's outcome from a store answer.
fn txn_outcome(answer: Result<StoreReply, StoreError>) -> Result<crate::store::TxnOutcome, StoreError> {
    expect(answer, |r| match r {
        StoreReply::Txn(o) => Some(o),
        _ => None,
    })
}

impl crate::coordinator::machine::driver::Machine for Instance {
    fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        Instance::step(self, now, input)
    }

    fn renews(&self) -> bool {
        Instance::renews(self)
    }

    fn tells_before_freeing(&self) -> bool {
        true
    }

    fn status(&self, ready: bool) -> crate::coordinator::StatusView {
        let empty = FleetCache::default();
        let cache = self.cache.as_ref().unwrap_or(&empty);
        super::status::view(cache, &self.config.instance_id, &self.config.backend, ready)
    }
}

/// Starts an instance of `config` over `store` as one state machine stepped by the
/// production driver (`coordinator/machine/driver/`); returns once it is ready, or fails
/// if its store cannot be read or its session is not granted in time.
pub async fn start_driven(
    store: std::sync::Arc<dyn crate::store::LeaseStore>,
    config: FleetConfig,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) -> Result<
    crate::coordinator::machine::driver::front::MachineCoordinator,
    crate::coordinator::CoordinatorError,
> {
    use crate::coordinator::machine::driver::front::{DriverSetup, MachineCoordinator};
    let setup = DriverSetup {
        instance_id: config.instance_id.clone(),
        store,
        ttl: config.lease_ttl,
        topics: crate::coordinator::shared::topics::Topics {
            configured: config.topic_partitions.clone(),
            source: config.kafka.clone(),
        },
        weights: None,
        drain: None,
        metrics,
    };
    tracing::info!(instance = %config.instance_id, backend = %config.backend, "coordinator started (state machine)");
    MachineCoordinator::start(setup, |start, now| Instance::new(config, start, now)).await
}
