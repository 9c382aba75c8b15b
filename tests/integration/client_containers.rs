//! The assigner in Docker containers (cargo feature `testcontainers`), through
//! `kafka_assigner::testing::containers` exactly as a user's suite would, with the client
//! library: the memory backend in one container; etcd and two assigners on a private
//! network with a warm handoff; an assigner container killed (`docker kill`) under a
//! consumer, which reconnects to the other one and keeps its partitions; the static
//! backend configured by environment variables.
//!
//! **Needs a Docker engine and the images** (`scripts/images`, which `scripts/test` runs).
//! Without an engine these tests print that they are skipped, unless `CI` is set: there a
//! missing engine fails them. Every check is on what the clients were told (the
//! [`Recorder`]'s handler calls and each client's owned set), and on `/status`.

use std::{collections::BTreeSet, time::Duration};

use kafka_assigner::cli::status::Status;
use kafka_assigner::client::{AssignerClient, Backoff, ClientConfig, ShutdownOutcome};
use kafka_assigner::testing::containers::{
    AssignerImage, EtcdNetwork, client_config, engine_available, images_available, kill, log_to_stderr,
    status,
    testcontainers::{ContainerAsync, ImageExt, runners::AsyncRunner},
    unique_name,
};
use prometheus_client::registry::Registry;

use crate::client::{Call, Recorder, wait_owned};

const TOPIC: &str = "payments";
/// The session TTL of the assigners here (the image's test default).
const TTL: Duration = Duration::from_secs(2);

/// Whether Docker can be used: an engine answers and both images are there. Without an
/// engine the test is skipped with a message, except under CI (`CI` set) where that fails.
async fn docker() -> bool {
    match engine_available().await {
        Ok(()) => {}
        Err(error) if std::env::var_os("CI").is_some() => {
            panic!("CI is set, and the container tests need Docker: {error}")
        }
        Err(error) => {
            eprintln!("skipped: {error} (with CI set, this is a failure)");
            return false;
        }
    }
    images_available().await.unwrap_or_else(|e| panic!("{e}"));
    true
}

/// Quick reconnects, as a test wants them (the defaults back off up to 2 s).
fn quick(mut config: ClientConfig) -> ClientConfig {
    config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    config.drain_timeout = Duration::from_secs(10);
    config
}

/// Starts the memory-backend image with the test topic, its logs copied to stderr.
async fn memory_assigner(name: &str) -> ContainerAsync<AssignerImage> {
    let started = std::time::Instant::now();
    let container = AssignerImage::default()
        .with_topics(&[(TOPIC, 4)])
        .with_log_consumer(log_to_stderr(name))
        .start()
        .await
        .unwrap_or_else(|e| panic!("the {name} container starts: {e}"));
    // Reported in the README ("Testing with kafka-assigner"): start to ready.
    println!("{name}: container ready {:?} after the start call", started.elapsed());
    container
}

/// Two assigners on `etcd`'s network, instances `assigner-0` and `assigner-1`, started
/// together.
async fn two_assigners(etcd: &EtcdNetwork) -> (ContainerAsync<AssignerImage>, ContainerAsync<AssignerImage>) {
    let image = |id: &str| AssignerImage::default().with_topics(&[(TOPIC, 4)]).with_instance_id(id);
    let (name0, name1) = (unique_name("assigner-0"), unique_name("assigner-1"));
    let (zero, one) = tokio::join!(
        etcd.start_assigner(image("assigner-0"), &name0),
        etcd.start_assigner(image("assigner-1"), &name1)
    );
    (zero.expect("assigner-0 starts"), one.expect("assigner-1 starts"))
}

/// A client configuration for `name` with these endpoints, reconnecting quickly.
async fn config(containers: &[&ContainerAsync<AssignerImage>], name: &str) -> ClientConfig {
    quick(client_config(containers, name, TOPIC).await.expect("client configuration"))
}

/// Partitions `consumer` owns in `status`.
fn owned_in(status: &Status, consumer: &str) -> BTreeSet<u32> {
    let Some(topic) = status.topics.iter().find(|t| t.topic == TOPIC) else { return BTreeSet::new() };
    (0..).zip(&topic.owners).filter(|(_, o)| o.as_deref() == Some(consumer)).map(|(p, _)| p).collect()
}

/// The instance holding `consumer`'s stream, per `status`.
fn instance_of(status: &Status, consumer: &str) -> Option<String> {
    let topic = status.topics.iter().find(|t| t.topic == TOPIC)?;
    topic.consumers.iter().find(|c| c.name == consumer).map(|c| c.instance.clone())
}

