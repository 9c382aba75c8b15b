//! The production driver of an instance's state machine: one task owns the machine and is
//! the only one that steps it; everything else only forwards inputs to it and carries its
//! effects out.
//!
//! * **Inputs** come on one channel ([`Message`]): consumer calls from the gRPC layer
//!   ([`front`]), store answers and watch batches from the tasks that run the store
//!   requests ([`store_io`]), streams that closed (a forwarder per stream that only waits
//!   for its receiver to go), and the lease's state from its keeper. The timer is the
//!   driver's own: the machine's last [`Effect::WakeAt`]. A step that planned is timed
//!   (`plan_seconds`); a machine started `plans_timed` is told what it took as its next
//!   input ([`Input::PlanningTook`]). Production does not start it so (`front.rs` says
//!   why): it states a cost per partition, and no step is spent on the measure.
//! * **Effects** are applied in the order of the step's list ([`apply`](Driver::apply)).
//!   What the machine observed ([`Effect::Observe`]) is recorded into the metrics and
//!   logged (`record.rs`): the machine's counters are its own, not derived from answers.
//!   Commands go into the streams' channels through one [`PassGate`] per step, so a
//!   consumer's gain (`assigned`, a warm) is taken off its channel before any loss of the
//!   same step (`unassigned`, a release) is sent: the new owner hears first, whatever order
//!   the runtime runs the streams' tasks in (`shared/outgoing.rs`).
//! * **The lease** is kept by the shared keeper on a thread of its own
//!   (`shared/lease.rs`): it reports its state here and, when it must fence, rings the bell
//!   the streams' transports read (`shared/transport.rs`), so a stalled runtime or a busy
//!   driver cannot delay a fence. It writes nothing else.
//! * **Stopping.** A graceful stop is a step (the machine ends its streams `UNAVAILABLE`
//!   and resigns), then the driver waits for the store requests still out, for at most
//!   [`STORE_ANSWER_WITHIN`], and ends; a crash rings the bell and ends at once.
//!
//! The driver decides nothing: every decision is the machine's, so what the whole-cluster
//! simulation checks (`src/sim/`) is what runs here.

pub mod front;
mod record;
mod shared;
mod store_io;
mod streams;
mod told;

pub(crate) use shared::Shared;
use streams::Open;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::io::{Call, CallId, Effect, Input, Micros, Replied, Stop, StreamId};
use super::observe::Observation;
use super::watchdog::STORE_ANSWER_WITHIN;
use crate::coordinator::shared::outgoing::{CommandSender, Outgoing, PassGate};
use crate::coordinator::shared::topics::Topics;
use crate::coordinator::shared::transport::{self};
use crate::coordinator::{CoordinatorError, EpochsAt, StatusView};

/// An instance's state and step, as the driver runs it: either backend's `Instance`.
pub trait Machine: Send + 'static {
    /// Takes `input` in at `now` (wall-clock µs) and returns what to do, in order.
    fn step(&mut self, now: Micros, input: Input) -> Vec<Effect>;
    /// Whether its lease may be kept alive now (not while it cannot follow its store).
    fn renews(&self) -> bool;
    /// The status view of its state, `ready` as last said.
    fn status(&self, ready: bool) -> StatusView;
    /// Whether a store request that follows commands in a step must wait until their
    /// transports took them (the fleet: a partition given back is freed only once its giver
    /// heard); the handoff backend only orders commands among themselves (gains first).
    fn tells_before_freeing(&self) -> bool {
        false
    }
    /// How each topic is placed (the handoff backend's loads and shadow plan), the zones
    /// from `weights`; a backend that places by count alone shows nothing.
    fn placement(
        &self,
        weights: Option<&dyn crate::weights::WeightSource>,
    ) -> Vec<crate::coordinator::TopicPlacement> {
        let _ = weights;
        Vec::new()
    }
}

/// Where a call's answer goes, and the stream a `Register` or `WatchEpochs` opens.
pub(crate) enum Outlet {
    /// A `Register`'s command stream.
    Commands(CommandSender),
    /// A `WatchEpochs`' epoch stream.
    Epochs(mpsc::UnboundedSender<EpochsAt>),
}

