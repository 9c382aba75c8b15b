//! Faults across a real network, with containers (docs/containers-faults.md has the table):
//! an assigner cut from etcd by `docker network disconnect`, the leader assigner's container
//! killed, a rolling restart of both assigner containers, the etcd raft leader's container
//! killed in a three-member cluster, and etcd paused past the TTL.
//!
//! etcd and the assigners run in containers (`stack.rs`, images from `scripts/images`); the
//! consumers run in the test process (`fleet.rs`, the client library), and every check is
//! made from what they were told: no partition with two owners, none that changes owner
//! when nothing should move, and how long each consumer held less than before. Times are
//! printed (`[container-faults] ...`, run with `--nocapture`). The scenarios run one at a
//! time (they measure against the TTL on a shared machine).

mod fleet;
mod stack;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use self::{
    fleet::Fleet,
    stack::{PARTITIONS, START, Stack},
};
use crate::support::docker::{ETCD_IMAGE, assigner_image, available, leader, ready, status};
use crate::support::findings::Findings;

/// Session TTL of the scenarios that measure against it (etcd TTLs are whole seconds).
const TTL: Duration = Duration::from_secs(2);
/// The assigner's default `--lease-ttl`.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// One container scenario at a time, here and in `compose_up`.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The checks a fault that must move nothing ends with, from what the consumers were told:
/// no partition moved since `from` (noted under `moved`) and none owned twice. Returns each
/// consumer's longest processing pause since `from` and the longest assigned/release overlap,
/// for the report.
fn nothing_moved(
    findings: &mut Findings,
    fleet: &Fleet,
    names: &[&str],
    moved: &str,
    from: Instant,
    before: &BTreeMap<u32, String>,
) -> (Vec<Duration>, Duration) {
    findings.extend(moved, fleet.moved_since(from, before));
    let (double, overlap) = fleet.double_owners();
    findings.extend("double owner", double);
    (pauses_since(fleet, names, from), overlap)
}

/// Each consumer's longest processing pause since `from`.
fn pauses_since(fleet: &Fleet, names: &[&str], from: Instant) -> Vec<Duration> {
    names.iter().map(|n| fleet.longest_pause(n, from)).collect()
}

/// Whether Docker and both images are there (see `support::docker::available`).
fn can_run(test: &str) -> bool {
    available(test, &[ETCD_IMAGE, &assigner_image()])
}

/// Polls `f` every 20 ms until it holds; `false` if `deadline` passes first.
async fn eventually<F: AsyncFnMut() -> bool>(deadline: Duration, mut f: F) -> bool {
    let give_up = Instant::now() + deadline;
    while Instant::now() < give_up {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Starts a0, waits until it leads, then starts a1.
async fn two_assigners(stack: &mut Stack) {
    stack.start_assigner(0).await;
    assert_eq!(stack.wait_leader(&[0], START).await, "a0", "the first instance leads");
    stack.start_assigner(1).await;
}

/// Consumer names and endpoints: `c<k>` starts on a0 for even `k`, on a1 for odd, and
/// knows both.
fn spread(stack: &Stack, names: &'static [&'static str]) -> Vec<(&'static str, Vec<String>)> {
    let (u0, u1) = (stack.grpc_url(0), stack.grpc_url(1));
    names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            (*n, if k % 2 == 0 { vec![u0.clone(), u1.clone()] } else { vec![u1.clone(), u0.clone()] })
        })
        .collect()
}

/// a0 (the leader) is cut from etcd by `docker network disconnect`; b0 and b1 reach only
/// a0, c0 and c1 only a1. b0 and b1 must be told they lost everything and see their
/// streams end within the TTL; c0 and c1 take every partition; nothing has two owners.
/// After `docker network connect`, a0 is ready again and a consumer new to it (d0) is
/// given partitions through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigner_cut_from_etcd_fences_its_consumers() {
    if can_run("assigner_cut_from_etcd_fences_its_consumers") {
        isolation(false).await;
    }
}

