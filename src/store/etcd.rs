//! [`EtcdStore`]: the [`LeaseStore`] on a real etcd v3 cluster.
//!
//! * **Timeouts and retries** (see `etcd_call.rs`). Every call is bounded by
//!   [`EtcdStoreConfig::request_timeout`] and retried while etcd answers `Unavailable` or the
//!   transport fails (a dead member, a leader election, a restarting member). Calls go to one
//!   pinned endpoint; with several endpoints each attempt is also bounded by
//!   [`EtcdStoreConfig::attempt_timeout`], and a failed attempt moves the pin (and its retry)
//!   to the next endpoint, so a frozen or dead member costs one attempt of one call, not
//!   every call's whole budget. When time runs out the call fails with [`StoreError::Unavailable`]
//!   naming the endpoints and the last error. A retried transaction whose first attempt was
//!   applied but whose answer was lost is seen as a failed compare-and-swap (its compares
//!   no longer hold); an unconditional write may be applied twice (same value, one more
//!   revision). Callers re-read after a failed CAS anyway.
//! * **Sessions** are etcd leases. etcd TTLs are whole seconds: the TTL is rounded **up** to
//!   whole seconds, at least 1 s; the server may raise it further to its minimum TTL
//!   (1.5 × election timeout, rounded up: 2 s with etcd's default settings).
//! * **Watches** use etcd's watch with `start_revision` and yield one [`WatchBatch`] per
//!   revision (see `etcd_watch.rs`); a compacted start revision ends the stream with
//!   [`StoreError::Compacted`] (reported as the first item, as etcd reports it
//!   asynchronously). Any broken or cancelled watch ends the stream with an error item.
//!   A start revision of `0` (or less) means "from the next revision on". A watch quiet for
//!   2 s asks etcd for a progress notification and ends `Unavailable` if none comes within
//!   the attempt (or, with one endpoint, request) timeout: a frozen member or a black-holed
//!   connection breaks the watch instead of silently stalling it.
//!   The client requires a leader (`hasleader` metadata), so a member cut off from the
//!   cluster fails requests and watches instead of serving stale state.
//! * **Time.** Timeouts and backoff run on tokio timers: do not use an `EtcdStore` under
//!   `tokio::time::pause()` (auto-advance would fire the timeouts while etcd is answering).
//!
//! [`WatchBatch`]: super::WatchBatch

#[path = "etcd_call.rs"]
mod call;
#[path = "etcd_codec.rs"]
mod codec;
#[path = "etcd_rpctypes.rs"]
pub(super) mod rpctypes;
#[path = "etcd_watch.rs"]
mod watch;

use std::{
    fmt,
    future::Future,
    sync::Arc,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions, GetOptions, WatchOptions};

use self::call::{CallError, Clients, is_retryable};
use self::codec::{etcd_txn, key_value, ttl_seconds};
use self::rpctypes::{is_compacted, is_lease_not_found};
use self::watch::Watch;
use super::{
    AttemptFailure, KeyValue, LeaseStore, Malformed, Op, PrefixSnapshot, Revision, SessionId, StoreError,
    Txn, TxnOutcome, Unreachable, WatchBroke, WatchStream,
};

/// How to reach etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdStoreConfig {
    /// Client URLs (`http://host:2379`; a bare `host:port` means `http://`).
    pub endpoints: Vec<String>,
    /// Bound on [`EtcdStore::connect`] (connection plus a first successful request) and on
    /// each TCP connection attempt.
    pub connect_timeout: Duration,
    /// Bound on every store call, retries included.
    pub request_timeout: Duration,
    /// With several endpoints, bound on one attempt of a call before it is retried on the
    /// next endpoint (a frozen member never answers). Ignored with one endpoint.
    pub attempt_timeout: Duration,
    /// TLS and credentials (none: plaintext, no auth).
    pub security: super::EtcdSecurity,
    /// How long a watch may be quiet before it asks etcd for a progress notification
    /// (`WatchRequest::ProgressRequest`, etcd 3.4+): a live member answers at once, and
    /// the answer reaches the follower as a progress mark, so a watch that hangs without
    /// an error is noticed ([`LeaseStore::watch_progress_every`]). The service sets a
    /// quarter of the session TTL.
    pub watch_progress_every: Duration,
}

