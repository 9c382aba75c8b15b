//! Handoff fast-path latency on a real etcd, against the raw etcd chain it is built from.
//!
//! * **baseline**: one client runs a compare-and-swap transaction, another client's watch
//!   receives it (the floor for "one fenced txn + one watch delivery");
//! * **handoff**: consumer B sends `PartitionReady` over gRPC, the instance applies it with
//!   one CAS transaction, and consumer A receives `ReleasePartition` on its stream.
//! * **gRPC floor**: B's `PartitionReady` refused by validation (`INVALID_ARGUMENT`, before
//!   the store): one loopback unary round trip, about what the two gRPC hops of a handoff
//!   (B → instance, instance → A) cost on top of the raw chain.
//!
//! All run in the same process against the same etcd, interleaved sample by sample, so
//! the machine's noise hits them alike; the ratio is the number to read (docs/design.md §9:
//! at most 2×, the goal 1.5×). The last row, handoff − raw − floor, is what the
//! instance's own work (batching, cache, relay, stream order) adds.
//!
//! Where that goes is measured by more paths, interleaved with these:
//! * stages on their own (`support/handoff_stages.rs`): the transaction alone, in the
//!   chain's shape and in `PartitionReady`'s, with `etcd_client`, `EtcdStore` and
//!   `MeteredStore`; a skeleton coordinator behind the same gRPC server, pushing the
//!   release at once or after committing that transaction (a minimal instance);
//! * the same handoff with no plan at all (nobody leads) and with the leader apart (another
//!   instance on a thread of its own) (`support/handoff_instance.rs`);
//! * inside every handoff, the time of each step, from pass-through probes around the
//!   instance's coordinator, its store and the leader's plan (`support/handoff_probe.rs`);
//! * the tables, and the gap over the raw chain split into parts that add up
//!   (`support/handoff_report.rs`).
//!
//! Run: `cargo bench --bench handoff` (starts etcd itself; needs the `etcd` binary). Writes
//! `bench-handoff.md` under the target directory, and with `-- --write-docs` (or `BENCH_DOCS=1`)
//! `docs/benchmarks/handoff.md`.
#![forbid(unsafe_code)]

#[path = "support/docs.rs"]
mod docs;
#[path = "support/handoff_instance.rs"]
mod instance;
#[path = "support/handoff_probe.rs"]
mod probe;
#[path = "support/handoff_report.rs"]
mod report;
#[path = "support/handoff_stages.rs"]
mod stages;

#[allow(dead_code)]
#[path = "../tests/integration/support/etcd.rs"]
mod etcd;
// etcd.rs starts a TLS etcd instead when KAT_ETCD_TLS is set.
#[allow(dead_code)]
#[path = "../tests/integration/support/certs.rs"]
mod certs;
#[allow(dead_code)]
#[path = "../tests/integration/support/etcd_tls.rs"]
mod etcd_tls;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, WatchOptions};
use kafka_assigner::{
    metrics::Metrics,
    proto::v1::{
        AssignmentCommand, RegisterRequest, TopicPartition, kafka_assigner_client::KafkaAssignerClient,
    },
    server::AssignerServer,
};

use instance::{Client, Instance, Mode, Pair, ready_to_release};
use report::{Samples, SkeletonSample};
use stages::{CpuStages, SKELETON_TXN_TOPIC, Skeleton, TxnStages};

const SAMPLES: u32 = 200;
/// The topic of every instance's handoffs.
const TOPIC: &str = "bench";
/// A topic of one partition and one consumer, planned after [`TOPIC`] (see `probe`).
const MARKER_TOPIC: &str = "zz-marker";

type BoxError = Box<dyn std::error::Error>;

/// The raw etcd chain: a writer client's CAS transaction, seen by a watcher client.
struct RawChain {
    writer: etcd_client::Client,
    stream: etcd_client::WatchStream,
    last: i64,
    /// The watcher's client.
    _watcher: etcd_client::Client,
}

impl RawChain {
    const KEY: &str = "/bench/raw";

    async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        let mut writer = etcd_client::Client::connect(endpoints, None).await?;
        let mut watcher = etcd_client::Client::connect(endpoints, None).await?;
        let last = writer.put(Self::KEY, "0", None).await?.header().map_or(0, |h| h.revision());
        let stream =
            watcher.watch(Self::KEY, Some(WatchOptions::new().with_start_revision(last + 1))).await?;
        Ok(Self { writer, stream, last, _watcher: watcher })
    }

    async fn sample(&mut self, i: u32) -> Result<Duration, BoxError> {
        let start = Instant::now();
        let txn = Txn::new()
            .when([Compare::mod_revision(Self::KEY, CompareOp::Equal, self.last)])
            .and_then([TxnOp::put(Self::KEY, i.to_string(), Some(PutOptions::new()))]);
        let response = self.writer.txn(txn).await?;
        if !response.succeeded() {
            return Err("raw txn lost its compare".into());
        }
        self.last = response.header().map_or(0, |h| h.revision());
        loop {
            let message = self.stream.message().await?.ok_or("watch ended")?;
            if message.events().iter().any(|e| e.kv().is_some_and(|kv| kv.mod_revision() == self.last)) {
                return Ok(start.elapsed());
            }
        }
    }
}

