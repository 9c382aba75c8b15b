//! A `Register` its caller gave up on never replaces the consumer's live stream
//! (docs/design.md §6), on real etcd with real gRPC, for both store-backed coordinators.
//!
//! Found with containers (docs/containers-faults.md): a client gives up on a slow
//! `Register` and sends its next attempt; the server carries the abandoned one to the end,
//! and when its write landed after the live attempt's, its stream (which nobody reads)
//! replaced the live one, whose client took the `ABORTED` for another consumer of its name
//! and stopped for good. Here the order is forced: the abandoned call's write is held at
//! the door of its instance's store connection (a stall) until the live attempt,
//! registered through another instance, has its stream.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use kafka_assigner::coordinator::{FleetConfig, fleet_backend::FleetKeys};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::proto::v1::{RegisterRequest, kafka_assigner_client::KafkaAssignerClient};
use kafka_assigner::server::AssignerServer;
use kafka_assigner::store::{AfterStall, EtcdStore, FaultyStore, LeaseStore, Op};
use tonic::transport::Channel;

use crate::support::assigner::TestCoordinator;
use crate::support::findings::Findings;
use crate::support::{
    assigner::{Backend, PROMPT, TestCluster, TestConsumer, TestStore, WIDE, connect},
    metric, wait_until,
};

/// The instances' lease TTL: the stall holds the ghost's instance's keep-alives too, and
/// must end well before that instance would fence itself (3/4 of the TTL).
const TTL: Duration = Duration::from_secs(10);
/// The longest the ghost's write is held: the test ends the stall as soon as the live
/// attempt has its stream.
const STALL: Duration = Duration::from_secs(4);

/// The handoff coordinator (`--backend etcd`): the ghost's write goes through the batched
/// registration writer, then (batch lost) its own compare-and-swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_its_caller_gave_up_on_never_replaces_the_live_one() {
    let mut cluster = TestCluster::start(Backend::Etcd, 1, |config| config.lease_ttl = TTL).await;
    let config = cluster.etcd.as_ref().expect("an etcd").store_config();
    let etcd = EtcdStore::connect(config).await.expect("connect to etcd");
    let steer = FaultyStore::new(Arc::new(etcd), 3);
    let ghost_at = cluster.add_instance_on(Arc::new(steer.clone())).await;
    // Another consumer first, through the ghost's instance: the topic's record is written,
    // only `a`'s registration is left to write.
    let mut z = cluster.consumer_on(ghost_at, "z", WIDE).await;
    z.expect_snapshot().await;
    let key = format!("{}consumers/{WIDE}/a", cluster.config.prefix);
    let race = Race {
        steer: &steer,
        store: &*cluster.store,
        key,
        ghost: cluster.client(ghost_at).await,
        ghost_admin: cluster.instance(ghost_at).admin_addr,
        live: cluster.client(0).await,
    };
    race.run("handoff").await;
}

/// The fleet coordinator (`--backend fleet --store etcd`): the ghost's write is its own
/// compare-and-swap on the member record and the consumer's leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_its_caller_gave_up_on_never_replaces_the_live_one_on_the_fleet() {
    let TestStore { prefix, store, memory, etcd } = TestStore::start(Backend::Etcd, "fleet").await;
    let mut config =
        FleetConfig { backend: "fleet-etcd".into(), prefix, lease_ttl: TTL, ..FleetConfig::default() };
    config.topic_partitions.insert(WIDE.into(), 12);
    let live = FleetNode::start(&config, "live", connect(memory.as_ref(), etcd.as_ref()).await).await;
    let store_config = etcd.as_ref().expect("an etcd").store_config();
    let steer = FaultyStore::new(Arc::new(EtcdStore::connect(store_config).await.expect("connect")), 3);
    let ghost = FleetNode::start(&config, "ghost", Arc::new(steer.clone())).await;
    let race = Race {
        steer: &steer,
        store: &*store,
        key: FleetKeys::new(&config.prefix).member(WIDE, "a"),
        ghost: ghost.client().await,
        ghost_admin: ghost.server.admin_addr,
        live: live.client().await,
    };
    race.run("fleet").await;
    for node in [ghost, live] {
        tokio::time::timeout(PROMPT, node.server.stop()).await.expect("instance did not stop");
    }
}

/// One fleet instance serving gRPC.
struct FleetNode {
    server: AssignerServer,
    // Kept for as long as the node serves.
    _coordinator: TestCoordinator,
}