impl EtcdStoreConfig {
    /// Default timeouts (5 s to connect, 5 s per request, 1 s per attempt) for these
    /// endpoints.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdStoreConfig { endpoints: endpoints.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`attempt_timeout`](Self::attempt_timeout).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// Sets [`watch_progress_every`](Self::watch_progress_every).
    pub fn with_watch_progress_every(mut self, every: Duration) -> Self {
        self.watch_progress_every = every;
        self
    }
}

/// Each etcd call's budget, retries included, unless configured otherwise
/// ([`EtcdStoreConfig::request_timeout`]). The handoff state machine gives each of its
/// store requests the same deadline.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for EtcdStoreConfig {
    /// `http://127.0.0.1:2379`, 5 s to connect, 5 s per request, 1 s per attempt.
    fn default() -> Self {
        EtcdStoreConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            connect_timeout: Duration::from_secs(5),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            // Loopback etcd answers a 64-key txn in about 1 ms; 1 s is far beyond a healthy
            // member's answer and leaves a 5 s budget room for four more endpoints.
            attempt_timeout: Duration::from_secs(1),
            security: super::EtcdSecurity::default(),
            // A quarter of the service's default 10 s session TTL.
            watch_progress_every: Duration::from_millis(2_500),
        }
    }
}

/// A [`LeaseStore`] on etcd (see the module docs). Cloning is cheap and shares the
/// connections.
#[derive(Clone)]
pub struct EtcdStore {
    clients: Arc<Clients>,
    config: Arc<EtcdStoreConfig>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Counts stores made by this process (to spread their pinned endpoints).
static NEXT_STORE: AtomicUsize = AtomicUsize::new(0);

/// Large prefix reads and watch replays may exceed gRPC's default 4 MiB per message.
const MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;

/// A failed first contact `error`, as the TLS or credentials flag to fix when its
/// `diagnosis` ([`super::EtcdSecurity::diagnose`]) names one; otherwise as it is.
fn diagnosed(diagnosis: Option<String>, error: StoreError) -> StoreError {
    match diagnosis {
        Some(diagnosis) => {
            StoreError::Invalid(Malformed::Misconfigured { diagnosis, cause: Box::new(error) })
        }
        None => error,
    }
}

/// Builds a client for `endpoints` within `timeout` (connections are made lazily by the
/// client; this fails only on malformed endpoints or a client that cannot start).
async fn client(
    endpoints: &[String],
    options: ConnectOptions,
    timeout: Duration,
    security: &super::EtcdSecurity,
) -> Result<Client, StoreError> {
    // A TLS or credentials problem is reported naming the flag to fix, not as "unavailable".
    let endpoints = endpoints.to_vec();
    match tokio::time::timeout(timeout, Client::connect(&endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => {
            let reason = super::etcd_tls::error_chain(&error);
            let retryable = is_retryable(&error);
            let diagnosis = security.diagnose(Some(&error), &reason);
            let source = Arc::new(error);
            let error = if retryable {
                StoreError::Unavailable(Unreachable::Connect { endpoints, source })
            } else {
                StoreError::Invalid(Malformed::Connect { endpoints, source })
            };
            Err(diagnosed(diagnosis, error))
        }
        Err(_) => Err(StoreError::Unavailable(Unreachable::ConnectTimeout { endpoints, within: timeout })),
    }
}

impl EtcdStore {
    /// Connects and checks the cluster answers (a linearizable read, so a cluster without
    /// a leader is not "up"), all within `connect_timeout`. A dead cluster is
    /// [`StoreError::Unavailable`], not a hang; a malformed endpoint is
    /// [`StoreError::Invalid`].
    pub async fn connect(config: EtcdStoreConfig) -> Result<EtcdStore, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Invalid(Malformed::NoEndpoints));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // Detects a silently dead connection under a long-lived watch. etcd refuses
            // pings more often than every 5 s (`--grpc-keepalive-min-time`).
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        let options = config
            .security
            .apply(options)
            .map_err(|e| StoreError::Invalid(Malformed::Security(Arc::new(e))))?;
        // One deadline for everything: the clients, then the probe.
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut clients = Vec::new();
        for endpoint in &config.endpoints {
            let single =
                client(std::slice::from_ref(endpoint), options.clone(), left(), &config.security).await?;
            clients.push((endpoint.clone(), single));
        }
        // Spread instances over the members: each starts pinned to a different endpoint.
        let first = std::process::id() as usize + NEXT_STORE.fetch_add(1, Ordering::Relaxed);
        let clients = Clients::new(clients, first, config.attempt_timeout);
        let security = config.security.clone();
        let store = EtcdStore { clients: Arc::new(clients), config: Arc::new(config) };
        let probe = store
            .clients
            .call(left(), "connect", |mut client| async move {
                client.get("kafka-assigner/connect-probe", Some(GetOptions::new().with_count_only())).await
            })
            .await;
        match probe {
            Ok(_) => Ok(store),
            // Out of time: the last attempt's failure says why.
            Err(CallError::Unavailable(unreachable)) => {
                let reason = unreachable.to_string();
                let last = match &unreachable {
                    Unreachable::OutOfTime { last: AttemptFailure::Failed { source, .. }, .. } => {
                        Some(source.clone())
                    }
                    _ => None,
                };
                let diagnosis = security.diagnose(last.as_deref(), &reason);
                Err(diagnosed(diagnosis, StoreError::Unavailable(unreachable)))
            }
            Err(CallError::Failed(error)) => {
                let reason = super::etcd_tls::error_chain(&error);
                let diagnosis = security.diagnose(Some(&error), &reason);
                Err(diagnosed(diagnosis, store.store_error(CallError::Failed(error))))
            }
        }
    }