/// The [`Skeleton`] coordinator behind its own `AssignerServer`, A registered on it.
struct SkeletonRig {
    coordinator: Arc<Skeleton>,
    server: AssignerServer,
    client: Client,
    a: tonic::Streaming<AssignmentCommand>,
}

impl SkeletonRig {
    async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        let coordinator = Arc::new(Skeleton::start(endpoints).await?);
        let any = "127.0.0.1:0".parse()?;
        let server = AssignerServer::start(coordinator.clone(), Arc::new(Metrics::new()), any, any).await?;
        let mut client = KafkaAssignerClient::connect(server.grpc_url()).await?;
        let register = RegisterRequest { consumer_name: "a".into(), topic: TOPIC.into() };
        let a = client.register(register).await?.into_inner();
        Ok(Self { coordinator, server, client, a })
    }

    /// One handoff through the skeleton; `topic` [`SKELETON_TXN_TOPIC`] commits first.
    async fn sample(&mut self, topic: &str, partition: u32) -> Result<SkeletonSample, BoxError> {
        let tp = TopicPartition { topic: topic.into(), partition };
        let (start, answered, received) = ready_to_release(&self.client, &mut self.a, &tp).await?;
        Ok(SkeletonSample { start, answered, received, steps: self.coordinator.take() })
    }
}

/// The paths that show where the handoff's time goes, beside the headline's.
struct Stages {
    leaderless: (Instance, Pair),
    apart: (Instance, Pair),
    txns: TxnStages,
    cpu: CpuStages,
    skeleton: SkeletonRig,
}

impl Stages {
    /// How many paths a round of samples has, the headline's three included.
    const PATHS: u32 = 8;

    async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        let mut leaderless = Instance::start(endpoints, "/bench/leaderless/", Mode::Leaderless).await?;
        let leaderless_pair = leaderless.pair().await?;
        leaderless.depose(endpoints).await?;
        let mut apart = Instance::start(endpoints, "/bench/apart/", Mode::Apart).await?;
        let apart_pair = apart.pair().await?;
        Ok(Self {
            leaderless: (leaderless, leaderless_pair),
            apart: (apart, apart_pair),
            txns: TxnStages::start(endpoints).await?,
            cpu: CpuStages::new(SAMPLES * 2),
            skeleton: SkeletonRig::start(endpoints).await?,
        })
    }

    /// Sample `i` of path `path` (3 to 7).
    async fn sample(&mut self, path: u32, i: u32, s: &mut Samples) -> Result<(), BoxError> {
        match path {
            // The handoff with no plan at all, and with the leader apart.
            3 => s.leaderless.push(self.leaderless.0.sample(&mut self.leaderless.1).await?),
            4 => s.apart.push(self.apart.0.sample(&mut self.apart.1).await?),
            5 => {
                s.txn.push(self.txns.sample().await?);
                s.cpu.push(self.cpu.sample());
            }
            6 => s.skeleton.push(self.skeleton.sample("grpc", i).await?),
            _ => s.skeleton_txn.push(self.skeleton.sample(SKELETON_TXN_TOPIC, i).await?),
        }
        Ok(())
    }

    async fn stop(self) {
        self.leaderless.0.stop().await;
        self.apart.0.stop().await;
        self.skeleton.server.stop().await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let server = etcd::EtcdServer::start().await;
    let endpoints = server.endpoints();
    let mut chain = RawChain::start(&endpoints).await?;
    let mut instance = Instance::start(&endpoints, "/bench/assigner/", Mode::Leads).await?;
    let mut benched = instance.pair().await?;
    // `HANDOFF_STAGES=0`: the headline's three paths alone, as before the stages existed
    // (the stages share the machine with them, which moves the headline: see the docs).
    let mut stages = match std::env::var("HANDOFF_STAGES").as_deref() {
        Ok("0") => None,
        _ => Some(Stages::start(&endpoints).await?),
    };
    // Interleaved sample by sample, so the machine's noise hits every path alike. With the
    // stages, in a rotating order: what ran just before (an etcd write, a pause) moves the
    // next etcd round trip by up to 100 µs, so no path keeps one neighbour.
    let paths = if stages.is_some() { Stages::PATHS } else { 3 };
    let mut s = Samples::default();
    for i in 0..SAMPLES {
        for k in 0..paths {
            match (i + k) % paths {
                0 => s.raw.push(chain.sample(i).await?),
                1 => s.handoff.push(instance.sample(&mut benched).await?),
                2 => s.floor.push(instance.refused_call().await?),
                path => {
                    if let Some(stages) = &mut stages {
                        stages.sample(path, i, &mut s).await?;
                    }
                }
            }
        }
    }
    instance.stop().await;
    if let Some(stages) = stages {
        stages.stop().await;
    }
    let table = report::tables(&s, SAMPLES);
    println!("{table}");
    let out = docs::write_target("handoff", &table)?;
    println!("wrote {}", out.display());
    if docs::wanted() {
        let command = docs::command("handoff", &["KAT_ETCD_TLS", "HANDOFF_STAGES"]);
        let path = docs::write("handoff", "Handoff fast path on etcd", &command, &table)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