impl FleetNode {
    async fn start(config: &FleetConfig, name: &str, store: Arc<dyn LeaseStore>) -> FleetNode {
        let config = FleetConfig { instance_id: format!("fleet-{name}"), ..config.clone() };
        let metrics = Arc::new(Metrics::new());
        let coordinator = TestCoordinator::start_fleet(store, config, metrics.clone()).await.expect("starts");
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = AssignerServer::start(coordinator.served(), metrics, any, any).await.expect("serves");
        FleetNode { server, _coordinator: coordinator }
    }

    async fn client(&self) -> KafkaAssignerClient<Channel> {
        KafkaAssignerClient::connect(self.server.grpc_url()).await.expect("connect")
    }
}

/// The race of an abandoned `Register` of consumer `a` (through the instance behind
/// `steer`) with the consumer's live one (through another instance).
struct Race<'a> {
    /// The ghost's instance's store connection.
    steer: &'a FaultyStore,
    /// A store handle of the test's own.
    store: &'a dyn LeaseStore,
    /// `a`'s registration record.
    key: String,
    ghost: KafkaAssignerClient<Channel>,
    ghost_admin: SocketAddr,
    live: KafkaAssignerClient<Channel>,
}

impl Race<'_> {
    /// `Register` of `a` whose write is held; its caller gives up; the live `Register` of
    /// `a` on the other instance gets its stream; then the held write goes on. The live
    /// registration must stay: its record unchanged, its stream open.
    async fn run(self, backend: &str) {
        let key = self.key.clone();
        let writes_a = move |txn: &kafka_assigner::store::Txn| {
            txn.ops.iter().any(|op| matches!(op, Op::Put { key: k, .. } if *k == key))
        };
        self.steer.stall_at_txn(STALL, AfterStall::Deliver, writes_a);
        let mut ghost = self.ghost.clone();
        let call = tokio::spawn(async move {
            ghost.register(RegisterRequest { consumer_name: "a".into(), topic: WIDE.into() }).await
        });
        wait_until(PROMPT, "the abandoned Register's write is held", async || {
            self.steer.last_stall().is_some()
        })
        .await;
        let held_at = Instant::now();
        // The caller gives up (its call is dropped: the stream is reset), and the server
        // sees it go.
        call.abort();
        assert!(call.await.is_err_and(|e| e.is_cancelled()), "the abandoned call was answered");
        wait_until(PROMPT, "the ghost's instance sees its caller gone", async || {
            metric(self.ghost_admin, "registers_abandoned").await == Some(1.0)
        })
        .await;
        let mut live = TestConsumer::register(self.live.clone(), "a", WIDE).await.expect("live Register");
        live.expect_snapshot().await;
        let written = self.store.get(&self.key).await.expect("read").expect("the live registration");
        let ghost_held = held_at.elapsed();
        assert!(ghost_held < STALL, "the stall ended by itself before the live attempt had its stream");
        self.steer.end_stall();
        // The held write reaches the store; whatever the ghost does next, it is done when
        // its instance counts no abandoned Register any more.
        wait_until(PROMPT, "the abandoned Register is over", async || {
            metric(self.ghost_admin, "registers_abandoned").await == Some(0.0)
        })
        .await;
        let after = self.store.get(&self.key).await.expect("read");
        live.poll_now();
        let mut findings = Findings::default();
        // The live registration's record, as written: the same registration in it, bound to
        // the same session. The handoff backend never writes it again; the fleet's claims
        // write it again unchanged (a claim rewrites its claimer's member record, so that a
        // registration decided before the claim fails its compare), so there only the
        // revision may move.
        let same = |kv: &kafka_assigner::store::KeyValue| {
            kv.value == written.value
                && kv.session == written.session
                && (backend == "fleet" || kv.mod_revision == written.mod_revision)
        };
        findings.check(
            after.as_ref().is_some_and(same),
            format!(
                "the abandoned Register replaced the live registration: revision {} became {:?}, {}",
                written.mod_revision,
                after.as_ref().map(|kv| kv.mod_revision),
                if after.as_ref().is_some_and(|kv| kv.value == written.value) {
                    "same record"
                } else {
                    "another record"
                }
            ),
        );
        findings.check(live.ended.is_none(), format!("the live stream ended: {:?}", live.ended));
        eprintln!(
            "[faults] {backend}: a Register abandoned while its write was held ({ghost_held:?}) left the live one \
             alone: {}",
            findings.is_empty()
        );
        findings.finish("abandoned register");
    }
}
