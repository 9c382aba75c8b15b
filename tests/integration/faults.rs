//! Fault scenarios on real processes (docs/reliability.md has their table): etcd stopped and
//! restarted, etcd frozen, the etcd raft leader killed mid-handoff (3 members), one instance
//! cut off from etcd by a proxy, the leader instance killed mid-handoff, 1,000 concurrent
//! `Register`s of one name. `memory.rs` adds the memory backend behind a `FaultyStore`: a
//! lost answer to the election transaction, and the cut-off scenario without etcd.
//! `abandoned.rs`: a `Register` its caller gave up on never replaces the live one.
//!
//! Each asserts from the consumers' views (`views.rs`): no double ownership outside a
//! handoff's release window; readiness following the store; after a stopped or frozen etcd,
//! every consumer that comes back within the settle period owns what it owned before. A
//! scenario collects every finding and fails with all of them, so one run shows the whole
//! picture. Recovery times are printed (`[faults] ...`, run with `--nocapture`).

mod abandoned;
mod holes;
mod memory;
mod views;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kafka_assigner::store::LeaseStore;

use self::views::{Fleet, double_ownership, grpc_serving, http_ready, moved};
use crate::support::findings::Findings;
use crate::support::{
    POLL_INTERVAL,
    assigner::{Backend, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster, TestConsumer, WIDE, topic},
    cluster::EtcdCluster,
    proxy::Proxy,
};

/// How long a stopped or frozen etcd stays out: well past the TTL.
const OUTAGE: Duration = Duration::from_secs(3);
/// Bound for the fleet to settle after a fault ends.
const RECOVERY: Duration = Duration::from_secs(20);

/// How etcd goes away.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// Killed, then started again on its data dir.
    Stop,
    /// SIGSTOP, then SIGCONT.
    Freeze,
}

