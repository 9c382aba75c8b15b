//! Epochs after etcd is restored from a snapshot (docs/design.md §10, docs/operating.md
//! "Restoring etcd from a snapshot"), on the handoff backend (`--backend etcd`) and the
//! fleet (`--backend fleet --store etcd`), with real parts: one etcd process, Debian's
//! `etcdctl` (3.4) for `snapshot save` and `snapshot restore`, two assigner instances
//! serving real gRPC, and consumers on the client library that record every epoch they are
//! handed (`warm` and `assigned`).
//!
//! The run: two consumers share the topic; `etcdctl snapshot save`; two more consumers
//! join, so partitions move and get new, higher epochs; the instances and etcd stop;
//! `etcdctl snapshot restore` into a new data dir, etcd starts on it (its revision is the
//! snapshot's again, and every epoch floor written after the snapshot is gone); the
//! runbook's step deletes the restored ownership records; the instances start again on the
//! same ports; the consumers, still running, reconnect on their own; a fifth consumer
//! joins. Every epoch handed out after the restore must be above every epoch handed out
//! before it, including those handed out after the snapshot.
//!
//! Before `records::next_epoch` (49bd4b5 and older) a new epoch was one above the store
//! revision, which the restore rewinds: the first epochs after the restore repeated or
//! undercut those handed out after the snapshot.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use kafka_assigner::client::{AssignerClient, Backoff, ClientConfig, Handler, Partition, WarmError};
use kafka_assigner::coordinator::{ConsumerGroupCoordinator, FleetConfig};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::server::AssignerServer;
use kafka_assigner::store::{EtcdStore, EtcdStoreConfig, LeaseStore};

use crate::support::assigner::TestCoordinator;
use crate::support::{
    assigner::{Backend, TTL, is_stable, owned_by, test_config, try_topic},
    etcd_restore::{RestorableEtcd, loopback_port},
    wait_until,
};

/// The topic: wide enough that every join moves several partitions (many store writes
/// after the snapshot, so a rewound revision is far behind).
const TOPIC: &str = "restored";
const PARTITIONS: u32 = 24;
/// Bound for a topic to settle after a join or a restart (a loaded 2-core machine).
const SETTLE: Duration = Duration::from_secs(30);

/// When an epoch was handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Era {
    BeforeSnapshot = 0,
    AfterSnapshot = 1,
    AfterRestore = 2,
}

impl Era {
    fn from_u8(value: u8) -> Era {
        match value {
            0 => Era::BeforeSnapshot,
            1 => Era::AfterSnapshot,
            _ => Era::AfterRestore,
        }
    }
}

/// One epoch a consumer was handed (the fields are read through `Debug`, in failure messages).
#[derive(Clone, Debug)]
#[allow(dead_code)]
struct Given {
    era: Era,
    consumer: String,
    partition: u32,
    epoch: u64,
    /// Handed with `warm` (the coming epoch) rather than `assigned`.
    warm: bool,
}

/// Every epoch handed to any consumer, tagged with the era the test is in.
#[derive(Default)]
struct Ledger {
    era: AtomicU8,
    given: Mutex<Vec<Given>>,
}

impl Ledger {
    fn push(&self, consumer: &str, p: &Partition, warm: bool) {
        let era = Era::from_u8(self.era.load(Ordering::SeqCst));
        let given = Given { era, consumer: consumer.into(), partition: p.partition, epoch: p.epoch, warm };
        self.given.lock().unwrap_or_else(|e| e.into_inner()).push(given);
    }

    fn enter(&self, era: Era) {
        self.era.store(era as u8, Ordering::SeqCst);
    }

