// The real assigner, in-process: the server crate is a dev-dependency of this one.
use std::{future::pending, sync::Arc, time::Duration};

use kafka_assigner::coordinator::HandoffConfig;
use kafka_assigner::server::AssignerServer;
use tokio::time::Instant;

use super::*;
use crate::{AssignerClient, ClientConfig, Handler, Partition, WarmError};

#[test]
fn addresses() {
    assert_eq!(status_url("127.0.0.1:9090").unwrap().to_string(), "http://127.0.0.1:9090/status");
    assert_eq!(status_url("http://a:1/").unwrap().to_string(), "http://a:1/status");
    for bad in ["", "https://a:1", "http://", "a b"] {
        assert!(matches!(status_url(bad), Err(StatusError::BadAddress(_))), "{bad}");
    }
}

/// Warms at once when `ready`; otherwise never, so a handoff to it stays in flight.
struct Consumer(bool);

#[async_trait::async_trait]
impl Handler for Consumer {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        if !self.0 {
            pending::<()>().await;
        }
        Ok(())
    }
    async fn assigned(&self, _: Partition) {}
    async fn release(&self, _: Partition) {}
    async fn unassigned(&self, _: Partition) {}
}

/// One definition of the document on each side: the server writes its `StatusView`, this
/// crate reads [`Status`]. Read from the real server with every part filled in (leader,
/// consumers, owners, a handoff in flight), then written back, it is the server's document
/// unchanged: a field the server adds, renames or retypes fails this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_field_the_server_writes() {
    let ttl = Duration::from_secs(2);
    let mut config = HandoffConfig {
        instance_id: "s1".into(),
        lease_ttl: ttl,
        reconcile_interval: Duration::from_millis(100),
        ..HandoffConfig::default()
    };
    config.topic_partitions.insert("events".into(), 4);
    let server = AssignerServer::start_memory(config).await.expect("in-process server");
    let admin = server.admin_addr.to_string();
    let start = |name: &str, warms: bool| {
        let config = ClientConfig::new([server.grpc_url()], name, "events").with_server_lease_ttl(ttl);
        AssignerClient::start(config, Arc::new(Consumer(warms)), None).expect(name)
    };
    let a = start("a", true);
    let mut owned_a = a.owned();
    tokio::time::timeout(Duration::from_secs(10), owned_a.wait_for(|o| o.len() == 4))
        .await
        .expect("a owns all 4 in time")
        .expect("a runs");
    // b joins and never finishes a warm: its share stays `Warming`.
    let b = start("b", false);

    let deadline = Instant::now() + Duration::from_secs(10);
    let (raw, status) = loop {
        let (raw, status) = fetch(&admin, Duration::from_secs(5)).await.expect("/status");
        let topic = status.topics.iter().find(|t| t.topic == "events");
        if topic.is_some_and(|t| t.consumers.len() == 2 && !t.handoffs.is_empty()) {
            break (raw, status);
        }
        assert!(Instant::now() < deadline, "no handoff to b in flight: {raw}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((status.instance.as_str(), status.leader.as_deref(), status.ready), ("s1", Some("s1"), true));
    let handoff = &status.topics[0].handoffs[0];
    assert_eq!((handoff.from.as_str(), handoff.to.as_str(), handoff.phase.as_str()), ("a", "b", "Warming"));
    let written_back = serde_json::to_value(&status).expect("serialises");
    assert_eq!(written_back, raw, "what this crate reads differs from what the server wrote");
    drop((a, b));
    server.stop().await;
}
