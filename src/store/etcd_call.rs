//! How one [`EtcdStore`](super::EtcdStore) call is tried, retried and bounded.
//!
//! * Every call ends within its budget (`request_timeout`): each attempt runs under
//!   `timeout_at(deadline)`, so no call can hang on a frozen member or a dead connection.
//! * etcd-client's own multi-endpoint client balances over every endpoint and never drops a
//!   dead one: a request can land on a killed member, a frozen one (no answer at all) or one
//!   that lost its leader (`Unavailable`: we require a leader), at random. So the store
//!   keeps one client per endpoint and, like etcd's Go client, **pins** one endpoint: every
//!   call goes there while it answers. An attempt that fails with a retryable error, or
//!   gets no answer within `attempt_timeout`, marks its endpoint suspect and moves the pin to
//!   the next endpoint not suspected in the last [`SUSPECT_FOR`]; the retry goes there. So a
//!   frozen or dead member costs one attempt of one call, not every call's whole budget.
//!   A watch stream that breaks or goes quiet moves the pin off its endpoint the same way
//!   (its re-watch then goes straight to a healthy member).
//! * With one endpoint there is nowhere else to go: one attempt may use the whole budget
//!   (a short attempt timeout would only resend, and double-apply, slow writes).
//! * A request cut by a broken connection (the client reports it as `Unknown: transport
//!   error`, or as an `h2 protocol error` when the answer was cut after its headers) is
//!   retried like `Unavailable`: no answer came, as with an attempt that timed
//!   out (and, like one, it may have been applied: a write's compares tell on the retry).
//! * A call that needed retries is logged once as it starts waiting (`warn`, naming the
//!   endpoint and the error), and once when it got through (`info`, with the time lost).

use std::{
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use etcd_client::Client;
use tokio::time::Instant;

use crate::store::{AttemptFailure, Unreachable};

/// Why a call did not succeed.
pub(super) enum CallError {
    /// etcd (or the client) refused it; not worth retrying.
    Failed(etcd_client::Error),
    /// No answer in time: what was tried, and how the last attempt failed.
    Unavailable(Unreachable),
}

/// First retry delay after a fast failure; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Whether an error means "try again" (no leader, member down, connection refused...).
pub(super) fn is_retryable(error: &etcd_client::Error) -> bool {
    // A certificate we refuse stays refused: fail now, naming the flag.
    if matches!(crate::store::etcd_tls::tls_error_of(error), Some(rustls::Error::InvalidCertificate(_))) {
        return false;
    }
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable || cut_in_transit(status)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // The keep-alive stream ended before its first answer.
        etcd_client::Error::WatchError(_) => true,
        _ => false,
    }
}

/// Whether `status` is the client's own report of a connection that broke under the request
/// (etcd's answers carry no source). A request sent on a connection etcd just dropped comes
/// back at once as `Unknown: transport error` (connection reset): the outage seen early,
/// and its retry waits for the next connection like any other attempt in it. An answer cut
/// after its headers comes back as `Unknown: h2 protocol error: error reading a body from
/// connection`, whose source is hyper's error over h2's, which hides the I/O error beneath
/// it: any hyper error but a misuse of its API is a broken connection too.
fn cut_in_transit(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::transport::Error>() || error.is::<std::io::Error>() {
            return true;
        }
        if error.downcast_ref::<hyper::Error>().is_some_and(|hyper| !hyper.is_user()) {
            return true;
        }
        source = error.source();
    }
    false
}

/// How long an endpoint that failed an attempt is passed over when the pin moves.
pub(super) const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// One client per endpoint, and which one calls use (see the module docs).
pub(super) struct Clients {
    /// `(url, client)` per endpoint, in configuration order; never empty.
    clients: Vec<(String, Client)>,
    /// The endpoint calls go to.
    pinned: AtomicUsize,
    /// When each endpoint last failed an attempt.
    failed_at: Mutex<Vec<Option<Instant>>>,
    /// All endpoints, for messages.
    endpoints: String,
    /// Bound on one attempt when there are several endpoints.
    attempt_timeout: Duration,
}

impl Clients {
    /// Clients for `clients` (`(url, client)`, at least one), pinned first to `first`.
    pub(super) fn new(clients: Vec<(String, Client)>, first: usize, attempt_timeout: Duration) -> Self {
        let endpoints = clients.iter().map(|(url, _)| url.as_str()).collect::<Vec<_>>().join(",");
        let failed_at = Mutex::new(vec![None; clients.len()]);
        let pinned = AtomicUsize::new(first % clients.len().max(1));
        Clients { clients, pinned, failed_at, endpoints, attempt_timeout }
    }

