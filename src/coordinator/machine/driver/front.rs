//! [`MachineCoordinator`]: the gRPC layer's face of an instance run by the driver. It
//! checks names, asks the drain policy (which may ask Kubernetes) before a `Deregister`
//! reaches the machine, hands each call to the driver with where its answer goes, and
//! turns a `Register`'s channel into the command stream the consumer reads. It keeps no
//! state of the instance's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{Driver, Machine, Message, Outlet, Shared};
use crate::coordinator::machine::Start;
use crate::coordinator::machine::io::{Call, Effect, Micros, Replied};
use crate::coordinator::shared::Readiness;
use crate::coordinator::shared::instance::stopping;
use crate::coordinator::shared::lease::LeaseState;
use crate::coordinator::shared::outgoing::command_channel;
use crate::coordinator::shared::topics::Topics;
use crate::coordinator::shared::transport::{self, EndWatch, Ends};
use crate::coordinator::{
    CommandStream, ConsumerGroupCoordinator, CoordinatorError, EpochStream, StatusView,
    validate_consumer_name, validate_topic_name,
};
use crate::drain::{DrainDecider, DrainPolicy};
use crate::metrics::Metrics;
use crate::proto::v1::DeregisterAction;
use crate::store::LeaseStore;

/// How a driven instance's `Deregister` asks whether to drain.
#[derive(Clone, Debug)]
pub struct DrainAsk {
    /// The policy when no decider is set.
    pub policy: DrainPolicy,
    /// The decider (Kubernetes), if any.
    pub decider: Option<Arc<dyn DrainDecider>>,
}

/// What starting a driven instance takes beside its machine.
pub struct DriverSetup {
    /// The instance's id.
    pub instance_id: String,
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// The session TTL.
    pub ttl: Duration,
    /// Where partition counts come from.
    pub topics: Topics,
    /// Where partition weights come from (`--placement load`), if anywhere.
    pub weights: Option<Arc<dyn crate::weights::WeightSource>>,
    /// The drain policy (`None`: the backend never drains).
    pub drain: Option<DrainAsk>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
}

/// An instance whose state is one machine, stepped by one driver task (module docs of
/// [`super`]).
pub struct MachineCoordinator {
    to_driver: mpsc::UnboundedSender<Message>,
    shared: Arc<Shared>,
    drain: Option<DrainAsk>,
    /// Call and stream ids (unique for the instance's life).
    ids: AtomicU64,
}

impl MachineCoordinator {
    /// Starts the driver of the machine `make` builds (given the life's [`Start`] and
    /// `now`), and the keeper of its lease; returns once the instance is ready (its store
    /// read, its session granted), or fails if it is not within the store's answer budget
    /// and a TTL (the instance is then stopped).
    pub async fn start<M: Machine>(
        setup: DriverSetup,
        make: impl FnOnce(Start, Micros) -> (M, Vec<Effect>),
    ) -> Result<Self, CoordinatorError> {
        let within = crate::coordinator::machine::watchdog::STORE_ANSWER_WITHIN + setup.ttl;
        let started = Self::spawn(setup, make);
        let mut ready = started.shared.readiness.subscribe();
        if tokio::time::timeout(within, ready.wait_for(|ready| *ready)).await.is_ok_and(|r| r.is_ok()) {
            return Ok(started);
        }
        let lease = *started.shared.lease.borrow();
        started.crash();
        Err(match lease.live() {
            None => CoordinatorError::NoSession(crate::coordinator::causes::SessionMissing::NotGranted),
            Some(_) => CoordinatorError::Store(crate::store::StoreError::Unavailable(
                crate::store::Unreachable::NotLoaded,
            )),
        })
    }

    /// Starts the driver and the keeper (see [`start`](Self::start)), ready or not.
    fn spawn<M: Machine>(setup: DriverSetup, make: impl FnOnce(Start, Micros) -> (M, Vec<Effect>)) -> Self {
        let DriverSetup { instance_id, store, ttl, topics, weights, drain, metrics } = setup;
        let start = Start {
            origin: tokio::time::Instant::now(),
            nonce: fresh_nonce(),
            watch_progress_every: store.watch_progress_every(),
            // A stated cost, not the measure: the driver can time only a whole step, and
            // the step that applies a ready's commit plans too, so a measured budget
            // charged the commit's relay to planning and held the next look back (the
            // handoff bench's ratio went from 1.35-1.41x to 1.70-1.75x).
            plan_nanos_per_partition: PLAN_NANOS_PER_PARTITION,
            plans_timed: false,
        };
        let shared = Arc::new(Shared {
            instance_id,
            store,
            ttl,
            lease: watch::Sender::new(LeaseState::Pending),
            bell: watch::Sender::new(Ends::default()),
            renews: AtomicBool::new(true),
            check_now: tokio::sync::Notify::new(),
            stop: CancellationToken::new(),
            readiness: Readiness::new(false),
            leading: AtomicBool::new(false),
            metrics,
        });
        let (machine, first) = make(start, super::now_micros());
        let (to_driver, inbox) = mpsc::unbounded_channel();
        let timed = start.plans_timed;
        Driver::spawn(machine, first, shared.clone(), (topics, weights), inbox, to_driver.clone(), timed);
        crate::coordinator::shared::lease::spawn_keeper(shared.clone(), |shared: &Shared| shared);
        Self { to_driver, shared, drain, ids: AtomicU64::new(1) }
    }