/// The same, with clients that give up on a call after 500 ms, and b0 and b1 (which kept
/// retrying a0) are given partitions again too: the `Register`s they gave up on, carried
/// out once etcd is back, must not replace their live attempts (docs/containers-faults.md,
/// docs/design.md §6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_a_reconnected_assigner_come_back() {
    if can_run("consumers_of_a_reconnected_assigner_come_back") {
        isolation(true).await;
    }
}

async fn isolation(old_consumers_come_back: bool) {
    let _serial = SERIAL.lock().await;
    // 3 s: the instance fences itself at 3/4 of the TTL without a renewal; a longer TTL
    // leaves a loaded machine more room to show that before the TTL.
    let mut stack = Stack::start(1, Duration::from_secs(3)).await;
    two_assigners(&mut stack).await;
    let (u0, u1) = (vec![stack.grpc_url(0)], vec![stack.grpc_url(1)]);
    // The stricter variant gives up on a Register after 500 ms rather than 2 s: more
    // Registers abandoned while a0 waits for etcd.
    let call_timeout = Duration::from_millis(if old_consumers_come_back { 500 } else { 2000 });
    let consumers = [("b0", u0.clone()), ("b1", u0.clone()), ("c0", u1.clone()), ("c1", u1)];
    let mut fleet = Fleet::join_with(&consumers, stack.ttl, call_timeout);
    fleet.settle(&["b0", "b1", "c0", "c1"], START).await;
    let mut findings = Findings::default();

    let cut = Instant::now();
    stack.assigner(0).disconnect(&stack.back).await;
    let took_over = eventually(START, async || {
        let owned = fleet.owned();
        owned["b0"].is_empty()
            && owned["b1"].is_empty()
            && owned["c0"].len() + owned["c1"].len() == PARTITIONS as usize
    })
    .await;
    findings.check(took_over, format!("c0 and c1 did not take every partition: {:?}", fleet.owned()));
    for b in ["b0", "b1"] {
        let (emptied, down) = (fleet.emptied_after(b, cut), fleet.stream_down_after(b, cut));
        findings.check(
            emptied.is_some_and(|t| t < stack.ttl),
            format!("{b} not told to stop within the TTL: {emptied:?}"),
        );
        findings.check(
            down.is_some_and(|t| t < stack.ttl),
            format!("{b}'s stream did not end within the TTL: {down:?}"),
        );
        eprintln!("[container-faults] isolation: {b} emptied after {emptied:?}, stream ended after {down:?}");
    }
    findings.check(!ready(stack.admin(0)).await, "the cut-off assigner still reports ready");

    stack.assigner(0).connect(&stack.back, &stack.back_ip(0)).await;
    let joined = Instant::now();
    let serves = eventually(START, async || ready(stack.admin(0)).await).await;
    findings.check(serves, "a0 is not ready again after docker network connect");
    fleet.add("d0", &u0, stack.ttl);
    let fed = eventually(START, async || {
        let owned = fleet.owned();
        !owned["d0"].is_empty() && fleet.owners().len() == PARTITIONS as usize
    })
    .await;
    findings.check(fed, format!("d0, new on a0, got nothing after the reconnect: {:?}", fleet.owned()));
    eprintln!("[container-faults] isolation: a0 ready and serving d0 after {:?}", joined.elapsed());
    let back = eventually(Duration::from_secs(if old_consumers_come_back { 30 } else { 5 }), async || {
        let owned = fleet.owned();
        !owned["b0"].is_empty() && !owned["b1"].is_empty()
    })
    .await;
    let back_after = joined.elapsed();
    let (ended0, ended1) = (fleet.ended("b0").await, fleet.ended("b1").await);
    eprintln!(
        "[container-faults] isolation: b0 and b1 own partitions again: {back}, {back_after:?} after the connect \
         (b0's client ended: {ended0:?}, b1's: {ended1:?})"
    );
    if old_consumers_come_back {
        findings.check(
            back,
            format!("b0 and b1 got nothing back: {:?}; ended: {ended0:?}, {ended1:?}", fleet.owned()),
        );
    }
    let (double, overlap) = fleet.double_owners();
    findings.extend("double owner", double);
    eprintln!("[container-faults] isolation: longest assigned/release overlap {overlap:?}");
    if !findings.is_empty() {
        eprintln!("a0 logs:\n{}", stack.assigner(0).logs());
    }
    findings.finish("assigner cut from etcd");
}

