//! Shared helpers for the integration tests: a real etcd server per test ([`EtcdServer`]),
//! a 3-member etcd cluster (`cluster`), a controllable TCP proxy (`proxy`), and waiting on
//! conditions with deadlines instead of fixed sleeps.

// Each test module uses a different subset of these helpers.
#![allow(dead_code)]

pub mod assigner;
pub mod browser;
pub mod certs;
pub mod child;
pub mod cluster;
pub mod docker;
pub mod etcd;
pub mod etcd_restore;
pub mod etcd_tls;
pub mod findings;
pub mod http10;
pub mod poll;
pub mod prometheus;
pub mod proxy;
pub mod secure;
pub mod serve_flags;

use std::{future::Future, time::Duration};

use futures::{Stream, StreamExt};

pub use etcd::EtcdServer;

/// How often [`wait_until`] re-checks its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `f` every [`POLL_INTERVAL`] until it returns `true`; panics with `what` if that
/// takes longer than `deadline`. Uses tokio time, so it also works under paused time.
pub async fn wait_until<F, Fut>(deadline: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() >= give_up {
            panic!("timed out after {deadline:?} waiting until {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The value of the metric `kafka_assigner_{name}` (a counter's `_total`, a gauge's bare
/// name) on the admin port `admin`, from its `/metrics`; `None` if it has none.
pub async fn metric(admin: std::net::SocketAddr, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(admin).await.expect("admin port");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("ask");
    let mut response = String::new();
    conn.read_to_string(&mut response).await.expect("read /metrics");
    let series = format!("kafka_assigner_{name} ");
    let line = response.lines().find(|l| l.starts_with(&series));
    line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok())
}

/// The next item of `stream`, panicking with `what` if none comes within `deadline` or
/// the stream ends.
pub async fn next_within<S>(stream: &mut S, deadline: Duration, what: &str) -> S::Item
where
    S: Stream + Unpin,
{
    match tokio::time::timeout(deadline, stream.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("stream ended while waiting for {what}"),
        Err(_) => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}
