//! How one [`EtcdStore`](super::EtcdStore) call is tried, retried and bounded.
//!
//! * Every call ends within its budget (`request_timeout`): each attempt runs under
//!   `timeout_at(deadline)`, so no call can hang on a frozen member or a dead connection.
//! * etcd-client balances over all endpoints (tower's power-of-two-choices) and never drops
//!   a dead one: a request can land on a killed member (fast transport error), a frozen one
//!   (no answer at all) or one that lost its leader (`Unavailable`, we require a leader).
//!   So with several endpoints an attempt is also bounded by `attempt_timeout`, and every
//!   retry goes to the next endpoint in turn through a client of its own: within as many
//!   attempts as there are endpoints, one lands on a healthy member.
//! * With one endpoint there is nowhere else to go: one attempt may use the whole budget
//!   (a short attempt timeout would only resend, and double-apply, slow writes).
//! * A call that needed retries is logged once as it starts waiting (`warn`, naming the
//!   endpoint and the error), and once when it got through (`info`, with the time lost).

use std::{
    future::Future,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use etcd_client::Client;
use tokio::time::Instant;

/// Why a call did not succeed.
pub(super) enum CallError {
    /// etcd (or the client) refused it; not worth retrying.
    Failed(etcd_client::Error),
    /// No answer in time; the message says what was tried.
    Unavailable(String),
}

/// First retry delay after a fast failure; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Whether an error means "try again" (no leader, member down, connection refused...).
pub(super) fn is_retryable(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => status.code() == tonic::Code::Unavailable,
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // The keep-alive stream ended before its first answer.
        etcd_client::Error::WatchError(_) => true,
        _ => false,
    }
}

/// The clients a call can use: the balanced one first, then one per endpoint in turn.
pub(super) struct Clients {
    /// Balanced over every endpoint.
    pub balanced: Client,
    /// One client per endpoint (`(url, client)`), only when there are several endpoints.
    pub per_endpoint: Vec<(String, Client)>,
    /// Where the next retry starts, shared by all calls so they spread over the endpoints.
    pub next: AtomicUsize,
    /// All endpoints, for messages.
    pub endpoints: String,
    /// Bound on one attempt when there are several endpoints.
    pub attempt_timeout: Duration,
}

impl Clients {
    /// Runs `f` until it succeeds, fails for good, or `budget` is spent (see the module docs).
    pub(super) async fn call<T, F, Fut>(
        &self,
        budget: Duration,
        what: &'static str,
        mut f: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let deadline = started + budget;
        let multi = !self.per_endpoint.is_empty();
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0u32;
        let mut last_error: Option<String> = None;
        loop {
            attempts += 1;
            let (client, via) = if attempts == 1 || !multi {
                (self.balanced.clone(), "any endpoint")
            } else {
                let index = self.next.fetch_add(1, Ordering::Relaxed) % self.per_endpoint.len();
                let (url, client) = &self.per_endpoint[index];
                (client.clone(), url.as_str())
            };
            let attempt_start = Instant::now();
            let attempt_deadline =
                if multi { deadline.min(attempt_start + self.attempt_timeout) } else { deadline };
            let failure = match tokio::time::timeout_at(attempt_deadline, f(client)).await {
                Ok(Ok(value)) => {
                    if attempts > 1 {
                        tracing::info!(
                            what,
                            attempts,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "etcd call got through after retries"
                        );
                    }
                    return Ok(value);
                }
                Ok(Err(error)) if is_retryable(&error) => format!("{via}: {error}"),
                Ok(Err(error)) => return Err(CallError::Failed(error)),
                Err(_elapsed) => format!("{via}: no answer within {:?}", attempt_deadline - attempt_start),
            };
            if last_error.is_none() {
                tracing::warn!(
                    what,
                    error = %failure,
                    endpoints = %self.endpoints,
                    "etcd call is waiting (a member down, an election, or no leader); retrying{}",
                    if multi { " on the next endpoint" } else { "" }
                );
            }
            let timed_out = Instant::now() >= attempt_deadline;
            last_error = Some(failure);
            if Instant::now() >= deadline {
                break;
            }
            if !timed_out {
                // A fast failure: do not spin on it.
                if Instant::now() + backoff >= deadline {
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        Err(CallError::Unavailable(format!(
            "{what}: no answer from etcd at {} within {budget:?} ({attempts} attempt(s); last error: {})",
            self.endpoints,
            last_error.as_deref().unwrap_or("timed out")
        )))
    }
}