/// What reaches the driver.
pub(crate) enum Message {
    /// An input for the machine, as it is.
    Input(Input),
    /// A consumer call, with where its answer goes and the stream it opens, if any.
    Call {
        call: CallId,
        body: Call,
        reply: oneshot::Sender<Result<Replied, CoordinatorError>>,
        outlet: Option<(StreamId, Outlet)>,
    },
    /// A question about the state (`status()`), answered between steps.
    Status(oneshot::Sender<StatusView>),
    /// A question about the placement (`placement()`), answered between steps.
    Placement(oneshot::Sender<Vec<crate::coordinator::TopicPlacement>>),
    /// A store request held until the commands before it were taken ([`told`]), or the
    /// streams that did not take them in time (then the request is not sent).
    Told { request: super::io::RequestId, op: super::io::StoreRequest, stalled: Vec<told::Stalled> },
    /// A graceful stop; `done` is told when the driver ended.
    Shutdown { done: oneshot::Sender<()> },
}

/// Wall-clock µs since the Unix epoch: the `now` of every step.
fn now_micros() -> Micros {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as Micros)
}

/// A call waiting for its answer.
struct Pending {
    reply: oneshot::Sender<Result<Replied, CoordinatorError>>,
    /// What it was, for the gauge its answer moves.
    kind: CallKind,
    /// A `Register` whose caller went away before its answer (`registers_abandoned`).
    abandoned: bool,
}

/// What a call was, for the gauge.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CallKind {
    Register(StreamId),
    Other,
}

impl CallKind {
    fn of(body: &Call) -> Self {
        match body {
            Call::Register { stream, .. } => CallKind::Register(*stream),
            _ => CallKind::Other,
        }
    }
}

/// How one step's effects are ordered as they are applied.
struct Order {
    /// The step's gains-first gate.
    gate: PassGate,
    /// For a machine that tells before it frees ([`Machine::tells_before_freeing`]): the
    /// step's commands so far, each held until its transport takes it.
    told: Option<Vec<told::Told>>,
    /// Streams ended while applying (not reading): the machine hears after the step.
    closed: Vec<StreamId>,
    /// A command that must be heard before what follows could not be queued.
    refused: bool,
    /// How long the step took (what planning costs, for `plan_seconds`).
    took: Duration,
}

/// The one task that owns an instance's machine.
pub(crate) struct Driver<M> {
    machine: M,
    shared: Arc<Shared>,
    topics: Topics,
    /// Where partition weights come from (`--placement load`), if anywhere.
    weights: Option<Arc<dyn crate::weights::WeightSource>>,
    inbox: mpsc::UnboundedReceiver<Message>,
    /// Where store answers and closed streams come back (the inbox's sender).
    to_self: mpsc::UnboundedSender<Message>,
    commands: HashMap<StreamId, Open>,
    epochs: HashMap<StreamId, (mpsc::UnboundedSender<EpochsAt>, tokio_util::sync::DropGuard)>,
    calls: HashMap<CallId, Pending>,
    /// The `Register` calls by the stream they open, until answered.
    registering: HashMap<StreamId, CallId>,
    store: store_io::StoreIo,
    wake: Option<Micros>,
    /// How long the last step ran (what a step that planned counts as planning time).
    step_took: Duration,
    /// The machine paces by the measured time of its planning steps
    /// ([`Start::plans_timed`](crate::coordinator::machine::Start::plans_timed)): only then
    /// is it told what one took, a step of its own.
    plans_timed: bool,
}

impl<M: Machine> Driver<M> {
    /// A driver of `machine`, whose first effects are `first`, started as a task.
    pub(crate) fn spawn(
        machine: M,
        first: Vec<Effect>,
        shared: Arc<Shared>,
        (topics, weights): (Topics, Option<Arc<dyn crate::weights::WeightSource>>),
        inbox: mpsc::UnboundedReceiver<Message>,
        to_self: mpsc::UnboundedSender<Message>,
        plans_timed: bool,
    ) {
        let store = store_io::StoreIo::new(shared.store.clone(), to_self.clone());
        let mut driver = Driver {
            machine,
            shared,
            topics,
            weights,
            inbox,
            to_self,
            commands: HashMap::new(),
            epochs: HashMap::new(),
            calls: HashMap::new(),
            registering: HashMap::new(),
            store,
            wake: None,
            step_took: Duration::ZERO,
            plans_timed,
        };
        driver.apply_all(first);
        tokio::spawn(driver.run());
    }

