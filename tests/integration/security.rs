//! gRPC over TLS and mTLS: consumer identity bound to the client certificate,
//! the SPIFFE mapping, and a server certificate rotated while a stream stays open.

use std::time::Duration;

use kafka_assigner::proto::v1::{
    DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
};
use kafka_assigner::server::{ServerOptions, identity::IdentityRule, tls::TlsSettings};
use tonic::Code;

use crate::support::assigner::{PROMPT, TOPIC, TestConsumer};
use crate::support::certs::{Leaf, Pem, TestCa, write_atomically};
use crate::support::secure::Secured;
use crate::support::{metric, wait_until};

/// mTLS settings for `ca`'s server certificate, clients checked against `ca`.
fn mtls(ca: &TestCa, reload: Duration) -> TlsSettings {
    let (cert, key) = ca.issue(Leaf::Server).write(ca.dir.path(), "server");
    TlsSettings { cert, key, client_ca: Some(ca.write_ca("client-ca")), reload_interval: reload }
}

fn bound(ca: &TestCa, pattern: Option<&str>) -> ServerOptions {
    ServerOptions {
        tls: Some(mtls(ca, Duration::from_secs(10))),
        bind_identity: Some(IdentityRule::new(pattern).expect("pattern")),
        ..ServerOptions::default()
    }
}

fn tp(partition: u32) -> Option<TopicPartition> {
    Some(TopicPartition { topic: TOPIC.into(), partition })
}

