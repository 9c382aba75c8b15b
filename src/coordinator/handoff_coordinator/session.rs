//! `Register`: the consumer's session, its record, and the task that keeps it alive.
//!
//! Each stream gets its own session (an etcd lease). The consumer record is bound to it,
//! so when the stream drops and nobody keeps the session alive, the record vanishes after
//! the TTL and the leader reassigns the partitions. Registering again under the same name
//! rewrites the record with the new session: the partitions (keyed by name) stay put, and
//! the instance holding the old stream sees the record change and ends it.

use std::{sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{
    Inner, now_ms,
    relay::{EndReason, LocalStream, relay_one},
};
use crate::coordinator::{
    CommandStream, CoordinatorError,
    records::{ConsumerRecord, RECORD_VERSION, TopicRecord, decode, encode},
    validate_consumer_name, validate_topic_name,
};
use crate::handoff::ConsumerStatus;
use crate::store::{Compare, Op, SessionId, StoreError, Txn};

/// How many times a compare-and-swap that lost a race is retried with fresh state.
pub(super) const CAS_ATTEMPTS: usize = 5;

/// Makes sure the topic has a stored partition count; returns it.
///
/// A count configured with `--topic-partitions` creates the record (compare-and-swap on
/// its absence, so concurrent instances agree) or grows it; a topic with no stored and
/// no configured count is `NOT_FOUND`.
pub(super) async fn ensure_topic(inner: &Inner, topic: &str) -> Result<u32, CoordinatorError> {
    let configured = inner.config.topic_partitions.get(topic).copied();
    let key = inner.keys.topic(topic);
    for _ in 0..CAS_ATTEMPTS {
        let cached = inner.read_cache().topics.get(topic).and_then(|t| t.config.clone());
        let stored = match cached {
            Some(c) => Some((c.value.partition_count, c.mod_revision)),
            None => match inner.store.get(&key).await? {
                Some(kv) => Some((decode::<TopicRecord>(&key, &kv.value)?.partition_count, kv.mod_revision)),
                None => None,
            },
        };
        let (count, revision) = match (stored, configured) {
            (Some((stored, _)), Some(c)) if c <= stored => return Ok(stored),
            (Some((stored, _)), None) => return Ok(stored),
            (Some((_, rev)), Some(c)) => (c, rev),
            (None, Some(c)) => (c, 0),
            (None, None) => {
                return Err(CoordinatorError::NotFound(format!(
                    "topic '{topic}' is unknown: no partition count is stored or configured for it \
                     (configure it with --topic-partitions {topic}=<count>)"
                )));
            }
        };
        let record = TopicRecord { v: RECORD_VERSION, partition_count: count };
        let txn = Txn::new().when(Compare::ModRevision(key.clone(), revision)).then(Op::put(&key, encode(&record)));
        if inner.store.txn(txn).await?.succeeded {
            tracing::info!(topic, partitions = count, "topic config stored");
            return Ok(count);
        }
    }
    Err(CoordinatorError::Aborted(format!("topic '{topic}' config kept changing; retry")))
}

/// Registers `consumer` for `topic` and returns its command stream.
pub(super) async fn register(inner: &Arc<Inner>, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    if inner.shutdown.is_cancelled() {
        return Err(CoordinatorError::Unavailable("this assigner instance is shutting down".into()));
    }
    ensure_topic(inner, topic).await?;
    let session = inner.store.grant_session(inner.config.lease_ttl).await?;
    let registered_at = match write_registration(inner, consumer, topic, session).await {
        Ok(revision) => revision,
        Err(error) => {
            let _ = inner.store.revoke_session(session).await;
            return Err(error);
        }
    };
    tracing::info!(topic, consumer, %session, "consumer registered");

    let (tx, rx) = mpsc::unbounded_channel();
    let (end_tx, end_rx) = oneshot::channel();
    let key = (topic.to_string(), consumer.to_string(), session);
    {
        // Lock order: cache, then streams (as in the relay), so the stream is activated
        // exactly once, either here or by the watcher.
        let cache = inner.read_cache();
        let mut streams = inner.lock_streams();
        let mut stream = LocalStream {
            session,
            registered_at,
            activated: false,
            told: Default::default(),
            tx: tx.clone(),
            end: Some(end_tx),
        };
        let ended = relay_one(topic, consumer, &mut stream, cache.topics.get(topic), cache.revision);
        streams.by_key.insert(key.clone(), stream);
        if let Some((reason, last)) = ended {
            streams.end(&key, reason, last);
        }
        inner.metrics.streams.set(streams.by_key.len() as i64);
    }
    tokio::spawn(session_task(inner.clone(), key, tx, end_rx));
    Ok(Box::pin(UnboundedReceiverStream::new(rx)))
}

/// Writes the consumer record bound to `session`, replacing any earlier registration of
/// the same name (compare-and-swap on what was read). Returns the write's revision.
async fn write_registration(
    inner: &Inner,
    consumer: &str,
    topic: &str,
    session: SessionId,
) -> Result<i64, CoordinatorError> {
    let key = inner.keys.consumer(topic, consumer);
    let record = ConsumerRecord {
        v: RECORD_VERSION,
        status: ConsumerStatus::Active,
        session: session.0,
        instance: inner.config.instance_id.clone(),
        hold_until: None,
    };
    for _ in 0..CAS_ATTEMPTS {
        let existing = inner.store.get(&key).await?.map_or(0, |kv| kv.mod_revision);
        let txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), existing))
            .then(Op::put_in(&key, encode(&record), session));
        let outcome = inner.store.txn(txn).await?;
        if outcome.succeeded {
            return Ok(outcome.revision);
        }
    }
    Err(CoordinatorError::Aborted(format!(
        "consumer '{consumer}' is being registered concurrently elsewhere; retry"
    )))
}

