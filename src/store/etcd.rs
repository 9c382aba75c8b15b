//! [`EtcdStore`]: the [`LeaseStore`] on a real etcd v3 cluster.
//!
//! * **Timeouts and retries.** Every call is bounded by
//!   [`EtcdStoreConfig::request_timeout`] and retried with a short backoff while etcd answers
//!   `Unavailable` or the transport fails (a dead endpoint of a multi-endpoint client, a
//!   leader election, a restarting member). When time runs out the call fails with
//!   [`StoreError::Unavailable`] naming the endpoints and the last error. A retried
//!   transaction whose first attempt was applied but whose answer was lost is seen as a
//!   failed compare-and-swap (its compares no longer hold); an unconditional write may be
//!   applied twice (same value, one more revision). Callers re-read after a failed CAS anyway.
//! * **Sessions** are etcd leases. etcd TTLs are whole seconds: the TTL is rounded **up** to
//!   whole seconds, at least 1 s; the server may raise it further to its minimum TTL
//!   (1.5 × election timeout, rounded up: 2 s with etcd's default settings).
//! * **Watches** use etcd's watch with `start_revision`; a compacted start revision ends the
//!   stream with [`StoreError::Compacted`] (reported as the first item, as etcd reports it
//!   asynchronously). Any broken or cancelled watch ends the stream with an error item.
//!   A start revision of `0` (or less) means "from the next revision on".
//!   The client requires a leader (`hasleader` metadata), so a member cut off from the
//!   cluster fails requests and watches instead of serving stale state.
//! * **Time.** Timeouts and backoff run on tokio timers: do not use an `EtcdStore` under
//!   `tokio::time::pause()` (auto-advance would fire the timeouts while etcd is answering).

use std::{collections::VecDeque, fmt, future::Future, sync::Arc, time::Duration};

use async_trait::async_trait;
use etcd_client::{
    Client, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, TxnOp, WatchOptions, WatchResponse,
};
use futures::StreamExt;
use tokio::time::Instant;

use super::{
    Compare, KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn, TxnOutcome,
    WatchEvent, WatchEventKind, WatchStream,
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
    /// TLS and credentials (none: plaintext, no auth).
    pub security: super::EtcdSecurity,
}

impl EtcdStoreConfig {
    /// Default timeouts (5 s to connect, 5 s per request) for these endpoints.
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
}

impl Default for EtcdStoreConfig {
    /// `http://127.0.0.1:2379`, 5 s to connect, 5 s per request.
    fn default() -> Self {
        EtcdStoreConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            security: super::EtcdSecurity::default(),
        }
    }
}

/// A [`LeaseStore`] on etcd (see the module docs). Cloning is cheap and shares the
/// connections.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    config: Arc<EtcdStoreConfig>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Why a call did not succeed.
enum CallError {
    /// etcd (or the client) refused it; not worth retrying.
    Failed(etcd_client::Error),
    /// No answer in time; the message says what was tried.
    Unavailable(String),
}

/// Large prefix reads and watch replays may exceed gRPC's default 4 MiB per message.
const MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;

/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Whether an error means "try again" (no leader, member down, connection refused...).
fn is_retryable(error: &etcd_client::Error) -> bool {
    // A certificate etcd or we refuse stays refused: fail now, naming the flag.
    if super::etcd_tls::error_chain(error).contains("InvalidCertificate") {
        return false;
    }
    match error {
        etcd_client::Error::GRpcStatus(status) => status.code() == tonic::Code::Unavailable,
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // The keep-alive stream ended before its first answer.
        etcd_client::Error::WatchError(_) => true,
        _ => false,
    }
}

fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::NotFound && status.message().contains("lease not found"))
}

fn grpc_message(error: &etcd_client::Error) -> Option<&str> {
    match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.message()),
        _ => None,
    }
}