fn assert_denied(result: Result<impl std::fmt::Debug, tonic::Status>, own: &str, claimed: &str, rpc: &str) {
    let status = result.err().unwrap_or_else(|| panic!("{rpc} as {claimed} was accepted"));
    assert_eq!(status.code(), Code::PermissionDenied, "{rpc}: {status:?}");
    let message = status.message();
    assert!(message.contains(&format!("'{own}'")) && message.contains(&format!("'{claimed}'")), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_consumers_certificate_is_refused_on_every_rpc() {
    let ca = TestCa::new("grpc-ca");
    let served = Secured::memory(bound(&ca, None)).await;
    let (pod_a, pod_b) = (ca.issue(Leaf::ClientDns("pod-a")), ca.issue(Leaf::ClientDns("pod-b")));
    let client_a = served.tls(&ca.cert_pem(), Some(&pod_a)).await.expect("pod-a connects");
    let mut a = TestConsumer::register(client_a, "pod-a", TOPIC).await.expect("pod-a registers as itself");
    a.expect_snapshot().await;
    a.wait_owned(4, PROMPT).await;

    // pod-b's certificate, pod-a's name: refused on all four RPCs, nothing changes.
    let mut b = served.tls(&ca.cert_pem(), Some(&pod_b)).await.expect("pod-b connects");
    let before = served.fingerprint().await;
    let register = RegisterRequest { consumer_name: "pod-a".into(), topic: TOPIC.into() };
    assert_denied(b.register(register).await.map(|_| ()), "pod-b", "pod-a", "Register");
    let ready = PartitionReadyRequest { consumer_name: "pod-a".into(), partition: tp(0) };
    assert_denied(b.partition_ready(ready).await, "pod-b", "pod-a", "PartitionReady");
    let released = PartitionReleasedRequest { consumer_name: "pod-a".into(), partition: tp(0) };
    assert_denied(b.partition_released(released).await, "pod-b", "pod-a", "PartitionReleased");
    assert_denied(
        b.deregister(DeregisterRequest { consumer_name: "pod-a".into() }).await,
        "pod-b",
        "pod-a",
        "Deregister",
    );
    assert_eq!(served.fingerprint().await, before, "a refused call changed state");
    a.assert_quiet(Duration::from_millis(200)).await;

    // pod-b as itself is fine, and takes its share through the usual handoff.
    let mut b = TestConsumer::register(b, "pod-b", TOPIC).await.expect("pod-b registers as itself");
    b.expect_snapshot().await;
    b.wait_for(PROMPT, "pod-b is told to warm", |c| !c.warms.is_empty()).await;
    b.ready_all().await;
    a.wait_for(PROMPT, "pod-a is told to release", |c| !c.releases.is_empty()).await;
    a.release_all().await;

    // Without a client certificate there is no session at all.
    let anonymous = served.tls(&ca.cert_pem(), None).await;
    let refused = match anonymous {
        Err(_) => true,
        Ok(mut client) => {
            client.deregister(DeregisterRequest { consumer_name: "pod-a".into() }).await.is_err()
        }
    };
    assert!(refused, "a client without a certificate got through");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_id_maps_to_the_pod_name() {
    let ca = TestCa::new("spiffe-ca");
    let served = Secured::memory(bound(&ca, Some("^spiffe://[^/]+/ns/[^/]+/pod/([^/]+)$"))).await;
    let spiffe = "spiffe://cluster.local/ns/kafka/pod/ingest-3";
    let pem = ca.issue(Leaf::ClientUri(spiffe));
    let client = served.tls(&ca.cert_pem(), Some(&pem)).await.expect("connects");
    let denied = TestConsumer::register(client.clone(), spiffe, TOPIC).await.err();
    assert_denied(denied.map_or(Ok(()), Err), "ingest-3", spiffe, "Register");
    let mut consumer =
        TestConsumer::register(client, "ingest-3", TOPIC).await.expect("the mapped name is accepted");
    consumer.expect_snapshot().await;
    consumer.wait_owned(4, PROMPT).await;
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_binding_needs_mtls_and_bad_files_name_the_flag() {
    let no_tls = ServerOptions { bind_identity: Some(IdentityRule::default()), ..ServerOptions::default() };
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let start = |options: ServerOptions| async move {
        let store = std::sync::Arc::new(kafka_assigner::store::MemoryStore::new());
        let metrics = std::sync::Arc::new(kafka_assigner::metrics::Metrics::new());
        let config = crate::support::assigner::test_config(crate::support::assigner::Backend::Memory, "/x/");
        let coordinator = crate::support::assigner::TestCoordinator::start(store, config, metrics.clone())
            .await
            .expect("coordinator");
        let result = kafka_assigner::server::AssignerServer::start_with(
            coordinator.served(),
            metrics,
            any,
            any,
            options,
        )
        .await;
        result.err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(start(no_tls).await.contains("--tls-client-ca"));
    let ca = TestCa::new("bad-files");
    let mut settings = mtls(&ca, Duration::from_secs(1));
    settings.key = ca.dir.path().join("missing.key");
    let message = start(ServerOptions { tls: Some(settings), ..ServerOptions::default() }).await;
    assert!(message.contains("--tls-key") && message.contains("missing.key"), "{message}");
}

/// cert-manager replaces the files; new connections get the new certificate, and a
/// stream opened before keeps working (commands arrive, answers are accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_server_certificate_is_picked_up_while_a_stream_stays_open() {
    let (old_ca, new_ca) = (TestCa::new("old-ca"), TestCa::new("new-ca"));
    let mut settings = mtls(&old_ca, Duration::from_millis(50));
    // Clients of both CAs are trusted across the rotation.
    let both = format!("{}{}", old_ca.cert_pem(), new_ca.cert_pem());
    let client_ca = old_ca.dir.path().join("both-cas.crt");
    write_atomically(&client_ca, &both);
    settings.client_ca = Some(client_ca);
    let (cert_file, key_file) = (settings.cert.clone(), settings.key.clone());
    let served = Secured::memory(ServerOptions { tls: Some(settings), ..ServerOptions::default() }).await;

    let pod_a = old_ca.issue(Leaf::ClientDns("pod-a"));
    let client = served.tls(&old_ca.cert_pem(), Some(&pod_a)).await.expect("connects with the old CA");
    let mut a = TestConsumer::register(client, "pod-a", TOPIC).await.expect("registers");
    a.expect_snapshot().await;
    a.wait_owned(4, PROMPT).await;
    assert!(
        served.tls(&new_ca.cert_pem(), Some(&pod_a)).await.is_err()
            || probe(&served, &new_ca.cert_pem(), &pod_a).await.is_err(),
        "the new CA must not be trusted before the rotation"
    );

    let rotated: Pem = new_ca.issue(Leaf::Server);
    // Half a rotation (the new key, the old certificate) is refused; the old pair stays.
    write_atomically(&key_file, &rotated.key);
    // The watcher saw the half rotation, and refused it twice (it keeps looking).
    let admin = served.server.admin_addr;
    let refused = r#"tls_reloads_total{result="refused"}"#;
    wait_until(PROMPT, "the watcher refused the half rotation twice", || async {
        metric(admin, refused).await.is_some_and(|n| n >= 2.0)
    })
    .await;
    probe(&served, &old_ca.cert_pem(), &pod_a).await.expect("the old pair still serves mid-rotation");
    let reloaded = r#"tls_reloads_total{result="reloaded"}"#;
    assert_eq!(metric(admin, reloaded).await, None, "nothing was reloaded mid-rotation");
    write_atomically(&cert_file, &rotated.cert);
    wait_until(PROMPT, "a new connection is served with the rotated certificate", || async {
        probe(&served, &new_ca.cert_pem(), &pod_a).await.is_ok()
    })
    .await;
    assert_eq!(metric(admin, reloaded).await, Some(1.0), "one reload, counted");
    assert!(probe(&served, &old_ca.cert_pem(), &pod_a).await.is_err(), "the old certificate is still served");

    // The stream opened before the rotation still carries commands both ways.
    let pod_b = new_ca.issue(Leaf::ClientDns("pod-b"));
    let client_b = served.tls(&new_ca.cert_pem(), Some(&pod_b)).await.expect("connects with the new CA");
    let mut b = TestConsumer::register(client_b, "pod-b", TOPIC).await.expect("pod-b registers");
    b.expect_snapshot().await;
    b.wait_for(PROMPT, "pod-b is told to warm", |c| !c.warms.is_empty()).await;
    b.ready_all().await;
    a.wait_for(PROMPT, "pod-a is told to release over its old stream", |c| !c.releases.is_empty()).await;
    a.release_all().await;
    served.stop().await;
}

/// One call on a fresh connection trusting `ca`: `Ok` when the handshake and call worked.
async fn probe(served: &Secured, ca: &str, identity: &Pem) -> Result<(), String> {
    let mut client = served.tls(ca, Some(identity)).await?;
    let request = DeregisterRequest { consumer_name: "nobody".into() };
    match client.deregister(request).await {
        Err(status) if status.code() == Code::NotFound || status.code() == Code::InvalidArgument => Ok(()),
        Err(status) => Err(format!("{status:?}")),
        Ok(_) => Ok(()),
    }
}