    async fn run(mut self) {
        let mut lease = self.shared.lease.subscribe();
        // The keeper may have reported before this task first ran: hand over what it said.
        lease.mark_changed();
        loop {
            let wake = self.wake.map(|at| {
                let left = Duration::from_micros(at.saturating_sub(now_micros()));
                tokio::time::Instant::now() + left
            });
            let message = tokio::select! {
                biased;
                () = self.shared.stop.cancelled() => return self.crashed(),
                changed = lease.changed() => match changed {
                    Ok(()) => Message::Input(Input::Lease(*lease.borrow_and_update())),
                    Err(_) => return,
                },
                message = self.inbox.recv() => match message {
                    Some(message) => message,
                    None => return,
                },
                () = sleep_until(wake) => {
                    self.wake = None;
                    Message::Input(Input::TimerFired)
                }
            };
            match message {
                Message::Input(Input::StreamClosed { stream }) => {
                    // Its receiver is gone: nothing more is sent on it.
                    self.commands.remove(&stream);
                    self.epochs.remove(&stream);
                    if let Some(call) = self.registering.get(&stream)
                        && let Some(pending) = self.calls.get_mut(call)
                        && !pending.abandoned
                    {
                        pending.abandoned = true;
                        self.shared.metrics.registers_abandoned.inc();
                    }
                    self.step(Input::StreamClosed { stream });
                }
                Message::Input(input) => self.step(input),
                Message::Call { call, body, reply, outlet } => {
                    let kind = CallKind::of(&body);
                    if let CallKind::Register(stream) = kind {
                        self.registering.insert(stream, call);
                    }
                    self.calls.insert(call, Pending { reply, kind, abandoned: false });
                    if let Some((stream, outlet)) = outlet {
                        self.open(stream, &body, outlet);
                    }
                    self.step(Input::Call { call, body });
                }
                Message::Status(answer) => {
                    let _ = answer.send(self.machine.status(self.shared.readiness.get()));
                }
                Message::Told { request, op, stalled } => self.told(request, op, stalled),
                Message::Placement(answer) => {
                    let _ = answer.send(self.machine.placement(self.weights.as_deref()));
                }
                Message::Shutdown { done } => {
                    self.step(Input::Stop(Stop::Graceful));
                    self.shared.bell.send_modify(|ends| {
                        ends.stop =
                            Some(transport::Stop::Shutdown { instance: self.shared.instance_id.clone() })
                    });
                    self.finish_requests().await;
                    self.shared.readiness.set(false);
                    self.shared.stop.cancel();
                    let _ = done.send(());
                    return;
                }
            }
        }
    }

    /// One step, its effects applied.
    fn step(&mut self, input: Input) {
        if let Input::StoreAnswer { request, .. } = &input {
            self.store.answered(*request);
        }
        let started = std::time::Instant::now();
        let effects = self.machine.step(now_micros(), input);
        let took = started.elapsed();
        self.step_took = took;
        self.shared.renews.store(self.machine.renews(), Ordering::Relaxed);
        let planned = effects.iter().any(|e| matches!(e, Effect::Observe(Observation::Planned { .. })));
        self.apply_all(effects);
        self.shared.metrics.streams.set(self.commands.len() as i64);
        if planned && self.plans_timed {
            // The machine paces its next plan by what this one took (it reads no clock):
            // told at once, before any other input, as the running leader sets its pace
            // the moment planning ends.
            self.step(Input::PlanningTook { took });
        }
    }

    /// Applies one step's effects in their order (module docs).
    fn apply_all(&mut self, effects: Vec<Effect>) {
        let mut order = Order {
            gate: PassGate::counting(self.shared.metrics.losses_waited_out.clone()),
            told: self.machine.tells_before_freeing().then(Vec::new),
            closed: Vec::new(),
            refused: false,
            // This step's time (a step nested below, for a stream found not reading, sets
            // its own).
            took: self.step_took,
        };
        for effect in effects {
            self.apply(effect, &mut order);
        }
        // Streams found not reading while the step was applied: the machine hears of them
        // after the step's effects, in their order, were all applied.
        for stream in order.closed {
            self.step(Input::StreamClosed { stream });
        }
    }