impl EtcdStore {
    /// Connects and checks the cluster answers (a linearizable read, so a cluster without
    /// a leader is not "up"), all within `connect_timeout`. A dead cluster is
    /// [`StoreError::Unavailable`], not a hang; a malformed endpoint is
    /// [`StoreError::Invalid`].
    pub async fn connect(config: EtcdStoreConfig) -> Result<EtcdStore, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Invalid("no etcd endpoints given".into()));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // Detects a silently dead connection under a long-lived watch. etcd refuses
            // pings more often than every 5 s (`--grpc-keepalive-min-time`).
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        let options = config.security.apply(options).map_err(|e| StoreError::Invalid(e.to_string()))?;
        // A TLS or credentials problem is reported naming the flag to fix, not as "unavailable".
        let diagnose = |reason: String| match config.security.diagnose(&reason) {
            Some(message) => StoreError::Invalid(message),
            None => StoreError::Unavailable(format!("etcd at {:?}: {reason}", config.endpoints)),
        };
        let client = match tokio::time::timeout(
            config.connect_timeout,
            Client::connect(&config.endpoints, Some(options)),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(error)) if is_retryable(&error) => {
                return Err(diagnose(super::etcd_tls::error_chain(&error)));
            }
            Ok(Err(error)) => {
                let reason = super::etcd_tls::error_chain(&error);
                return Err(config.security.diagnose(&reason).map_or_else(
                    || StoreError::Invalid(format!("etcd endpoints {:?}: {reason}", config.endpoints)),
                    StoreError::Invalid,
                ));
            }
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "etcd at {:?}: no connection within {:?}",
                    config.endpoints, config.connect_timeout
                )));
            }
        };
        let connect_timeout = config.connect_timeout;
        let security = config.security.clone();
        let store = EtcdStore { client, config: Arc::new(config) };
        let probe = store
            .call_within(connect_timeout, "connect", |mut client| async move {
                client.get("kafka-assigner/connect-probe", Some(GetOptions::new().with_count_only())).await
            })
            .await;
        match probe {
            Ok(_) => Ok(store),
            // The retry loop keeps only the last error's text: diagnose that.
            Err(CallError::Unavailable(reason)) => {
                Err(security.diagnose(&reason).map_or(StoreError::Unavailable(reason), StoreError::Invalid))
            }
            Err(CallError::Failed(error)) => {
                let reason = super::etcd_tls::error_chain(&error);
                Err(security
                    .diagnose(&reason)
                    .map_or_else(|| store.store_error(CallError::Failed(error)), StoreError::Invalid))
            }
        }
    }

    /// The configuration this store was connected with.
    pub fn config(&self) -> &EtcdStoreConfig {
        &self.config
    }

    /// Runs `f` (with a fresh client handle each attempt) within `request_timeout`.
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(self.config.request_timeout, what, f).await
    }

    /// Runs `f` until it succeeds, fails for good, or `budget` is spent, retrying
    /// retryable errors with a short backoff.
    async fn call_within<T, F, Fut>(
        &self,
        budget: Duration,
        what: &'static str,
        mut f: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + budget;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0u32;
        let mut last_error = None;
        loop {
            attempts += 1;
            match tokio::time::timeout_at(deadline, f(self.client.clone())).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) if is_retryable(&error) => {
                    tracing::debug!(%error, what, attempts, "etcd call failed; retrying");
                    last_error = Some(super::etcd_tls::error_chain(&error));
                    if Instant::now() + backoff >= deadline {
                        break;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Ok(Err(error)) => return Err(CallError::Failed(error)),
                Err(_elapsed) => break,
            }
        }
        Err(CallError::Unavailable(format!(
            "{what}: no answer from etcd at {} within {budget:?} ({attempts} attempt(s); last error: {})",
            self.config.endpoints.join(","),
            last_error.as_deref().unwrap_or("timed out")
        )))
    }

    /// The generic mapping of a failed call.
    fn store_error(&self, error: CallError) -> StoreError {
        match error {
            CallError::Unavailable(message) => StoreError::Unavailable(message),
            CallError::Failed(error) => match &error {
                etcd_client::Error::GRpcStatus(status)
                    if matches!(
                        status.code(),
                        tonic::Code::InvalidArgument
                            | tonic::Code::OutOfRange
                            | tonic::Code::FailedPrecondition
                    ) =>
                {
                    StoreError::Invalid(format!("etcd refused the request: {}", status.message()))
                }
                etcd_client::Error::InvalidArgs(_)
                | etcd_client::Error::InvalidUri(_)
                | etcd_client::Error::Utf8Error(_) => StoreError::Invalid(error.to_string()),
                _ => StoreError::Unavailable(format!("etcd at {}: {error}", self.config.endpoints.join(","))),
            },
        }
    }
}

/// etcd TTLs are whole seconds: round up, at least 1.
fn ttl_seconds(ttl: Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

fn key_value(kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: key_string(kv)?,
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        session: (kv.lease() != 0).then_some(SessionId(kv.lease())),
    })
}

fn key_string(kv: &etcd_client::KeyValue) -> Result<String, StoreError> {
    String::from_utf8(kv.key().to_vec()).map_err(|_| {
        StoreError::Invalid(format!("etcd key is not UTF-8: {:?}", String::from_utf8_lossy(kv.key())))
    })
}