/// The leader assigner's container is killed (`docker kill`): a1 leads within TTL + 1 s,
/// the consumers that were on a0 reconnect to a1, and no partition is lost, moved or owned
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_assigner_killed_fails_over_within_the_ttl() {
    if !can_run("leader_assigner_killed_fails_over_within_the_ttl") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut stack = Stack::start(1, TTL).await;
    two_assigners(&mut stack).await;
    let names = &["c0", "c1", "c2"];
    let fleet = Fleet::join(&spread(&stack, names), stack.ttl);
    let before = fleet.settle(names, START).await;
    let mut findings = Findings::default();

    let killed = Instant::now();
    stack.assigner(0).act("kill").await;
    let mut failover = None;
    let led = eventually(START, async || {
        let leads = status(stack.admin(1)).await.as_ref().and_then(leader).as_deref() == Some("a1");
        if leads && ready(stack.admin(1)).await {
            failover = Some(killed.elapsed());
        }
        failover.is_some()
    })
    .await;
    findings.check(led, "a1 never led");
    findings.check(
        failover.is_some_and(|t| t <= stack.ttl + Duration::from_secs(1)),
        format!("failover took {failover:?}, more than TTL + 1 s"),
    );
    let whole =
        eventually(START, async || names.iter().all(|n| fleet.connected(n)) && fleet.owners() == before)
            .await;
    findings.check(whole, format!("the consumers do not own what they owned before: {:?}", fleet.owned()));
    let (pauses, overlap) = nothing_moved(&mut findings, &fleet, names, "moved", killed, &before);
    eprintln!(
        "[container-faults] leader kill: failover after {failover:?}; processing pauses {pauses:?}; longest assigned/release overlap {overlap:?}"
    );
    findings.finish("leader assigner killed");
}

/// Both assigner containers are replaced one after the other (`docker stop`: SIGTERM, then
/// a new container at the same address) under four consumers at the default TTL: no
/// partition changes owner, nothing is owned twice; each consumer's processing pause and
/// longest stream outage are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_moves_nothing() {
    if !can_run("rolling_restart_moves_nothing") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut stack = Stack::start(1, DEFAULT_TTL).await;
    two_assigners(&mut stack).await;
    let names = &["c0", "c1", "c2", "c3"];
    let fleet = Fleet::join(&spread(&stack, names), stack.ttl);
    let before = fleet.settle(names, START).await;
    let mut findings = Findings::default();

    let began = Instant::now();
    for i in [0, 1] {
        let stopping = Instant::now();
        stack.assigner(i).act("stop").await;
        let stopped = stopping.elapsed();
        stack.remove_assigner(i);
        stack.start_assigner(i).await;
        let back =
            eventually(START, async || names.iter().all(|n| fleet.connected(n)) && fleet.owners() == before)
                .await;
        findings.check(
            back,
            format!(
                "after restarting a{i}: the consumers do not own what they owned before: {:?}",
                fleet.owned()
            ),
        );
        eprintln!(
            "[container-faults] rolling restart: a{i} stopped in {stopped:?}, replaced and settled after {:?}",
            stopping.elapsed()
        );
    }
    let (pauses, overlap) = nothing_moved(&mut findings, &fleet, names, "moved", began, &before);
    eprintln!("[container-faults] rolling restart: longest assigned/release overlap {overlap:?}");
    for (n, pause) in names.iter().zip(pauses) {
        eprintln!(
            "[container-faults] rolling restart: {n} processing pause {pause:?}, longest stream outage {:?}",
            fleet.longest_disconnect(n, began)
        );
    }
    findings.finish("rolling restart");
}

