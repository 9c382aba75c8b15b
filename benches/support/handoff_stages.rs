//! Stages of a handoff timed on their own, on the bench's etcd:
//!
//! * [`TxnStages`]: a transaction alone (no watch on its keys), with 1 compare + 1 put,
//!   and with the shape of `PartitionReady`'s commit (3 compares: the caller's
//!   registration, the owner, the handoff; 2 puts: the owner and the handoff, the real
//!   records encoded), first with `etcd_client` directly, then through the crate's
//!   `EtcdStore`, then through `MeteredStore` over it (what `serve` builds);
//! * [`CpuStages`]: the CPU of the leader's plan of a topic like the benched one, and of
//!   the relay's views of A and B, with the pure functions on a replica of its state;
//! * [`Skeleton`]: a coordinator with nothing in it, served by the real `AssignerServer`:
//!   `PartitionReady` pushes `ReleasePartition` onto A's stream at once (the gRPC floor of
//!   a handoff's two hops), or after committing the ready-shaped transaction through an
//!   `EtcdStore` (a minimal instance: gRPC, one store transaction, a channel).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use etcd_client::{CompareOp, ConnectOptions, TxnOp};
use futures::StreamExt;
use kafka_assigner::{
    coordinator::{
        CommandStream, ConsumerGroupCoordinator, CoordinatorError, StatusView,
        causes::{ConsumerUnknown, Contention},
        records::{AssignmentRecord, HandoffRecord, RECORD_VERSION, encode},
    },
    handoff::{
        ConsumerStatus, ConsumerView, Cooldowns, Handoff, Phase, PlanConfig, TopicState, diff_views,
        diff_writes, plan,
    },
    metrics::Metrics,
    proto::v1::{
        AssignmentCommand, DeregisterAction, ReleasePartition, TopicPartition, assignment_command::Command,
    },
    store::{Compare, EtcdStore, EtcdStoreConfig, LeaseStore, MeteredStore, Op, Txn},
};
use tokio::sync::{mpsc, watch};

type BoxError = Box<dyn std::error::Error>;

/// The records of one ready-shaped transaction and their current mod revisions.
struct ReadyShape {
    consumer: (String, i64),
    owner: (String, i64),
    handoff: (String, i64),
    owner_value: Vec<u8>,
    handoff_value: Vec<u8>,
}

impl ReadyShape {
    /// Writes the three records under `prefix` (the instance's key layout) with `store`.
    async fn create(store: &dyn LeaseStore, prefix: &str) -> Result<Self, BoxError> {
        let keys = kafka_assigner::coordinator::records::Keys::new(prefix);
        let owner_value = encode(&AssignmentRecord { v: RECORD_VERSION, owner: "b".into(), epoch: 1 });
        let handoff =
            Handoff { from: "a".into(), to: "b".into(), phase: Phase::Releasing, since: 1 << 40, epoch: 0 };
        let handoff_value = encode(&HandoffRecord { v: RECORD_VERSION, handoff });
        let consumer_key = keys.consumer("bench", "b");
        // About the size of a registration record.
        let consumer_value = br#"{"v":1,"status":"Active","session":7587882255219745283,"instance":"bench"}"#;
        let consumer_rev = store.put(&consumer_key, consumer_value.to_vec(), None).await?;
        let (owner_key, handoff_key) = (keys.assignment("bench", 7), keys.handoff("bench", 7));
        let txn = Txn::new()
            .then(Op::put(owner_key.clone(), owner_value.clone()))
            .then(Op::put(handoff_key.clone(), handoff_value.clone()));
        let rev = store.txn(txn).await?.revision;
        Ok(Self {
            consumer: (consumer_key, consumer_rev),
            owner: (owner_key, rev),
            handoff: (handoff_key, rev),
            owner_value,
            handoff_value,
        })
    }

    /// The ready-shaped transaction for the crate's store.
    fn store_txn(&self) -> Txn {
        let compare = |(key, rev): &(String, i64)| Compare::ModRevision(key.clone(), *rev);
        Txn {
            compares: vec![compare(&self.consumer), compare(&self.owner), compare(&self.handoff)],
            ops: vec![
                Op::put(self.owner.0.clone(), self.owner_value.clone()),
                Op::put(self.handoff.0.clone(), self.handoff_value.clone()),
            ],
        }
    }

    /// The same with `etcd_client`, or only its compare and put of the handoff (`full` false).
    fn etcd_txn(&self, full: bool) -> etcd_client::Txn {
        let compare = |(key, rev): &(String, i64)| {
            etcd_client::Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
        };
        let handoff = TxnOp::put(self.handoff.0.as_str(), self.handoff_value.clone(), None);
        let (compares, ops) = if full {
            let owner = TxnOp::put(self.owner.0.as_str(), self.owner_value.clone(), None);
            (
                vec![compare(&self.consumer), compare(&self.owner), compare(&self.handoff)],
                vec![owner, handoff],
            )
        } else {
            (vec![compare(&self.handoff)], vec![handoff])
        };
        etcd_client::Txn::new().when(compares).and_then(ops)
    }

