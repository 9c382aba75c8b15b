//! The README's container test ("Testing with kafka-assigner"), verbatim: everything
//! below this header is copied there, and
//! `client_containers::readme_shows_the_container_test_verbatim` checks that the copy is
//! still the same. A user's view: the client crate only (feature `testcontainers`), no
//! server. Needs Docker and `kafka-assigner:local`.

use std::{sync::Arc, time::Duration};

use kafka_assigner_client::testing::containers::{
    AssignerImage, client_config, engine_available, testcontainers::runners::AsyncRunner,
};
use kafka_assigner_client::{AssignerClient, Handler, Partition, WarmError};

/// Your consumer's handler (here: one that does nothing).
struct Worker;

#[async_trait::async_trait]
impl Handler for Worker {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }
    async fn assigned(&self, _: Partition) {}
    async fn release(&self, _: Partition) {}
    async fn unassigned(&self, _: Partition) {}
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_share_the_topic() {
    if let Err(e) = engine_available().await {
        assert!(std::env::var_os("CI").is_none(), "CI needs Docker: {e}");
        return eprintln!("skipped: {e}");
    }
    // kafka-assigner:local on the memory backend; the container is removed when
    // `assigner` is dropped, also when the test fails.
    let assigner = AssignerImage::default().with_topics(&[("payments", 4)]).start().await.expect("starts");
    let config_a = client_config(&[&assigner], "worker-a", "payments").await.expect("a");
    let config_b = client_config(&[&assigner], "worker-b", "payments").await.expect("b");
    let a = AssignerClient::start(config_a, Arc::new(Worker), None).expect("a");
    let b = AssignerClient::start(config_b, Arc::new(Worker), None).expect("b");

    let (mut owned_a, mut owned_b) = (a.owned(), b.owned());
    let halves = async {
        owned_a.wait_for(|owned| owned.len() == 2).await.expect("a runs");
        owned_b.wait_for(|owned| owned.len() == 2).await.expect("b runs");
    };
    tokio::time::timeout(Duration::from_secs(10), halves).await.expect("each owns half");
    assert!(owned_a.borrow().is_disjoint(&owned_b.borrow()));
    a.shutdown().await.expect("a leaves");
    b.shutdown().await.expect("b leaves");
}
