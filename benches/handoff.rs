//! Handoff fast-path latency on a real etcd, against the raw etcd chain it is built from.
//!
//! * **baseline**: one client runs a compare-and-swap transaction, another client's watch
//!   receives it (the floor for "one fenced txn + one watch delivery");
//! * **handoff**: consumer B sends `PartitionReady` over gRPC, the instance applies it with
//!   one CAS transaction, and consumer A receives `ReleasePartition` on its stream.
//!
//! * **gRPC floor**: B's `PartitionReady` refused by validation (`INVALID_ARGUMENT`, before
//!   the store): one loopback unary round trip, about what the two gRPC hops of a handoff
//!   (B → instance, instance → A) cost on top of the raw chain.
//!
//! All run in the same process against the same etcd, interleaved sample by sample, so
//! the machine's noise hits them alike; the ratio is the number to read (docs/design.md §9:
//! at most 2×, the goal 1.5×). The last row, handoff − raw − floor, is what the
//! instance's own work (batching, cache, relay, stream order) adds.
//! Run: `cargo bench --bench handoff` (starts etcd itself; needs the `etcd` binary). Writes
//! `bench-handoff.md` under the target directory, and with `-- --write-docs` (or `BENCH_DOCS=1`)
//! `docs/benchmarks/handoff.md`.

#[path = "support/docs.rs"]
mod docs;

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
use futures::StreamExt;
use kafka_assigner::{
    coordinator::{HandoffConfig, HandoffCoordinator},
    handoff::PlanConfig,
    metrics::Metrics,
    proto::v1::{
        AssignmentCommand, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
        assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
    },
    server::AssignerServer,
    store::LeaseStore,
};

const SAMPLES: u32 = 200;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

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

/// The handoff path: an assigner instance on the same etcd, consumer A owning every
/// partition and consumer B warming `SAMPLES` of them.
struct Handoffs {
    server: AssignerServer,
    client: KafkaAssignerClient<tonic::transport::Channel>,
    a: tonic::Streaming<AssignmentCommand>,
    /// Keeps B registered.
    _b: tonic::Streaming<AssignmentCommand>,
    warms: Vec<u32>,
}

impl Handoffs {
    async fn start(endpoints: &[String]) -> Result<Self, BoxError> {
        let store = kafka_assigner::store::EtcdStore::connect(kafka_assigner::store::EtcdStoreConfig {
            endpoints: endpoints.to_vec(),
            ..Default::default()
        })
        .await?;
        let store: Arc<dyn LeaseStore> = Arc::new(store);
        let mut config = HandoffConfig {
            prefix: "/bench/assigner/".into(),
            reconcile_interval: Duration::from_millis(200),
            plan: PlanConfig { max_warming_per_consumer: 1_000, ..PlanConfig::default() },
            ..HandoffConfig::default()
        };
        config.topic_partitions.insert("bench".into(), SAMPLES * 2);
        let metrics = Arc::new(Metrics::new());
        let coordinator = Arc::new(HandoffCoordinator::start(store, config, metrics.clone()).await?);
        let any = "127.0.0.1:0".parse()?;
        let server = AssignerServer::start(coordinator, metrics, any, any).await?;
        let mut client = KafkaAssignerClient::connect(server.grpc_url()).await?;
        let register = |name: &str| RegisterRequest { consumer_name: name.into(), topic: "bench".into() };
        let mut a = client.register(register("a")).await?.into_inner();
        // Wait until A owns everything.
        let mut owned = 0;
        while owned < SAMPLES * 2 {
            if let Some(Command::Assignment(update)) = a.next().await.ok_or("a ended")??.command {
                owned += update.assigned.len() as u32;
            }
        }
        let mut b = client.register(register("b")).await?.into_inner();
        let mut warms = Vec::new();
        while warms.len() < SAMPLES as usize {
            if let Some(Command::Warm(warm)) = b.next().await.ok_or("b ended")??.command {
                warms.push(warm.partition.ok_or("warm without partition")?.partition);
            }
        }
        Ok(Self { server, client, a, _b: b, warms })
    }

