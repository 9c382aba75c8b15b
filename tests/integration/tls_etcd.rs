//! etcd with TLS, client-certificate auth and users: the store works through it,
//! every misconfiguration stops the start naming the flag and carrying etcd's reason
//! (promptly, never a hang), and an expired auth token is refreshed.

use std::{sync::Arc, time::Duration};

use clap::Parser;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use futures::StreamExt;
use kafka_assigner::backend::coordinator_from_args;
use kafka_assigner::config::{Cli, Command};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::store::{EtcdSecurity, EtcdStore, LeaseStore, Malformed, StoreError, Unreachable};

use crate::support::certs::{Leaf, TestCa};
use crate::support::etcd_tls::{ASSIGNER_PASSWORD, TlsEtcd};

/// A misconfigured start must fail well within this (the connect timeout is 2 s).
const FAIL_FAST: Duration = Duration::from_secs(4);

async fn connect_with(etcd: &TlsEtcd, security: EtcdSecurity) -> Result<EtcdStore, StoreError> {
    let mut config = etcd.store_config();
    config.security = security;
    tokio::time::timeout(FAIL_FAST, EtcdStore::connect(config))
        .await
        .unwrap_or_else(|_| panic!("connect did not finish within {FAIL_FAST:?}"))
}

fn refused(result: Result<EtcdStore, StoreError>) -> String {
    match result {
        Ok(_) => panic!("connected although the settings are wrong"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_reads_writes_and_watches_over_tls_with_auth() {
    let etcd = TlsEtcd::start().await;
    let store = etcd.store().await;
    let mut watch = store.watch_prefix("/tls/", 0).await.expect("watch");
    let session = store.grant_session(Duration::from_secs(5)).await.expect("session");
    store.put("/tls/a", b"1".to_vec(), Some(session)).await.expect("put");
    let snapshot = store.get_prefix("/tls/").await.expect("get_prefix");
    assert_eq!(snapshot.kvs.len(), 1, "{snapshot:?}");
    let event =
        tokio::time::timeout(Duration::from_secs(5), watch.next()).await.expect("watch event in time");
    assert!(matches!(event, Some(Ok(_))), "{event:?}");
    store.keep_alive(session).await.expect("keep_alive");
    store.revoke_session(session).await.expect("revoke");
    assert!(store.get("/tls/a").await.expect("get").is_none(), "revoking the session deletes its key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_expired_certificate_and_bad_credentials_name_the_flag() {
    let etcd = TlsEtcd::start().await;
    let good = etcd.security();

    let other = TestCa::new("someone-else");
    let wrong_ca = EtcdSecurity { ca: Some(other.write_ca("other-ca")), ..good.clone() };
    let result = connect_with(&etcd, wrong_ca).await;
    // Refused at the first attempt (rustls' InvalidCertificate is not retried), not after
    // the connect budget ran out.
    let first_attempt = matches!(
        &result,
        Err(StoreError::Invalid(Malformed::Misconfigured { cause, .. }))
            if !matches!(**cause, StoreError::Unavailable(Unreachable::OutOfTime { .. }))
    );
    assert!(first_attempt, "{result:?}");
    let message = refused(result);
    assert!(message.contains("--etcd-ca") && message.contains("UnknownIssuer"), "{message}");

    let (cert, key) = etcd.ca.issue_expired(Leaf::ClientCn("assigner")).write(etcd.ca.dir.path(), "expired");
    let expired = EtcdSecurity { cert: Some(cert), key: Some(key), ..good.clone() };
    let message = refused(connect_with(&etcd, expired).await);
    assert!(message.contains("--etcd-cert") && message.to_lowercase().contains("certificate"), "{message}");

    let (cert, key) = other.issue(Leaf::ClientCn("assigner")).write(other.dir.path(), "foreign");
    let foreign = EtcdSecurity { cert: Some(cert), key: Some(key), ..good.clone() };
    let message = refused(connect_with(&etcd, foreign).await);
    assert!(message.contains("--etcd-cert"), "{message}");

    let bad_password = EtcdSecurity { password: Some("wrong".into()), ..good.clone() };
    let message = refused(connect_with(&etcd, bad_password).await);
    assert!(message.contains("--etcd-password") && message.contains("authentication failed"), "{message}");

    let unknown_user = EtcdSecurity { username: Some("nobody".into()), ..good.clone() };
    let message = refused(connect_with(&etcd, unknown_user).await);
    assert!(message.contains("--etcd-username"), "{message}");

    let no_tls = EtcdSecurity { ca: None, cert: None, key: None, ..good.clone() };
    let mut config = etcd.store_config();
    config.security = no_tls;
    config.endpoints = etcd.endpoints().iter().map(|e| e.replace("https://", "http://")).collect();
    let result = tokio::time::timeout(FAIL_FAST, EtcdStore::connect(config)).await.expect("no hang");
    assert!(result.is_err(), "a plaintext client must not reach a TLS etcd");

    assert!(connect_with(&etcd, good).await.is_ok(), "the right settings still work");
}

/// The same failures through `kafka-assigner serve`'s flags (and --etcd-password-file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_flags_stop_the_start_naming_the_flag() {
    let etcd = TlsEtcd::start().await;
    let security = etcd.security();
    let password_file = etcd.ca.dir.path().join("password");
    std::fs::write(&password_file, format!("{ASSIGNER_PASSWORD}\n")).expect("password file");
    let path =
        |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let start = |ca: String, password_file: String| {
        let flags = vec![
            "kafka-assigner".to_string(),
            "serve".into(),
            "--backend=etcd".into(),
            format!("--etcd-endpoints={}", etcd.endpoints().join(",")),
            format!("--etcd-prefix={}", crate::support::etcd::unique_prefix("tls-flags")),
            format!("--etcd-ca={ca}"),
            format!("--etcd-cert={}", path(&security.cert)),
            format!("--etcd-key={}", path(&security.key)),
            "--etcd-username=assigner".into(),
            format!("--etcd-password-file={password_file}"),
            "--topic-partitions=events=4".into(),
        ];
        async move {
            let Command::Serve(args) = Cli::try_parse_from(&flags).expect("flags parse").command else {
                unreachable!()
            };
            tokio::time::timeout(FAIL_FAST, coordinator_from_args(&args, Arc::new(Metrics::new())))
                .await
                .expect("the start finishes promptly")
        }
    };
    let coordinator = start(path(&security.ca), password_file.display().to_string()).await.expect("starts");
    coordinator.shutdown().await;

    let wrong = TestCa::new("wrong").write_ca("wrong");
    let error = start(wrong.display().to_string(), password_file.display().to_string()).await.err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--etcd-ca"), "{message}");

    std::fs::write(&password_file, "not-it\n").expect("password file");
    let error = start(path(&security.ca), password_file.display().to_string()).await.err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--etcd-password"), "{message}");

    let error = start(path(&security.ca), "/nonexistent/password".into()).await.err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--etcd-password-file /nonexistent/password"), "{message}");
}

/// etcd drops a simple token after `--auth-token-ttl` unused; the store authenticates again
/// instead of failing. A client without the refresh shows the token really expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_auth_token_is_refreshed() {
    let etcd = TlsEtcd::start_with_token_ttl(Duration::from_secs(1)).await;
    let store = etcd.store().await;
    let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(etcd.ca.cert_pem())).identity(
        Identity::from_pem(
            std::fs::read(&etcd.client.0).expect("cert"),
            std::fs::read(&etcd.client.1).expect("key"),
        ),
    );
    let options = ConnectOptions::new().with_tls(tls).with_user("assigner", ASSIGNER_PASSWORD);
    let mut plain = Client::connect(etcd.endpoints(), Some(options)).await.expect("plain client");
    plain.get("/probe", None).await.expect("a fresh token works");
    // Both tokens sit unused now. Every successful use restarts a token's TTL, so probe
    // less often than the TTL, until etcd has dropped it (bounded).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        match plain.get("/probe", None).await {
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("invalid auth token") =>
            {
                break;
            }
            other => assert!(tokio::time::Instant::now() < give_up, "the token never expired: {other:?}"),
        }
    }
    store.put("/tls/after-expiry", b"x".to_vec(), None).await.expect("the store refreshes its token");
    assert!(store.get("/tls/after-expiry").await.expect("get").is_some());
}
