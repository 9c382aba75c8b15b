//! The handoff bench's tables: the headline (handoff against the raw etcd chain), the
//! stages timed on their own, the steps inside each handoff, and the gap over the raw
//! chain split into parts that add up.
//!
//! Inside a handoff the steps follow one another, so per sample they add up to the whole;
//! p50s of steps do not (each is the middle of its own ordering). The breakdown therefore
//! uses the middle half of the samples (p25 to p75 of each path's total) and their means,
//! which add up exactly and, unlike plain means, ignore the machine's stalls.

use std::{fmt::Write, time::Duration, time::Instant};

use crate::probe::{Steps, signed_us};
use crate::stages::{SkeletonSteps, TxnSample};

/// One handoff through an instance: the bench's clock at each end, the probes' between.
#[derive(Clone, Copy)]
pub struct HandoffSample {
    /// B's call went out.
    pub start: Instant,
    /// B had its answer.
    pub answered: Instant,
    /// A had its release.
    pub received: Instant,
    /// The probes' notes.
    pub steps: Steps,
}

/// One handoff through the skeleton coordinator.
#[derive(Clone, Copy)]
pub struct SkeletonSample {
    /// B's call went out.
    pub start: Instant,
    /// B had its answer.
    pub answered: Instant,
    /// A had its release.
    pub received: Instant,
    /// The skeleton's notes.
    pub steps: SkeletonSteps,
}

/// Everything one run measured, sample by sample.
#[derive(Default)]
pub struct Samples {
    /// The raw etcd chain.
    pub raw: Vec<Duration>,
    /// The refused call's round trip.
    pub floor: Vec<Duration>,
    /// Handoffs through the benched instance (it leads).
    pub handoff: Vec<HandoffSample>,
    /// Handoffs through an instance nobody leads.
    pub leaderless: Vec<HandoffSample>,
    /// Handoffs through an instance whose leader is apart.
    pub apart: Vec<HandoffSample>,
    /// The transactions alone.
    pub txn: Vec<TxnSample>,
    /// The plan's and the relay views' CPU ([`crate::stages::CpuStages`]).
    pub cpu: Vec<(Duration, Duration)>,
    /// Handoffs through the skeleton, at once.
    pub skeleton: Vec<SkeletonSample>,
    /// Handoffs through the skeleton, after its transaction (the minimal instance).
    pub skeleton_txn: Vec<SkeletonSample>,
}

/// One handoff in µs, step by step: `grpc_in + before_txn + etcd + after_commit + grpc_out`
/// is `total`. The commit is seen when the instance's watch brings it back and the
/// instance's loop relays it; or, on the own-write fast path (the release left before the
/// watch brought the commit back), when the store answers and the loop relays it then.
#[derive(Clone, Copy)]
struct Path {
    grpc_in: f64,
    before_txn: f64,
    etcd: f64,
    after_commit: f64,
    grpc_out: f64,
    total: f64,
    /// Commit seen → the mirror has it and the streams were fed.
    relay: f64,
    /// Commit seen → B's `assigned` leaves.
    to_gain: f64,
    /// Start → B has its answer.
    answered: f64,
    /// The store's answer after the watch brought the commit back.
    answer_lag: Option<f64>,
    /// The leader's plan of the topic, and how much of it fell in commit seen → release.
    plan: Option<(f64, f64)>,
    /// The loop relayed the write on the store's answer (the fast path).
    fast: bool,
}

fn path(s: &HandoffSample) -> Option<Path> {
    let t = &s.steps;
    let left = t.release_left?;
    let fast = t.watched.is_none_or(|w| left < w);
    let (seen, relayed) = if fast { (t.txn_done?, t.returned?) } else { (t.watched?, t.relayed?) };
    let plan = t
        .plan_started
        .zip(t.plan_done)
        .map(|(from, to)| (signed_us(from, to), signed_us(from.max(seen), to.min(left)).max(0.0)));
    Some(Path {
        grpc_in: signed_us(s.start, t.entered?),
        before_txn: signed_us(t.entered?, t.txn_sent?),
        etcd: signed_us(t.txn_sent?, seen),
        after_commit: signed_us(seen, left),
        grpc_out: signed_us(left, s.received),
        total: signed_us(s.start, s.received),
        relay: signed_us(seen, relayed),
        to_gain: signed_us(seen, t.gain_left?),
        answered: signed_us(s.start, s.answered),
        answer_lag: Steps::between(t.watched, t.txn_done),
        plan,
        fast,
    })
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `p` quantile (NaN when empty).
fn pct(values: impl IntoIterator<Item = f64>, p: f64) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_unstable_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn p50(values: impl IntoIterator<Item = f64>) -> f64 {
    pct(values, 0.5)
}

/// The samples from p25 to p75 of `key`.
fn middle<T: Copy>(items: &[T], key: fn(&T) -> f64) -> Vec<T> {
    let mut sorted = items.to_vec();
    sorted.sort_unstable_by(|a, b| key(a).total_cmp(&key(b)));
    let n = sorted.len();
    sorted[n / 4..n - n / 4].to_vec()
}

fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values.into_iter().fold((0.0, 0), |(s, n), v| (s + v, n + 1));
    sum / n as f64
}