    /// B is ready with one warm; measured until A hears its release (whether or not B has
    /// its answer yet: the path is B's call to A's command), then A releases.
    async fn sample(&mut self) -> Result<Duration, BoxError> {
        let partition = self.warms.pop().ok_or("no warm left")?;
        let tp = TopicPartition { topic: "bench".into(), partition };
        let start = Instant::now();
        let ready = PartitionReadyRequest { consumer_name: "b".into(), partition: Some(tp.clone()) };
        let mut client = self.client.clone();
        let a = &mut self.a;
        let release = async {
            loop {
                if let Some(Command::Release(release)) = a.next().await.ok_or("a ended")??.command
                    && release.partition.as_ref() == Some(&tp)
                {
                    return Ok::<_, BoxError>(start.elapsed());
                }
            }
        };
        let (answer, elapsed) = tokio::join!(client.partition_ready(ready), release);
        answer?;
        let elapsed = elapsed?;
        let released = PartitionReleasedRequest { consumer_name: "a".into(), partition: Some(tp) };
        self.client.partition_released(released).await?;
        Ok(elapsed)
    }

    /// One unary round trip the instance answers before the store: the gRPC floor.
    async fn refused_call(&mut self) -> Result<Duration, BoxError> {
        let start = Instant::now();
        let nameless = PartitionReadyRequest { consumer_name: String::new(), partition: None };
        match self.client.partition_ready(nameless).await {
            Err(status) if status.code() == tonic::Code::InvalidArgument => Ok(start.elapsed()),
            other => Err(format!("a nameless PartitionReady must be INVALID_ARGUMENT, got {other:?}").into()),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let server = etcd::EtcdServer::start().await;
    let endpoints = server.endpoints();
    let mut chain = RawChain::start(&endpoints).await?;
    let mut handoffs = Handoffs::start(&endpoints).await?;
    // Interleaved, sample by sample: the machine's noise hits both paths alike.
    let (mut raw, mut ours, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        raw.push(chain.sample(i).await?);
        ours.push(handoffs.sample().await?);
        floor.push(handoffs.refused_call().await?);
    }
    handoffs.server.stop().await;
    let (raw50, raw99) = (percentile(&mut raw, 0.5), percentile(&mut raw, 0.99));
    let (our50, our99) = (percentile(&mut ours, 0.5), percentile(&mut ours, 0.99));
    let (floor50, floor99) = (percentile(&mut floor, 0.5), percentile(&mut floor, 0.99));
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let own50 = our50.saturating_sub(raw50 + floor50);
    let table = format!(
        "| path ({SAMPLES} samples, etcd 3.4 on loopback) | p50 | p99 |\n| --- | --- | --- |\n\
         | raw etcd: CAS txn → another client's watch | {raw50:.2?} | {raw99:.2?} |\n\
         | handoff: PartitionReady → old owner gets ReleasePartition | {our50:.2?} | {our99:.2?} |\n\
         | ratio handoff / raw | {:.2}× | {:.2}× |\n\
         | gRPC floor: a PartitionReady refused before the store, round trip | {floor50:.2?} | {floor99:.2?} |\n\
         | ratio (raw + floor) / raw: the least two gRPC hops allow | {:.2}× | |\n\
         | handoff − raw − floor at p50: the instance's own work | {own50:.2?} | |\n",
        ratio(our50, raw50),
        ratio(our99, raw99),
        ratio(raw50 + floor50, raw50),
    );
    println!("{table}");
    // Under the target directory in use (CARGO_TARGET_DIR when set), created if missing.
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("bench-handoff.md");
    std::fs::write(&out, &table)?;
    println!("wrote {}", out.display());
    if docs::wanted() {
        let command = docs::command("handoff", &["KAT_ETCD_TLS"]);
        let path = docs::write("handoff", "Handoff fast path on etcd", &command, &table)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
