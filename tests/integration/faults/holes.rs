//! The ownership holes found after the fault work, each shown on real etcd with real gRPC:
//! a cancelled `Register` leaves no ghost consumer; a `Register` answered after the fence
//! admits no stream; a non-leader instance whose lease etcd expires early moves nothing; an
//! instance that cannot relay fences its consumers, and so does one whose watch hangs
//! without an error; an outage that outlives one instance's
//! lease, while the leader notices nothing, moves nothing.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use kafka_assigner::proto::v1::RegisterRequest;
use kafka_assigner::store::{EtcdStore, EtcdStoreConfig, FaultyStore, LeaseStore};

use super::RECOVERY;
use super::views::{Fleet, moved};
use crate::support::findings::Findings;
use crate::support::{
    POLL_INTERVAL,
    assigner::{Backend, PROMPT, SMALL, TTL, TestCluster, TestConsumer, WIDE, consumer_names, topic},
    proxy::Proxy,
};

/// Two instances on a fresh etcd: instance 0 leads; instance 1 reaches etcd through the
/// store `second` builds from the etcd's settings (a fault wrapper, a proxy), with what
/// the test steers it by.
async fn leader_and_second<T>(
    second: impl AsyncFnOnce(EtcdStoreConfig) -> (Arc<dyn LeaseStore>, T),
) -> (TestCluster, T) {
    let mut cluster = TestCluster::start(Backend::Etcd, 1, |_| {}).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 0, "the first instance leads");
    let config = cluster.etcd.as_ref().expect("an etcd").store_config();
    let (store, steer) = second(config).await;
    cluster.add_instance_on(store).await;
    (cluster, steer)
}

/// [`leader_and_second`] with instance 1 behind a [`FaultyStore`] (seeded by `seed`).
async fn leader_and_faulty(seed: u64) -> (TestCluster, FaultyStore) {
    leader_and_second(async |config| {
        let store = faulty(&config, seed).await;
        (Arc::new(store.clone()) as Arc<dyn LeaseStore>, store)
    })
    .await
}

/// An instance's own connection to the cluster's etcd behind a fault wrapper the test
/// steers.
async fn faulty(config: &EtcdStoreConfig, seed: u64) -> FaultyStore {
    let etcd = EtcdStore::connect(config.clone()).await.expect("connect to etcd");
    FaultyStore::new(Arc::new(etcd), seed)
}

