//! The client task: one `Register` stream at a time, reconnects with backoff and jitter
//! across the endpoints, the client-side lease, and the shutdown dance.
//!
//! Beside each `Register` stream, once its first message is in, a `WatchEpochs` stream on
//! the same connection (docs/design.md §10): commands wait in the [`EpochGate`] until the
//! epochs they need have arrived, then go to the state machine. An epoch that does not
//! arrive within the call timeout, or a `WatchEpochs` that fails or ends, drops the session
//! like a broken stream (register again). An assigner without epochs (`UNIMPLEMENTED`)
//! gives epoch 0 under [`EpochPolicy::IfServed`] and ends the client under
//! [`EpochPolicy::Required`].

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::future::OptionFuture;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::{JoinHandle, JoinSet},
    time::Instant,
};
use tonic::{
    Code, Status, Streaming,
    transport::{Channel, Endpoint},
};

use super::calls::{self, Ack, AckOutcome, CallSettings, Registered, Rpc};
use super::epochs::{Command as Gated, EpochGate};
use super::state::{Action, ClientState, Input, Stage};
use super::workers::Workers;
use super::{ClientConfig, ClientError, ClientMetrics, EpochPolicy, Handler, ShutdownOutcome};
use crate::proto::v1::{AssignmentCommand, DeregisterAction, EpochSnapshot, assignment_command::Command};

type Connecting = JoinHandle<Result<Registered, Status>>;
type OpeningEpochs = JoinHandle<Result<Streaming<EpochSnapshot>, Status>>;

/// Everything the client task holds.
pub struct Driver<H> {
    config: ClientConfig,
    endpoints: Vec<Endpoint>,
    metrics: ClientMetrics,
    owned_tx: watch::Sender<BTreeSet<u32>>,
    connected_tx: watch::Sender<bool>,
    state: ClientState,
    /// `None` once finished.
    workers: Option<Workers<H>>,
    done: mpsc::UnboundedReceiver<Input>,
    rpc: watch::Sender<Option<Rpc>>,
    acks: JoinSet<(Ack, u32, AckOutcome)>,
    stream: Option<Streaming<AssignmentCommand>>,
    /// The stream's connection, for `WatchEpochs`.
    channel: Option<Channel>,
    /// `WatchEpochs`, being opened.
    opening_epochs: Option<OpeningEpochs>,
    /// `WatchEpochs`, open.
    epochs: Option<Streaming<EpochSnapshot>>,
    /// Commands waiting for their epochs.
    gate: EpochGate,
    /// The next message on the stream is the snapshot.
    expect_snapshot: bool,
    connecting: Option<Connecting>,
    next_endpoint: usize,
    attempt: u32,
    reconnect_at: Instant,
    /// Armed while the stream is down and we hold something: the client-side lease.
    lease_deadline: Option<Instant>,
    /// The session timeout in force: the configured one, lowered to what the last
    /// assigner announced ([`super::effective_session_timeout`]).
    session_timeout: Duration,
    /// When each running `release` stops counting as holding its partition.
    release_deadlines: BTreeMap<u32, Instant>,
    /// This client's number on every `Register` ([`calls::new_incarnation`]): a reconnect is
    /// the same process, so the assigner keeps its epochs.
    incarnation: u64,
}

impl<H: Handler> Driver<H> {
    /// A driver for `handler`, not yet running.
    pub fn new(
        config: ClientConfig,
        endpoints: Vec<Endpoint>,
        handler: Arc<H>,
        metrics: ClientMetrics,
        owned_tx: watch::Sender<BTreeSet<u32>>,
        connected_tx: watch::Sender<bool>,
    ) -> Self {
        let (done_tx, done) = mpsc::unbounded_channel();
        let workers = Workers::new(handler, config.topic.clone(), metrics.clone(), done_tx);
        let session_timeout = config.session_timeout;
        let gate = EpochGate::new(config.call_timeout);
        metrics.session_timeout_seconds.set(session_timeout.as_secs_f64());
        Self {
            config,
            endpoints,
            metrics,
            owned_tx,
            connected_tx,
            state: ClientState::default(),
            workers: Some(workers),
            done,
            rpc: watch::channel(None).0,
            acks: JoinSet::new(),
            stream: None,
            channel: None,
            opening_epochs: None,
            epochs: None,
            gate,
            expect_snapshot: false,
            connecting: None,
            next_endpoint: 0,
            attempt: 0,
            reconnect_at: Instant::now(),
            lease_deadline: None,
            session_timeout,
            release_deadlines: BTreeMap::new(),
            incarnation: calls::new_incarnation(),
        }
    }

