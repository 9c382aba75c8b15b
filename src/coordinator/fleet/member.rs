//! `Register`, and the task that claims and renews on behalf of one local consumer.
//!
//! Each stream gets its own session. The member record and every lease the consumer holds
//! are bound to it; the consumer task keeps it alive while the stream is open and runs the
//! consumer's claim step ([`super::share`]) on every change and on a timer.

use std::{sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{
    Inner,
    relay::{EndReason, LocalStream, relay, relay_one},
    share,
    state::{LeaseRecord, MemberRecord},
};
use crate::coordinator::wire::update;
use crate::coordinator::{
    CommandStream, CoordinatorError,
    cas::CAS_ATTEMPTS,
    records::{RECORD_VERSION, TopicRecord, decode, encode},
    streams::{CommandSender, StreamKey},
    validate_consumer_name, validate_topic_name,
};
use crate::store::{Compare, Op, Revision, SessionId, StoreError, Txn};

/// Makes sure the topic has a stored partition count, so every instance shares one count
/// even if their `--topic-partitions` differ; returns it.
///
/// The count comes from [`super::FleetConfig::partition_count`] (a larger configured count
/// grows the stored one) or, for a topic this instance does not configure, from the store;
/// neither: `NOT_FOUND`. The record is written with compare-and-swap on what was read.
async fn ensure_topic(inner: &Inner, topic: &str) -> Result<u32, CoordinatorError> {
    let configured = inner.config.partition_count(topic);
    let key = inner.keys.topic(topic);
    for _ in 0..CAS_ATTEMPTS {
        let stored = match inner.store.get(&key).await? {
            Some(kv) => Some((decode::<TopicRecord>(&key, &kv.value)?.partition_count, kv.mod_revision)),
            None => None,
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
        let txn =
            Txn::new().when(Compare::ModRevision(key.clone(), revision)).then(Op::put(&key, encode(&record)));
        if inner.store.txn(txn).await?.succeeded {
            tracing::info!(topic, partitions = count, "fleet topic config stored");
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
    tracing::info!(topic, consumer, %session, "consumer registered (fleet)");

    let (tx, rx) = mpsc::unbounded_channel();
    let (end_tx, end_rx) = oneshot::channel();
    let key = (topic.to_string(), consumer.to_string(), session);
    {
        // Lock order: cache, then streams (as in the relay), so the snapshot is sent
        // exactly once, either here or by the watcher.
        let cache = inner.mirror.read();
        let mut streams = inner.lock_streams();
        let mut stream = LocalStream {
            session,
            registered_at,
            activated: false,
            told: Default::default(),
            releasing: Default::default(),
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
    tokio::spawn(consumer_task(inner.clone(), key, registered_at, tx, end_rx));
    Ok(Box::pin(UnboundedReceiverStream::new(rx)))
}

/// Writes the member record bound to `session` and, in the same transaction, re-binds
/// every lease the consumer already holds (a reconnect within the TTL) to it, each guarded
/// by its mod revision. Returns the write's revision.
async fn write_registration(
    inner: &Inner,
    consumer: &str,
    topic: &str,
    session: SessionId,
) -> Result<Revision, CoordinatorError> {
    let key = inner.keys.member(topic, consumer);
    let record = MemberRecord {
        v: RECORD_VERSION,
        session: session.0,
        instance: inner.config.instance_id.clone(),
        leaving: false,
    };
    for _ in 0..CAS_ATTEMPTS {
        let existing = inner.store.get(&key).await?.map_or(0, |kv| kv.mod_revision);
        let leases = inner.store.get_prefix(&inner.keys.leases(topic)).await?;
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
            &key,
            encode(&record),
            session,
        ));
        for kv in leases.kvs {
            let Ok(lease) = decode::<LeaseRecord>(&kv.key, &kv.value) else { continue };
            if lease.owner == consumer {
                txn = txn
                    .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
                    .then(Op::put_in(kv.key, kv.value, session));
            }
        }
        let outcome = inner.store.txn(txn).await?;
        if outcome.succeeded {
            return Ok(outcome.revision);
        }
    }
    Err(CoordinatorError::Aborted(format!(
        "consumer '{consumer}' is being registered concurrently elsewhere; retry"
    )))
}

/// Keeps the stream's session alive and runs the consumer's claim step while the stream
/// is open, then settles the session: revoked when the consumer left or was replaced, left
/// to expire after its TTL otherwise (so a quick reconnect keeps the partitions).
async fn consumer_task(
    inner: Arc<Inner>,
    key: StreamKey,
    registered_at: Revision,
    tx: CommandSender,
    mut end_rx: oneshot::Receiver<EndReason>,
) {
    /// How the loop ended.
    enum Ended {
        /// The server ended the stream (the relay decided why).
        Server(EndReason),
        /// The client went away.
        ClientGone,
        /// The session could not be kept alive.
        Expired,
    }
    let session = key.2;
    let keep_alive_period = (inner.config.lease_ttl / 3).max(Duration::from_millis(100));
    let mut keep_alive =
        tokio::time::interval_at(tokio::time::Instant::now() + keep_alive_period, keep_alive_period);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut claim_timer = tokio::time::interval(inner.config.claim_interval);
    claim_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changed = inner.mirror.subscribe();
    // The claim step acts only on a cache that has seen its own last write.
    let mut seen = registered_at;
    let ended = loop {
        let claim = tokio::select! {
            biased;
            reason = &mut end_rx => break Ended::Server(reason.unwrap_or(EndReason::Shutdown)),
            _ = tx.closed() => break Ended::ClientGone,
            _ = inner.shutdown.cancelled() => return,
            _ = keep_alive.tick() => {
                match inner.store.keep_alive(session).await {
                    Err(StoreError::SessionExpired(_)) => break Ended::Expired,
                    Err(error) => tracing::warn!(%error, topic = %key.0, consumer = %key.1, "keep-alive failed; retrying"),
                    Ok(()) => {}
                }
                false
            }
            result = changed.changed() => {
                if result.is_err() {
                    return;
                }
                true
            }
            _ = claim_timer.tick() => true,
        };
        if claim {
            match claim_step(&inner, &key, registered_at, &mut seen).await {
                Ok(()) => {}
                Err(StoreError::SessionExpired(_)) => break Ended::Expired,
                Err(error) => {
                    tracing::warn!(%error, topic = %key.0, consumer = %key.1, "claim step failed; retrying")
                }
            }
        }
    };
    drop(tx);
    match ended {
        Ended::Server(EndReason::Left | EndReason::Replaced) => {
            let _ = inner.store.revoke_session(session).await;
        }
        Ended::Server(EndReason::Expired | EndReason::Shutdown) => {}
        Ended::ClientGone => {
            tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected; its leases expire after the TTL");
            inner.lock_streams().end(&key, EndReason::Shutdown, None);
        }
        Ended::Expired => {
            let error = CoordinatorError::Unavailable(format!(
                "the session of consumer '{}' on topic '{}' expired; register again",
                key.1, key.0
            ));
            let mut streams = inner.lock_streams();
            if let Some(stream) = streams.by_key.get_mut(&key)
                && stream.activated
                && !stream.told.is_empty()
            {
                let told = std::mem::take(&mut stream.told);
                let _ = stream.tx.send(Ok(update(&key.0, [], told)));
            }
            streams.end(&key, EndReason::Expired, Some(error));
        }
    }
}

/// One claim step of a local consumer: give back what exceeds its fair share, claim free
/// leases up to it. Acts on the cache, writes with compare-and-swap; a write that loses a
/// race changes nothing, and the watch delivery of whatever won triggers the next step.
async fn claim_step(
    inner: &Inner,
    key: &StreamKey,
    registered_at: Revision,
    seen: &mut Revision,
) -> Result<(), StoreError> {
    let (topic, consumer, session) = key;
    let (plan, revisions) = {
        let cache = inner.mirror.read();
        if cache.revision < *seen {
            return Ok(()); // our last write is not in the cache yet
        }
        let Some(entry) = cache.topics.get(topic) else { return Ok(()) };
        let ours =
            entry.members.get(consumer).is_some_and(|r| r.value.session == session.0 && !r.value.leaving);
        if !ours || !inner.lock_streams().by_key.contains_key(key) {
            return Ok(()); // not registered yet, leaving, or replaced: the relay handles it
        }
        let owners = entry.leases.iter().map(|(p, o)| (*p, o.value.as_str())).collect();
        let live = entry.live();
        let registered = |name: &str| entry.members.contains_key(name);
        let Some(plan) = share::plan(entry.partition_count(), &live, registered, consumer, &owners) else {
            return Ok(());
        };
        let revisions: Vec<(u32, Revision)> =
            plan.give_back.iter().chain(&plan.claim).map(|p| (*p, entry.lease_revision(*p))).collect();
        (plan, revisions)
    };
    let revision_of = |p: u32| revisions.iter().find(|(q, _)| *q == p).map_or(0, |(_, r)| *r);

    if !plan.give_back.is_empty() {
        // Tell the consumer first, then free the leases: it has stopped before anyone can
        // claim them.
        unassign_locally(inner, key, &plan.give_back);
        let batch = |ps: &[u32]| {
            ps.iter().fold(Txn::new(), |txn, p| {
                let lease = inner.keys.lease(topic, *p);
                txn.when(Compare::ModRevision(lease.clone(), revision_of(*p))).then(Op::delete(lease))
            })
        };
        let mut kept = Vec::new();
        let outcome = inner.store.txn(batch(&plan.give_back)).await?;
        if outcome.succeeded {
            *seen = outcome.revision;
        } else {
            for p in &plan.give_back {
                let outcome = inner.store.txn(batch(&[*p])).await?;
                if outcome.succeeded {
                    *seen = outcome.revision;
                } else {
                    kept.push(*p);
                }
            }
        }
        tracing::info!(topic, consumer, partitions = ?plan.give_back, quota = plan.quota, "leases given back");
        if !kept.is_empty() {
            // The lease changed under us (it cannot be ours any more, or it is and the
            // relay will tell the consumer again): stop hiding it from the view.
            if let Some(stream) = inner.lock_streams().by_key.get_mut(key) {
                stream.releasing.retain(|p| !kept.contains(p));
            }
            let cache = inner.mirror.read();
            relay(inner, &cache, Some(&[topic.clone()].into()));
        }
    }

    if !plan.claim.is_empty() {
        let member = inner.keys.member(topic, consumer);
        let record = encode(&LeaseRecord { v: RECORD_VERSION, owner: consumer.clone() });
        let batch = |ps: &[u32]| {
            ps.iter().fold(Txn::new().when(Compare::ModRevision(member.clone(), registered_at)), |txn, p| {
                let lease = inner.keys.lease(topic, *p);
                txn.when(Compare::ModRevision(lease.clone(), revision_of(*p))).then(Op::put_in(
                    lease,
                    record.clone(),
                    *session,
                ))
            })
        };
        let mut claimed = Vec::new();
        let outcome = inner.store.txn(batch(&plan.claim)).await?;
        if outcome.succeeded {
            *seen = outcome.revision;
            claimed.clone_from(&plan.claim);
        } else {
            // Someone else claimed one of them first: take the others one by one.
            for p in &plan.claim {
                let outcome = inner.store.txn(batch(&[*p])).await?;
                if outcome.succeeded {
                    *seen = outcome.revision;
                    claimed.push(*p);
                }
            }
        }
        if !claimed.is_empty() {
            tracing::info!(topic, consumer, partitions = ?claimed, quota = plan.quota, "leases claimed");
        }
    }
    Ok(())
}

/// Sends `unassigned` for `partitions` on the consumer's stream now and hides them from
/// its view until their leases are gone.
fn unassign_locally(inner: &Inner, key: &StreamKey, partitions: &[u32]) {
    let mut streams = inner.lock_streams();
    let Some(stream) = streams.by_key.get_mut(key) else { return };
    stream.releasing.extend(partitions.iter().copied());
    let told: Vec<u32> = partitions.iter().copied().filter(|p| stream.told.remove(p)).collect();
    if stream.activated && !told.is_empty() {
        let _ = stream.tx.send(Ok(update(&key.0, [], told)));
    }
}
