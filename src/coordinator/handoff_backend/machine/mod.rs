//! The handoff backend's instance as one state with one step (issue 40, stage 1):
//! [`Instance::step`]`(now, input) -> effects`, over the inputs and effects of
//! [`crate::coordinator::machine::io`].
//!
//! The state is everything an instance keeps: the store mirror (the backend's [`Cache`]),
//! the streams and what each was told, the registrations waiting to be settled, the lease
//! as last reported, leadership with its placement budget and cool-downs, and the calls and
//! store requests in flight. The step decides with the backend's pure functions
//! (`decide.rs`, `leave.rs`, `relay.rs`, `incarnation.rs`, the leader's election and plan,
//! the departures, the mutation hooks); what the step adds is only the bookkeeping between
//! them. The production driver (`coordinator/machine/driver/`) runs it for the memory and
//! etcd backends, and the whole-cluster simulation drives it, so what the simulation checks
//! is what runs.
//!
//! The step reads no clock: `now` is wall-clock µs. The shared pieces that keep monotonic
//! time ([`Departures`], the leader's arrivals) are given `origin + now`, with `origin`
//! fixed when the instance is made, so their answers depend on `now` alone.
//!
//! **Batching.** A ready / released call's first write and a registration decided on the
//! cache wait at the end of the step for a batch (`machine/batching.rs`): one transaction
//! per batch, at most four in flight, so what is decided while they are out is written
//! together; a batch applied is applied to the cache at once, and one that lost a compare
//! leaves each of its writers to decide again on the store's records and write alone.
//!
//! **Simplifications** (where a finer rule would cost a read or a round trip): a
//! registration decided on the store's state raises epochs from the cache, not from prefix
//! reads (a raise decided on a stale cache loses its compares and is decided again); a
//! consumer that left is handed to the departures when its stream's end is emitted, not
//! when its transport took the last commands. A silence or a deadline noticed late (a busy instance) starts afresh
//! (`coordinator/machine/watchdog.rs`). The Kafka topic refresh (`topic_refresh.rs`) and
//! the weights refresh (`weights.rs`) are parts of each group's leader; the weight
//! source and Kafka are asked through effects ([`Effect::LookUpWeights`],
//! [`Effect::LookUpPartitions`]).
//!
//! **Metrics and logs** are said, not recorded: where a decision is counted or logged,
//! the step emits an [`Effect::Observe`] naming it (a plan written with its moves and
//! report, a deferral, a refused batch, leadership won or given up, a ready or released
//! call with its phase's start, a release sent, a consumer leaving, a swept registration;
//! `coordinator/machine/observe.rs`), which the production driver records into the
//! metrics and logs, and a simulation drops. The planning time is the driver's measure of
//! the steps that planned, as the step reads no clock.
//!
//! **Pacing** (`leader.rs`, `Pacing`): after a look that planned `n` partitions no leader
//! group looks before `PLAN_PACE × n ×` the stated cost ([`Start::plan_nanos_per_partition`],
//! what the production driver and a simulation state), and the groups look in turn. Started
//! [`Start::plans_timed`], the instance is paced by the measured time of each step that
//! planned instead ([`Input::PlanningTook`]); production is not (the driver's `front.rs`
//! says why). A look held back is woken for when the budget allows, never before.
//!
//! **What the step never waits for forever.** Every store request has a deadline on the
//! instance's own timer ([`STORE_ANSWER_WITHIN`], the etcd client's per-call budget): past
//! it, the request counts as failed `Unavailable` (whether or not it took effect, which is
//! what a lost answer means) and a later answer to it is ignored. A watch that says nothing
//! at all, not even a progress mark, for the mirror's bound ([`silence_bound`]: ¾ TTL) makes
//! the instance stale as of when it was last heard from, as production's follower does; it
//! follows again once a new watch speaks. A silence or a deadline noticed late (the step
//! runs more than a progress period after the time the instance asked to be woken for it,
//! so the instance was slow, not the store: a busy driver, a frozen runtime) is neither:
//! a fresh bound starts from the step that noticed it (`machine/watchdog.rs`; the running
//! follower gives two progress periods more instead of a whole bound).
//!
//! [`silence_bound`]: crate::coordinator::shared::mirror::silence_bound
//!
//! Files: `streams.rs` (the streams, the relay pass and the epoch streams), `register.rs`
//! (`Register`), `calls.rs` (ready, released, deregister), `leader.rs`, `upkeep.rs` (the
//! lease, the watch, the departures, the rebind, the timer), `watchdog.rs` (the
//! requests' deadlines and the watch's silence).