    fn settings(&self, limit: std::time::Duration) -> CallSettings {
        CallSettings {
            consumer: self.config.consumer_name.clone(),
            topic: self.config.topic.clone(),
            backoff: self.config.backoff,
            call_timeout: self.config.call_timeout,
            limit,
        }
    }

    /// Runs until a fatal error or, after `stop`, the end of the shutdown.
    pub async fn run(mut self, stop: oneshot::Receiver<()>) -> Result<ShutdownOutcome, ClientError> {
        let result = self.serve(stop).await;
        let abandoned = self.finish().await;
        match result {
            Ok(outcome) if abandoned > 0 => {
                Err(ClientError::HandlerCallsAbandoned { abandoned, waited: self.session_timeout, outcome })
            }
            // A fatal error says more than the abandoned calls, which were logged and counted.
            result => result,
        }
    }

    async fn serve(&mut self, stop: oneshot::Receiver<()>) -> Result<ShutdownOutcome, ClientError> {
        let mut stop = Some(stop);
        let mut deregistering: Option<JoinHandle<Result<DeregisterAction, Status>>> = None;
        let mut drain_deadline: Option<Instant> = None;
        let far = || Instant::now() + std::time::Duration::from_secs(86_400);
        loop {
            let stopping = stop.is_none();
            let next_release = self.release_deadlines.values().min().copied();
            tokio::select! {
                biased;
                _ = async { if let Some(s) = stop.as_mut() { let _ = s.await; } }, if !stopping => {
                    stop = None;
                    tracing::info!(consumer = %self.config.consumer_name, "shutting down: Deregister");
                    let settings = self.settings(self.config.drain_timeout);
                    deregistering = Some(tokio::spawn(calls::deregister(self.rpc.subscribe(), settings)));
                    drain_deadline = Some(Instant::now() + self.config.drain_timeout);
                }
                Some(input) = self.done.recv() => self.apply(input),
                Some(answer) = OptionFuture::from(deregistering.as_mut()), if deregistering.is_some() => {
                    deregistering = None;
                    match answer {
                        Ok(Ok(DeregisterAction::WaitForDrain)) => {
                            tracing::info!("Deregister: WAIT_FOR_DRAIN; serving releases until the stream ends");
                        }
                        Ok(Ok(action)) => {
                            tracing::info!(?action, "Deregister: leaving now");
                            return Ok(ShutdownOutcome::ShutdownNow);
                        }
                        Ok(Err(status)) => return Ok(ShutdownOutcome::NotDeregistered(status.message().into())),
                        Err(error) => return Ok(ShutdownOutcome::NotDeregistered(error.to_string())),
                    }
                }
                message = next_message(&mut self.stream), if self.stream.is_some() => {
                    match message {
                        Ok(Some(command)) => self.command(command),
                        // The server ends a stream cleanly only after a drain; the stream
                        // may end before the Deregister answer is read.
                        Ok(None) if stopping => {
                            if let Some(deregistering) = deregistering.take() {
                                deregistering.abort();
                            }
                            tracing::info!("drained: the assigner ended the stream");
                            return Ok(ShutdownOutcome::Drained);
                        }
                        Ok(None) => self.went_down("the assigner ended the stream"),
                        Err(status) if status.code() == Code::Aborted => {
                            tracing::error!(%status, "replaced by another registration of this name; stopping");
                            return Err(ClientError::Replaced(status));
                        }
                        Err(status) => self.went_down(&format!("{:?}: {}", status.code(), status.message())),
                    }
                }
                Some(opened) = OptionFuture::from(self.opening_epochs.as_mut()), if self.opening_epochs.is_some() => {
                    self.opening_epochs = None;
                    match opened {
                        Ok(Ok(epochs)) => {
                            self.epochs = Some(epochs);
                            self.gate.answered(true);
                        }
                        Ok(Err(status)) if status.code() == Code::Unimplemented => self.no_epochs(status)?,
                        Ok(Err(status)) => {
                            self.went_down(&format!("WatchEpochs: {:?}: {}", status.code(), status.message()))
                        }
                        Err(error) => self.went_down(&format!("WatchEpochs: {error}")),
                    }
                }
                snapshot = next_message(&mut self.epochs), if self.epochs.is_some() => {
                    match snapshot {
                        Ok(Some(snapshot)) => {
                            let partitions = snapshot.partitions.iter().map(|p| (p.partition, p.epoch, p.warming));
                            if self.gate.snapshot(snapshot.revision, partitions) {
                                self.release_gate();
                            } else {
                                tracing::debug!(revision = snapshot.revision, "an epoch snapshot older than one applied; ignored");
                            }
                        }
                        // A drain ends both streams; the commands' end is what tells.
                        Ok(None) | Err(_) if stopping => self.epochs = None,
                        Ok(None) => self.went_down("the assigner ended the WatchEpochs stream"),
                        Err(status) => {
                            self.went_down(&format!("WatchEpochs: {:?}: {}", status.code(), status.message()))
                        }
                    }
                }
                _ = tokio::time::sleep_until(self.gate.deadline().unwrap_or_else(far)),
                    if self.gate.deadline().is_some() => {
                    let why = format!(
                        "{} did not arrive within {:?}: never handing a partition over without its epoch",
                        self.gate.waiting_for(),
                        self.config.call_timeout
                    );
                    self.metrics.epoch_timeouts.inc();
                    self.went_down(&why);
                }
                Some(connected) = OptionFuture::from(self.connecting.as_mut()), if self.connecting.is_some() => {
                    self.connecting = None;
                    match connected {
                        Ok(Ok(registered)) => self.connected(registered),
                        Ok(Err(status)) if status.code() == Code::InvalidArgument => {
                            return Err(ClientError::Refused(status));
                        }
                        Ok(Err(status)) => self.connect_failed(&format!("{:?}: {}", status.code(), status.message())),
                        Err(error) => self.connect_failed(&error.to_string()),
                    }
                }
                _ = tokio::time::sleep_until(self.reconnect_at),
                    if self.stream.is_none() && self.connecting.is_none() => self.connect(),
                _ = tokio::time::sleep_until(self.lease_deadline.unwrap_or_else(far)),
                    if self.lease_deadline.is_some() => {
                    self.lease_deadline = None;
                    tracing::warn!(
                        session_timeout = ?self.session_timeout,
                        "client-side lease ran out: no assigner reachable; unassigning everything"
                    );
                    self.metrics.lease_expirations.inc();
                    self.apply(Input::LoseAll);
                }
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or_else(far)),
                    if drain_deadline.is_some() && deregistering.is_none() => {
                    tracing::warn!(drain_timeout = ?self.config.drain_timeout, "drain deadline passed");
                    return Ok(ShutdownOutcome::DrainTimedOut);
                }
                Some(Ok((ack, p, outcome))) = self.acks.join_next(), if !self.acks.is_empty() => {
                    self.acked(ack, p, &outcome);
                }
                _ = tokio::time::sleep_until(next_release.unwrap_or_else(far)),
                    if next_release.is_some() => self.releases_overdue(),
            }
        }
    }

    /// Releases that have run for the session timeout stop holding their partition: the
    /// server may have completed the handoff without us (it does not tell the old owner).
    fn releases_overdue(&mut self) {
        let now = Instant::now();
        let overdue: Vec<u32> =
            self.release_deadlines.iter().filter(|(_, at)| **at <= now).map(|(p, _)| *p).collect();
        for p in overdue {
            self.release_deadlines.remove(&p);
            self.apply(Input::ReleaseOverdue(p));
        }
    }

    /// Applies `input` and carries out the actions.
    fn apply(&mut self, input: Input) {
        let finished = match input {
            Input::ReleaseFinished(p) => Some(p),
            _ => None,
        };
        let actions = self.state.apply(input);
        if let Some(p) = finished
            && self.state.stage(p) != Some(Stage::Releasing)
        {
            self.release_deadlines.remove(&p);
        }
        for action in actions {
            match action {
                Action::SendReady(p) => self.send(Ack::Ready, p),
                Action::SendReleased(p) => self.send(Ack::Released, p),
                Action::ReleaseAbandoned(p) => {
                    // The handler cannot be stopped: say so, loudly, and stop counting it.
                    tracing::warn!(
                        topic = %self.config.topic,
                        partition = p,
                        session_timeout = ?self.session_timeout,
                        "release has not returned, and the partition may have a new owner by now: \
                         it is no longer reported as owned; PartitionReleased follows when it returns"
                    );
                    self.metrics.abandoned_releases.inc();
                }
                other => {
                    if let Action::Release(p, _) = other {
                        self.release_deadlines.insert(p, Instant::now() + self.session_timeout);
                    }
                    if let Some(workers) = self.workers.as_mut() {
                        workers.queue(other);
                    }
                }
            }
        }
        let owned = self.state.owned();
        self.metrics.owned_partitions.set(owned.len() as i64);
        self.owned_tx.send_if_modified(|current| {
            let changed = *current != owned;
            *current = owned;
            changed
        });
    }

    fn send(&mut self, ack: Ack, p: u32) {
        let settings = self.settings(self.config.retry_limit);
        let rpc = self.rpc.subscribe();
        self.acks.spawn(async move { (ack, p, calls::acknowledge(rpc, settings, ack, p).await) });
    }

    fn acked(&mut self, ack: Ack, p: u32, outcome: &AckOutcome) {
        let name = match ack {
            Ack::Ready => "ready",
            Ack::Released => "released",
        };
        ClientMetrics::count(&self.metrics.calls, &format!("{name}_{}", outcome.label()));
        match outcome {
            AckOutcome::Done => tracing::debug!(partition = p, "{name} acknowledged"),
            AckOutcome::AlreadyDone(message) => {
                tracing::info!(partition = p, %message, "{name}: already done")
            }
            AckOutcome::Refused(code, message) => {
                tracing::info!(partition = p, ?code, %message, "{name} refused (the handoff moved on)")
            }
            AckOutcome::GaveUp(message) => {
                tracing::warn!(partition = p, %message, "{name}: gave up retrying")
            }
        }
    }

    fn command(&mut self, command: AssignmentCommand) {
        let snapshot = std::mem::take(&mut self.expect_snapshot);
        let part = |tp: Option<crate::proto::v1::TopicPartition>| tp.map(|tp| tp.partition);
        let partitions =
            |tps: Vec<crate::proto::v1::TopicPartition>| tps.into_iter().map(|tp| tp.partition).collect();
        let (kind, gated) = match command.command {
            Some(Command::Assignment(update)) if snapshot => {
                ("snapshot", Some(Gated::Snapshot(partitions(update.assigned))))
            }
            Some(Command::Assignment(update)) => (
                "assignment",
                Some(Gated::Update {
                    assigned: partitions(update.assigned),
                    unassigned: partitions(update.unassigned),
                }),
            ),
            Some(Command::Warm(warm)) => ("warm", part(warm.partition).map(Gated::Warm)),
            Some(Command::Release(release)) => ("release", part(release.partition).map(Gated::Release)),
            None => ("empty", None),
        };
        ClientMetrics::count(&self.metrics.commands, kind);
        let now = Instant::now();
        if snapshot {
            // The registration exists now: its epochs can be asked for.
            self.open_epochs();
            if kind != "snapshot" {
                self.gate.push(Gated::Snapshot(Vec::new()), now);
            }
        }
        match gated {
            Some(gated) => {
                tracing::debug!(?gated, "command");
                self.gate.push(gated, now);
            }
            None => tracing::warn!(kind, "a command without a partition; ignored"),
        }
        self.release_gate();
    }

    /// Applies the commands whose epochs are known, in order.
    fn release_gate(&mut self) {
        for input in self.gate.ready() {
            if matches!(input, Input::Snapshot(_)) {
                // The stream is back: the lease is renewed, whatever the snapshot says. Not
                // before its epochs are in: until then the client holds nothing new, and what
                // it held is still counted down.
                self.lease_deadline = None;
            }
            self.apply(input);
        }
    }

    /// Opens `WatchEpochs` on the stream's connection, in the background.
    fn open_epochs(&mut self) {
        let Some(channel) = self.channel.clone() else { return };
        if let Some(opening) = self.opening_epochs.take() {
            opening.abort();
        }
        self.epochs = None;
        let (consumer, topic) = (self.config.consumer_name.clone(), self.config.topic.clone());
        let timeout = self.config.call_timeout;
        self.opening_epochs =
            Some(tokio::spawn(async move { calls::watch_epochs(channel, &consumer, &topic, timeout).await }));
    }

    /// The assigner has no epochs (`UNIMPLEMENTED`): epoch 0, or the end under
    /// [`EpochPolicy::Required`].
    fn no_epochs(&mut self, status: Status) -> Result<(), ClientError> {
        let endpoint = self.config.endpoints[self.next_endpoint % self.endpoints.len()].clone();
        match self.config.epochs {
            EpochPolicy::Required => {
                tracing::error!(
                    %endpoint,
                    %status,
                    "the assigner hands out no ownership epochs and they are required; stopping"
                );
                Err(ClientError::EpochsNotServed { endpoint, status })
            }
            EpochPolicy::IfServed => {
                tracing::info!(
                    %endpoint,
                    "the assigner hands out no ownership epochs: partitions go to the handler with epoch 0"
                );
                self.gate.answered(false);
                self.release_gate();
                Ok(())
            }
        }
    }

    fn connect(&mut self) {
        let endpoint = self.endpoints[self.next_endpoint % self.endpoints.len()].clone();
        let (consumer, topic) = (self.config.consumer_name.clone(), self.config.topic.clone());
        let (timeout, incarnation) = (self.config.call_timeout, self.incarnation);
        tracing::debug!(endpoint = %endpoint.uri(), "connecting");
        let register =
            async move { calls::register(&endpoint, &consumer, &topic, incarnation, timeout).await };
        self.connecting = Some(tokio::spawn(register));
    }

    fn connected(&mut self, registered: Registered) {
        let Registered { rpc, channel, stream, announced_ttl } = registered;
        let endpoint = &self.config.endpoints[self.next_endpoint % self.endpoints.len()];
        tracing::info!(%endpoint, consumer = %self.config.consumer_name, "registered");
        self.learn_session_ttl(announced_ttl);
        self.stream = Some(stream);
        self.channel = Some(channel);
        self.drop_epochs();
        self.expect_snapshot = true;
        self.attempt = 0;
        self.rpc.send_replace(Some(rpc));
        self.connected_tx.send_replace(true);
        self.metrics.connects.inc();
        self.metrics.connected.set(1);
    }

    /// Lowers the session timeout to what the assigner's session TTL allows. The last
    /// announcement wins (an instance that announces nothing changes nothing): every
    /// instance of a deployment runs with one `--lease-ttl`, which a rollout may change.
    fn learn_session_ttl(&mut self, announced: Option<Duration>) {
        let Some(ttl) = announced else { return };
        let effective = super::effective_session_timeout(self.config.session_timeout, ttl);
        if effective != self.session_timeout {
            tracing::info!(
                server_session_ttl = ?ttl,
                configured = ?self.config.session_timeout,
                session_timeout = ?effective,
                "session timeout set from the assigner's session TTL"
            );
            if self.config.keepalive * 2 >= effective {
                tracing::warn!(
                    keepalive = ?self.config.keepalive,
                    session_timeout = ?effective,
                    "keepalives too slow for the assigner's session TTL: a dropped stream unassigns \
                     everything at once (use ClientConfig::with_server_lease_ttl)"
                );
            }
        }
        self.session_timeout = effective;
        self.metrics.session_timeout_seconds.set(effective.as_secs_f64());
    }

    fn connect_failed(&mut self, why: &str) {
        let endpoint = &self.config.endpoints[self.next_endpoint % self.endpoints.len()];
        tracing::warn!(%endpoint, why, attempt = self.attempt, "cannot register; trying the next endpoint");
        self.next_endpoint = self.next_endpoint.wrapping_add(1);
        self.schedule_reconnect();
    }

    fn schedule_reconnect(&mut self) {
        self.reconnect_at = Instant::now() + self.config.backoff.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
    }

    fn went_down(&mut self, why: &str) {
        tracing::warn!(why, "stream lost; reconnecting");
        self.stream = None;
        self.channel = None;
        self.drop_epochs();
        self.rpc.send_replace(None);
        self.connected_tx.send_replace(false);
        self.metrics.connected.set(0);
        if self.lease_deadline.is_none() && !self.state.is_empty() {
            // Counted from the last moment the connection was known alive: a silently
            // dead one is noticed up to two keepalive periods late.
            let detection = self.config.keepalive * 2;
            let left = self.session_timeout.saturating_sub(detection);
            self.lease_deadline = Some(Instant::now() + left);
        }
        self.schedule_reconnect();
    }

    /// Forgets the epochs stream and what waited for it (a new session starts over).
    fn drop_epochs(&mut self) {
        if let Some(opening) = self.opening_epochs.take() {
            opening.abort();
        }
        self.epochs = None;
        self.gate.reset();
    }

    /// Unassigns what is left, runs the queued handler calls (for at most the session
    /// timeout: past it the partitions count as lost anyway, and a hung handler must not
    /// hold the shutdown forever), sends the last acknowledgements (bounded), and marks the
    /// client disconnected. Returns how many handler calls were abandoned.
    async fn finish(&mut self) -> usize {
        if let Some(connecting) = self.connecting.take() {
            connecting.abort();
        }
        self.drop_epochs();
        self.apply(Input::LoseAll);
        self.stream = None;
        let mut abandoned = 0;
        if let Some(workers) = self.workers.take() {
            abandoned = workers.finish(self.session_timeout).await;
        }
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                session_timeout = ?self.session_timeout,
                "handler calls still running after the session timeout; stopping without them"
            );
            self.metrics.handler_calls_abandoned.inc_by(abandoned as u64);
        }
        // A release that was running when we stopped is acknowledged now.
        while let Ok(input) = self.done.try_recv() {
            self.apply(input);
        }
        let bound = self.config.call_timeout;
        let _ = tokio::time::timeout(bound, async {
            while let Some(result) = self.acks.join_next().await {
                if let Ok((ack, p, outcome)) = result {
                    self.acked(ack, p, &outcome);
                }
            }
        })
        .await;
        self.acks.abort_all();
        self.rpc.send_replace(None);
        self.connected_tx.send_replace(false);
        self.metrics.connected.set(0);
        self.metrics.owned_partitions.set(self.state.owned().len() as i64);
        abandoned
    }
}

/// The next message of the stream (pending forever without one).
async fn next_message<T>(stream: &mut Option<Streaming<T>>) -> Result<Option<T>, Status> {
    match stream.as_mut() {
        Some(stream) => stream.message().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