/// Waits until `container`'s `/status` satisfies `pred`.
async fn wait_status(
    container: &ContainerAsync<AssignerImage>,
    what: &str,
    mut pred: impl FnMut(&Status) -> bool,
) -> Status {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let last = status(container).await;
        if let Ok(s) = &last
            && pred(s)
        {
            return last.expect("checked");
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}; last: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Both clients settled: disjoint halves covering the topic, as `/status` says too.
async fn settled(
    container: &ContainerAsync<AssignerImage>,
    a: &AssignerClient,
    b: &AssignerClient,
) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let owned_a = wait_owned(&mut a.owned(), "a owns half", |o| o.len() == 2).await;
    let owned_b = wait_owned(&mut b.owned(), "b owns half", |o| o.len() == 2).await;
    assert!(owned_a.is_disjoint(&owned_b), "one owner per partition: a {owned_a:?}, b {owned_b:?}");
    wait_status(container, "the status agrees with both clients", |s| {
        owned_in(s, "a") == *a.owned().borrow() && owned_in(s, "b") == *b.owned().borrow()
    })
    .await;
    (owned_a, owned_b)
}

/// The partitions that moved from `from` to `to` went by warm handoff: `to` was warmed
/// before it was assigned each, `from` released it (and was never told to drop it).
fn warm_handoffs(moved: &BTreeSet<u32>, from: &Recorder, to: &Recorder) {
    for &p in moved {
        let warmed = to.when(Call::WarmDone(p)).unwrap_or_else(|| panic!("warmed {p}: {:?}", to.kinds()));
        let assigned = to.when(Call::Assigned(p)).unwrap_or_else(|| panic!("assigned {p}: {:?}", to.kinds()));
        assert!(warmed <= assigned, "warm({p}) returns before assigned({p}): {:?}", to.kinds());
        assert!(from.when(Call::Release(p)).is_some(), "released {p}: {:?}", from.kinds());
        assert!(
            !from.kinds().contains(&Call::Unassigned(p)),
            "a handoff, not an unassign: {:?}",
            from.kinds()
        );
    }
}

/// The memory backend in one container; two clients of the library share its topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_container_two_clients_share() {
    if !docker().await {
        return;
    }
    let assigner = memory_assigner("assigner").await;
    let (a, b) = (Recorder::new(), Recorder::new());
    let client_a = AssignerClient::start(config(&[&assigner], "a").await, a.clone(), None).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&[&assigner], "b").await, b.clone(), None).expect("client b");
    let (_, owned_b) = settled(&assigner, &client_a, &client_b).await;
    warm_handoffs(&owned_b, &a, &b);
    assert_eq!(client_a.shutdown().await.expect("a"), ShutdownOutcome::ShutdownNow);
    assert_eq!(client_b.shutdown().await.expect("b"), ShutdownOutcome::ShutdownNow);
}

/// etcd and two assigners on a private network; each client talks to its own instance,
/// and the second one's arrival takes half the partitions from the first by warm handoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_two_assigners_warm_handoff_between_instances() {
    if !docker().await {
        return;
    }
    let etcd = EtcdNetwork::start().await.expect("etcd starts");
    let (zero, one) = two_assigners(&etcd).await;

    let (a, b) = (Recorder::new(), Recorder::new());
    let client_a = AssignerClient::start(config(&[&zero], "a").await, a.clone(), None).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&[&one], "b").await, b.clone(), None).expect("client b");
    let (_, owned_b) = settled(&zero, &client_a, &client_b).await;
    warm_handoffs(&owned_b, &a, &b);
    // Both instances show the same owners, and each holds its own client's stream.
    let on_one = wait_status(&one, "instance 1 agrees", |s| {
        owned_in(s, "b") == owned_b && owned_in(s, "a").len() == 2
    })
    .await;
    assert_eq!(instance_of(&on_one, "a").as_deref(), Some("assigner-0"), "{on_one:?}");
    assert_eq!(instance_of(&on_one, "b").as_deref(), Some("assigner-1"), "{on_one:?}");
    assert_eq!(client_a.shutdown().await.expect("a"), ShutdownOutcome::ShutdownNow);
    assert_eq!(client_b.shutdown().await.expect("b"), ShutdownOutcome::ShutdownNow);
}

