//! `kafka-assigner probe` (the real binary, the images' healthcheck): exit 0 against a
//! running instance; exit 1 with a message naming the URL and the reason for a port with
//! nothing on it, an instance that answers 503, a 404 and a server that never answers.

use std::{net::SocketAddr, time::Duration};

use kafka_assigner::testing::InProcessAssigner;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// Runs the binary: (exit code, stdout, stderr, how long it took).
async fn probe(args: &[&str]) -> (i32, String, String, Duration) {
    let started = std::time::Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
            .arg("probe")
            .args(args)
            .env_remove("KAFKA_ASSIGNER_ADMIN_ADDR")
            .output(),
    )
    .await
    .expect("kafka-assigner probe finished")
    .expect("kafka-assigner probe ran");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr), started.elapsed())
}

/// A loopback port nothing listens on (bound, then closed).
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

/// A server that answers every request with `response` (or, when `None`, reads and never
/// answers).
async fn fixed_server(response: Option<&'static str>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                match response {
                    Some(r) => {
                        let _ = socket.write_all(r.as_bytes()).await;
                    }
                    // Hold the connection open, silent, until the test ends.
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_a_running_instance_by_admin_address_and_by_env() {
    let assigner = InProcessAssigner::start(&[("events", 2)]).await.expect("assigner");
    let admin = assigner.admin_addr().to_string();
    let (code, stdout, stderr, _) = probe(&["--admin-addr", &admin]).await;
    assert_eq!(code, 0, "stdout: {stdout} stderr: {stderr}");
    assert!(stdout.starts_with(&format!("ready: http://{admin}/ready answered 200")), "{stdout}");

    // As in the images: the listen address from the environment, unspecified host.
    let unspecified = format!("0.0.0.0:{}", assigner.admin_addr().port());
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
        .arg("probe")
        .env("KAFKA_ASSIGNER_ADMIN_ADDR", &unspecified)
        .output()
        .await
        .expect("ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("http://127.0.0.1:{}/ready", assigner.admin_addr().port())), "{stdout}");

    // Another path on the same server: a 404 is not ready.
    let url = format!("http://{admin}/nope");
    let (code, stdout, stderr, _) = probe(&["--url", &url]).await;
    assert_eq!(code, 1, "stdout: {stdout}");
    assert!(stderr.contains(&url) && stderr.contains("HTTP 404"), "{stderr}");

    assigner.stop().await;
    let (code, _, stderr, _) = probe(&["--admin-addr", &admin]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_fails_clearly_when_nothing_listens() {
    let addr = closed_port().await.to_string();
    let (code, stdout, stderr, _) = probe(&["--admin-addr", &addr]).await;
    assert_eq!(code, 1, "stdout: {stdout}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with(&format!("kafka-assigner probe: http://{addr}/ready: cannot connect")),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains("connection refused"), "the cause is shown: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_fails_on_503_and_on_silence_and_waits_when_asked() {
    let not_ready =
        fixed_server(Some("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\n\r\nnot ready\n")).await;
    let (code, _, stderr, _) = probe(&["--admin-addr", &not_ready.to_string()]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("HTTP 503: not ready"), "{stderr}");

    let silent = fixed_server(None).await.to_string();
    let (code, _, stderr, took) = probe(&["--admin-addr", &silent, "--timeout", "300ms"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("no answer within 300ms"), "{stderr}");
    assert!(took < Duration::from_secs(5), "the timeout bounds it: {took:?}");

    // --wait: not ready at first, then a server comes up on that port within the wait.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    let waiter =
        tokio::spawn(
            async move { probe(&["--admin-addr", &format!("127.0.0.1:{port}"), "--wait", "20s"]).await },
        );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("rebind the port");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nready\n").await;
        }
    });
    let (code, stdout, stderr, took) = waiter.await.expect("probe task");
    assert_eq!(code, 0, "stdout: {stdout} stderr: {stderr}");
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(20), "{took:?}");
}
