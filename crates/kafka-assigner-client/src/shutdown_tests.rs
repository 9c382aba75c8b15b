//! `AssignerClient::shutdown` against the real assigner (in-process, memory store, real
//! gRPC): a handler call that never returns does not hold the shutdown past the session
//! timeout, and what was given up is counted.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use kafka_assigner::coordinator::HandoffConfig;
use kafka_assigner::server::AssignerServer;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::*;

/// The server's session TTL: short, so the client's session timeout (60% of it) is too.
const SERVER_TTL: Duration = Duration::from_secs(2);
/// How long anything the test waits for may take before it counts as a failure.
const PROMPT: Duration = Duration::from_secs(10);

/// A handler whose `release` never returns; it says which partitions it was asked to release.
struct ReleaseHangs {
    releasing: watch::Sender<Vec<u32>>,
}

#[async_trait]
impl Handler for ReleaseHangs {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }

    async fn assigned(&self, _: Partition) {}

    async fn release(&self, p: Partition) {
        self.releasing.send_modify(|r| r.push(p.partition));
        std::future::pending::<()>().await
    }

    async fn unassigned(&self, _: Partition) {}
}

/// A handler that does what it is told at once.
struct Quick;

#[async_trait]
impl Handler for Quick {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }

    async fn assigned(&self, _: Partition) {}

    async fn release(&self, _: Partition) {}

    async fn unassigned(&self, _: Partition) {}
}

fn client_config(url: &str, name: &str) -> ClientConfig {
    let mut config = ClientConfig::new([url], name, "events").with_server_lease_ttl(SERVER_TTL);
    config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    config.call_timeout = Duration::from_secs(2);
    config.drain_timeout = Duration::from_secs(5);
    config
}

/// The value of counter `name` (no labels) in `registry`.
fn metric(registry: &Mutex<Registry>, name: &str) -> Option<f64> {
    let mut text = String::new();
    let registry = registry.lock().unwrap_or_else(|p| p.into_inner());
    prometheus_client::encoding::text::encode(&mut text, &registry).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Client `a` owns both partitions; `b` joins, one partition is handed over to it, and
/// `a`'s `release` of it never returns. `a.shutdown()` still returns within the session
/// timeout (plus the Deregister round trip), says it abandoned one handler call, and counts
/// it. Before the bound, shutdown waited for the release forever (this test's deadline
/// fired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_up_on_a_hung_handler_after_the_session_timeout() {
    let mut server_config = HandoffConfig { lease_ttl: SERVER_TTL, ..HandoffConfig::default() };
    server_config.reconcile_interval = Duration::from_millis(100);
    server_config.rebalance_delay = Duration::from_millis(50);
    server_config.topic_partitions.insert("events".into(), 2);
    let server = AssignerServer::start_memory(server_config).await.expect("in-process server");
    let url = server.grpc_url();

    let (releasing_tx, mut releasing) = watch::channel(Vec::new());
    let registry = Mutex::new(Registry::default());
    let config_a = client_config(&url, "a");
    let session = config_a.session_timeout;
    let a = {
        let mut registry = registry.lock().unwrap_or_else(|p| p.into_inner());
        let handler = Arc::new(ReleaseHangs { releasing: releasing_tx });
        AssignerClient::start(config_a, handler, Some(&mut registry)).expect("client a")
    };
    let owns_both = a.owned().wait_for(|o| o.len() == 2).await.map(|_| ());
    tokio::time::timeout(PROMPT, async { owns_both }).await.expect("a owns both").expect("a alive");
    let b = AssignerClient::start(client_config(&url, "b"), Arc::new(Quick), None).expect("client b");
    tokio::time::timeout(PROMPT, releasing.wait_for(|r| r.len() == 1))
        .await
        .expect("a is asked to release one partition")
        .expect("handler alive");

    let started = tokio::time::Instant::now();
    // The bound under test, and room for Deregister and the last acknowledgements.
    let limit = session + Duration::from_secs(3);
    let outcome = tokio::time::timeout(limit, a.shutdown())
        .await
        .unwrap_or_else(|_| panic!("shutdown still waits for the hung release after {limit:?}"));
    let took = started.elapsed();
    println!("shutdown with a hung release took {took:?} (session timeout {session:?}): {outcome:?}");
    match outcome {
        Err(ClientError::HandlerCallsAbandoned { abandoned: 1, waited, .. }) => assert_eq!(waited, session),
        other => panic!("expected one abandoned handler call, got {other:?}"),
    }
    assert_eq!(metric(&registry, "kafka_assigner_client_handler_calls_abandoned_total"), Some(1.0));
    assert!(took >= session, "it waited the session timeout for the release first: {took:?}");

    let _ = b.shutdown().await;
    server.stop().await;
}
