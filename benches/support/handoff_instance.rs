//! The handoff bench's instances: an assigner serving consumers A and B over gRPC, on the
//! bench's etcd, behind the probes (`handoff_probe.rs`), in one of three [`Mode`]s.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use kafka_assigner::{
    coordinator::{
        ConsumerGroupCoordinator, HandoffConfig, MachineCoordinator, handoff_backend,
        leader_groups::LeaderGroup, records::Keys,
    },
    handoff::PlanConfig,
    metrics::Metrics,
    proto::v1::{
        AssignmentCommand, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
        assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
    },
    server::AssignerServer,
    store::{EtcdStore, EtcdStoreConfig, LeaseStore},
};
use tokio::sync::oneshot;

use crate::probe::{MARKER_CONSUMER, Probe, ProbedCoordinator, ProbedRollout, ProbedStore};
use crate::report::HandoffSample;
use crate::{BoxError, MARKER_TOPIC, SAMPLES, TOPIC};

/// A gRPC client of an assigner.
pub type Client = KafkaAssignerClient<tonic::transport::Channel>;

/// Waits on A's stream for the release of `tp`; returns when it came.
async fn released(
    a: &mut tonic::Streaming<AssignmentCommand>,
    tp: &TopicPartition,
) -> Result<Instant, BoxError> {
    loop {
        if let Some(Command::Release(release)) = a.next().await.ok_or("a ended")??.command
            && release.partition.as_ref() == Some(tp)
        {
            return Ok(Instant::now());
        }
    }
}

/// B's `PartitionReady` for `tp` and A's wait for its release, together (whether or not B
/// has its answer yet: the path is B's call to A's command). Returns (start, B answered,
/// A received).
pub async fn ready_to_release(
    client: &Client,
    a: &mut tonic::Streaming<AssignmentCommand>,
    tp: &TopicPartition,
) -> Result<(Instant, Instant, Instant), BoxError> {
    let mut client = client.clone();
    let start = Instant::now();
    let ready = PartitionReadyRequest { consumer_name: "b".into(), partition: Some(tp.clone()) };
    let answer = async { client.partition_ready(ready).await.map(|_| Instant::now()) };
    let (answered, received) = tokio::join!(answer, released(a, tp));
    Ok((start, answered?, received?))
}

async fn etcd(endpoints: &[String]) -> Result<Arc<dyn LeaseStore>, BoxError> {
    let config = EtcdStoreConfig { endpoints: endpoints.to_vec(), ..Default::default() };
    Ok(Arc::new(EtcdStore::connect(config).await?))
}

/// How an instance of the bench is set up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It leads, as a lone instance does.
    Leads,
    /// Another instance on the same prefix leads, on a thread and runtime of its own (as
    /// another process would be), started first so that it wins the election.
    Apart,
    /// Nobody leads once the consumers are set up ([`Instance::depose`]): no plan at all.
    Leaderless,
}

/// An instance that only leads, on a thread and runtime of its own.
struct Leader {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Leader {
    async fn start(endpoints: &[String], config: HandoffConfig) -> Result<Self, BoxError> {
        let (ready, is_ready) = oneshot::channel::<Result<(), String>>();
        let (stop, stopped) = oneshot::channel::<()>();
        let endpoints = endpoints.to_vec();
        let lead = async move {
            let store = etcd(&endpoints).await.map_err(|e| e.to_string())?;
            let leader = handoff_backend::machine::start_driven(store, config, Arc::new(Metrics::new()))
                .await
                .map_err(|e| e.to_string())?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !leader.is_leader() {
                if Instant::now() > deadline {
                    return Err("the leading instance did not win the election within 30 s".to_string());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(leader)
        };
        let thread = std::thread::Builder::new().name("bench-leader".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => return drop(ready.send(Err(error.to_string()))),
            };
            runtime.block_on(async move {
                match lead.await {
                    Ok(leader) => {
                        let _ = ready.send(Ok(()));
                        let _ = stopped.await;
                        leader.shutdown().await;
                    }
                    Err(error) => drop(ready.send(Err(error))),
                }
            })
        })?;
        is_ready.await.map_err(|_| "the leader's thread ended")??;
        Ok(Self { stop, thread })
    }
}

/// Consumer A owning every partition of a topic and consumer B warming `SAMPLES` of them.
pub struct Pair {
    a: tonic::Streaming<AssignmentCommand>,
    /// Keeps B registered.
    _b: tonic::Streaming<AssignmentCommand>,
    warms: Vec<u32>,
}

/// The handoff path: an assigner instance on the bench's etcd, behind the probes.
pub struct Instance {
    /// Its gRPC and admin servers.
    pub server: AssignerServer,
    client: Client,
    probe: Arc<Probe>,
    keys: Keys,
    /// Keeps the marker topic's consumer registered.
    _marker: tonic::Streaming<AssignmentCommand>,
    /// The instance that leads instead, when apart.
    leader: Option<Leader>,
    handoff: Arc<MachineCoordinator>,
    mode: Mode,
}

impl Instance {
    /// An instance under `prefix`, set up as `mode` says.
    pub async fn start(endpoints: &[String], prefix: &str, mode: Mode) -> Result<Self, BoxError> {
        let probe = Arc::new(Probe::default());
        let mut config = HandoffConfig {
            prefix: prefix.into(),
            reconcile_interval: Duration::from_millis(200),
            plan: PlanConfig { max_warming_per_consumer: 1_000, ..PlanConfig::default() },
            rollout: Some(Arc::new(ProbedRollout::new(probe.clone()))),
            ..HandoffConfig::default()
        };
        config.topic_partitions.insert(TOPIC.into(), SAMPLES * 2);
        config.topic_partitions.insert(MARKER_TOPIC.into(), 1);
        let leader = if mode == Mode::Apart {
            let leading = HandoffConfig { instance_id: "bench-leader".into(), ..config.clone() };
            config.instance_id = "bench-serving".into();
            Some(Leader::start(endpoints, leading).await?)
        } else {
            None
        };
        let store: Arc<dyn LeaseStore> = Arc::new(ProbedStore::new(etcd(endpoints).await?, probe.clone()));
        let metrics = Arc::new(Metrics::new());
        let handoff = Arc::new(handoff_backend::machine::start_driven(store, config, metrics.clone()).await?);
        let coordinator: Arc<dyn ConsumerGroupCoordinator> =
            Arc::new(ProbedCoordinator::new(handoff.clone(), probe.clone()));
        let any = "127.0.0.1:0".parse()?;
        let server = AssignerServer::start(coordinator, metrics, any, any).await?;
        let mut client = KafkaAssignerClient::connect(server.grpc_url()).await?;
        let register = RegisterRequest { consumer_name: MARKER_CONSUMER.into(), topic: MARKER_TOPIC.into() };
        let mut marker = client.register(register).await?.into_inner();
        loop {
            let command = marker.next().await.ok_or("the marker consumer's stream ended")??.command;
            if let Some(Command::Assignment(update)) = command
                && !update.assigned.is_empty()
            {
                break;
            }
        }
        Ok(Self { server, client, probe, keys: Keys::new(prefix), _marker: marker, leader, handoff, mode })
    }