mod calls;
mod leader;
mod register;
mod streams;
mod topic_refresh;
mod upkeep;
mod watchdog;
mod weights;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod following_tests;
#[cfg(test)]
mod test_harness;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

pub(super) use crate::coordinator::machine::expect;

use super::HandoffConfig;
use super::records::Keys;
use super::state::Cache;
use crate::coordinator::machine::io::{
    CallId, Effect, Input, LeaseState, Micros, Replied, RequestId, Stop, StoreReply, StoreRequest,
};
use crate::coordinator::machine::watchdog::Watchdog;
use crate::coordinator::shared::departures::Departures;
use crate::coordinator::shared::upkeep::Upkeep;
use crate::coordinator::{CoordinatorError, PartitionEpoch};
use crate::handoff::Millis;
use crate::store::{StoreError, Txn};

use crate::coordinator::machine::batching::{Batch, TxnBatches};
use calls::{BatchedCall, CallWait, LeaveWait};
use leader::LeaderState;
use register::Enrolling;
use streams::{EpochWatch, Stream};

pub use crate::coordinator::machine::Start;
pub use crate::coordinator::machine::watchdog::STORE_ANSWER_WITHIN;

/// What a store request of the instance is for: where its answer goes.
#[derive(Debug)]
enum Waiting {
    /// The first read of the prefix, or a re-read after the watch broke.
    Reread,
    /// The watch (its batches come as [`Input::Watched`]).
    Watch,
    /// A `Register`'s store call.
    Register(Box<Enrolling>),
    /// A ready / released call's store call.
    Call(Box<CallWait>),
    /// A batch of ready / released calls' first writes.
    Calls(Box<Batch<BatchedCall>>),
    /// A batch of `Register`s' first writes.
    Registers(Vec<Enrolling>),
    /// A `Deregister`'s store call.
    Leave(Box<LeaveWait>),
    /// The leader's store call.
    Leader(usize, leader::Why),
    /// The registration of an ended stream, read (`None`) or deleted (`Some`).
    Unregister(crate::coordinator::shared::streams::StreamKey, Option<Txn>),
    /// A lost registration written again.
    Rebind(crate::coordinator::shared::streams::StreamKey),
    /// The instance record bound to this lease.
    Record(crate::store::SessionId),
    /// The resignation at a graceful stop.
    Resign,
    /// A leader group's topic refresh, in its round (`topic_refresh.rs`).
    Refresh(usize, u64),
    /// A leader group's ask for weights, under its fence (`weights.rs`).
    Weights(usize, crate::coordinator::handoff_backend::Fence),
}