/// Three etcd members in containers; the raft leader's container is killed under two
/// assigners at the default TTL. Nothing moves: every consumer keeps what it owned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_moves_nothing() {
    if !can_run("etcd_leader_killed_moves_nothing") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut stack = Stack::start(3, DEFAULT_TTL).await;
    two_assigners(&mut stack).await;
    let names = &["c0", "c1", "c2"];
    let fleet = Fleet::join(&spread(&stack, names), stack.ttl);
    let before = fleet.settle(names, START).await;
    let mut findings = Findings::default();

    let mut old = None;
    assert!(
        eventually(START, async || {
            old = stack.etcd_leader().await;
            old.is_some()
        })
        .await,
        "no etcd leader"
    );
    let old = old.unwrap_or_default();
    let killed = Instant::now();
    stack.etcd[old].act("kill").await;
    let mut elected = None;
    let reelected = eventually(START, async || {
        if let Some(m) = stack.etcd_leader().await.filter(|m| *m != old) {
            elected = Some((m, killed.elapsed()));
        }
        elected.is_some()
    })
    .await;
    findings.check(reelected, "the two remaining etcd members elected no leader");
    // Watch a few more seconds: a late consequence (a session expiring) would show here.
    let settled =
        eventually(START, async || ready(stack.admin(0)).await && ready(stack.admin(1)).await).await;
    findings.check(settled, "an assigner is not ready after the etcd election");
    tokio::time::sleep(Duration::from_secs(3)).await;
    findings.check(fleet.owners() == before, format!("owners changed: {:?}", fleet.owned()));
    let (pauses, overlap) = nothing_moved(&mut findings, &fleet, names, "moved", killed, &before);
    eprintln!(
        "[container-faults] etcd leader e{old} killed: new leader {elected:?}; processing pauses {pauses:?}; longest assigned/release overlap {overlap:?}"
    );
    findings.finish("etcd leader killed");
}

/// etcd is paused (`docker pause`) for longer than the TTL, then unpaused. Once it is back,
/// nothing moves: every consumer ends up with what it owned before, and no partition goes
/// to anyone else; nothing is owned twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_paused_past_the_ttl_moves_nothing_after() {
    if !can_run("etcd_paused_past_the_ttl_moves_nothing_after") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut stack = Stack::start(1, TTL).await;
    two_assigners(&mut stack).await;
    let names = &["c0", "c1", "c2"];
    let fleet = Fleet::join(&spread(&stack, names), stack.ttl);
    let before = fleet.settle(names, START).await;
    let mut findings = Findings::default();

    let paused = Instant::now();
    stack.etcd[0].act("pause").await;
    tokio::time::sleep(stack.ttl + Duration::from_millis(1500)).await;
    stack.etcd[0].act("unpause").await;
    let resumed = Instant::now();
    let whole = eventually(START, async || {
        ready(stack.admin(0)).await && ready(stack.admin(1)).await && fleet.owners() == before
    })
    .await;
    findings.check(whole, format!("the consumers do not own what they owned before: {:?}", fleet.owned()));
    findings.extend("moved after etcd returned", fleet.moved_since(resumed, &before));
    let (double, overlap) = fleet.double_owners();
    findings.extend("double owner", double);
    let pauses = pauses_since(&fleet, names, paused);
    eprintln!(
        "[container-faults] etcd paused {:?}: all back {:?} after it resumed; processing pauses {pauses:?}; longest assigned/release overlap {overlap:?}",
        resumed - paused,
        resumed.elapsed()
    );
    findings.finish("etcd paused");
}