    /// Stops the server, then the leader apart, if any.
    pub async fn stop(self) {
        self.server.stop().await;
        if let Some(Leader { stop, thread }) = self.leader {
            let _ = stop.send(());
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    /// Registers A, waits until it owns all of [`TOPIC`], then B, until it warms `SAMPLES`.
    pub async fn pair(&mut self) -> Result<Pair, BoxError> {
        let register = |name: &str| RegisterRequest { consumer_name: name.into(), topic: TOPIC.into() };
        let mut a = self.client.register(register("a")).await?.into_inner();
        let mut owned = 0;
        while owned < SAMPLES * 2 {
            if let Some(Command::Assignment(update)) = a.next().await.ok_or("a ended")??.command {
                owned += update.assigned.len() as u32;
            }
        }
        let mut b = self.client.register(register("b")).await?.into_inner();
        let mut warms = Vec::new();
        while warms.len() < SAMPLES as usize {
            if let Some(Command::Warm(warm)) = b.next().await.ok_or("b ended")??.command {
                warms.push(warm.partition.ok_or("warm without partition")?.partition);
            }
        }
        Ok(Pair { a, _b: b, warms })
    }

    /// Takes the leader key from this instance for a lease of the bench's own: deletes
    /// it, then creates it again if nobody did meanwhile (the instance may campaign in
    /// between: then again). The instance steps down (the key's create revision changed)
    /// and, the key being held, does not campaign again: nobody plans after.
    pub async fn depose(&mut self, endpoints: &[String]) -> Result<(), BoxError> {
        use etcd_client::{Compare, CompareOp, PutOptions, TxnOp};
        let mut client = etcd_client::Client::connect(endpoints, None).await?;
        let lease = client.lease_grant(600, None).await?.id();
        let key = self.keys.leader(LeaderGroup::ONLY);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if Instant::now() > deadline {
                return Err("could not take the leader key within 30 s".into());
            }
            client.delete(key.as_str(), None).await?;
            let take = etcd_client::Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), "bench", Some(PutOptions::new().with_lease(lease)))]);
            if !client.txn(take).await?.succeeded() {
                continue;
            }
            while self.handoff.is_leader() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let held = client.get(key.as_str(), None).await?;
            if held.kvs().first().is_some_and(|kv| kv.lease() == lease) && !self.handoff.is_leader() {
                return Ok(());
            }
        }
    }

    /// B is ready with one warm of `pair`; measured until A hears its release, then A
    /// releases.
    pub async fn sample(&mut self, pair: &mut Pair) -> Result<HandoffSample, BoxError> {
        let partition = pair.warms.pop().ok_or("no warm left")?;
        let tp = TopicPartition { topic: TOPIC.into(), partition };
        self.probe.arm(tp.clone(), self.keys.handoff(TOPIC, partition));
        let (start, answered, received) = ready_to_release(&self.client, &mut pair.a, &tp).await?;
        let released = PartitionReleasedRequest { consumer_name: "a".into(), partition: Some(tp) };
        let passes = self.probe.passes();
        self.client.partition_released(released).await?;
        // The release's revision makes the leader plan (at once, or once paced): let that
        // pass end here rather than in the next path's sample.
        if self.mode != Mode::Leaderless {
            self.probe.pass_after(passes, Duration::from_millis(5)).await;
        }
        // Taken only now, so that a step noted late (a preempted follower) is still in.
        // The release touches none of them: its txn deletes the handoff record.
        Ok(HandoffSample { start, answered, received, steps: self.probe.take() })
    }

    /// One unary round trip the instance answers before the store: the gRPC floor.
    pub async fn refused_call(&mut self) -> Result<Duration, BoxError> {
        let start = Instant::now();
        let nameless = PartitionReadyRequest { consumer_name: String::new(), partition: None };
        match self.client.partition_ready(nameless).await {
            Err(status) if status.code() == tonic::Code::InvalidArgument => Ok(start.elapsed()),
            other => Err(format!("a nameless PartitionReady must be INVALID_ARGUMENT, got {other:?}").into()),
        }
    }
}
