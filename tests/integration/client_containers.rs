//! The testcontainers image type (cargo feature `testcontainers`) used as a user would.
//!
//! **Needs a Docker engine** and the image built from this repository
//! (`docker build -t kafka-assigner:local .`). Where no Docker engine is reachable
//! (no `DOCKER_HOST`, no `/var/run/docker.sock`: this machine and CI), each test prints
//! that it is skipped and returns: the one kind of test in this suite allowed to skip.
//! CI still compiles them (`cargo check --features testcontainers --tests`).

use std::path::Path;

use kafka_assigner::client::{AssignerClient, ShutdownOutcome};
use kafka_assigner::testing::containers::{AssignerImage, grpc_url, start_with_etcd};
use testcontainers::runners::AsyncRunner;

use crate::client::{Recorder, config, wait_owned};

fn docker_available() -> bool {
    std::env::var_os("DOCKER_HOST").is_some() || Path::new("/var/run/docker.sock").exists()
}

/// Two clients share the topic of an assigner in a container.
async fn two_clients_share(url: String) {
    let urls = [url];
    let (a, b) = (Recorder::new(), Recorder::new());
    let mut ca = config(&urls, "a");
    ca.topic = "payments".into();
    let mut cb = config(&urls, "b");
    cb.topic = "payments".into();
    let client_a = AssignerClient::start(ca, a, None).expect("client a");
    wait_owned(&mut client_a.owned(), "a owns everything", |o| o.len() == 4).await;
    let client_b = AssignerClient::start(cb, b, None).expect("client b");
    wait_owned(&mut client_b.owned(), "b owns half", |o| o.len() == 2).await;
    wait_owned(&mut client_a.owned(), "a keeps half", |o| o.len() == 2).await;
    assert_eq!(client_a.shutdown().await.expect("a"), ShutdownOutcome::ShutdownNow);
    assert_eq!(client_b.shutdown().await.expect("b"), ShutdownOutcome::ShutdownNow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_container() {
    if !docker_available() {
        eprintln!("skipped: no Docker engine (needs Docker and the kafka-assigner:local image)");
        return;
    }
    let container = AssignerImage::default()
        .with_topics(&[("payments", 4)])
        .with_flag("LEASE_TTL", "1s")
        .start()
        .await
        .expect("the assigner container starts");
    two_clients_share(grpc_url(&container).await.expect("gRPC port")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_containers() {
    if !docker_available() {
        eprintln!("skipped: no Docker engine (needs Docker and the kafka-assigner:local image)");
        return;
    }
    let image = AssignerImage::default().with_topics(&[("payments", 4)]).with_flag("LEASE_TTL", "1s");
    let running = start_with_etcd(image).await.expect("etcd and the assigner start");
    two_clients_share(grpc_url(&running.assigner).await.expect("gRPC port")).await;
}
