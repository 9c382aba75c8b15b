//! `--state-dir` (docs/design.md §10, docs/backends.md): the memory and static backends,
//! built from flags as `kafka-assigner serve` builds them, started several times on one
//! state dir, serve epochs (read from the outside through `WatchEpochs`) above every
//! earlier run's, also when the floor on disk was written by a run whose clock was an hour
//! ahead of ours (ours stepped back by an hour). Without `--state-dir` the static backend
//! keeps epoch 1 and the memory backend follows the clock alone, below such a floor: the
//! documented limit.

use std::{collections::BTreeMap, path::Path};

use kafka_assigner::epoch_floor::{FILE_NAME, FloorFile, now_micros};
use kafka_assigner::proto::v1::{
    WatchEpochsRequest, kafka_assigner_client::KafkaAssignerClient,
    ownership_epochs_client::OwnershipEpochsClient,
};
use kafka_assigner::server::AssignerServer;

use crate::support::{
    assigner::{PROMPT, TestConsumer},
    next_within,
};

const TOPIC: &str = "events";
/// An hour in microseconds: how far the clock is stepped back.
const HOUR: u64 = 3_600_000_000;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Static,
}

/// Starts `kind` from flags, with `--state-dir dir` when given.
async fn start(kind: Kind, dir: Option<&Path>) -> AssignerServer {
    let mut flags: Vec<String> =
        ["kafka-assigner", "serve", "--topic-partitions", "events=4"].iter().map(|s| s.to_string()).collect();
    let backend: &[&str] = match kind {
        Kind::Memory => &["--backend", "memory", "--lease-ttl", "1s"],
        Kind::Static => &["--backend", "static", "--static-assignment", "a=0-3"],
    };
    flags.extend(backend.iter().map(|s| s.to_string()));
    if let Some(dir) = dir {
        flags.extend(["--state-dir".into(), dir.display().to_string()]);
    }
    crate::support::serve_flags::serve_from_flags(&flags, &format!("{kind:?}")).await
}

/// One run: consumer `a` registers, owns all four partitions; returns their epochs as
/// `WatchEpochs` serves them; then the server stops.
async fn run(kind: Kind, dir: Option<&Path>) -> BTreeMap<u32, u64> {
    let server = start(kind, dir).await;
    let url = server.grpc_url();
    let client = KafkaAssignerClient::connect(url.clone()).await.expect("connect");
    let mut a = TestConsumer::register(client, "a", TOPIC).await.expect("a registers");
    a.wait_owned(4, PROMPT).await;
    let mut epochs = OwnershipEpochsClient::connect(url).await.expect("connect");
    let request = WatchEpochsRequest { consumer_name: "a".into(), topic: TOPIC.into() };
    let mut stream = epochs.watch_epochs(request).await.expect("a is registered").into_inner();
    let owned = loop {
        let snapshot = next_within(&mut stream, PROMPT, "an epoch snapshot").await.expect("not an error");
        let owned: BTreeMap<u32, u64> =
            snapshot.partitions.iter().filter(|p| !p.warming).map(|p| (p.partition, p.epoch)).collect();
        if owned.len() == 4 {
            break owned;
        }
    };
    drop((stream, a));
    server.stop().await;
    owned
}

fn lowest(epochs: &BTreeMap<u32, u64>) -> u64 {
    epochs.values().copied().min().unwrap_or(0)
}

fn highest(epochs: &BTreeMap<u32, u64>) -> u64 {
    epochs.values().copied().max().unwrap_or(0)
}

/// The floor a run whose clock read an hour later than ours would have left.
fn floor_from_a_clock_an_hour_ahead(dir: &Path) -> u64 {
    let file = FloorFile::open(dir).expect("the state dir");
    let floor = now_micros() + HOUR;
    file.write(floor).expect("write the floor");
    floor
}

async fn restarts_never_lower_the_epochs(kind: Kind) {
    let state = tempfile::tempdir().expect("temp dir");
    let dir = state.path();
    let first = run(kind, Some(dir)).await;
    assert!(dir.join(FILE_NAME).is_file(), "the floor file is written");
    let second = run(kind, Some(dir)).await;
    assert!(
        lowest(&second) > highest(&first),
        "{kind:?}: the restart's epochs {second:?} are above the first run's {first:?}"
    );

    let floor = floor_from_a_clock_an_hour_ahead(dir);
    let third = run(kind, Some(dir)).await;
    assert!(
        lowest(&third) > floor,
        "{kind:?}: with the clock an hour behind the last run's, the epochs {third:?} are above its floor {floor}"
    );
    // Without --state-dir nothing protects them: the documented limit.
    let without = run(kind, None).await;
    assert!(
        highest(&without) < floor,
        "{kind:?}: without --state-dir the epochs {without:?} are not above the floor {floor}"
    );
    eprintln!(
        "{kind:?}: first run {}..={}, restart {}..={}, floor of a clock an hour ahead {floor}, \
         run after it {}..={}, without --state-dir {}..={}",
        lowest(&first),
        highest(&first),
        lowest(&second),
        highest(&second),
        lowest(&third),
        highest(&third),
        lowest(&without),
        highest(&without)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_restarts_on_a_state_dir_never_lower_the_epochs() {
    restarts_never_lower_the_epochs(Kind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_restarts_on_a_state_dir_raise_every_epoch() {
    restarts_never_lower_the_epochs(Kind::Static).await;
    // And without it, today's constant.
    let plain = run(Kind::Static, None).await;
    assert!(plain.values().all(|epoch| *epoch == 1), "{plain:?}");
}