/// The mean of the middle half of `values`.
fn mid_mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.into_iter().collect();
    mean(middle(&v, |x| *x))
}

/// µs shown as the headline shows durations; `—` for nothing measured.
fn show(x: f64) -> String {
    if x.is_nan() {
        return "—".into();
    }
    let d = format!("{:.2?}", Duration::from_secs_f64(x.abs() / 1e6));
    if x < 0.0 { format!("−{d}") } else { d }
}

/// The parts of the gap over the raw chain, in the breakdown's row order.
fn parts(paths: &[Path], raw: f64, txn: [f64; 3]) -> [f64; 13] {
    let [one, ready, store] = txn;
    let m = middle(paths, |p| p.total);
    let avg = |f: fn(&Path) -> f64| mean(m.iter().map(f));
    let etcd = avg(|p| p.etcd);
    let after = avg(|p| p.after_commit);
    [
        avg(|p| p.total) - raw,
        avg(|p| p.grpc_in) + avg(|p| p.grpc_out),
        avg(|p| p.before_txn),
        etcd - raw,
        ready - one,
        store - ready,
        etcd - store,
        one - raw,
        after,
        avg(|p| p.relay),
        avg(|p| p.to_gain - p.relay),
        avg(|p| p.after_commit - p.to_gain),
        avg(|p| p.plan.map_or(0.0, |(_, on_path)| on_path)),
    ]
}