fn etcd_txn(txn: &Txn) -> etcd_client::Txn {
    let compares: Vec<etcd_client::Compare> = txn
        .compares
        .iter()
        .map(|compare| match compare {
            Compare::ModRevision(key, rev) => {
                etcd_client::Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
            }
            Compare::CreateRevision(key, rev) => {
                etcd_client::Compare::create_revision(key.as_str(), CompareOp::Equal, *rev)
            }
            Compare::Value(key, value) => {
                etcd_client::Compare::value(key.as_str(), CompareOp::Equal, value.clone())
            }
        })
        .collect();
    let ops: Vec<TxnOp> = txn
        .ops
        .iter()
        .map(|op| match op {
            Op::Put { key, value, session } => {
                TxnOp::put(key.as_str(), value.clone(), session.map(|s| PutOptions::new().with_lease(s.0)))
            }
            Op::Delete { key } => TxnOp::delete(key.as_str(), None),
        })
        .collect();
    etcd_client::Txn::new().when(compares).and_then(ops)
}

/// The state behind a [`WatchStream`] from etcd.
struct Watch {
    stream: etcd_client::WatchStream,
    pending: VecDeque<Result<WatchEvent, StoreError>>,
    /// An error item was queued: nothing after it.
    failed: bool,
    from_revision: Revision,
    endpoints: String,
}

impl Watch {
    /// Queues the events (or the error) of one etcd response, in order.
    fn absorb(&mut self, response: WatchResponse) {
        if self.failed {
            return;
        }
        if response.compact_revision() > 0 {
            self.fail(StoreError::Compacted {
                requested: self.from_revision,
                compacted: response.compact_revision(),
            });
            return;
        }
        if response.canceled() {
            let reason = response.cancel_reason();
            self.fail(StoreError::Unavailable(format!(
                "etcd at {} cancelled the watch: {reason}",
                self.endpoints
            )));
            return;
        }
        for event in response.events() {
            let Some(kv) = event.kv() else {
                self.fail(StoreError::Invalid("etcd watch event without a key".into()));
                return;
            };
            let item = match event.event_type() {
                EventType::Put => key_value(kv).map(|record| WatchEvent {
                    key: record.key.clone(),
                    revision: kv.mod_revision(),
                    kind: WatchEventKind::Put(record),
                }),
                EventType::Delete => key_string(kv).map(|key| WatchEvent {
                    key,
                    revision: kv.mod_revision(),
                    kind: WatchEventKind::Delete,
                }),
            };
            match item {
                Ok(event) => self.pending.push_back(Ok(event)),
                Err(error) => {
                    self.fail(error);
                    return;
                }
            }
        }
    }

    fn fail(&mut self, error: StoreError) {
        self.failed = true;
        self.pending.push_back(Err(error));
    }

    /// The next item: queued ones first, then the next response; `None` after an error item.
    async fn next(&mut self) -> Option<Result<WatchEvent, StoreError>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            if self.failed {
                return None;
            }
            match self.stream.message().await {
                Ok(Some(response)) => self.absorb(response),
                Ok(None) => self
                    .fail(StoreError::Unavailable(format!("etcd at {}: watch stream ended", self.endpoints))),
                Err(error) => self.fail(StoreError::Unavailable(format!(
                    "etcd at {}: watch stream broke: {error}",
                    self.endpoints
                ))),
            }
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
            return Err(StoreError::Unavailable(format!("etcd lease grant: {}", response.error())));
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
        let (stream, first) = self
            .call("watch", |client| {
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
        let mut watch = Watch {
            stream,
            pending: VecDeque::new(),
            failed: false,
            from_revision,
            endpoints: self.config.endpoints.join(","),
        };
        match first {
            Some(response) => watch.absorb(response),
            None => {
                return Err(StoreError::Unavailable(format!(
                    "etcd at {}: watch stream ended at once",
                    watch.endpoints
                )));
            }
        }
        if let Some(Err(StoreError::Compacted { .. })) = watch.pending.front() {
            return Err(watch.pending.pop_front().and_then(Result::err).unwrap_or(StoreError::Closed));
        }
        Ok(futures::stream::unfold(
            watch,
            |mut watch| async move { watch.next().await.map(|item| (item, watch)) },
        )
        .boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let result =
            self.call("compact", |mut client| async move { client.compact(revision, None).await }).await;
        match result {
            Ok(_) => Ok(()),
            // Already compacted at or past this revision: nothing to do.
            Err(CallError::Failed(error))
                if grpc_message(&error)
                    .is_some_and(|m| m.contains("required revision has been compacted")) =>
            {
                Ok(())
            }
            Err(error) => Err(self.store_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(10)), 10);
    }

    #[tokio::test]
    async fn empty_endpoints_are_invalid() {
        let config = EtcdStoreConfig { endpoints: vec![], ..EtcdStoreConfig::default() };
        assert!(matches!(EtcdStore::connect(config).await, Err(StoreError::Invalid(_))));
    }
}