/// 500 `Register`s under distinct names, each cancelled right after it was sent, among
/// 1,000 `Register`s of one name: within two TTLs no cancelled name is a consumer any more
/// and no warm goes towards one. Every registration either has a live stream or ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_registers_leave_no_ghost_consumers() {
    const CANCELLED: usize = 500;
    const SAME: usize = 1_000;
    let cluster = TestCluster::start(Backend::Etcd, 2, |_| {}).await;
    let mut fleet = Fleet::join(&cluster, WIDE, &["a", "b"]).await;
    fleet.settle(&cluster, RECOVERY).await;
    let mut clients = Vec::new();
    for i in 0..20 {
        clients.push(cluster.client(i % 2).await);
    }
    let same: Vec<_> = (0..SAME)
        .map(|n| {
            let client = clients[n % clients.len()].clone();
            tokio::spawn(async move { TestConsumer::register(client, "same", WIDE).await })
        })
        .collect();
    let cancelled: Vec<_> = (0..CANCELLED)
        .map(|n| {
            let mut client = clients[n % clients.len()].clone();
            let request = RegisterRequest { consumer_name: format!("ghost-{n}"), topic: WIDE.into() };
            // Cancelled at different points: before it left, while the instance writes it,
            // just after its answer.
            let patience = Duration::from_millis(4 * n as u64);
            tokio::spawn(
                async move { tokio::time::timeout(patience, client.register(request)).await.is_ok() },
            )
        })
        .collect();
    let mut answered = 0;
    for call in cancelled {
        answered += usize::from(call.await.unwrap_or(false));
    }
    let mut survivors = Vec::new();
    for call in same {
        if let Ok(Ok(consumer)) = call.await {
            survivors.push(consumer);
        }
    }
    let cancelled_at = Instant::now();
    let allowed: BTreeSet<&str> = ["a", "b", "same"].into();
    let (mut ghosts, mut warms_to_ghosts) = (Vec::new(), Vec::new());
    // Every registration ends within the TTL after its stream went; the sweep is a
    // second line two TTLs on. Past that, nothing of the cancelled calls may be left.
    while cancelled_at.elapsed() < TTL * 4 {
        fleet.pass(&cluster).await;
        survivors.iter_mut().for_each(TestConsumer::poll_now);
        let status = cluster.status().await;
        let wide = topic(&status, WIDE);
        ghosts =
            consumer_names(wide).into_iter().filter(|n| !allowed.contains(n)).map(String::from).collect();
        warms_to_ghosts = wide
            .handoffs
            .iter()
            .filter(|h| !allowed.contains(h.to.as_str()))
            .map(|h| format!("{} -> {}", h.partition, h.to))
            .collect();
        if ghosts.is_empty() && warms_to_ghosts.is_empty() && cancelled_at.elapsed() > TTL * 2 {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL * 10).await;
    }
    let mut findings = Findings::default();
    findings
        .check(ghosts.is_empty(), format!("ghost consumers after {:?}: {ghosts:?}", cancelled_at.elapsed()));
    findings.check(warms_to_ghosts.is_empty(), format!("warms towards ghosts: {warms_to_ghosts:?}"));
    let live = survivors.iter().filter(|c| c.ended.is_none()).count();
    // How the answered ones ended, by code, to tell a replacement from another end.
    let mut ends: std::collections::BTreeMap<String, usize> = Default::default();
    for c in &survivors {
        *ends
            .entry(format!("{:?}", c.ended.as_ref().map(|e| e.as_ref().err().map(|s| s.code()))))
            .or_default() += 1;
    }
    findings.check(
        live == 1,
        format!("{live} live streams of 'same' ({} answered, ended: {ends:?})", survivors.len()),
    );
    findings.extend("double ownership", fleet.double_ownership());
    let swept = [swept(&cluster, 0).await, swept(&cluster, 1).await];
    findings.check(swept == [0, 0], format!("registrations were left for the sweep to find: {swept:?}"));
    eprintln!(
        "[faults] {CANCELLED} cancelled Registers ({answered} answered before the cancel): ghosts {ghosts:?} after \
         {:?}, swept {swept:?}",
        cancelled_at.elapsed()
    );
    findings.finish("cancelled registers");
}

/// `kafka_assigner_registrations_swept_total` of instance `i`, from its `/metrics`
/// (`u64::MAX` if it has none).
async fn swept(cluster: &TestCluster, i: usize) -> u64 {
    let swept = crate::support::metric(cluster.instance(i).admin_addr, "registrations_swept_total").await;
    swept.map_or(u64::MAX, |v| v as u64)
}

/// A consumer's `Register` is written to etcd, but its answer reaches the instance only
/// after the instance fenced itself (cut off from etcd meanwhile). The stream must not be
/// admitted: the consumer is refused, never shown a snapshot of partitions the leader is
/// about to give away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_answered_after_the_fence_admits_no_stream() {
    let (cluster, steer) = leader_and_faulty(7).await;
    // `a` owns the whole topic through instance 1, then its client crashes.
    let mut a = cluster.sole_owner(1, "a", WIDE).await;
    let owned = a.owned.clone();
    let mut z = cluster.consumer_on(1, "z", SMALL).await;
    z.expect_snapshot().await;
    a.crash().await;
    // It comes back on the same instance within the TTL; the write applies, its answer
    // is held while the instance is cut off and fences itself.
    steer.hold_txn_answers();
    let client = cluster.client(1).await;
    let again = tokio::spawn(async move { TestConsumer::register(client, "a", WIDE).await });
    let written = Instant::now();
    let key = format!("{}consumers/{WIDE}/a", cluster.config.prefix);
    let initial = cluster.store.get(&key).await.expect("read").map(|kv| kv.mod_revision);
    while cluster.store.get(&key).await.expect("read").map(|kv| kv.mod_revision) == initial {
        assert!(written.elapsed() < PROMPT, "the registration was never written");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    // Instance 1 fences itself: its other consumer `z` is told so.
    steer.cut_off();
    match z.expect_end(TTL * 2).await {
        Err(status) if status.message().contains("lost contact with its store") => {}
        other => panic!("z was not fenced: {other:?}"),
    }
    steer.release_held_answers();
    let mut findings = Findings::default();
    match tokio::time::timeout(PROMPT, again).await.expect("answered").expect("task") {
        Err(status) => findings.check(
            status.code() == tonic::Code::Unavailable,
            format!("refused with {:?}, not UNAVAILABLE: {}", status.code(), status.message()),
        ),
        Ok(mut late) => {
            late.poll_now();
            tokio::time::sleep(TTL / 2).await;
            late.poll_now();
            findings.check(
                late.history.iter().all(|(_, c)| {
                    !matches!(&c.command, Some(kafka_assigner::proto::v1::assignment_command::Command::Assignment(u)) if !u.assigned.is_empty())
                }),
                format!("a stream admitted after the fence told 'a' it owns {owned:?}: {late:?}"),
            );
        }
    }
    steer.restore();
    findings.finish("register answered after the fence");
}