/// Keeps the stream's session alive while the stream is open, then settles it: revoked
/// when drained or replaced, held until `hold_until` after a `SHUTDOWN_NOW`, otherwise left
/// to expire after its TTL (so a quick reconnect keeps the partitions).
async fn session_task(
    inner: Arc<Inner>,
    key: (String, String, SessionId),
    tx: mpsc::UnboundedSender<Result<crate::proto::v1::AssignmentCommand, CoordinatorError>>,
    mut end_rx: oneshot::Receiver<EndReason>,
) {
    /// How the keep-alive loop ended.
    enum Ended {
        /// The server ended the stream (the relay decided why).
        Server(EndReason),
        /// The client went away.
        ClientGone,
        /// The session could not be kept alive.
        Expired,
    }
    let session = key.2;
    let period = (inner.config.lease_ttl / 3).max(Duration::from_millis(100));
    let ended = loop {
        tokio::select! {
            reason = &mut end_rx => break Ended::Server(reason.unwrap_or(EndReason::Shutdown)),
            _ = tx.closed() => break Ended::ClientGone,
            _ = tokio::time::sleep(period) => {
                if let Err(error) = inner.store.keep_alive(session).await {
                    if matches!(error, StoreError::SessionExpired(_)) {
                        break Ended::Expired;
                    }
                    tracing::warn!(%error, topic = %key.0, consumer = %key.1, "keep-alive failed; retrying");
                }
            }
        }
    };
    drop(tx);
    match ended {
        Ended::Server(EndReason::Drained | EndReason::Replaced) => {
            let _ = inner.store.revoke_session(session).await;
        }
        Ended::Server(EndReason::Expired | EndReason::Shutdown) => {}
        Ended::ClientGone => {
            tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected");
            inner.lock_streams().end(&key, EndReason::Shutdown, None);
            hold_for_restart(&inner, &key).await;
        }
        Ended::Expired => {
            let error = CoordinatorError::Unavailable(format!(
                "the session of consumer '{}' expired; register again",
                key.1
            ));
            inner.lock_streams().end(&key, EndReason::Expired, Some(error));
        }
    }
}

/// After a `SHUTDOWN_NOW` deregistration the consumer is expected back under the same
/// name: keep its session (and so its partitions) until the record's `hold_until`.
async fn hold_for_restart(inner: &Inner, key: &(String, String, SessionId)) {
    let (topic, consumer, session) = key;
    let period = (inner.config.lease_ttl / 3).max(Duration::from_millis(100));
    loop {
        let hold_until = {
            let cache = inner.read_cache();
            let record = cache.topics.get(topic).and_then(|t| t.consumers.get(consumer));
            match record {
                Some(r) if r.value.session == session.0 => r.value.hold_until,
                _ => return, // replaced by a new registration, or gone
            }
        };
        let Some(until) = hold_until else { return };
        let now = now_ms();
        if now >= until {
            tracing::info!(topic, consumer, "restart grace over; releasing the consumer's partitions");
            let _ = inner.store.revoke_session(*session).await;
            return;
        }
        if inner.store.keep_alive(*session).await.is_err() {
            return;
        }
        let wait = Duration::from_millis(until - now).min(period);
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