    /// Notes the revision a successful transaction wrote at.
    fn written(&mut self, succeeded: bool, revision: i64, full: bool) -> Result<(), BoxError> {
        if !succeeded {
            return Err("a stage transaction lost its compare".into());
        }
        self.handoff.1 = revision;
        if full {
            self.owner.1 = revision;
        }
        Ok(())
    }

    async fn through_store(&mut self, store: &dyn LeaseStore) -> Result<Duration, BoxError> {
        let txn = self.store_txn();
        let start = Instant::now();
        let outcome = store.txn(txn).await?;
        let elapsed = start.elapsed();
        self.written(outcome.succeeded, outcome.revision, true)?;
        Ok(elapsed)
    }

    async fn through_client(
        &mut self,
        client: &mut etcd_client::Client,
        full: bool,
    ) -> Result<Duration, BoxError> {
        let txn = self.etcd_txn(full);
        let start = Instant::now();
        let response = client.txn(txn).await?;
        let elapsed = start.elapsed();
        let revision = response.header().map_or(0, |h| h.revision());
        self.written(response.succeeded(), revision, full)?;
        Ok(elapsed)
    }
}

/// One sample of each transaction stage.
pub struct TxnSample {
    /// `etcd_client`, 1 compare + 1 put.
    pub one: Duration,
    /// `etcd_client`, the ready's shape.
    pub ready: Duration,
    /// `EtcdStore`, the ready's shape.
    pub store: Duration,
    /// `MeteredStore` over `EtcdStore`, the ready's shape.
    pub metered: Duration,
}

/// The transaction stages, each on records of its own, none of them watched.
pub struct TxnStages {
    client: etcd_client::Client,
    one: ReadyShape,
    ready: ReadyShape,
    store: (Arc<dyn LeaseStore>, ReadyShape),
    metered: (Arc<dyn LeaseStore>, ReadyShape),
}

impl TxnStages {
    /// Connects (`etcd_client` with `EtcdStore`'s options, and an `EtcdStore`) and writes
    /// each stage's records.
    pub async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        // The options `EtcdStore` connects with, so the client differs from it only in
        // the layer under test.
        let options = ConnectOptions::new()
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        let client = etcd_client::Client::connect(endpoints, Some(options)).await?;
        let etcd =
            EtcdStore::connect(EtcdStoreConfig { endpoints: endpoints.to_vec(), ..Default::default() })
                .await?;
        let store: Arc<dyn LeaseStore> = Arc::new(etcd);
        let metered: Arc<dyn LeaseStore> =
            Arc::new(MeteredStore::new(store.clone(), Arc::new(Metrics::new())));
        Ok(Self {
            one: ReadyShape::create(&*store, "/bench/stage-one/").await?,
            ready: ReadyShape::create(&*store, "/bench/stage-ready/").await?,
            store: (store.clone(), ReadyShape::create(&*store, "/bench/stage-store/").await?),
            metered: (metered.clone(), ReadyShape::create(&*store, "/bench/stage-metered/").await?),
            client,
        })
    }

    /// One of each transaction, one after the other.
    pub async fn sample(&mut self) -> Result<TxnSample, BoxError> {
        Ok(TxnSample {
            one: self.one.through_client(&mut self.client, false).await?,
            ready: self.ready.through_client(&mut self.client, true).await?,
            store: self.store.1.through_store(&*self.store.0).await?,
            metered: self.metered.1.through_store(&*self.metered.0).await?,
        })
    }
}

/// A topic like the benched one halfway through the run: `partitions`, A owning three
/// quarters, B one quarter and warming another, and the views each was last told.
pub struct CpuStages {
    state: TopicState,
    told: [ConsumerView; 2],
}

impl CpuStages {
    /// The replica of a topic of `partitions`.
    pub fn new(partitions: u32) -> Self {
        let now = now_ms();
        let mut state = TopicState { partition_count: partitions, ..Default::default() };
        for name in ["a", "b"] {
            state.consumers.insert(name.into(), ConsumerStatus::Active);
        }
        for p in 0..partitions {
            state.owners.insert(p, if p < partitions * 3 / 4 { "a" } else { "b" }.into());
            if (partitions / 2..partitions * 3 / 4).contains(&p) {
                let handoff =
                    Handoff { from: "a".into(), to: "b".into(), phase: Phase::Warming, since: now, epoch: 0 };
                state.handoffs.insert(p, handoff);
            }
        }
        let told = [ConsumerView::of(&state, "a"), ConsumerView::of(&state, "b")];
        // One ready applied since: B owns the partition, A releases it.
        let p = partitions / 2;
        state.owners.insert(p, "b".into());
        if let Some(h) = state.handoffs.get_mut(&p) {
            (h.phase, h.since) = (Phase::Releasing, now);
        }
        Self { state, told }
    }