/// One instance of the handoff backend (see the module docs).
pub struct Instance {
    config: HandoffConfig,
    keys: Keys,
    /// Where the monotonic time of the shared pieces starts (module docs).
    origin: Instant,
    /// The `now` of the step under way.
    now: Micros,
    /// The store's state as followed (`None` until the first read answered).
    cache: Option<Cache>,
    /// How many times `cache` was loaded anew (a cache only ever gains topics between
    /// loads: the leaders' lists of their groups' topics follow it by this and its size).
    cache_loads: u64,
    /// The newest own write applied ahead of revisions the cache has not seen (0: none).
    ahead: crate::store::Revision,
    /// The watch in use, and whether the mirror follows the store.
    watch: Option<RequestId>,
    /// Since when the mirror has not followed the store (`None`: it follows).
    stale_since: Option<Micros>,
    /// The streams were fenced because the mirror did not follow.
    stale_fenced: bool,
    /// How many times the mirror's view was interrupted (the leader settles on a change).
    interruptions: u64,
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
    /// Registration ids handed out so far (ids are derived from the instance id, the life's
    /// nonce and this).
    registrations: u64,
    /// This life's random bits ([`Start::nonce`]).
    nonce: u64,
    /// The requests' deadlines and the watch's silence.
    watchdog: Watchdog,
    waiting: BTreeMap<RequestId, Waiting>,
    /// Command streams by (topic, consumer).
    streams: BTreeMap<(String, String), Stream>,
    /// The streams whose registration the store lost (`Stream::lost_since` set): looked at
    /// on every step, so kept apart from the thousands that are not.
    lost: BTreeSet<(String, String)>,
    /// Streams that closed before their `Register` admitted them: their caller went away
    /// (a registration whose caller is gone never replaces another, docs/design.md §6).
    closed: std::collections::BTreeSet<crate::coordinator::machine::io::StreamId>,
    /// Epoch streams by their id.
    epoch_streams: BTreeMap<crate::coordinator::machine::io::StreamId, EpochWatch>,
    /// Registrations whose streams ended, until settled.
    departures: Departures,
    /// Deletes of ended streams' registrations that failed: when each is tried again, and
    /// its backoff.
    unregistering: BTreeMap<crate::coordinator::shared::streams::StreamKey, (Micros, Micros)>,
    /// The registrations the sweep is deleting (counted once deleted).
    sweeping: BTreeSet<crate::coordinator::shared::streams::StreamKey>,
    /// The sweep of registrations of this instance no stream holds (a safety net), as the
    /// running instance's upkeep keeps it.
    sweeper: Upkeep,
    /// Ready / released calls' first writes waiting for their batch, and the batches in
    /// flight (`machine/batching.rs`).
    call_batches: TxnBatches<BatchedCall>,
    /// `Register`s' first writes waiting for their batch, and the batches in flight.
    register_batches: TxnBatches<Enrolling>,
    /// `Register`s waiting for their topic's record (`machine/topic_wait.rs`).
    topic_waits: crate::coordinator::machine::topic_wait::TopicWaits<Enrolling>,
    /// One leader state per leader group (one unless `leader_groups` > 1).
    leaders: Vec<LeaderState>,
    /// The leaders' planning budget (`leader.rs`, [`Input::PlanningTook`]).
    pacing: leader::Pacing,
    /// What was last said of readiness and of the timer (said again only when it changes).
    ready: Option<bool>,
    wake: Option<Micros>,
    /// The effects of the step under way.
    out: Vec<Effect>,
}