    /// All endpoints, comma-separated.
    pub(super) fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// The pinned endpoint's URL.
    pub(super) fn pinned_endpoint(&self) -> &str {
        &self.clients[self.pinned()].0
    }

    /// The pinned endpoint's index.
    pub(super) fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Relaxed)
    }

    /// A stream on endpoint `index` broke or went quiet: calls move off it (with one
    /// endpoint, nothing changes).
    pub(super) fn failed(&self, index: usize) {
        if self.clients.len() > 1 {
            self.fail_over(index);
        }
    }

    /// Marks endpoint `failed` suspect and, if calls still go there, moves the pin to the
    /// next endpoint not suspected lately (or simply the next one if all are).
    fn fail_over(&self, failed: usize) {
        let n = self.clients.len();
        let now = Instant::now();
        let next = {
            let mut failed_at = self.failed_at.lock().unwrap_or_else(PoisonError::into_inner);
            failed_at[failed] = Some(now);
            (1..n)
                .map(|step| (failed + step) % n)
                .find(|&i| failed_at[i].is_none_or(|at| now.duration_since(at) >= SUSPECT_FOR))
                .unwrap_or((failed + 1) % n)
        };
        if n > 1 && self.pinned.compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::warn!(
                from = %self.clients[failed].0,
                to = %self.clients[next].0,
                "etcd endpoint failed an attempt; calls move to the next endpoint"
            );
        }
    }

    /// Runs `f` until it succeeds, fails for good, or `budget` is spent (see the module docs).
    pub(super) async fn call<T, F, Fut>(
        &self,
        budget: Duration,
        what: &'static str,
        f: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_on(budget, what, f).await.map(|(value, _)| value)
    }

    /// [`call`](Self::call), also returning the index of the endpoint that answered (a
    /// long-lived stream stays there; [`failed`](Self::failed) reports it broken).
    pub(super) async fn call_on<T, F, Fut>(
        &self,
        budget: Duration,
        what: &'static str,
        mut f: F,
    ) -> Result<(T, usize), CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let deadline = started + budget;
        let multi = self.clients.len() > 1;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let index = self.pinned();
            let (url, client) = &self.clients[index];
            let attempt_start = Instant::now();
            let attempt_deadline =
                if multi { deadline.min(attempt_start + self.attempt_timeout) } else { deadline };
            let failure = match tokio::time::timeout_at(attempt_deadline, f(client.clone())).await {
                Ok(Ok(value)) => {
                    if attempts > 1 {
                        tracing::info!(
                            what,
                            attempts,
                            endpoint = %url,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "etcd call got through after retries"
                        );
                    }
                    return Ok((value, index));
                }
                Ok(Err(error)) if is_retryable(&error) => {
                    AttemptFailure::Failed { endpoint: url.clone(), source: Arc::new(error) }
                }
                Ok(Err(error)) => return Err(CallError::Failed(error)),
                Err(_elapsed) => AttemptFailure::NoAnswer {
                    endpoint: url.clone(),
                    within: attempt_deadline - attempt_start,
                },
            };
            if attempts == 1 {
                tracing::warn!(
                    what,
                    error = %failure,
                    "etcd call is waiting (a member down or frozen, an election, or no leader); retrying{}",
                    if multi { " on the next endpoint" } else { "" }
                );
            }
            let timed_out = Instant::now() >= attempt_deadline;
            if multi {
                self.fail_over(index);
            }
            // A fast failure waits before its retry, so it does not spin (all endpoints may be
            // refusing): when that wait would not fit, the budget is spent too.
            let spent = Instant::now() >= deadline || (!timed_out && Instant::now() + backoff >= deadline);
            if spent {
                let endpoints = self.endpoints.clone();
                let out_of_time = Unreachable::OutOfTime { what, endpoints, budget, attempts, last: failure };
                return Err(CallError::Unavailable(out_of_time));
            }
            if !timed_out {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients on loopback ports nobody listens on (clients connect lazily).
    async fn dead_clients(n: usize) -> Clients {
        let mut clients = Vec::new();
        for _ in 0..n {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap_or_else(|e| panic!("bind: {e}"));
            let url = format!("http://127.0.0.1:{port}");
            let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_millis(100));
            let client =
                Client::connect([url.as_str()], Some(options)).await.unwrap_or_else(|e| panic!("{e}"));
            clients.push((url, client));
        }
        Clients::new(clients, 0, Duration::from_millis(200))
    }

    #[tokio::test]
    async fn the_pin_skips_suspects_and_moves_once() {
        let clients = dead_clients(3).await;
        assert_eq!(clients.pinned(), 0);
        clients.failed(0);
        assert_eq!(clients.pinned(), 1);
        // A late report about endpoint 0 does not move the pin off the healthy-looking 1.
        clients.failed(0);
        assert_eq!(clients.pinned(), 1);
        clients.failed(1);
        assert_eq!(clients.pinned(), 2, "0 and 1 are suspect");
        clients.failed(2);
        assert_eq!(clients.pinned(), 0, "all suspect: simply the next");
    }

    #[tokio::test]
    async fn a_call_to_dead_endpoints_ends_within_its_budget() {
        let clients = dead_clients(3).await;
        let budget = Duration::from_millis(700);
        let started = Instant::now();
        let result =
            clients.call(budget, "get", |mut client| async move { client.get("k", None).await }).await;
        let elapsed = started.elapsed();
        match result {
            Err(CallError::Unavailable(Unreachable::OutOfTime { endpoints, attempts, .. })) => {
                assert_eq!(endpoints, clients.endpoints());
                assert!(attempts >= 1);
            }
            Err(CallError::Unavailable(other)) => panic!("expected OutOfTime, got {other}"),
            Err(CallError::Failed(error)) => panic!("expected Unavailable, got {error}"),
            Ok(_) => panic!("a dead endpoint answered"),
        }
        // It may give up early, when the next retry would not fit: never late.
        assert!(elapsed < budget + Duration::from_millis(300), "took {elapsed:?}");
    }

    /// Serves gRPC health on loopback behind a proxy that passes the client's bytes on, and
    /// the server's up to the first response headers, then closes the client's connection:
    /// an answer cut after its headers, as when etcd dies mid-answer. The address to call.
    async fn answers_cut_after_their_headers() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let server_addr = server.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let (_reporter, health) = tonic_health::server::health_reporter();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(server);
        tokio::spawn(tonic::transport::Server::builder().add_service(health).serve_with_incoming(incoming));
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let proxy_addr = proxy.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            let (client, _) = proxy.accept().await.unwrap_or_else(|e| panic!("{e}"));
            let upstream =
                tokio::net::TcpStream::connect(server_addr).await.unwrap_or_else(|e| panic!("{e}"));
            let ((mut from_client, mut to_client), (mut from_server, mut to_server)) =
                (client.into_split(), upstream.into_split());
            tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
            // The server's side, frame by frame (9-byte header: length, type, flags, stream).
            let mut frame_header = [0u8; 9];
            loop {
                from_server.read_exact(&mut frame_header).await.unwrap_or_else(|e| panic!("{e}"));
                let length = u32::from_be_bytes([0, frame_header[0], frame_header[1], frame_header[2]]);
                let mut payload = vec![0u8; length as usize];
                from_server.read_exact(&mut payload).await.unwrap_or_else(|e| panic!("{e}"));
                to_client.write_all(&frame_header).await.unwrap_or_else(|e| panic!("{e}"));
                to_client.write_all(&payload).await.unwrap_or_else(|e| panic!("{e}"));
                let stream =
                    u32::from_be_bytes([frame_header[5], frame_header[6], frame_header[7], frame_header[8]]);
                const HEADERS: u8 = 0x1;
                if frame_header[3] == HEADERS && stream & 0x7fff_ffff != 0 {
                    break;
                }
            }
            // A clean end of the connection (FIN), so the headers arrive before it.
            to_client.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
            std::future::pending::<()>().await;
        });
        proxy_addr
    }

    #[tokio::test]
    async fn an_answer_cut_after_its_headers_is_retried() {
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let address = answers_cut_after_their_headers().await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap_or_else(|e| panic!("{e}"))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let answer = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await;
        let status = answer.expect_err("the answer was cut");
        assert_eq!(status.code(), tonic::Code::Unknown, "{status:?}");
        assert!(is_retryable(&etcd_client::Error::GRpcStatus(status.clone())), "not retried: {status:?}");
    }
}