    fn all(&self) -> Vec<Given> {
        self.given.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A consumer's handler: records what it is handed; warms at once.
struct Recorder {
    name: String,
    ledger: Arc<Ledger>,
}

#[async_trait]
impl Handler for Recorder {
    async fn warm(&self, p: Partition) -> Result<(), WarmError> {
        self.ledger.push(&self.name, &p, true);
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        self.ledger.push(&self.name, &p, false);
    }

    async fn release(&self, _: Partition) {}

    async fn unassigned(&self, _: Partition) {}
}

/// Which assigner runs on the etcd.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `--backend etcd`: warm handoffs, one elected leader plans.
    Handoff,
    /// `--backend fleet --store etcd`: lease claiming.
    Fleet,
}

/// One assigner instance on fixed ports (a restart serves where the consumers look).
struct Node {
    coordinator: Arc<dyn ConsumerGroupCoordinator>,
    server: AssignerServer,
}

/// The instances' fixed (gRPC, admin) ports.
type Ports = Vec<(u16, u16)>;

async fn start_nodes(kind: Kind, etcd: &RestorableEtcd, prefix: &str, ports: &Ports) -> Vec<Node> {
    let mut nodes = Vec::new();
    for (index, (grpc, admin)) in ports.iter().enumerate() {
        let config = EtcdStoreConfig::new(vec![etcd.endpoint()])
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(5));
        let store: Arc<dyn LeaseStore> =
            Arc::new(EtcdStore::connect(config).await.unwrap_or_else(|e| panic!("etcd store: {e}")));
        let metrics = Arc::new(Metrics::new());
        let instance_id = format!("restore-{index}");
        let coordinator: Arc<dyn ConsumerGroupCoordinator> = match kind {
            Kind::Handoff => {
                let mut config = test_config(Backend::Etcd, prefix);
                config.instance_id = instance_id;
                config.topic_partitions.insert(TOPIC.into(), PARTITIONS);
                TestCoordinator::start(store, config, metrics.clone()).await.expect("handoff starts").served()
            }
            Kind::Fleet => {
                let mut config = FleetConfig {
                    instance_id,
                    backend: "fleet-etcd".into(),
                    prefix: prefix.into(),
                    lease_ttl: TTL,
                    claim_interval: Duration::from_millis(100),
                    ..FleetConfig::default()
                };
                config.topic_partitions.insert(TOPIC.into(), PARTITIONS);
                TestCoordinator::start_fleet(store, config, metrics.clone())
                    .await
                    .expect("fleet starts")
                    .served()
            }
        };
        let grpc_addr = SocketAddr::from(([127, 0, 0, 1], *grpc));
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], *admin));
        let server = AssignerServer::start(coordinator.clone(), metrics, grpc_addr, admin_addr)
            .await
            .unwrap_or_else(|e| panic!("instance {index} cannot serve on {grpc_addr}: {e}"));
        nodes.push(Node { coordinator, server });
    }
    nodes
}

/// Stops every instance as the runbook does (streams end, leadership resigned).
async fn stop_nodes(nodes: Vec<Node>) {
    for node in nodes {
        tokio::time::timeout(Duration::from_secs(10), node.server.stop())
            .await
            .unwrap_or_else(|_| panic!("an instance did not stop"));
    }
}

fn start_client(name: &str, urls: &[String], ledger: &Arc<Ledger>) -> AssignerClient {
    let mut config = ClientConfig::new(urls.to_vec(), name, TOPIC).with_server_lease_ttl(TTL);
    config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    config.call_timeout = Duration::from_secs(2);
    let handler = Arc::new(Recorder { name: name.into(), ledger: ledger.clone() });
    AssignerClient::start(config, handler, None).expect("the client starts")
}

/// Waits until the topic is stable on instance 0, lists exactly `clients`, and each
/// client holds what the status says it owns.
async fn settle(nodes: &[Node], clients: &BTreeMap<String, AssignerClient>, what: &str) {
    let names: BTreeSet<&str> = clients.keys().map(String::as_str).collect();
    wait_until(SETTLE, what, || async {
        let status = nodes[0].coordinator.status().await;
        let Some(topic) = try_topic(&status, TOPIC) else { return false };
        let listed: BTreeSet<&str> = topic.consumers.iter().map(|c| c.name.as_str()).collect();
        is_stable(topic)
            && listed == names
            && clients.iter().all(|(name, client)| *client.owned().borrow() == owned_by(topic, name))
    })
    .await;
}

/// The ownership records the restore brought back, and their epochs.
fn restored_epochs(kind: Kind, etcd: &RestorableEtcd, prefix: &str) -> Vec<u64> {
    let records = match kind {
        Kind::Handoff => format!("{prefix}assignments/"),
        Kind::Fleet => format!("{prefix}fleet/leases/"),
    };
    let values = etcd.etcdctl(&["get", "--prefix", "--print-value-only", &records]);
    values
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let record: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("record {line:?}: {e}"));
            record["epoch"].as_u64().unwrap_or_else(|| panic!("record without an epoch: {line}"))
        })
        .collect()
}