/// etcd expires a non-leader instance's lease (revoked here) while that instance still
/// thinks it is live: its consumers' registrations vanish, the leader's view is never
/// interrupted. That instance's store answers take 30–60 ms (a busier or farther
/// instance), so writing the registrations again takes a few round trips while the leader
/// sees them gone at once. They are written again, and nothing moves meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_leaders_lease_expired_early_moves_nothing() {
    let (cluster, slow) = leader_and_faulty(5).await;
    slow.delay(Duration::from_millis(30), Duration::from_millis(60));
    super::lease_expired_early(cluster, 1).await;
}

/// Instance 1's relay cannot follow etcd (its watch breaks and re-reads fail) while its
/// lease stays alive. A handoff completes elsewhere meanwhile. Its consumer `a` must be
/// fenced (told it owns nothing, its stream ended) within the TTL, not left believing it
/// owns the partitions that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_relay_fences_its_consumers() {
    let (cluster, steer) = leader_and_faulty(11).await;
    let mut a = cluster.sole_owner(1, "a", WIDE).await;
    let mut b = cluster.consumer_on(0, "b", WIDE).await;
    b.expect_snapshot().await;
    b.wait_for(PROMPT, "warms", |b| !b.warms.is_empty()).await;
    steer.cut_reads();
    let cut = Instant::now();
    b.ready_all().await;
    let mut fenced_at = None;
    while cut.elapsed() < TTL * 3 && fenced_at.is_none() {
        a.poll_now();
        b.poll_now();
        b.answer_all().await;
        if a.ended.is_some() && a.owned.is_empty() {
            fenced_at = Some(cut.elapsed());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    steer.restore_reads();
    let mut findings = Findings::default();
    findings.check(
        fenced_at.is_some_and(|t| t < TTL),
        format!("a was not fenced within the TTL of the relay's loss: {fenced_at:?}; {a:?}"),
    );
    // The overlap with b is a release window that a never heard about: the fence ends it
    // (the check above), as the lease's fence would, well before any release timeout.
    eprintln!("[faults] relay lost under a live lease: a fenced after {fenced_at:?}");
    findings.finish("relay stale under a live lease");
}

/// Instance 1's watch hangs without an error (it delivers nothing, not even etcd's
/// progress notifications) while every other call to etcd works and its lease stays alive.
/// A handoff completes elsewhere meanwhile. The relay counts as stale after three quarters
/// of the TTL of silence, and its consumer `a` is fenced then (told it owns nothing, its
/// stream ended), not left believing it owns the partitions that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_watch_hangs_fences_its_consumers() {
    let (cluster, steer) = leader_and_faulty(13).await;
    let mut a = cluster.sole_owner(1, "a", WIDE).await;
    let mut b = cluster.consumer_on(0, "b", WIDE).await;
    b.expect_snapshot().await;
    b.wait_for(PROMPT, "warms", |b| !b.warms.is_empty()).await;
    // A quiet watch that answers etcd's progress requests is not silent: two TTLs in
    // which nothing changes end no stream.
    let quiet = Instant::now();
    while quiet.elapsed() < TTL * 2 {
        a.poll_now();
        assert!(a.ended.is_none(), "a quiet, live watch fenced a: {a:?}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    steer.hush_watches();
    let hushed = Instant::now();
    b.ready_all().await;
    let mut fenced_at = None;
    while hushed.elapsed() < TTL * 3 && fenced_at.is_none() {
        a.poll_now();
        b.poll_now();
        b.answer_all().await;
        if a.ended.is_some() && a.owned.is_empty() {
            fenced_at = Some(hushed.elapsed());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    steer.unhush_watches();
    let mut findings = Findings::default();
    // Three quarters of the TTL of silence, and a quarter TTL for the fence to reach `a`.
    let bound = TTL * 3 / 4 + TTL / 4;
    findings.check(
        fenced_at.is_some_and(|t| t < bound),
        format!("a was not fenced within {bound:?} of its relay's watch hanging: {fenced_at:?}; {a:?}"),
    );
    eprintln!("[faults] watch hung under a live lease: a fenced after {fenced_at:?}");
    findings.finish("watch hung without an error");
}

/// A non-leader instance is cut from etcd (a proxy) long enough for etcd to expire its
/// lease, while the leader never loses etcd; its consumers can reach only it. When it is
/// back they register again: nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_outlives_one_instances_lease_moves_nothing() {
    let (cluster, proxy) = leader_and_second(async |config| {
        let proxy = Proxy::in_front_of(&config.endpoints[0]).await;
        let behind = EtcdStore::connect(EtcdStoreConfig { endpoints: vec![proxy.url()], ..config })
            .await
            .expect("connect through the proxy");
        (Arc::new(behind) as Arc<dyn LeaseStore>, proxy)
    })
    .await;
    let c = cluster.consumer_on(0, "c", WIDE).await;
    let d = cluster.consumer_on(1, "d", WIDE).await;
    let e = cluster.consumer_on(1, "e", WIDE).await;
    let mut fleet = Fleet::from_streams(WIDE, vec![c, d, e]);
    fleet.settle(&cluster, RECOVERY).await;
    let before = fleet.owned();
    let key = |name: &str| format!("{}consumers/{WIDE}/{name}", cluster.config.prefix);
    proxy.partition();
    let cut = Instant::now();
    // Past the fence, until etcd has expired the instance's lease with its registrations.
    while cluster.store.get(&key("d")).await.expect("read").is_some() {
        assert!(cut.elapsed() < TTL * 3, "etcd never expired the cut-off instance's lease");
        fleet.live.values_mut().for_each(TestConsumer::poll_now);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let expired = cut.elapsed();
    proxy.restore();
    // Its consumers come back to it (and only it) once it serves again.
    let mut back = Vec::new();
    for name in ["d", "e"] {
        let since = Instant::now();
        let consumer = loop {
            match cluster.try_consumer_on(1, name, WIDE).await {
                Ok(consumer) => break consumer,
                Err(_) if since.elapsed() < PROMPT => tokio::time::sleep(POLL_INTERVAL * 5).await,
                Err(status) => panic!("{name} cannot register again: {status:?}"),
            }
        };
        back.push(consumer);
    }
    for consumer in back {
        if let Some(old) = fleet.live.insert(consumer.name.clone(), consumer) {
            fleet.retired.push(old);
        }
    }
    for consumer in fleet.live.values_mut() {
        if consumer.history.is_empty() {
            consumer.expect_snapshot().await;
        }
    }
    fleet.settle(&cluster, RECOVERY).await;
    let moved = moved(&before, &fleet.owned());
    let mut findings = Findings::default();
    findings
        .check(moved == 0, format!("{moved} partitions moved: before {before:?}, after {:?}", fleet.owned()));
    findings.extend("double ownership", fleet.double_ownership());
    eprintln!(
        "[faults] one instance's lease expired in an outage ({expired:?} after the cut): {moved} moved"
    );
    findings.finish("outage outliving one instance's lease");
}