/// Writes the run's tables (Markdown).
pub fn tables(s: &Samples, samples: u32) -> String {
    let raw: Vec<f64> = s.raw.iter().map(|d| us(*d)).collect();
    let floor: Vec<f64> = s.floor.iter().map(|d| us(*d)).collect();
    let total = |v: &[HandoffSample]| v.iter().map(|h| signed_us(h.start, h.received)).collect::<Vec<_>>();
    let (ours, apart_total) = (total(&s.handoff), total(&s.apart));
    let leaderless_total = total(&s.leaderless);
    let txn = |f: fn(&TxnSample) -> Duration| s.txn.iter().map(|t| us(f(t))).collect::<Vec<_>>();
    let (one, ready, store, metered) =
        (txn(|t| t.one), txn(|t| t.ready), txn(|t| t.store), txn(|t| t.metered));
    let skel = |v: &[SkeletonSample], f: fn(&SkeletonSample) -> Option<f64>| {
        v.iter().filter_map(f).collect::<Vec<_>>()
    };
    let skel_total = |v: &[SkeletonSample]| skel(v, |k| Some(signed_us(k.start, k.received)));
    let (skeleton, minimal) = (skel_total(&s.skeleton), skel_total(&s.skeleton_txn));
    let (raw50, raw99) = (p50(raw.clone()), pct(raw.clone(), 0.99));
    let (our50, our99) = (p50(ours.clone()), pct(ours.clone(), 0.99));
    let (floor50, floor99) = (p50(floor.clone()), pct(floor.clone(), 0.99));
    let mut out = String::new();
    // The headline, as before.
    let _ = write!(
        out,
        "| path ({samples} samples, etcd 3.4 on loopback) | p50 | p99 |\n| --- | --- | --- |\n\
         | raw etcd: CAS txn → another client's watch | {} | {} |\n\
         | handoff: PartitionReady → old owner gets ReleasePartition | {} | {} |\n\
         | ratio handoff / raw | {:.2}× | {:.2}× |\n\
         | gRPC floor: a PartitionReady refused before the store, round trip | {} | {} |\n\
         | ratio (raw + floor) / raw: the least two gRPC hops allow | {:.2}× | |\n\
         | handoff − raw − floor at p50: the instance's own work | {} | |\n",
        show(raw50),
        show(raw99),
        show(our50),
        show(our99),
        our50 / raw50,
        our99 / raw99,
        show(floor50),
        show(floor99),
        (raw50 + floor50) / raw50,
        show((our50 - raw50 - floor50).max(0.0)),
    );
    if s.txn.is_empty() {
        return out; // `HANDOFF_STAGES=0`
    }
    // The stages on their own.
    out.push_str(
        "\n**Stages on their own** (same run, interleaved with the rows above):\n\n\
         | stage | p50 | p99 |\n| --- | --- | --- |\n",
    );
    let row = |out: &mut String, name: &str, v: &[f64]| {
        let _ = writeln!(out, "| {name} | {} | {} |", show(p50(v.to_vec())), show(pct(v.to_vec(), 0.99)));
    };
    row(&mut out, "etcd txn alone, 1 compare + 1 put (`etcd_client`, nobody watching)", &one);
    let _ = writeln!(
        out,
        "| → the raw chain's watch delivery: raw − txn alone, p50s | {} | |",
        show(raw50 - p50(one.clone()))
    );
    row(
        &mut out,
        "etcd txn alone, the shape of PartitionReady's: 3 compares + 2 puts (`etcd_client`)",
        &ready,
    );
    row(&mut out, "the same through the crate's `EtcdStore`", &store);
    row(&mut out, "the same through `MeteredStore` over `EtcdStore` (as `serve` runs it)", &metered);
    let cpu = |f: fn(&(Duration, Duration)) -> Duration| s.cpu.iter().map(|c| us(f(c))).collect::<Vec<_>>();
    row(
        &mut out,
        "CPU: the leader's plan of a topic like the benched one (clone, plan, diff)",
        &cpu(|c| c.0),
    );
    row(&mut out, "CPU: the relay's views of A and B and their diffs (`ConsumerView::of`)", &cpu(|c| c.1));
    row(
        &mut out,
        "gRPC skeleton: PartitionReady → a coordinator that only pushes ReleasePartition to A",
        &skeleton,
    );
    row(
        &mut out,
        "minimal instance: the skeleton, committing the ready's txn through `EtcdStore` first",
        &minimal,
    );
    let _ = writeln!(out, "| ratio minimal instance / raw | {:.2}× | |", p50(minimal.clone()) / raw50);
    row(
        &mut out,
        "handoff with no plan at all: nobody leads (the bench holds the leader key)",
        &leaderless_total,
    );
    let _ = writeln!(
        out,
        "| ratio handoff with no plan / raw | {:.2}× | |",
        p50(leaderless_total.clone()) / raw50
    );
    row(
        &mut out,
        "handoff, the leader apart (another instance, on a thread and runtime of its own)",
        &apart_total,
    );
    let _ = writeln!(
        out,
        "| ratio handoff with the leader apart / raw | {:.2}× | |",
        p50(apart_total.clone()) / raw50
    );
    // The steps.
    let columns: Vec<Vec<Path>> =
        [&s.handoff, &s.leaderless, &s.apart].map(|v| v.iter().filter_map(path).collect()).into();
    let skel_in = skel(&s.skeleton_txn, |k| Steps::between(Some(k.start), k.steps.entered));
    let skel_txn = skel(&s.skeleton_txn, |k| Steps::between(k.steps.entered, k.steps.pushed));
    let skel_out = skel(&s.skeleton_txn, |k| Steps::between(k.steps.pushed, Some(k.received)));
    let skel_answer = skel(&s.skeleton_txn, |k| Some(signed_us(k.start, k.answered)));
    out.push_str(
        "\n**Inside each handoff**, p50 of each step (the instance's steps from pass-through probes around \
         its coordinator, its store and the leader's plan; the commit is seen when the instance's watch \
         brings it back to the instance's loop, which relays it, unless the loop had the store's answer \
         first and relayed it then: the fast path, counted below):\n\n\
         | step | handoff (benched: the instance leads) | no plan | the leader apart | minimal instance |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    let step = |out: &mut String, name: &str, f: fn(&Path) -> Option<f64>, m: &[f64]| {
        let cells: Vec<String> = columns.iter().map(|c| show(p50(c.iter().filter_map(f)))).collect();
        let _ = writeln!(out, "| {name} | {} | {} |", cells.join(" | "), show(p50(m.to_vec())));
    };
    step(&mut out, "B's call reaches the coordinator (gRPC in)", |p| Some(p.grpc_in), &skel_in);
    step(&mut out, "coordinator, until its txn goes to etcd", |p| Some(p.before_txn), &[]);
    step(
        &mut out,
        "txn sent → commit seen (minimal: call arrived → release pushed)",
        |p| Some(p.etcd),
        &skel_txn,
    );
    step(&mut out, "commit seen → relay done (mirror applied, streams fed)", |p| Some(p.relay), &[]);
    step(&mut out, "commit seen → B's `assigned` leaves for gRPC", |p| Some(p.to_gain), &[]);
    step(&mut out, "commit seen → A's release leaves for gRPC", |p| Some(p.after_commit), &[]);
    step(&mut out, "A's release leaves → A has it (gRPC out)", |p| Some(p.grpc_out), &skel_out);
    step(&mut out, "A has its release: the handoff", |p| Some(p.total), &minimal);
    step(&mut out, "B has its answer", |p| Some(p.answered), &skel_answer);
    step(
        &mut out,
        "the store's answer to the call after the watch brought the commit back",
        |p| p.answer_lag,
        &[],
    );
    step(
        &mut out,
        "the leader's plan of the topic (its last pass begun before the release left)",
        |p| p.plan.map(|(all, _)| all),
        &[],
    );
    step(&mut out, "… of it between commit seen and release leaves", |p| p.plan.map(|(_, on)| on), &[]);
    let count = |f: fn(&Path) -> bool| {
        columns
            .iter()
            .map(|c| format!("{}/{}", c.iter().filter(|p| f(p)).count(), c.len()))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let _ = writeln!(
        out,
        "| handoffs whose commit the watch brought back before the store's answer | {} | |\n\
         | handoffs relayed on the store's answer (the own-write fast path) | {} | |\n\
         | handoffs whose release waited while the leader planned the topic | {} | |",
        count(|p| p.answer_lag.is_some_and(|lag| lag > 0.0)),
        count(|p| p.fast),
        count(|p| p.plan.is_some_and(|(_, on)| on > 0.0)),
    );
    // The breakdown.
    let raw_mid = mid_mean(raw.clone());
    let txns = [mid_mean(one.clone()), mid_mean(ready.clone()), mid_mean(store.clone())];
    let parted: Vec<[f64; 13]> = columns.iter().map(|c| parts(c, raw_mid, txns)).collect();
    out.push_str(
        "\n**The gap over the raw chain, part by part**: means of the middle half of each path's samples \
         (p25 to p75), which add up, unlike p50s; each part's share of the gap.\n\n\
         | part | handoff (benched) | share | no plan | share | the leader apart | share |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let names = [
        "gap: handoff − raw chain",
        "gRPC in + out",
        "coordinator until its txn (validation, cache read, the hop to the instance's loop)",
        "txn sent → commit seen, over the raw chain",
        "  the ready's shape: 3 + 2 vs 1 + 1 (`etcd_client` alone)",
        "  the store layer: `EtcdStore` vs `etcd_client` (alone)",
        "  inside the instance: its txn sent → commit seen vs `EtcdStore` alone",
        "  the chain's watch delivery, which the handoff does not wait for",
        "commit seen → A's release leaves",
        "  commit seen → relay done (mirror applied, streams fed)",
        "  relay done → B's `assigned` leaves (B's stream task)",
        "  B's `assigned` left → A's release leaves (the gains-first gate, A's stream task)",
        "  the leader's plan of the topic, within the three above",
    ];
    for (i, name) in names.iter().enumerate() {
        let cells: Vec<String> = parted
            .iter()
            .map(|p| {
                let share = if i == 0 { String::new() } else { format!("{:.0} %", 100.0 * p[i] / p[0]) };
                format!("{} | {share}", show(p[i]))
            })
            .collect();
        let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
    }
    let skel_grpc =
        mean(middle(&s.skeleton, |k| signed_us(k.start, k.received)).iter().filter_map(|k| {
            Some(signed_us(k.start, k.steps.entered?) + signed_us(k.steps.pushed?, k.received))
        }));
    let floor_mid = mid_mean(floor.clone());
    let own: Vec<String> = parted.iter().map(|p| show(p[0] - floor_mid)).collect();
    let _ = writeln!(
        out,
        "\nFor scale, same means: the gRPC floor (a refused call's round trip) {}; the skeleton's gRPC in + out {}; \
         handoff − raw − floor (the headline's \"own work\") {} benched, {} with no plan, {} with the leader apart.",
        show(floor_mid),
        show(skel_grpc),
        own[0],
        own[1],
        own[2],
    );
    out.push_str(
        "\nThese paths share the machine with the headline's and move it: `HANDOFF_STAGES=0 cargo bench \
         --bench handoff` runs the headline's three alone, as before they existed.\n",
    );
    out
}