/// The runbook's step (docs/operating.md): before any assigner starts on the restored
/// store, delete the ownership records it brought back, so every partition gets a new
/// ownership, whose epoch is above the clock.
fn delete_restored_ownerships(etcd: &RestorableEtcd, prefix: &str) {
    for records in ["assignments/", "handoffs/", "fleet/leases/"] {
        etcd.etcdctl(&["del", "--prefix", &format!("{prefix}{records}")]);
    }
}

async fn epochs_after_a_restore_are_above_every_earlier_one(kind: Kind) {
    let mut etcd = RestorableEtcd::start().await;
    let prefix = format!("/kat/restore-{kind:?}/").to_lowercase();
    let ports: Ports = (0..2).map(|_| (loopback_port(), loopback_port())).collect();
    let urls: Vec<String> = ports.iter().map(|(grpc, _)| format!("http://127.0.0.1:{grpc}")).collect();
    let ledger = Arc::new(Ledger::default());
    let mut nodes = start_nodes(kind, &etcd, &prefix, &ports).await;
    let mut clients = BTreeMap::new();
    for name in ["c0", "c1"] {
        clients.insert(name.to_string(), start_client(name, &urls, &ledger));
    }
    settle(&nodes, &clients, "c0 and c1 share the topic").await;

    let snapshot = etcd.path("snapshot.db");
    etcd.snapshot_save(&snapshot);
    ledger.enter(Era::AfterSnapshot);
    for name in ["c2", "c3"] {
        clients.insert(name.to_string(), start_client(name, &urls, &ledger));
        settle(&nodes, &clients, &format!("{name} joined")).await;
    }

    // Everything stops; the consumers keep running and keep trying to reconnect.
    stop_nodes(std::mem::take(&mut nodes)).await;
    etcd.stop();
    ledger.enter(Era::AfterRestore);
    etcd.restore(&snapshot).await;
    let restored = restored_epochs(kind, &etcd, &prefix);
    delete_restored_ownerships(&etcd, &prefix);
    nodes = start_nodes(kind, &etcd, &prefix, &ports).await;
    settle(&nodes, &clients, "the consumers are back on the restored store").await;
    clients.insert("c4".into(), start_client("c4", &urls, &ledger));
    settle(&nodes, &clients, "c4 joined after the restore").await;

    let given = ledger.all();
    for g in &given {
        assert!(g.epoch > 0, "{kind:?}: a served epoch is never 0: {g:?}");
    }
    let before: Vec<&Given> = given.iter().filter(|g| g.era < Era::AfterRestore).collect();
    let after: Vec<&Given> = given.iter().filter(|g| g.era == Era::AfterRestore).collect();
    let after_snapshot = before.iter().filter(|g| g.era == Era::AfterSnapshot).count();
    assert!(after_snapshot > 0, "{kind:?}: the joins after the snapshot moved nothing");
    assert!(after.len() >= PARTITIONS as usize, "{kind:?}: every partition has a new owner: {after:?}");
    let highest_before = before.iter().map(|g| g.epoch).max().unwrap_or(0);
    let lowest_after = after.iter().map(|g| g.epoch).min().unwrap_or(0);
    eprintln!(
        "{kind:?}: {} epochs before the restore ({after_snapshot} after the snapshot), highest {highest_before}; \
         {} after, lowest {lowest_after}; the restore brought back {} ownership records, highest epoch {}",
        before.len(),
        after.len(),
        restored.len(),
        restored.iter().max().copied().unwrap_or(0)
    );
    // Why the runbook deletes them: served as they were, they would hand their consumers
    // epochs below those handed out after the snapshot.
    assert!(
        restored.iter().all(|epoch| *epoch < highest_before),
        "{kind:?}: the restored records are the snapshot's: {restored:?} vs {highest_before}"
    );
    let below: Vec<&&Given> = after.iter().filter(|g| g.epoch <= highest_before).collect();
    assert!(
        below.is_empty(),
        "{kind:?}: {} epochs handed out after the restore are not above the highest before it \
         ({highest_before}): {below:?}",
        below.len()
    );

    drop(clients);
    stop_nodes(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_epochs_after_an_etcd_restore_are_above_every_earlier_one() {
    epochs_after_a_restore_are_above_every_earlier_one(Kind::Handoff).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_epochs_after_an_etcd_restore_are_above_every_earlier_one() {
    epochs_after_a_restore_are_above_every_earlier_one(Kind::Fleet).await;
}