/// etcd goes away for [`OUTAGE`] (> TTL) under two instances and three consumers of a
/// 12-partition topic, then comes back. Readiness must follow it, and every consumer that
/// comes back must own what it owned before.
async fn etcd_outage(outage: Outage) {
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    if cluster.etcd.as_ref().is_some_and(crate::support::EtcdServer::is_shared) {
        eprintln!("NOT RUN on a shared ETCD_ENDPOINTS cluster: it cannot be stopped or frozen");
        return;
    }
    let mut fleet = Fleet::join(&cluster, WIDE, &["a", "b", "c"]).await;
    fleet.settle(&cluster, RECOVERY).await;
    // Clients whose stream ends come back one by one, all within one TTL (the default
    // settle period): a, then b 450 ms later, then c.
    fleet.stagger = Duration::from_millis(450);
    let before = fleet.owned();
    let mut findings = Findings::default();

    let etcd = cluster.etcd.as_mut().expect("an etcd cluster");
    match outage {
        Outage::Stop => etcd.stop(),
        Outage::Freeze => etcd.freeze(),
    }
    let went = Instant::now();
    // Clients whose stream ends retry after the outage (a Register would only wait on the
    // store meanwhile, and stall this loop).
    fleet.not_before = Some(went + OUTAGE);
    // Through the outage: readiness of both instances, sampled; the consumers as clients.
    // Both must go NOT_SERVING (HTTP and gRPC) and stay so until etcd is back.
    let (mut not_ready_at, mut flaps) = (None, 0);
    while went.elapsed() < OUTAGE {
        let mut all_down = true;
        for i in 0..2 {
            all_down &= !http_ready(&cluster, i).await && !grpc_serving(&cluster, i).await;
        }
        if all_down {
            not_ready_at.get_or_insert(went.elapsed());
        } else if not_ready_at.is_some() {
            flaps += 1;
        }
        fleet.pass(&cluster).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    findings.check(
        not_ready_at.is_some() && flaps == 0,
        format!(
            "readiness: both instances should go NOT_SERVING while etcd is away and stay so (first \
             all-down sample after {not_ready_at:?} of {OUTAGE:?}, {flaps} ready samples after it)"
        ),
    );

    let etcd = cluster.etcd.as_mut().expect("an etcd cluster");
    match outage {
        Outage::Stop => etcd.restart().await,
        Outage::Freeze => etcd.thaw(),
    }
    let back = Instant::now();
    fleet.not_before = Some(back);
    let ready_again = wait_ready(&cluster, &[0, 1], RECOVERY).await;
    findings.check(ready_again.is_some(), "readiness: not SERVING again after etcd came back");
    fleet.settle(&cluster, RECOVERY).await;
    let settled = back.elapsed();
    let after = fleet.owned();
    let moved = moved(&before, &after);
    findings.check(moved == 0, format!("{moved} of 12 partitions moved: before {before:?}, after {after:?}"));
    findings.extend("double ownership", fleet.double_ownership());
    eprintln!(
        "[faults] etcd {outage:?} for {OUTAGE:?}: ready again {ready_again:?} and the fleet settled {settled:?} \
         after etcd came back; {} reconnects; {moved} of 12 partitions moved",
        fleet.reconnects
    );
    findings.finish(&format!("etcd {outage:?}"));
}

/// Waits until every instance in `instances` is ready on HTTP and gRPC; returns when.
async fn wait_ready(cluster: &TestCluster, instances: &[usize], deadline: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < deadline {
        let mut ready = true;
        for i in instances {
            ready &= http_ready(cluster, *i).await && grpc_serving(cluster, *i).await;
        }
        if ready {
            return Some(started.elapsed());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_past_the_ttl_then_restarted_moves_nothing() {
    etcd_outage(Outage::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_frozen_past_the_ttl_moves_nothing() {
    etcd_outage(Outage::Freeze).await;
}

/// A handoff is warming when the etcd raft leader (of 3 members) is SIGKILLed: the
/// handoff completes through the remaining members, nothing is owned twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_mid_handoff() {
    let mut etcd = EtcdCluster::start(3).await;
    let store: Arc<dyn LeaseStore> = Arc::new(etcd.store().await);
    let mut cluster = TestCluster::with_store(Backend::Etcd, store, &etcd.unique_prefix("leader-kill"));
    for _ in 0..2 {
        let store: Arc<dyn LeaseStore> = Arc::new(etcd.store().await);
        cluster.add_instance_on(store).await;
    }
    let mut a = cluster.consumer_on(0, "a", TOPIC).await;
    a.expect_snapshot().await;
    a.wait_owned(PARTITIONS as usize, PROMPT).await;
    let mut b = cluster.consumer_on(1, "b", TOPIC).await;
    b.expect_snapshot().await;
    b.wait_warms(2, PROMPT).await;

    let killed = etcd.kill_leader().await;
    let started = Instant::now();
    // b is ready right away: the calls must get through the remaining members.
    b.ready_all().await;
    let ready_done = started.elapsed();
    b.wait_owned(2, PROMPT).await;
    a.wait_for(PROMPT, "two releases", |c| c.releases.len() == 2).await;
    a.release_all().await;
    let status = cluster
        .wait_status(PROMPT, "the handoffs are done", |s| {
            crate::support::assigner::is_stable(topic(s, TOPIC))
        })
        .await;
    let done = started.elapsed();
    let t = topic(&status, TOPIC);
    assert_eq!(crate::support::assigner::owned_by(t, "b"), b.owned);
    assert_eq!(crate::support::assigner::owned_by(t, "a"), a.owned);
    let found = double_ownership([&a, &b].into_iter());
    assert!(found.is_empty(), "double ownership: {found:?}");
    assert!(a.ended.is_none() && b.ended.is_none(), "streams survive an etcd leader change: {a:?} {b:?}");
    eprintln!(
        "[faults] etcd leader m{killed} SIGKILLed mid-handoff: PartitionReady x2 answered {ready_done:?} after, \
         handoffs complete {done:?} after"
    );
}

/// etcd expires the leader instance's lease while that instance still thinks it is live
/// (revoked here, as an operator or a store whose clock ran ahead would). Its consumers'
/// registrations vanish with it. The instance registers them again on a new lease without
/// ending their streams, and since the new leader settles before it moves partitions of
/// consumers that are gone, no consumer is told anything and nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expired_early_by_etcd_keeps_streams_and_moves_nothing() {
    let cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let leader = cluster.wait_leader(PROMPT).await;
    lease_expired_early(cluster, leader).await;
}

/// etcd expires the lease of `cluster`'s instance `target` early (see the tests that call
/// it): its registrations are written again, no stream ends, no consumer is told
/// anything, nothing moves.
async fn lease_expired_early(cluster: TestCluster, target: usize) {
    let begun = Instant::now();
    let mut fleet = Fleet::join(&cluster, WIDE, &["a", "b", "c", "d"]).await;
    fleet.settle(&cluster, RECOVERY).await;
    // The leader won before `begun` and settled for one period after it: the fault comes
    // to a leader past its settle period, with a view it has never lost.
    let settled = begun + cluster.config.settle_period.unwrap_or(cluster.config.lease_ttl);
    while Instant::now() < settled {
        fleet.pass(&cluster).await;
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let before = fleet.owned();
    let seen: Vec<usize> = fleet.live.values().map(TestConsumer::seen).collect();
    let leader_id = cluster.instance(target).id.clone();
    let registrations = format!("{}consumers/{WIDE}/", cluster.config.prefix);
    let on_leader = |snapshot: &kafka_assigner::store::PrefixSnapshot| -> Vec<(String, Option<_>)> {
        let mut found: Vec<_> = snapshot
            .kvs
            .iter()
            .filter(|kv| kv.key.starts_with(&registrations))
            .filter(|kv| String::from_utf8_lossy(&kv.value).contains(&format!("\"{leader_id}\"")))
            .map(|kv| (kv.key.clone(), kv.session))
            .collect();
        found.sort();
        found
    };
    let bound = on_leader(&cluster.stored().await);
    assert!(!bound.is_empty(), "round robin put consumers on every instance");
    let lease = bound[0].1.expect("registrations are bound to the instance lease");
    cluster.store.revoke_session(lease).await.expect("etcd revokes the lease");
    let revoked = Instant::now();

    // Every registration of that instance comes back, bound to a new lease.
    let mut rebound = None;
    while revoked.elapsed() < RECOVERY {
        fleet.pass(&cluster).await;
        let now = on_leader(&cluster.stored().await);
        let keys = |v: &[(String, Option<_>)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        if keys(&now) == keys(&bound) && now.iter().all(|(_, s)| s.is_some() && *s != Some(lease)) {
            rebound = Some(revoked.elapsed());
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let mut findings = Findings::default();
    findings.check(
        rebound.is_some(),
        format!("the registrations were not written again: {:?}", on_leader(&cluster.stored().await)),
    );
    // Past the settle period (one TTL) of a leader that just took over.
    let quiet_until = Instant::now() + TTL * 2;
    while Instant::now() < quiet_until {
        fleet.pass(&cluster).await;
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    fleet.settle(&cluster, RECOVERY).await;
    findings.check(fleet.reconnects == 0, format!("{} streams ended and reconnected", fleet.reconnects));
    for ((name, consumer), seen) in fleet.live.iter().zip(seen) {
        let told: Vec<String> =
            consumer.since(seen).into_iter().map(crate::support::assigner::describe).collect();
        findings.check(told.is_empty(), format!("{name} was told {told:?}"));
    }
    let moved = moved(&before, &fleet.owned());
    findings.check(moved == 0, format!("{moved} partitions moved"));
    findings.extend("double ownership", fleet.double_ownership());
    eprintln!(
        "[faults] {leader_id}'s lease revoked by etcd: {} registrations written again {rebound:?} after; \
         {moved} partitions moved, {} reconnects",
        bound.len(),
        fleet.reconnects
    );
    findings.finish("lease expired early");
}

/// The leader instance loses etcd (a proxy partitions it) while the other keeps it. Its
/// consumer must be told `unassigned` before the TTL runs out, the other consumer takes
/// over, and nothing is owned twice; only one instance reports itself leader throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_cut_off_from_etcd_fences_its_consumers() {
    // Instance 0 reaches etcd through the proxy and starts first, so it leads; instance 1
    // reaches etcd directly.
    let mut cluster = TestCluster::start(Backend::Etcd, 0, |_| {}).await;
    let etcd = cluster.etcd.as_ref().expect("an etcd");
    let proxy = Proxy::in_front_of(&etcd.endpoints()[0]).await;
    let config =
        kafka_assigner::store::EtcdStoreConfig { endpoints: vec![proxy.url()], ..etcd.store_config() };
    let behind: Arc<dyn LeaseStore> =
        Arc::new(kafka_assigner::store::EtcdStore::connect(config).await.expect("connect through the proxy"));
    cluster.add_instance_on(behind).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 0, "the first instance leads");
    cluster.add_instance().await;
    cut_off_leader_instance(cluster, || proxy.partition(), "etcd (proxy partition)").await;
    proxy.restore();
}

/// Instance 0 (the leader, holding consumer `b`) loses its store through `cut`; instance 1
/// (holding `a`) keeps it. Shared by the etcd (proxy) and memory (fault wrapper) variants.
pub(crate) async fn cut_off_leader_instance(cluster: TestCluster, cut: impl FnOnce(), what: &str) {
    let mut a = cluster.consumer_on(1, "a", WIDE).await;
    a.expect_snapshot().await;
    let mut b = cluster.consumer_on(0, "b", WIDE).await;
    b.expect_snapshot().await;
    let mut fleet = Fleet::from_streams(WIDE, vec![a, b]);
    fleet.settle(&cluster, RECOVERY).await;
    let b_owned = fleet.owned()["b"].clone();
    let mut findings = Findings::default();

    cut();
    let cut = Instant::now();
    let (mut two_leaders, mut fenced_at, mut a_has_all_at) = (0, None, None);
    while cut.elapsed() < TTL * 4 && (fenced_at.is_none() || a_has_all_at.is_none()) {
        for consumer in fleet.live.values_mut() {
            consumer.poll_now();
            consumer.answer_all().await;
        }
        let b = &fleet.live["b"];
        if fenced_at.is_none() && (b.owned.is_empty() || b.ended.is_some()) {
            fenced_at = Some(cut.elapsed());
        }
        if a_has_all_at.is_none() && fleet.live["a"].owned.len() == 12 {
            a_has_all_at = Some(cut.elapsed());
        }
        let leaders = (0..2).filter(|i| cluster.instance(*i).coordinator.is_leader()).count();
        two_leaders += usize::from(leaders > 1);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    findings.check(
        fenced_at.is_some_and(|t| t < TTL),
        format!("b (on the cut-off instance) was not told to stop within the TTL: {fenced_at:?}; it owned {b_owned:?}"),
    );
    findings.check(a_has_all_at.is_some(), "a did not take over every partition");
    findings.check(
        two_leaders == 0,
        format!("both instances reported themselves leader in {two_leaders} samples"),
    );
    findings.check(!http_ready(&cluster, 0).await, "the cut-off instance still reports ready");
    findings.extend("double ownership", fleet.double_ownership());
    eprintln!(
        "[faults] instance cut off from {what}: b fenced after {fenced_at:?}, a owns all after {a_has_all_at:?}"
    );
    findings.finish(&format!("instance cut off from {what}"));
}

/// The leader instance is killed while a handoff is warming (one warm at a time, so the
/// rest of the rebalance needs the new leader): the other instance leads within about a
/// TTL and the rebalance completes; nothing is owned twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_instance_killed_mid_handoff() {
    let mut cluster = TestCluster::start(Backend::Etcd, 2, |c| c.plan.max_warming_per_consumer = 1).await;
    let leader = cluster.wait_leader(PROMPT).await;
    let survivor = 1 - leader;
    let mut a = cluster.consumer_on(survivor, "a", WIDE).await;
    a.expect_snapshot().await;
    a.wait_owned(12, PROMPT).await;
    let mut b = cluster.consumer_on(survivor, "b", WIDE).await;
    b.expect_snapshot().await;
    b.wait_warms(1, PROMPT).await;

    let killed = Instant::now();
    cluster.crash(leader).await;
    b.ready_all().await;
    let mut fleet = Fleet::from_streams(WIDE, vec![a, b]);
    while !cluster.instance(survivor).coordinator.is_leader() {
        assert!(killed.elapsed() < TTL * 3, "no new leader {:?} after the crash", killed.elapsed());
        fleet.pass(&cluster).await;
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let takeover = killed.elapsed();
    let settled = fleet.settle(&cluster, RECOVERY).await;
    let owned = fleet.owned();
    assert_eq!((owned["a"].len(), owned["b"].len()), (6, 6), "{owned:?}");
    let found = fleet.double_ownership();
    assert!(found.is_empty(), "double ownership: {found:?}");
    eprintln!(
        "[faults] leader instance killed mid-handoff: new leader after {takeover:?}, rebalance done {:?} after the crash",
        takeover + settled
    );
}

/// 1,000 `Register`s of one name at once, over two instances: exactly one stream stays
/// live (the last accepted), the others end `ABORTED`, nobody sees `INTERNAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_registers_of_one_name_leave_one_stream() {
    const CALLS: usize = 1_000;
    let cluster = Arc::new(TestCluster::start(Backend::Etcd, 2, |_| {}).await);
    let mut clients = Vec::new();
    for i in 0..20 {
        clients.push(cluster.client(i % 2).await);
    }
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            let client = clients[n % clients.len()].clone();
            tokio::spawn(async move { TestConsumer::register(client, "same", TOPIC).await })
        })
        .collect();
    let mut consumers = Vec::new();
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    // One message per refusal code, for the report.
    let mut samples = std::collections::BTreeMap::<String, String>::new();
    for call in calls {
        match call.await.expect("register task") {
            Ok(consumer) => consumers.push(consumer),
            Err(status) => {
                let code = format!("{:?}", status.code());
                samples.entry(code.clone()).or_insert_with(|| status.message().to_string());
                *refused.entry(code).or_default() += 1;
            }
        }
    }
    let mut findings = Findings::default();
    // Let the race play out: every stream but one must end...
    let live_now = |consumers: &mut Vec<TestConsumer>| {
        consumers.iter_mut().for_each(TestConsumer::poll_now);
        consumers.iter().filter(|c| c.ended.is_none()).count()
    };
    let give_up = Instant::now() + PROMPT;
    while live_now(&mut consumers) > 1 && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...and that one must stay (a replaced registration's session must not end it).
    let watch_until = Instant::now() + TTL * 2;
    while Instant::now() < watch_until {
        live_now(&mut consumers);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live = live_now(&mut consumers);
    let mut ends = std::collections::BTreeMap::<String, usize>::new();
    for consumer in &consumers {
        if let Some(end) = &consumer.ended {
            let code = end.as_ref().err().map_or("OK".to_string(), |s| format!("{:?}", s.code()));
            *ends.entry(code).or_default() += 1;
        }
    }
    findings.check(
        live == 1,
        format!(
            "{live} live streams of {CALLS} (stream ends {ends:?}, refused {refused:?}; messages {samples:?})"
        ),
    );
    findings.check(
        !ends.contains_key("Internal") && !refused.contains_key("Internal"),
        format!("INTERNAL seen: ends {ends:?}, refused {refused:?}; messages {samples:?}"),
    );
    findings.check(
        ends.keys().chain(refused.keys()).all(|code| code == "Aborted"),
        format!("every call but the survivor must end ABORTED: stream ends {ends:?}, refused {refused:?}"),
    );
    eprintln!(
        "[faults] {CALLS} concurrent Registers: {live} live, stream ends {ends:?}, refused {refused:?} \
         (messages: {samples:?})"
    );
    findings.finish("concurrent same-name registers");
}