    /// Stops the instance abruptly, as if the process died: streams break with an error,
    /// no session is revoked, no leadership resigned. For failover tests.
    pub fn crash(&self) {
        self.shared.bell.send_modify(|ends| ends.stop = Some(transport::Stop::Crashed));
        self.shared.readiness.set(false);
        self.shared.stop.cancel();
    }

    /// Whether this instance leads now (some leader group).
    pub fn is_leader(&self) -> bool {
        self.shared.leading.load(Ordering::Relaxed) && !self.shared.stop.is_cancelled()
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// Hands `body` to the driver and waits for its answer.
    async fn call(&self, body: Call, outlet: Option<(u64, Outlet)>) -> Result<Replied, CoordinatorError> {
        let (reply, answer) = oneshot::channel();
        let call = self.next_id();
        self.to_driver.send(Message::Call { call, body, reply, outlet }).map_err(|_| stopping())?;
        answer.await.map_err(|_| stopping())?
    }
}

/// Random bits for this life of the instance (registration ids are derived from them).
fn fresh_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(super::now_micros() as u128);
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// What a driven instance's `Deregister` was answered that is not a `Deregistered`.
fn unexpected(replied: Replied) -> CoordinatorError {
    let _ = replied;
    CoordinatorError::Store(crate::store::StoreError::Invalid(crate::store::Malformed::WrongAnswerKind))
}

#[async_trait]
impl ConsumerGroupCoordinator for MachineCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        self.register_as(consumer, topic, 0).await
    }

    async fn register_as(
        &self,
        consumer: &str,
        topic: &str,
        incarnation: u64,
    ) -> Result<CommandStream, CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        let (tx, rx) = command_channel();
        let stream = self.next_id();
        // A fence that rings from now on ends this stream too.
        let admitted_at = self.shared.bell.borrow().fences;
        let body =
            Call::Register { stream, consumer: consumer.to_string(), topic: topic.to_string(), incarnation };
        self.call(body, Some((stream, Outlet::Commands(tx)))).await?;
        Ok(transport::command_stream(rx, EndWatch::new(self.shared.bell.subscribe(), admitted_at)))
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        let body =
            Call::PartitionReady { consumer: consumer.to_string(), topic: topic.to_string(), partition };
        self.call(body, None).await.map(|_| ())
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        let body =
            Call::PartitionReleased { consumer: consumer.to_string(), topic: topic.to_string(), partition };
        self.call(body, None).await.map(|_| ())
    }

    async fn watch_epochs(&self, consumer: &str, topic: &str) -> Result<EpochStream, CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = self.next_id();
        let body = Call::WatchEpochs { stream, consumer: consumer.to_string(), topic: topic.to_string() };
        self.call(body, Some((stream, Outlet::Epochs(tx)))).await?;
        Ok(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)))
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        validate_consumer_name(consumer)?;
        let wants_drain = match &self.drain {
            Some(ask) => {
                let decider = ask.decider.as_deref();
                crate::drain::wants_drain(decider, ask.policy, consumer, &self.shared.metrics).await
            }
            None => false,
        };
        match self.call(Call::Deregister { consumer: consumer.to_string(), wants_drain }, None).await? {
            Replied::Deregistered(action) => Ok(action),
            other => Err(unexpected(other)),
        }
    }

    async fn status(&self) -> StatusView {
        let (answer, status) = oneshot::channel();
        if self.to_driver.send(Message::Status(answer)).is_ok()
            && let Ok(status) = status.await
        {
            return status;
        }
        StatusView {
            instance: self.shared.instance_id.clone(),
            backend: String::new(),
            leader: None,
            ready: false,
            topics: Vec::new(),
        }
    }

    async fn placement(&self) -> Vec<crate::coordinator::TopicPlacement> {
        let (answer, placement) = oneshot::channel();
        if self.to_driver.send(Message::Placement(answer)).is_ok()
            && let Ok(placement) = placement.await
        {
            return placement;
        }
        Vec::new()
    }

    fn session_ttl(&self) -> Option<Duration> {
        Some(self.shared.ttl)
    }

    fn readiness(&self) -> watch::Receiver<bool> {
        self.shared.readiness.subscribe()
    }

    async fn shutdown(&self) {
        let (done, ended) = oneshot::channel();
        if self.to_driver.send(Message::Shutdown { done }).is_ok() {
            let _ = ended.await;
        }
    }
}

impl Drop for MachineCoordinator {
    fn drop(&mut self) {
        // A coordinator dropped without a shutdown leaves nothing running.
        if !self.shared.stop.is_cancelled() {
            self.crash();
        }
    }
}

/// What planning one partition costs, in ns, as the leaders' budget counts it: of the order
/// `cargo bench --bench plan` measures for a plan over a few thousand partitions.
const PLAN_NANOS_PER_PARTITION: u64 = 2_000;