    /// The endpoint calls go to now (it moves when an attempt there fails).
    pub fn pinned_endpoint(&self) -> &str {
        self.clients.pinned_endpoint()
    }

    /// The configuration this store was connected with.
    pub fn config(&self) -> &EtcdStoreConfig {
        &self.config
    }

    /// Runs `f` (with a client handle per attempt) within `request_timeout`.
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.clients.call(self.config.request_timeout, what, f).await
    }

    /// The generic mapping of a failed call.
    fn store_error(&self, error: CallError) -> StoreError {
        match error {
            CallError::Unavailable(unreachable) => StoreError::Unavailable(unreachable),
            CallError::Failed(error) => match &error {
                etcd_client::Error::GRpcStatus(status)
                    if matches!(
                        status.code(),
                        tonic::Code::InvalidArgument
                            | tonic::Code::OutOfRange
                            | tonic::Code::FailedPrecondition
                    ) =>
                {
                    StoreError::Invalid(Malformed::Refused(Arc::new(error)))
                }
                etcd_client::Error::InvalidArgs(_)
                | etcd_client::Error::InvalidUri(_)
                | etcd_client::Error::Utf8Error(_) => StoreError::Invalid(Malformed::Client(Arc::new(error))),
                _ => StoreError::Unavailable(Unreachable::Client {
                    endpoints: self.clients.endpoints().to_string(),
                    source: Arc::new(error),
                }),
            },
        }
    }
}

#[async_trait]
impl LeaseStore for EtcdStore {
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError> {
        let seconds = ttl_seconds(ttl);
        let response = self
            .call("lease grant", |mut client| async move { client.lease_grant(seconds, None).await })
            .await
            .map_err(|e| self.store_error(e))?;
        if !response.error().is_empty() {
            let reason = response.error().to_string();
            return Err(StoreError::Unavailable(Unreachable::LeaseGrant { reason }));
        }
        if response.ttl() != seconds {
            tracing::debug!(requested = seconds, granted = response.ttl(), "etcd changed the lease TTL");
        }
        Ok(SessionId(response.id()))
    }

    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError> {
        // One request on a fresh keep-alive stream; the client reads the one answer and
        // reports TTL 0 (lease gone) as `LeaseKeepAliveError`.
        let alive = self
            .call("lease keep-alive", |mut client| async move {
                match client.lease_keep_alive(session.0).await {
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                    Err(error) if is_lease_not_found(&error) => Ok(false),
                    Err(error) => Err(error),
                }
            })
            .await
            .map_err(|e| self.store_error(e))?;
        if alive { Ok(()) } else { Err(StoreError::SessionExpired(session)) }
    }