/// The assigner holding a consumer's stream is killed (`docker kill`); the client
/// reconnects to the other instance within the TTL and keeps its partitions: no handler
/// call on either consumer, nothing moves, even after the TTL has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_assigner_container_client_reconnects_and_keeps_partitions() {
    if !docker().await {
        return;
    }
    let etcd = EtcdNetwork::start().await.expect("etcd starts");
    let (zero, one) = two_assigners(&etcd).await;

    let (a, b) = (Recorder::new(), Recorder::new());
    // a tries assigner-0 first, then assigner-1; b only knows assigner-1.
    let mut registry = Registry::default();
    let client_a =
        AssignerClient::start(config(&[&zero, &one], "a").await, a.clone(), Some(&mut registry)).expect("a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(config(&[&one], "b").await, b.clone(), None).expect("client b");
    let (owned_a, owned_b) = settled(&one, &client_a, &client_b).await;
    let s = wait_status(&one, "a is on assigner-0", |s| instance_of(s, "a").as_deref() == Some("assigner-0"))
        .await;
    assert_eq!(owned_in(&s, "a"), owned_a);
    let (calls_a, calls_b) = (a.kinds().len(), b.kinds().len());

    let killed = tokio::time::Instant::now();
    kill(&zero).await.expect("docker kill assigner-0");
    // The reconnect can be over before a watch on `connected` would see it drop: the
    // evidence is assigner-1 holding a's stream, within the TTL, with a's partitions.
    wait_status(&one, "a is held by assigner-1 with its partitions", |s| {
        instance_of(s, "a").as_deref() == Some("assigner-1") && owned_in(s, "a") == owned_a
    })
    .await;
    let reconnected = killed.elapsed();
    println!("docker kill -> a held by assigner-1 after {reconnected:?}");
    assert!(reconnected < TTL, "a reconnects within the TTL: {reconnected:?}");
    assert!(*client_a.connected().borrow(), "a is connected");
    // Past the TTL (assigner-0's sessions expire) and a settle period: nothing moved.
    tokio::time::sleep(TTL * 2).await;
    let s = status(&one).await.expect("status");
    assert_eq!(owned_in(&s, "a"), owned_a, "{s:?}");
    assert_eq!(owned_in(&s, "b"), owned_b, "{s:?}");
    assert_eq!(a.kinds()[calls_a..], [], "no handler call on a");
    assert_eq!(b.kinds()[calls_b..], [], "no handler call on b");
    assert_eq!(*client_a.owned().borrow(), owned_a);
    assert_eq!(*client_b.owned().borrow(), owned_b);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("kafka_assigner_client_connects_total 2"), "one reconnect: {text}");
    assert!(text.contains("kafka_assigner_client_lease_expirations_total 0"), "{text}");
    assert_eq!(client_a.shutdown().await.expect("a"), ShutdownOutcome::ShutdownNow);
    assert_eq!(client_b.shutdown().await.expect("b"), ShutdownOutcome::ShutdownNow);
}

/// The static backend, configured by environment variables as a developer would: each
/// client gets exactly its configured partitions, and keeps them when the other leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_backend_from_environment_variables() {
    if !docker().await {
        return;
    }
    let assigner = AssignerImage::default()
        .with_flag("BACKEND", "static")
        .with_topics(&[(TOPIC, 6)])
        .with_flag("STATIC_ASSIGNMENT", "worker-a=0-3;worker-b=4,5")
        .with_log_consumer(log_to_stderr("static"))
        .start()
        .await
        .expect("the static assigner starts");
    let (a, b) = (Recorder::new(), Recorder::new());
    let client_a = AssignerClient::start(config(&[&assigner], "worker-a").await, a.clone(), None).expect("a");
    let client_b = AssignerClient::start(config(&[&assigner], "worker-b").await, b.clone(), None).expect("b");
    wait_owned(&mut client_a.owned(), "worker-a owns 0-3", |o| *o == BTreeSet::from([0, 1, 2, 3])).await;
    wait_owned(&mut client_b.owned(), "worker-b owns 4-5", |o| *o == BTreeSet::from([4, 5])).await;
    assert_eq!(client_b.shutdown().await.expect("b"), ShutdownOutcome::ShutdownNow);
    let s = status(&assigner).await.expect("status");
    assert_eq!(s.backend, "static", "{s:?}");
    assert_eq!(*client_a.owned().borrow(), BTreeSet::from([0, 1, 2, 3]), "static: nothing moves to a");
    assert!(
        !a.kinds().iter().any(|c| matches!(c, Call::Release(_) | Call::Unassigned(_))),
        "{:?}",
        a.kinds()
    );
    assert_eq!(client_a.shutdown().await.expect("a"), ShutdownOutcome::ShutdownNow);
}

/// The README's container test is `readme_container.rs` as it stands (below its header).
#[test]
fn readme_shows_the_container_test_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |path: &str| std::fs::read_to_string(format!("{root}/{path}")).expect(path);
    let source = read("tests/integration/readme_container.rs");
    let body: Vec<&str> = source.lines().skip_while(|l| l.starts_with("//!") || l.is_empty()).collect();
    let block = format!("```rust\n{}\n```", body.join("\n"));
    assert!(
        read("README.md").contains(&block),
        "README's \"Testing with kafka-assigner\" must show tests/integration/readme_container.rs:\n{block}"
    );
}
