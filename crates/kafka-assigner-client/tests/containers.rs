//! `testing::containers` as a consumer's suite uses it: this crate alone, feature
//! `testcontainers`. The container test needs a Docker engine and the images
//! (`scripts/images`); without an engine it says it is skipped, unless `CI` is set, where
//! that fails. The server's suites (`tests/integration/client_containers.rs`) cover etcd,
//! several instances and a killed container.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use kafka_assigner_client::testing::containers::{
    AssignerImage, client_config, engine_available, images_available, log_to_stderr, status,
    testcontainers::{ImageExt, runners::AsyncRunner},
};
use kafka_assigner_client::{AssignerClient, Handler, Partition, WarmError};
use tokio::sync::watch;

/// A consumer that takes whatever it is given, and shows what its handler was told it
/// owns (`assigned` minus `unassigned`).
#[derive(Default)]
struct Worker(watch::Sender<BTreeSet<u32>>);

#[async_trait::async_trait]
impl Handler for Worker {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }
    async fn assigned(&self, p: Partition) {
        self.0.send_modify(|owned| {
            owned.insert(p.partition);
        });
    }
    async fn release(&self, _: Partition) {}
    async fn unassigned(&self, p: Partition) {
        self.0.send_modify(|owned| {
            owned.remove(&p.partition);
        });
    }
}

/// The TTL a test reads back is the one the container is started with, in the server's
/// syntax, so `client_config` matches the client's session timeout to the real server.
#[test]
fn the_lease_ttl_is_read_as_the_server_reads_it() {
    assert_eq!(AssignerImage::default().lease_ttl(), Duration::from_secs(2));
    assert_eq!(AssignerImage::default().with_flag("lease-ttl", " 3s").lease_ttl(), Duration::from_secs(3));
    let ttl = Duration::from_millis(1500);
    assert_eq!(AssignerImage::default().with_lease_ttl(ttl).lease_ttl(), ttl);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_owns_the_topic_and_status_shows_it() {
    match engine_available().await {
        Ok(()) => images_available().await.unwrap_or_else(|e| panic!("{e}")),
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI is set, and this test needs Docker: {e}"),
        Err(e) => return eprintln!("skipped: {e} (with CI set, this is a failure)"),
    }
    let image = AssignerImage::default()
        .with_topics(&[("payments", 3)])
        .with_instance_id("tc-1")
        .with_flag("LEASE_TTL", "3s");
    let assigner = image
        .with_log_consumer(log_to_stderr("tc-1"))
        .start()
        .await
        .unwrap_or_else(|e| panic!("starts: {e}"));
    let config = client_config(&[&assigner], "worker", "payments").await.expect("configuration");
    assert_eq!(config.session_timeout, Duration::from_millis(1800), "60% of the container's 3 s TTL");
    let worker = Arc::new(Worker::default());
    let client = AssignerClient::start(config, worker.clone(), None).expect("client");
    let mut told = worker.0.subscribe();
    tokio::time::timeout(Duration::from_secs(10), told.wait_for(|o| *o == BTreeSet::from([0, 1, 2])))
        .await
        .expect("`assigned` for all 3 in time")
        .expect("the worker is alive");

    let status = status(&assigner).await.expect("/status");
    assert_eq!((status.instance.as_str(), status.backend.as_str(), status.ready), ("tc-1", "memory", true));
    let topic = status.topics.iter().find(|t| t.topic == "payments").expect("payments in /status");
    let registered = topic.consumers.iter().find(|c| c.name == "worker").expect("worker in /status");
    assert_eq!((registered.instance.as_str(), registered.partitions), ("tc-1", 3), "{status:?}");
    assert!(topic.owners.iter().all(|o| o.as_deref() == Some("worker")), "{status:?}");
    client.shutdown().await.expect("leaves");
    assert!(worker.0.borrow().is_empty(), "`unassigned` for each partition before shutdown returns");
}