    async fn connect_again(&self) -> Result<Option<Arc<dyn LeaseStore>>, StoreError> {
        let again = EtcdStore::connect((*self.config).clone()).await?;
        Ok(Some(Arc::new(again)))
    }

    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError> {
        self.call("lease revoke", |mut client| async move {
            match client.lease_revoke(session.0).await {
                Ok(_) => Ok(()),
                Err(error) if is_lease_not_found(&error) => Ok(()),
                Err(error) => Err(error),
            }
        })
        .await
        .map_err(|e| self.store_error(e))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let response = self
            .call("get", |mut client| async move { client.get(key, None).await })
            .await
            .map_err(|e| self.store_error(e))?;
        response.kvs().first().map(key_value).transpose()
    }

    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError> {
        let response = self
            .call("get prefix", |client| async move {
                let mut kv = client.kv_client().max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE);
                kv.get(prefix, Some(GetOptions::new().with_prefix())).await
            })
            .await
            .map_err(|e| self.store_error(e))?;
        let revision = response.header().map(|h| h.revision()).unwrap_or_default();
        let kvs = response.kvs().iter().map(key_value).collect::<Result<_, _>>()?;
        Ok(PrefixSnapshot { kvs, revision })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let request = etcd_txn(&txn);
        let result = self
            .call("txn", |mut client| {
                let request = request.clone();
                async move { client.txn(request).await }
            })
            .await;
        match result {
            Ok(response) => Ok(TxnOutcome {
                succeeded: response.succeeded(),
                revision: response.header().map(|h| h.revision()).unwrap_or_default(),
            }),
            Err(CallError::Failed(error)) if is_lease_not_found(&error) => {
                // etcd does not say which lease; name the first one the txn uses.
                let session = txn.ops.iter().find_map(|op| match op {
                    Op::Put { session, .. } => *session,
                    Op::Delete { .. } => None,
                });
                Err(StoreError::SessionExpired(session.unwrap_or(SessionId(0))))
            }
            Err(error) => Err(self.store_error(error)),
        }
    }

    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError> {
        let options = WatchOptions::new().with_prefix().with_start_revision(from_revision.max(0));
        let ((stream, first), endpoint) = self
            .clients
            .call_on(self.config.request_timeout, "watch", |client| {
                let options = options.clone();
                async move {
                    let mut watcher =
                        client.watch_client().max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE);
                    let mut stream = watcher.watch(prefix, Some(options)).await?;
                    // The "created" answer: the watch is registered once we have it.
                    let first = stream.message().await?;
                    Ok((stream, first))
                }
            })
            .await
            .map_err(|e| self.store_error(e))?;
        let answer_within = if self.config.endpoints.len() > 1 {
            self.config.attempt_timeout
        } else {
            self.config.request_timeout
        };
        let on_break = (self.clients.clone(), endpoint);
        let timing = watch::Timing { progress_every: self.config.watch_progress_every, answer_within };
        let mut watch =
            Watch::new(stream, from_revision, self.clients.endpoints().to_string(), timing, on_break);
        match first {
            Some(response) => watch.absorb(response),
            None => {
                let endpoints = self.clients.endpoints().to_string();
                return Err(StoreError::Unavailable(WatchBroke::EndedAtOnce { endpoints }.into()));
            }
        }
        if let Some(compacted) = watch.take_compacted() {
            return Err(compacted);
        }
        Ok(watch.into_stream())
    }

    fn watch_progress_every(&self) -> Option<Duration> {
        Some(self.config.watch_progress_every)
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let result =
            self.call("compact", |mut client| async move { client.compact(revision, None).await }).await;
        match result {
            Ok(_) => Ok(()),
            // Already compacted at or past this revision: nothing to do.
            Err(CallError::Failed(error)) if is_compacted(&error) => Ok(()),
            Err(error) => Err(self.store_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn empty_endpoints_are_invalid() {
        let config = EtcdStoreConfig { endpoints: vec![], ..EtcdStoreConfig::default() };
        assert!(matches!(EtcdStore::connect(config).await, Err(StoreError::Invalid(Malformed::NoEndpoints))));
    }
}
