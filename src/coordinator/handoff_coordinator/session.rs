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
    cache::TopicEntry,
    cas::CAS_ATTEMPTS,
    records::{ConsumerRecord, RECORD_VERSION, TopicRecord, decode, encode},
    streams::{CommandSender, StreamKey},
    validate_consumer_name, validate_topic_name,
};
use crate::handoff::ConsumerStatus;
use crate::kafka::KafkaError;
use crate::store::{Compare, Op, SessionId, StoreError, Txn};

/// Makes sure the topic has a stored partition count; returns it.
///
/// In order: a count configured with `--topic-partitions` (it overrides Kafka: it creates
/// the record, or grows it); a stored count; Kafka's count (`--kafka-brokers`); otherwise
/// `NOT_FOUND`. A record is created with compare-and-swap on its absence, so concurrent
/// instances agree on one value (the loser reads the winner's). Kafka unreachable is
/// `UNAVAILABLE` after the Kafka timeout, and nothing is stored.
pub(super) async fn ensure_topic(inner: &Inner, topic: &str) -> Result<u32, CoordinatorError> {
    let configured = inner.config.topic_partitions.get(topic).copied();
    let key = inner.keys.topic(topic);
    let mut from_kafka = None;
    for _ in 0..CAS_ATTEMPTS {
        let cached = inner.mirror.read().topics.get(topic).and_then(|t| t.config.clone());
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
                let Some(kafka) = &inner.config.kafka else {
                    return Err(CoordinatorError::NotFound(format!(
                        "topic '{topic}' is unknown: no partition count is stored or configured for it \
                         (configure it with --topic-partitions {topic}=<count>, or set --kafka-brokers)"
                    )));
                };
                let count = match from_kafka {
                    Some(count) => count,
                    None => {
                        let count = kafka.partition_count(topic).await.map_err(|error| match error {
                            KafkaError::UnknownTopic(_) => CoordinatorError::NotFound(format!(
                                "topic '{topic}' is unknown: it does not exist in Kafka ({})",
                                kafka.brokers()
                            )),
                            KafkaError::Unavailable(_) | KafkaError::Config(_) => {
                                CoordinatorError::Unavailable(format!(
                                    "cannot learn the partition count of topic '{topic}': {error}"
                                ))
                            }
                        })?;
                        *from_kafka.insert(count)
                    }
                };
                (count, 0)
            }
        };
        let record = TopicRecord { v: RECORD_VERSION, partition_count: count };
        let txn =
            Txn::new().when(Compare::ModRevision(key.clone(), revision)).then(Op::put(&key, encode(&record)));
        if inner.store.txn(txn).await?.succeeded {
            let source = if configured.is_some() { "--topic-partitions" } else { "Kafka" };
            tracing::info!(topic, partitions = count, source, "topic config stored");
            return Ok(count);
        }
    }
    Err(CoordinatorError::Aborted(format!("topic '{topic}' config kept changing; retry")))
}

/// Registers `consumer` for `topic` and returns its command stream.
pub(super) async fn register(
    inner: &Arc<Inner>,
    consumer: &str,
    topic: &str,
) -> Result<CommandStream, CoordinatorError> {
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
        let cache = inner.mirror.read();
        let mut streams = inner.lock_streams();
        let mut stream = LocalStream {
            session,
            registered_at,
            activated: false,
            told: Default::default(),
            tx: tx.clone(),
            end: Some(end_tx),
        };
        let entry = cache.topics.get(topic);
        let views = entry.map(TopicEntry::views).unwrap_or_default();
        let ended = relay_one(topic, consumer, &mut stream, entry, &views, cache.revision);
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
        let txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
            &key,
            encode(&record),
            session,
        ));
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
    key: StreamKey,
    tx: CommandSender,
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
    // The session was granted (or last refreshed) no earlier than this.
    let mut alive_at = tokio::time::Instant::now();
    let ended = loop {
        tokio::select! {
            reason = &mut end_rx => break Ended::Server(reason.unwrap_or(EndReason::Shutdown)),
            _ = tx.closed() => break Ended::ClientGone,
            _ = tokio::time::sleep(period) => {
                let asked_at = tokio::time::Instant::now();
                match inner.store.keep_alive(session).await {
                    Ok(()) => alive_at = asked_at,
                    Err(error) => {
                        if matches!(error, StoreError::SessionExpired(_)) {
                            break Ended::Expired;
                        }
                        tracing::warn!(%error, topic = %key.0, consumer = %key.1, "keep-alive failed; retrying");
                    }
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
            hold_for_restart(&inner, &key, alive_at).await;
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

/// After the stream drops, the session lives on for its TTL: a quick reconnect keeps the
/// partitions. If a `SHUTDOWN_NOW` deregistration sets `hold_until` on the record (before
/// or during that window, through any instance), keep the session (and so the partitions)
/// alive until then, waiting for the consumer's return; then revoke it.
async fn hold_for_restart(inner: &Inner, key: &StreamKey, alive_at: tokio::time::Instant) {
    let (topic, consumer, session) = key;
    let period = (inner.config.lease_ttl / 3).max(Duration::from_millis(100));
    let mut changed = inner.mirror.subscribe();
    let mut expires_at = alive_at + inner.config.lease_ttl;
    loop {
        let hold_until = {
            let cache = inner.mirror.read();
            let record = cache.topics.get(topic).and_then(|t| t.consumers.get(consumer));
            match record {
                Some(r) if r.value.session == session.0 => r.value.hold_until,
                _ => return, // replaced by a new registration, or gone
            }
        };
        let wait = match hold_until {
            Some(until) if now_ms() >= until => {
                tracing::info!(topic, consumer, "restart grace over; releasing the consumer's partitions");
                let _ = inner.store.revoke_session(*session).await;
                return;
            }
            Some(until) => {
                let asked_at = tokio::time::Instant::now();
                if inner.store.keep_alive(*session).await.is_err() {
                    return;
                }
                expires_at = asked_at + inner.config.lease_ttl;
                Duration::from_millis(until.saturating_sub(now_ms())).min(period)
            }
            // No hold (yet): watch the record until the session would expire by itself.
            None if tokio::time::Instant::now() >= expires_at => return,
            None => expires_at - tokio::time::Instant::now(),
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = changed.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