    /// (the plan, the relay's views), each timed.
    pub fn sample(&self) -> (Duration, Duration) {
        let start = Instant::now();
        let mut after = self.state.clone();
        plan(
            &mut after,
            now_ms(),
            &PlanConfig { max_warming_per_consumer: 1_000, ..Default::default() },
            &mut Cooldowns::default(),
        );
        std::hint::black_box(diff_writes(&self.state, &after));
        let planned = start.elapsed();
        let start = Instant::now();
        for (name, told) in ["a", "b"].iter().zip(&self.told) {
            std::hint::black_box(diff_views(told, &ConsumerView::of(&self.state, name)));
        }
        (planned, start.elapsed())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The topic whose `PartitionReady` makes the [`Skeleton`] commit a transaction first.
pub const SKELETON_TXN_TOPIC: &str = "txn";

/// When the skeleton's last `PartitionReady` arrived and pushed its release.
#[derive(Clone, Copy, Debug, Default)]
pub struct SkeletonSteps {
    /// The call reached the skeleton.
    pub entered: Option<Instant>,
    /// It pushed the release onto A's stream.
    pub pushed: Option<Instant>,
}

type Sender = mpsc::UnboundedSender<Result<AssignmentCommand, CoordinatorError>>;

/// A coordinator with nothing in it (see the module docs). Consumer "a" is told every
/// release.
pub struct Skeleton {
    store: Arc<dyn LeaseStore>,
    shape: tokio::sync::Mutex<ReadyShape>,
    streams: Mutex<HashMap<String, Sender>>,
    steps: Mutex<SkeletonSteps>,
    readiness: watch::Sender<bool>,
}

impl Skeleton {
    /// Connects its `EtcdStore` and writes its transaction's records.
    pub async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        let etcd =
            EtcdStore::connect(EtcdStoreConfig { endpoints: endpoints.to_vec(), ..Default::default() })
                .await?;
        let store: Arc<dyn LeaseStore> = Arc::new(etcd);
        let shape = ReadyShape::create(&*store, "/bench/skeleton/").await?;
        Ok(Self {
            store,
            shape: tokio::sync::Mutex::new(shape),
            streams: Mutex::default(),
            steps: Mutex::default(),
            readiness: watch::Sender::new(true),
        })
    }

    /// The steps of the last `PartitionReady`, forgotten.
    pub fn take(&self) -> SkeletonSteps {
        std::mem::take(&mut *self.steps.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn note(&self, step: fn(&mut SkeletonSteps) -> &mut Option<Instant>) {
        let now = Instant::now();
        *step(&mut self.steps.lock().unwrap_or_else(PoisonError::into_inner)) = Some(now);
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for Skeleton {
    async fn register(&self, consumer: &str, _topic: &str) -> Result<CommandStream, CoordinatorError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).insert(consumer.to_string(), tx);
        Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed())
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.note(|s| &mut s.entered);
        if topic == SKELETON_TXN_TOPIC {
            let mut shape = self.shape.lock().await;
            let outcome = self.store.txn(shape.store_txn()).await?;
            shape
                .written(outcome.succeeded, outcome.revision, true)
                .map_err(|_| Contention::Partition { topic: topic.to_string(), partition })?;
        }
        let release = ReleasePartition {
            partition: Some(TopicPartition { topic: topic.into(), partition }),
            new_owner: consumer.into(),
        };
        let command = AssignmentCommand { command: Some(Command::Release(release)) };
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let a = streams.get("a").ok_or_else(not_registered)?;
        self.note(|s| &mut s.pushed);
        a.send(Ok(command)).map_err(|_| not_registered())
    }

    async fn partition_released(&self, _: &str, _: &str, _: u32) -> Result<(), CoordinatorError> {
        Ok(())
    }

    async fn deregister(&self, _consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        Ok(DeregisterAction::ShutdownNow)
    }

    async fn status(&self) -> StatusView {
        StatusView::default()
    }

    fn readiness(&self) -> watch::Receiver<bool> {
        self.readiness.subscribe()
    }

    /// Ends every stream, so the server's graceful stop has nothing to wait for.
    async fn shutdown(&self) {
        self.readiness.send_replace(false);
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// The bench's one consumer, `a`, has no stream (it left, or never came).
fn not_registered() -> CoordinatorError {
    ConsumerUnknown::NotRegistered { consumer: "a".into() }.into()
}
