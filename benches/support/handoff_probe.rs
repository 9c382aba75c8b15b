//! Timing probes around the real instance of the handoff bench: a pass-through
//! coordinator (between the gRPC layer and the instance's `MachineCoordinator`) and a pass-through
//! store (between the coordinator and etcd). For the one handoff the bench has armed, they
//! note when each step happened: the call reaches the coordinator, its transaction goes
//! to etcd and comes back, the instance's own watch brings that revision back to the
//! follower and the follower is done with it (applied and relayed), the new owner's
//! `assigned` and the old owner's `ReleasePartition` leave the coordinator's streams for
//! the gRPC transport, and the call returns. Each note is a clock read under an
//! uncontended lock; nothing else changes on the path.
//!
//! The leader's plan pass is seen through the one hook it calls while planning, the
//! Kubernetes [`RolloutView`]: [`ProbedRollout`] answers what no view answers (no rollout,
//! nothing known of any consumer) and notes when the pass reached the benched topic (its
//! consumers are "a" and "b") and the marker topic planned after it (its one consumer is
//! [`MARKER_CONSUMER`]): the benched topic's plan lies between.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::StreamExt;
use kafka_assigner::{
    assignment::{ConsumerInfo, Rollout},
    coordinator::{CommandStream, ConsumerGroupCoordinator, CoordinatorError, StatusView},
    drain::RolloutView,
    proto::v1::{AssignmentCommand, DeregisterAction, TopicPartition, assignment_command::Command},
    store::{
        KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn, TxnOutcome,
        WatchBatch, WatchEventKind, WatchStream,
    },
};
use tokio::sync::watch;

/// When each step of the armed handoff happened (`None`: not seen).
#[derive(Clone, Copy, Debug, Default)]
pub struct Steps {
    /// `PartitionReady` reached the coordinator.
    pub entered: Option<Instant>,
    /// Its transaction (the one that puts the partition's handoff record) went to the store.
    pub txn_sent: Option<Instant>,
    /// The store answered it.
    pub txn_done: Option<Instant>,
    /// The instance's own watch delivered that put.
    pub watched: Option<Instant>,
    /// The follower asked its watch for more after applying and relaying that put (its
    /// second poll after it: the first comes from `apply`'s look for more ready items, the
    /// second from the next `Follower::next`, once `relay::tell` is done).
    pub relayed: Option<Instant>,
    /// The new owner's `assigned` left the coordinator's stream for gRPC.
    pub gain_left: Option<Instant>,
    /// The old owner's `ReleasePartition` left the coordinator's stream for gRPC.
    pub release_left: Option<Instant>,
    /// `PartitionReady` returned from the coordinator.
    pub returned: Option<Instant>,
    /// The leader's last plan pass begun between the call's arrival and the release's
    /// departure reached the benched topic ...
    pub plan_started: Option<Instant>,
    /// ... and the marker topic after it: the benched topic's plan was done.
    pub plan_done: Option<Instant>,
}

impl Steps {
    /// `to - from` in µs, when both were seen.
    pub fn between(from: Option<Instant>, to: Option<Instant>) -> Option<f64> {
        Some(signed_us(from?, to?))
    }
}

/// `to - from` in µs, negative when `to` came first.
pub fn signed_us(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(from.duration_since(to).as_secs_f64() * 1e6),
    }
}

/// The handoff being watched.
struct Target {
    tp: TopicPartition,
    handoff_key: String,
}

/// What the probes share: the armed handoff and its steps.
#[derive(Default)]
pub struct Probe {
    state: Mutex<(Option<Target>, Steps)>,
    /// Plan passes finished (the marker topic planned), and a wake-up at each.
    passes: (std::sync::atomic::AtomicU64, tokio::sync::Notify),
}

impl Probe {
    /// Watches the handoff of `tp`, whose handoff record lives at `handoff_key`.
    pub fn arm(&self, tp: TopicPartition, handoff_key: String) {
        *self.lock() = (Some(Target { tp, handoff_key }), Steps::default());
    }

    /// The steps seen since [`arm`](Self::arm); stops watching.
    pub fn take(&self) -> Steps {
        std::mem::take(&mut *self.lock()).1
    }

