//! What goes into an instance's [`step`](super) and what comes out of it, as plain data.
//!
//! An instance is a state and a step: `step(now, input) -> effects`. Everything the
//! outside world tells an instance is an [`Input`]; everything the instance wants done is
//! an [`Effect`]. The step reads no clock (`now` is an argument), does no I/O, spawns
//! nothing and takes no lock, so the same inputs in the same order give the same effects:
//! a production driver applies them to a real store and real streams, a simulation to
//! models of both, in one thread, from a seed.
//!
//! **Correlation.** Each store request carries a [`RequestId`] and each call a [`CallId`],
//! chosen by whoever issues them (the instance for requests, the driver for calls) and
//! echoed in the answer, so answers may come back in any order, or never (a lost answer is
//! a request whose answer never arrives; the instance times it out on its own timer).
//!
//! **Order.** The effects of one step are in the order they must be applied. In
//! particular commands to streams are listed in delivery order across streams: a consumer
//! that gains a partition hears its `assigned` (or `warm`) before the consumer that loses
//! it hears its release or `unassigned`. A driver may batch and pace effects, but must
//! not reorder [`Effect::Command`]s.
//!
//! **Commands in wire form.** A command to a stream is an [`AssignmentCommand`], exactly
//! what the consumer receives: the relay (`handoff_backend/relay.rs`) and a stream's
//! farewell (`shared/streams.rs`) already derive wire commands, so a driver forwards them
//! as they are, and a simulation checks what consumers are actually told.

use crate::coordinator::{CoordinatorError, EpochsAt};
use crate::proto::v1::{AssignmentCommand, DeregisterAction};
use crate::store::{KeyValue, PrefixSnapshot, Revision, StoreError, Txn, TxnOutcome};

pub use crate::coordinator::shared::lease::LeaseState;
pub use crate::coordinator::shared::streams::EndReason;

/// Wall-clock time in microseconds since the Unix epoch: the one clock an instance reads,
/// always as an argument. Stored deadlines are wall-clock milliseconds (`now / 1000`) and
/// ownership epochs are built from microseconds (`shared/records.rs::next_epoch`).
pub type Micros = u64;

/// Names one store request of one instance, unique for the instance's life; its answer
/// carries it back.
pub type RequestId = u64;

/// Names one consumer call; chosen by the driver, unique per instance.
pub type CallId = u64;

/// Names one consumer stream (a `Register`'s command stream, or a `WatchEpochs`' epoch
/// stream); chosen by the driver, unique per instance.
pub type StreamId = u64;

/// Something the outside world tells an instance.
#[derive(Clone, Debug)]
pub enum Input {
    /// The store answered a request.
    StoreAnswer {
        /// The request answered.
        request: RequestId,
        /// What it said.
        answer: Result<StoreReply, StoreError>,
    },
    /// A watch the instance started ([`StoreRequest::Watch`]) delivered one revision.
    Watched {
        /// The request that started the watch.
        watch: RequestId,
        /// The revision's changes (empty: a progress mark).
        batch: crate::store::WatchBatch,
    },
    /// A watch ended: cut, failed, or its history compacted ([`StoreError::Compacted`]).
    /// Nothing more comes from it.
    WatchEnded {
        /// The request that started the watch.
        watch: RequestId,
        /// Why it ended.
        error: StoreError,
    },
    /// A consumer call arrived.
    Call {
        /// Its id, echoed in the [`Effect::Reply`].
        call: CallId,
        /// The call.
        body: Call,
    },
    /// A stream went away on its own (the client left, the connection broke, or the
    /// consumer stopped reading): it takes no more effects. Sent too for the stream of a
    /// `Register` whose caller went away before the answer: that registration is then
    /// decided no more (it must never replace the caller's next attempt), or, if it was
    /// written already, settled as after a disconnect.
    StreamClosed {
        /// The stream.
        stream: StreamId,
    },
    /// The time of the last [`Effect::WakeAt`] has come (or passed).
    TimerFired,
    /// How long the step just before this one ran, when that step planned (it said
    /// [`Observation::Planned`](super::observe::Observation::Planned)): the driver's measure
    /// of the planning time, since the step reads no clock. The leaders' next look then waits
    /// until `PLAN_PACE × took` has passed from this step's `now`, as the running leader's
    /// next pass waits after a pass that took that long. A driver that times its steps
    /// ([`Start::plans_timed`](super::Start::plans_timed)) sends it right after the planning
    /// step's effects, before any other input; a machine with no planning budget (the
    /// fleet's) ignores it, and a simulation sends none (its planning cost is the stated one).
    PlanningTook {
        /// How long the step that planned ran.
        took: std::time::Duration,
    },
    /// The instance lease's state, as its keeper last reported it (`shared/lease.rs`).
    Lease(LeaseState),
    /// A partition count asked for with [`Effect::LookUpPartitions`] (Kafka's answer).
    PartitionCount {
        /// The request answered.
        request: RequestId,
        /// The count, or why there is none.
        answer: Result<u32, CoordinatorError>,
    },
    /// The weights asked for with [`Effect::LookUpWeights`] (the weight source's answer):
    /// by topic, those it knows.
    Weights {
        /// The request answered.
        request: RequestId,
        /// Partition → weight, by topic.
        weights: std::collections::BTreeMap<String, std::collections::BTreeMap<u32, u64>>,
    },
    /// The instance stops.
    Stop(Stop),
}

