//! `Register` and the session keep-alive, shared by the store-backed backends.
//!
//! Each stream gets its own session (a store lease) and the backend binds the consumer's
//! registration to it ([`Registrar::write_registration`]). While the stream is open its
//! session task keeps the session alive; when it ends, the task settles the session:
//! revoked when the consumer left or was replaced, otherwise left to expire after its TTL,
//! so a quick reconnect keeps the partitions (the backend may hold it longer,
//! [`Registrar::after_disconnect`]).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use super::Core;
use super::mirror::MirrorCache;
use super::streams::{CommandSender, EndReason, Ending, LocalStream, StreamKey, Told};
use super::validate::{validate_consumer_name, validate_topic_name};
use crate::coordinator::{CommandStream, CoordinatorError};
use crate::store::{Revision, SessionId, StoreError};

/// What a store-backed backend plugs into the shared registration.
#[async_trait]
pub trait Registrar: Send + Sync + Sized + 'static {
    /// The backend's cache of the store.
    type Cache: MirrorCache + Send + Sync + 'static;
    /// What each of its streams remembers having told its consumer.
    type Told: Told;

    /// The shared core.
    fn core(&self) -> &Core<Self::Cache, Self::Told>;

    /// Writes the consumer's registration bound to `session`, replacing any earlier one
    /// of the same name with compare-and-swap; returns the write's revision.
    async fn write_registration(
        &self,
        consumer: &str,
        topic: &str,
        session: SessionId,
    ) -> Result<Revision, CoordinatorError>;

    /// Brings one stream up to date with the cache; returns why it must end, if it must.
    fn relay_one(
        &self,
        cache: &Self::Cache,
        topic: &str,
        consumer: &str,
        stream: &mut LocalStream<Self::Told>,
    ) -> Option<Ending>;

    /// Work that runs beside a stream until `done` is cancelled (the fleet's claim step).
    fn spawn_companion(
        self: &Arc<Self>,
        _key: StreamKey,
        _registered_at: Revision,
        _done: CancellationToken,
    ) {
    }

    /// Called once the client went away; the session was last kept alive at `alive_at`.
    async fn after_disconnect(&self, _key: &StreamKey, _alive_at: tokio::time::Instant) {}
}

/// Registers `consumer` for `topic` through `backend` and returns its command stream, whose
/// first item is the snapshot.
pub async fn register<R: Registrar>(
    backend: &Arc<R>,
    consumer: &str,
    topic: &str,
) -> Result<CommandStream, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    let core = backend.core();
    if core.shutdown.is_cancelled() {
        return Err(CoordinatorError::Unavailable("this assigner instance is shutting down".into()));
    }
    core.ensure_topic(topic).await?;
    let session = core.store.grant_session(core.lease_ttl).await?;
    let registered_at = match backend.write_registration(consumer, topic, session).await {
        Ok(revision) => revision,
        Err(error) => {
            let _ = core.store.revoke_session(session).await;
            return Err(error);
        }
    };
    tracing::info!(topic, consumer, %session, "consumer registered");

    let (tx, rx) = mpsc::unbounded_channel();
    let (mut stream, end_rx) = LocalStream::new(session, registered_at, tx.clone());
    let key = (topic.to_string(), consumer.to_string(), session);
    {
        // Relay and insert under one read of the cache: the watcher applies the next
        // revision only after, and its relay then finds the stream.
        let cache = core.mirror.read();
        let ended = backend.relay_one(&cache, topic, consumer, &mut stream);
        core.streams.insert(topic, consumer, stream);
        if let Some((reason, last)) = ended {
            core.streams.end(&key, reason, last);
        }
    }
    let done = CancellationToken::new();
    backend.spawn_companion(key.clone(), registered_at, done.clone());
    tokio::spawn(session_task(backend.clone(), key, tx, end_rx, done));
    Ok(Box::pin(UnboundedReceiverStream::new(rx)))
}

/// How a stream's keep-alive loop ended.
#[derive(Debug)]
enum Ended {
    /// The server ended the stream (the relay decided why).
    Server(EndReason),
    /// The client went away.
    ClientGone,
    /// The session could not be kept alive.
    Expired,
}