    fn apply(&mut self, effect: Effect, order: &mut Order) {
        match effect {
            // A command of the step could not be queued: what follows it is not sent (the
            // machine's watchdog fails it; the consumer's registration keeps its leases).
            Effect::Store { .. } if order.refused => {}
            Effect::Store { request, op } => match order.told.as_ref().filter(|told| !told.is_empty()) {
                Some(told) => {
                    told::send_once_taken(told.clone(), request, op, self.shared.ttl, &self.to_self)
                }
                None => self.store.send(request, op),
            },
            Effect::Command { stream, command } => self.command(stream, command, order),
            Effect::Epochs { stream, epochs } => {
                if let Some((tx, _)) = self.epochs.get(&stream)
                    && tx.send(epochs).is_err()
                {
                    self.epochs.remove(&stream);
                }
            }
            Effect::Reply { call, reply } => self.reply(call, reply),
            Effect::EndStream { stream, reason, error } => {
                self.epochs.remove(&stream);
                if let Some(open) = self.commands.remove(&stream) {
                    let (topic, consumer) = (&open.topic, &open.consumer);
                    tracing::info!(topic, consumer, ?reason, "consumer stream ended");
                    if let Some(error) = error {
                        // The channel keeps two slots beyond its buffer for this.
                        let _ = open.tx.try_send(Outgoing::free(Err(error)));
                    }
                }
            }
            Effect::WakeAt(at) => self.wake = Some(at),
            Effect::Ready(ready) => self.shared.readiness.set(ready),
            Effect::Leading(leading) => {
                self.shared.leading.store(leading, Ordering::Relaxed);
                self.shared.metrics.is_leader.set(i64::from(leading));
            }
            Effect::KeepLeaseAliveNow => self.shared.check_now.notify_one(),
            Effect::LookUpWeights { request, topics } => {
                // The weight source answers from what it learned, at once.
                let source = self.weights.as_ref();
                let weights = topics
                    .into_iter()
                    .filter_map(|topic| Some((topic.clone(), source?.weights(&topic)?)))
                    .collect();
                let _ = self.to_self.send(Message::Input(Input::Weights { request, weights }));
            }
            Effect::Observe(observation) => record::record(&self.shared.metrics, observation, order.took),
            Effect::LookUpPartitions { request, topic } => {
                let (topics, to_self) = (self.topics.clone(), self.to_self.clone());
                tokio::spawn(async move {
                    let answer = topics.ask_source(&topic).await;
                    let _ = to_self.send(Message::Input(Input::PartitionCount { request, answer }));
                });
            }
        }
    }

    /// Answers `call` (a `Register` whose caller went away is no longer counted as one).
    fn reply(&mut self, call: CallId, reply: Result<Replied, CoordinatorError>) {
        let Some(pending) = self.calls.remove(&call) else { return };
        if let CallKind::Register(stream) = pending.kind {
            self.registering.remove(&stream);
            if pending.abandoned {
                self.shared.metrics.registers_abandoned.dec();
            }
        }
        let _ = pending.reply.send(reply);
    }

    /// After a graceful stop's step: the answers still out (the resignation) are taken in
    /// for at most [`STORE_ANSWER_WITHIN`].
    async fn finish_requests(&mut self) {
        let deadline = tokio::time::Instant::now() + STORE_ANSWER_WITHIN;
        while self.store.outstanding() > 0 {
            let message = tokio::select! {
                message = self.inbox.recv() => message,
                () = tokio::time::sleep_until(deadline) => None,
            };
            match message {
                Some(Message::Input(input @ Input::StoreAnswer { .. })) => self.step(input),
                Some(Message::Call { reply, .. }) => {
                    let _ = reply.send(Err(crate::coordinator::shared::instance::stopping().into()));
                }
                Some(Message::Input(Input::StreamClosed { stream })) => {
                    self.commands.remove(&stream);
                    self.epochs.remove(&stream);
                }
                Some(_) => {}
                None => return,
            }
        }
    }

    /// A crash: nothing more is said; the streams break as a dead process's would.
    fn crashed(mut self) {
        let _ = self.machine.step(now_micros(), Input::Stop(Stop::Crash));
        self.store.stop();
    }
}

/// Resolves at `at`, or never.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