    /// Plan passes finished so far.
    pub fn passes(&self) -> u64 {
        self.passes.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until more than `seen` plan passes have finished, or `within` has passed.
    pub async fn pass_after(&self, seen: u64, within: Duration) {
        let _ = tokio::time::timeout(within, async {
            loop {
                let notified = self.passes.1.notified();
                if self.passes() > seen {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Target>, Steps)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes `step` now (the first time only) if `hit` says the event is the armed one's.
    fn note(&self, hit: impl FnOnce(&Target) -> bool, step: fn(&mut Steps) -> &mut Option<Instant>) {
        let now = Instant::now();
        let mut state = self.lock();
        let (target, steps) = &mut *state;
        if target.as_ref().is_some_and(hit) {
            step(steps).get_or_insert(now);
        }
    }

    fn command_left(&self, topic: &str, item: &Result<AssignmentCommand, CoordinatorError>) {
        let Ok(AssignmentCommand { command: Some(command) }) = item else { return };
        match command {
            Command::Release(release) => {
                self.note(|t| release.partition.as_ref() == Some(&t.tp), |s| &mut s.release_left)
            }
            Command::Assignment(update) => {
                self.note(|t| t.tp.topic == topic && update.assigned.contains(&t.tp), |s| &mut s.gain_left)
            }
            Command::Warm(_) => {}
        }
    }
}

/// The one consumer of the marker topic, which sorts (and is planned) after the benched one.
pub const MARKER_CONSUMER: &str = "m";

/// A [`RolloutView`] that knows nothing (as no view at all) and notes the plan pass.
pub struct ProbedRollout {
    probe: Arc<Probe>,
}

impl std::fmt::Debug for ProbedRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbedRollout")
    }
}

impl ProbedRollout {
    /// Notes into `probe`.
    pub fn new(probe: Arc<Probe>) -> Self {
        Self { probe }
    }
}

impl RolloutView for ProbedRollout {
    fn rollout(&self, live: &BTreeSet<String>, _active: &BTreeSet<String>) -> Option<Rollout> {
        let now = Instant::now();
        let mut state = self.probe.lock();
        let steps = &mut state.1;
        if live.contains("a") {
            // The last pass that began after the call arrived and before the release left.
            if steps.entered.is_some() && steps.release_left.is_none() {
                (steps.plan_started, steps.plan_done) = (Some(now), None);
            }
        } else if live.contains(MARKER_CONSUMER) {
            if steps.plan_started.is_some() && steps.plan_done.is_none() {
                steps.plan_done = Some(now);
            }
            drop(state);
            self.probe.passes.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.probe.passes.1.notify_waiters();
        }
        None
    }

    fn info(&self, _consumer: &str) -> Option<ConsumerInfo> {
        None
    }
}

/// The instance's watch stream, noting when the armed put comes out and when the
/// follower next polls twice.
struct ProbedWatch {
    inner: WatchStream,
    probe: Arc<Probe>,
    /// Polls since the armed put came out.
    polls_since: Option<u32>,
}

impl futures::Stream for ProbedWatch {
    type Item = Result<WatchBatch, StoreError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if let Some(polls) = &mut self.polls_since {
            *polls += 1;
            if *polls == 2 {
                self.probe.note(|_| true, |s| &mut s.relayed);
            }
        }
        let item = self.inner.poll_next_unpin(cx);
        if let std::task::Poll::Ready(Some(Ok(batch))) = &item {
            let put = |t: &Target| {
                batch
                    .events
                    .iter()
                    .any(|e| e.key == t.handoff_key && matches!(e.kind, WatchEventKind::Put(_)))
            };
            if self.probe.lock().0.as_ref().is_some_and(put) {
                self.probe.note(|_| true, |s| &mut s.watched);
                self.polls_since = Some(0);
            }
        }
        item
    }
}

fn puts_key(txn: &Txn, key: &str) -> bool {
    txn.ops.iter().any(|op| matches!(op, Op::Put { key: k, .. } if k == key))
}

/// A [`ConsumerGroupCoordinator`] that passes every call to `inner`, noting the armed
/// handoff's steps.
pub struct ProbedCoordinator {
    inner: Arc<dyn ConsumerGroupCoordinator>,
    probe: Arc<Probe>,
}

impl ProbedCoordinator {
    /// Passes to `inner`, noting into `probe`.
    pub fn new(inner: Arc<dyn ConsumerGroupCoordinator>, probe: Arc<Probe>) -> Self {
        Self { inner, probe }
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for ProbedCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        let stream = self.inner.register(consumer, topic).await?;
        let (probe, topic) = (self.probe.clone(), topic.to_string());
        Ok(Box::pin(stream.inspect(move |item| probe.command_left(&topic, item))))
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        let armed = |t: &Target| t.tp.topic == topic && t.tp.partition == partition;
        self.probe.note(armed, |s| &mut s.entered);
        let result = self.inner.partition_ready(consumer, topic, partition).await;
        self.probe.note(armed, |s| &mut s.returned);
        result
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.inner.partition_released(consumer, topic, partition).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        self.inner.deregister(consumer).await
    }

    async fn status(&self) -> StatusView {
        self.inner.status().await
    }

    fn session_ttl(&self) -> Option<Duration> {
        self.inner.session_ttl()
    }

    fn readiness(&self) -> watch::Receiver<bool> {
        self.inner.readiness()
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }
}

/// A [`LeaseStore`] that passes every call to `inner`, noting when the armed handoff's
/// transaction goes out and comes back, and when the watch delivers it.
pub struct ProbedStore {
    inner: Arc<dyn LeaseStore>,
    probe: Arc<Probe>,
}

impl ProbedStore {
    /// Passes to `inner`, noting into `probe`.
    pub fn new(inner: Arc<dyn LeaseStore>, probe: Arc<Probe>) -> Self {
        Self { inner, probe }
    }
}

#[async_trait]
impl LeaseStore for ProbedStore {
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError> {
        self.inner.grant_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError> {
        self.inner.keep_alive(session).await
    }

    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError> {
        self.inner.revoke_session(session).await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.inner.get(key).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError> {
        self.inner.get_prefix(prefix).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        // Decided before the call: the txn is moved into it.
        let ours = {
            let state = self.probe.lock();
            state.0.as_ref().is_some_and(|t| puts_key(&txn, &t.handoff_key))
        };
        if ours {
            self.probe.note(|_| true, |s| &mut s.txn_sent);
        }
        let outcome = self.inner.txn(txn).await;
        if ours {
            self.probe.note(|_| true, |s| &mut s.txn_done);
        }
        outcome
    }

    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError> {
        let inner = self.inner.watch_prefix(prefix, from_revision).await?;
        Ok(ProbedWatch { inner, probe: self.probe.clone(), polls_since: None }.boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.inner.compact(revision).await
    }

    async fn connect_again(&self) -> Result<Option<Arc<dyn LeaseStore>>, StoreError> {
        self.inner.connect_again().await
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        session: Option<SessionId>,
    ) -> Result<Revision, StoreError> {
        self.inner.put(key, value, session).await
    }

    async fn delete(&self, key: &str) -> Result<Revision, StoreError> {
        self.inner.delete(key).await
    }
}