/// Keeps the stream's session alive while the stream is open, then settles it (see the
/// module docs). Cancels `done` when it returns.
async fn session_task<R: Registrar>(
    backend: Arc<R>,
    key: StreamKey,
    tx: CommandSender,
    mut end_rx: oneshot::Receiver<EndReason>,
    done: CancellationToken,
) {
    let _done = done.drop_guard();
    let core = backend.core();
    let session = key.2;
    let period = core.keep_alive_period();
    // The session was granted (or last refreshed) no earlier than this.
    let mut alive_at = tokio::time::Instant::now();
    let ended = loop {
        tokio::select! {
            reason = &mut end_rx => break Ended::Server(reason.unwrap_or(EndReason::Shutdown)),
            _ = tx.closed() => break Ended::ClientGone,
            _ = tokio::time::sleep(period) => {
                let asked_at = tokio::time::Instant::now();
                match core.store.keep_alive(session).await {
                    Ok(()) => alive_at = asked_at,
                    Err(StoreError::SessionExpired(_)) => break Ended::Expired,
                    Err(error) => {
                        tracing::warn!(%error, topic = %key.0, consumer = %key.1, "keep-alive failed; retrying");
                    }
                }
            }
        }
    };
    drop(tx);
    match ended {
        Ended::Server(EndReason::Left | EndReason::Replaced) => {
            let _ = core.store.revoke_session(session).await;
        }
        Ended::Server(EndReason::Expired | EndReason::Shutdown) => {}
        Ended::ClientGone => {
            tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected");
            core.streams.end(&key, EndReason::Shutdown, None);
            backend.after_disconnect(&key, alive_at).await;
        }
        Ended::Expired => {
            tracing::warn!(topic = %key.0, consumer = %key.1, "consumer session expired while connected");
            core.streams.with(&key, |stream| stream.farewell(&key.0));
            let error = CoordinatorError::Unavailable(format!(
                "the session of consumer '{}' on topic '{}' expired; register again",
                key.1, key.0
            ));
            core.streams.end(&key, EndReason::Expired, Some(error));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::register;
    use crate::coordinator::ErrorCode;
    use crate::coordinator::shared::test_backend::{TestBackend, registration};
    use crate::proto::v1::assignment_command::Command;
    use crate::store::LeaseStore;

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn an_open_stream_keeps_its_session_for_many_ttls() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events").await.expect("registers");
        let first = stream.next().await.expect("snapshot").expect("not an error");
        assert!(matches!(first.command, Some(Command::Assignment(_))), "the snapshot comes first: {first:?}");
        tokio::time::sleep(TTL * 5).await;
        let record = store.get(&registration("events", "a")).await.expect("read");
        assert!(record.is_some(), "kept alive while the stream is open");
        assert!(backend.core.streams.names().contains(&("events".into(), "a".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_stream_loses_its_registration_after_the_ttl() {
        let (backend, store) = TestBackend::start(TTL).await;
        let stream = register(&backend, "a", "events").await.expect("registers");
        drop(stream);
        tokio::time::sleep(TTL / 2).await;
        assert!(store.get(&registration("events", "a")).await.expect("read").is_some(), "kept for the TTL");
        assert!(backend.core.streams.names().is_empty(), "the registry forgets the stream at once");
        tokio::time::sleep(TTL).await;
        assert!(store.get(&registration("events", "a")).await.expect("read").is_none(), "gone after the TTL");
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_registration_replaces_the_first() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut first = register(&backend, "a", "events").await.expect("registers");
        first.next().await.expect("snapshot").expect("not an error");
        let first_session =
            store.get(&registration("events", "a")).await.expect("read").and_then(|kv| kv.session);
        let mut second = register(&backend, "a", "events").await.expect("registers again");
        second.next().await.expect("snapshot").expect("not an error");
        let error = first.next().await.expect("an error item").expect_err("replaced");
        assert_eq!(error.code(), ErrorCode::Aborted, "{error}");
        assert!(first.next().await.is_none(), "then the stream ends");
        tokio::time::sleep(TTL * 2).await;
        let record =
            store.get(&registration("events", "a")).await.expect("read").expect("the second is alive");
        assert_ne!(record.session, first_session);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_expires_while_connected_ends_the_stream_unavailable() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events").await.expect("registers");
        stream.next().await.expect("snapshot").expect("not an error");
        let session = store.get(&registration("events", "a")).await.expect("read").and_then(|kv| kv.session);
        store.revoke_session(session.expect("bound to a session")).await.expect("revoked");
        let error = tokio::time::timeout(TTL, stream.next()).await.expect("ends within a TTL");
        let error = error.expect("an error item").expect_err("expired");
        assert_eq!(error.code(), ErrorCode::Unavailable, "{error}");
        assert!(error.to_string().contains("expired"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn bad_names_and_unknown_topics_are_refused_and_store_nothing() {
        let (backend, store) = TestBackend::start(TTL).await;
        let before = store.revision();
        for (consumer, topic, code) in [
            ("", "events", ErrorCode::InvalidArgument),
            ("a/b", "events", ErrorCode::InvalidArgument),
            ("a", "", ErrorCode::InvalidArgument),
            ("a", "unknown", ErrorCode::NotFound),
        ] {
            let error = register(&backend, consumer, topic).await.err().expect("refused");
            assert_eq!(error.code(), code, "{consumer:?}/{topic:?}: {error}");
        }
        assert_eq!(store.revision(), before, "nothing written");
    }

    #[tokio::test(start_paused = true)]
    async fn no_registration_after_shutdown() {
        let (backend, _store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events").await.expect("registers");
        stream.next().await.expect("snapshot").expect("not an error");
        assert!(backend.core.begin_shutdown());
        assert!(!backend.core.begin_shutdown(), "a second shutdown does nothing");
        assert!(!backend.core.readiness.get());
        let error = stream.next().await.expect("an error item").expect_err("shutting down");
        assert_eq!(error.code(), ErrorCode::Unavailable);
        let error = register(&backend, "b", "events").await.err().expect("refused");
        assert_eq!(error.code(), ErrorCode::Unavailable);
    }
}