impl Instance {
    /// A new instance of `config` at `now` (wall-clock µs), in the life `start`, and its
    /// first effects (the read of the prefix).
    pub fn new(config: HandoffConfig, start: Start, now: Micros) -> (Self, Vec<Effect>) {
        let Start { origin, nonce, watch_progress_every, plan_nanos_per_partition, plans_timed } = start;
        let keys = Keys::new(&config.prefix);
        let departures = Departures::new(config.lease_ttl);
        let sweeper = Upkeep::new(config.lease_ttl, origin + Duration::from_micros(now));
        let mut instance = Instance {
            keys,
            origin,
            now,
            cache: None,
            cache_loads: 0,
            ahead: 0,
            watch: None,
            stale_since: None,
            stale_fenced: false,
            interruptions: 0,
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
            closed: Default::default(),
            epoch_streams: BTreeMap::new(),
            departures,
            sweeper,
            unregistering: BTreeMap::new(),
            sweeping: BTreeSet::new(),
            call_batches: TxnBatches::default(),
            register_batches: TxnBatches::default(),
            topic_waits: Default::default(),
            leaders: LeaderState::all(config.leader_groups, now, config.topic_refresh_interval),
            pacing: leader::Pacing::new(plan_nanos_per_partition, plans_timed),
            ready: None,
            wake: None,
            out: Vec::new(),
            config,
        };
        instance.reread();
        let groups = instance.config.leader_groups.max(1);
        let groups = crate::coordinator::machine::observe::Observation::LeaderGroups { groups };
        instance.out.push(Effect::Observe(groups));
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
            Input::PlanningTook { took } => self.pacing.took(self.now, took),
            Input::Lease(state) => self.lease_reported(state),
            Input::PartitionCount { request, answer } => self.partition_count(request, answer),
            Input::Weights { request, weights } => self.weights_given(request, weights),
            Input::Stop(Stop::Crash) => {
                self.crashed = true;
                self.out.clear();
                return Vec::new();
            }
            Input::Stop(Stop::Graceful) => self.stop(),
        }
        if !self.stopping {
            self.upkeep();
            self.lead();
        }
        self.send_batches();
        self.settle_outputs();
        std::mem::take(&mut self.out)
    }

    /// Whether its lease may be kept alive now (the flag its keeper reads,
    /// `LeaseHolder::renews`): not while it cannot follow its store.
    pub fn renews(&self) -> bool {
        !self.stale_fenced
    }

    /// Whether this instance leads now (some leader group).
    pub fn is_leader(&self) -> bool {
        self.leaders.iter().any(|me| me.fence.is_some())
    }

    /// The cache, once the first read answered (for a simulation's checks).
    pub fn cache(&self) -> Option<&Cache> {
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

    /// `now` in wall-clock ms, what stored deadlines are in.
    fn now_ms(&self) -> Millis {
        self.now / 1000
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
            Waiting::Call(call) => self.call_answered(*call, answer),
            Waiting::Calls(batch) => self.calls_answered(*batch, answer),
            Waiting::Registers(writers) => self.registers_answered(writers, answer),
            Waiting::Leave(leave) => self.leave_answered(*leave, answer),
            Waiting::Leader(group, why) => self.leader_answered(group, why, answer),
            Waiting::Unregister(key, txn) => self.unregister_answered(key, txn, answer),
            Waiting::Rebind(key) => self.rebind_answered(key, answer),
            Waiting::Record(session) => {
                if matches!(answer, Ok(StoreReply::Txn(_))) {
                    self.recorded = Some(session);
                }
            }
            Waiting::Resign => {}
            Waiting::Refresh(g, round) => self.refresh_stored(g, round, answer),
            Waiting::Weights(..) => {}
        }
    }

    /// Sends the batches due (`machine/batching.rs`); while the lease is not live (or the
    /// instance stops), what waits for a batch is refused instead.
    fn send_batches(&mut self) {
        let refusal = self.live_lease().err();
        self.send_call_batches(refusal.as_ref());
        self.send_register_batches(refusal.as_ref());
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

    /// The epochs of `consumer`'s partitions on `topic` since `since` (what its epoch
    /// stream shows).
    fn epochs_of(&self, topic: &str, consumer: &str, since: crate::store::Revision) -> Vec<PartitionEpoch> {
        let entry = self.cache.as_ref().and_then(|c| c.topics.get(topic));
        entry.map(|e| e.epochs_of(consumer, since)).unwrap_or_default()
    }
}

impl crate::coordinator::machine::driver::Machine for Instance {
    fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        Instance::step(self, now, input)
    }

    fn renews(&self) -> bool {
        Instance::renews(self)
    }

    fn status(&self, ready: bool) -> crate::coordinator::StatusView {
        let empty = Cache::default();
        let cache = self.cache.as_ref().unwrap_or(&empty);
        super::status::view(cache, &self.config.instance_id, &self.config.backend, ready)
    }

    fn placement(
        &self,
        weights: Option<&dyn crate::weights::WeightSource>,
    ) -> Vec<crate::coordinator::TopicPlacement> {
        let states = self.cache.as_ref().map(super::placement::states_of).unwrap_or_default();
        super::placement::placement_of(states, &self.config.placement, weights)
    }
}

/// Starts an instance of `config` over `store` as one state machine stepped by the
/// production driver (`coordinator/machine/driver/`); returns once it is ready, or fails
/// if its store cannot be read or its session is not granted in time.
pub async fn start_driven(
    store: std::sync::Arc<dyn crate::store::LeaseStore>,
    config: HandoffConfig,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) -> Result<
    crate::coordinator::machine::driver::front::MachineCoordinator,
    crate::coordinator::CoordinatorError,
> {
    use crate::coordinator::machine::driver::front::{DrainAsk, DriverSetup, MachineCoordinator};
    let setup = DriverSetup {
        instance_id: config.instance_id.clone(),
        store,
        ttl: config.lease_ttl,
        topics: crate::coordinator::shared::topics::Topics {
            configured: config.topic_partitions.clone(),
            source: config.kafka.clone(),
        },
        weights: config.weights.clone(),
        drain: Some(DrainAsk { policy: config.drain_policy, decider: config.drain_decider.clone() }),
        metrics,
    };
    tracing::info!(instance = %config.instance_id, backend = %config.backend, "coordinator started (state machine)");
    MachineCoordinator::start(setup, |start, now| Instance::new(config, start, now)).await
}