/// How an instance stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Shutdown: streams end `UNAVAILABLE`, registrations are kept for their TTL,
    /// leadership is resigned, and what is in flight is still answered.
    Graceful,
    /// As if the process died: no effect at all from now on.
    Crash,
}

/// A consumer call, as the gRPC layer hands it over (names already validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `Register`: open the command stream `stream` of `consumer` on `topic`.
    Register {
        /// The stream its commands go to.
        stream: StreamId,
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// The client process' incarnation (0: none; docs/design.md §10).
        incarnation: u64,
    },
    /// `PartitionReady`: `consumer` finished warming `partition`.
    PartitionReady {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// `PartitionReleased`: `consumer` stopped processing `partition`.
    PartitionReleased {
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// `Deregister`: `consumer` is shutting down.
    Deregister {
        /// The consumer.
        consumer: String,
        /// What the drain policy answered (asked by the driver before the call reaches
        /// the instance: the policy may ask Kubernetes).
        wants_drain: bool,
    },
    /// `WatchEpochs`: open the epoch stream `stream` of `consumer` on `topic`.
    WatchEpochs {
        /// The stream its snapshots go to.
        stream: StreamId,
        /// The consumer.
        consumer: String,
        /// The topic.
        topic: String,
    },
}

/// What the store answered a request with (the variant matches the request's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreReply {
    /// A transaction's outcome.
    Txn(TxnOutcome),
    /// The records of a [`StoreRequest::Get`], one per key in its order (`None`: absent).
    Values(Vec<Option<KeyValue>>),
    /// The records under a prefix, at one revision.
    Prefix(PrefixSnapshot),
    /// A watch was started; its revisions come as [`Input::Watched`].
    Watching,
}

/// Something an instance asks of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreRequest {
    /// Apply this transaction (its compares are the guard of the decision).
    Txn(Txn),
    /// Read these keys.
    Get(Vec<String>),
    /// Read everything under this prefix at one revision.
    GetPrefix(String),
    /// Watch this prefix from this revision on; every earlier watch of the instance is
    /// dropped by the driver (a batch of one that still arrives is ignored by its id).
    Watch {
        /// The prefix.
        prefix: String,
        /// The first revision to deliver.
        from: Revision,
    },
}

/// Something an instance wants done, in the order of the step's list.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Send this request to the store; answer it with [`Input::StoreAnswer`] (or, for a
    /// watch, [`Input::Watched`] / [`Input::WatchEnded`]) carrying `request`.
    Store {
        /// Its id.
        request: RequestId,
        /// The request.
        op: StoreRequest,
    },
    /// Send this command on the command stream `stream`.
    Command {
        /// The stream.
        stream: StreamId,
        /// The command, as the consumer receives it.
        command: AssignmentCommand,
    },
    /// Send this snapshot of epochs on the epoch stream `stream`.
    Epochs {
        /// The stream.
        stream: StreamId,
        /// The snapshot.
        epochs: EpochsAt,
    },
    /// Answer the call `call`.
    Reply {
        /// The call.
        call: CallId,
        /// The answer.
        reply: Result<Replied, CoordinatorError>,
    },
    /// End the stream `stream` (command or epoch stream): after `error`, if any, as its
    /// last item. Nothing more is sent on it.
    EndStream {
        /// The stream.
        stream: StreamId,
        /// Why (what the driver does with the consumer's session follows from it).
        reason: EndReason,
        /// The last item, if the stream ends with an error.
        error: Option<CoordinatorError>,
    },
    /// Fire [`Input::TimerFired`] at this time (replaces any earlier `WakeAt`).
    WakeAt(Micros),
    /// Whether the instance serves (`/ready`, gRPC health).
    Ready(bool),
    /// Whether the instance leads now (the leader gauge; a simulation's invariants).
    Leading(bool),
    /// Keep the instance lease alive now, not at its next period (the store said the
    /// instance's records are gone, or a fence should be lifted as soon as possible).
    KeepLeaseAliveNow,
    /// Ask the topic source (Kafka) for `topic`'s partition count; answer with
    /// [`Input::PartitionCount`] carrying `request`.
    LookUpPartitions {
        /// Its id.
        request: RequestId,
        /// The topic.
        topic: String,
    },
    /// Ask the weight source (`--placement load`: Kafka's learned rates) for the weights of
    /// `topics`' partitions; answer with [`Input::Weights`] carrying `request`.
    LookUpWeights {
        /// Its id.
        request: RequestId,
        /// The topics.
        topics: Vec<String>,
    },
    /// Something the instance decided or saw, for metrics and logs ([`super::observe`]):
    /// changes nothing, and a simulation ignores it.
    Observe(super::observe::Observation),
}

/// A call's successful answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replied {
    /// `Register`: the registration is written; its snapshot is the first
    /// [`Effect::Command`] on the stream (same step or later).
    Registered,
    /// `PartitionReady` / `PartitionReleased`: applied, or already in effect.
    Applied,
    /// `Deregister`: what the consumer should do.
    Deregistered(DeregisterAction),
    /// `WatchEpochs`: the epoch stream is open; snapshots follow as [`Effect::Epochs`].
    WatchingEpochs,
}
