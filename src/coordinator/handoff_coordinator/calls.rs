//! `PartitionReady`, `PartitionReleased`, `Deregister` and the status view.
//!
//! Ready and released are the fast path of a handoff (DESIGN.md §9): the receiving
//! instance validates the call against its cache and applies it with one transaction
//! guarded by the mod revisions of the partition's assignment and handoff records. Only
//! when the cache disagrees (it may lag the store by a watch delivery) or the transaction
//! loses a race does it re-read those records from the store and decide again, so a call
//! is refused only on the store's current state, and a refused call changes nothing.

use crate::coordinator::{
    ConsumerStatusView, CoordinatorError, HandoffStatusView, StatusView, TopicStatus,
    cas::{CAS_ATTEMPTS, Rewrite, rewrite_bound},
    records::{AssignmentRecord, ConsumerRecord, HandoffRecord, RECORD_VERSION, TopicRecord, decode, encode},
    validate_consumer_name, validate_topic_name,
};
use crate::handoff::{
    ConsumerStatus, HandoffError, Millis, TopicState, Write, apply_ready, apply_released, diff_writes,
};
use crate::proto::v1::DeregisterAction;
use crate::store::{Compare, Op, Revision, Txn};

use super::{Inner, now_ms};

/// The part of a topic's state one partition call needs (the partition count, the
/// caller's registration, the partition's owner and handoff), with the revisions to guard
/// on. Built the same way from the cache and from the store.
struct PartitionSlice {
    state: TopicState,
    owner_revision: Revision,
    handoff_revision: Revision,
}

fn from_cache(inner: &Inner, topic: &str, consumer: &str, partition: u32) -> Option<PartitionSlice> {
    let cache = inner.mirror.read();
    let entry = cache.topics.get(topic)?;
    entry.config.as_ref()?;
    Some(PartitionSlice {
        state: entry.partition_state(consumer, partition),
        owner_revision: entry.owner_revision(partition),
        handoff_revision: entry.handoff_revision(partition),
    })
}

async fn from_store(
    inner: &Inner,
    topic: &str,
    consumer: &str,
    partition: u32,
) -> Result<PartitionSlice, CoordinatorError> {
    let keys = &inner.keys;
    let topic_key = keys.topic(topic);
    let Some(config) = inner.store.get(&topic_key).await? else {
        return Err(CoordinatorError::NotFound(format!(
            "topic '{topic}' is unknown: no consumer registered for it"
        )));
    };
    let mut state = TopicState {
        partition_count: decode::<TopicRecord>(&topic_key, &config.value)?.partition_count,
        ..Default::default()
    };
    let consumer_key = keys.consumer(topic, consumer);
    if let Some(kv) = inner.store.get(&consumer_key).await? {
        state
            .consumers
            .insert(consumer.to_string(), decode::<ConsumerRecord>(&consumer_key, &kv.value)?.status);
    }
    let (mut owner_revision, mut handoff_revision) = (0, 0);
    let owner_key = keys.assignment(topic, partition);
    if let Some(kv) = inner.store.get(&owner_key).await? {
        state.owners.insert(partition, decode::<AssignmentRecord>(&owner_key, &kv.value)?.owner);
        owner_revision = kv.mod_revision;
    }
    let handoff_key = keys.handoff(topic, partition);
    if let Some(kv) = inner.store.get(&handoff_key).await? {
        state.handoffs.insert(partition, decode::<HandoffRecord>(&handoff_key, &kv.value)?.handoff);
        handoff_revision = kv.mod_revision;
    }
    Ok(PartitionSlice { state, owner_revision, handoff_revision })
}

/// Turns writes into transaction ops.
pub(super) fn write_ops(inner: &Inner, topic: &str, writes: &[Write]) -> Vec<Op> {
    let keys = &inner.keys;
    writes
        .iter()
        .map(|w| match w {
            Write::SetOwner { partition, owner } => Op::put(
                keys.assignment(topic, *partition),
                encode(&AssignmentRecord { v: RECORD_VERSION, owner: owner.clone() }),
            ),
            Write::ClearOwner { partition } => Op::delete(keys.assignment(topic, *partition)),
            Write::PutHandoff { partition, handoff } => Op::put(
                keys.handoff(topic, *partition),
                encode(&HandoffRecord { v: RECORD_VERSION, handoff: handoff.clone() }),
            ),
            Write::DeleteHandoff { partition } => Op::delete(keys.handoff(topic, *partition)),
        })
        .collect()
}

type Transition = fn(&mut TopicState, &str, u32, Millis) -> Result<(), HandoffError>;

/// Validates and applies one consumer call with compare-and-swap (see the module docs).
async fn apply_call(
    inner: &Inner,
    consumer: &str,
    topic: &str,
    partition: u32,
    transition: Transition,
) -> Result<Option<i64>, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    let mut slice = from_cache(inner, topic, consumer, partition);
    for _ in 0..CAS_ATTEMPTS {
        let fresh = slice.is_none();
        let current = match slice.take() {
            Some(s) => s,
            None => from_store(inner, topic, consumer, partition).await?,
        };
        let mut next = current.state.clone();
        if let Err(error) = transition(&mut next, consumer, partition, now_ms()) {
            if fresh {
                return Err(CoordinatorError::from_handoff(topic, error));
            }
            continue; // the cache may lag: decide on the store's state
        }
        let writes = diff_writes(&current.state, &next);
        if writes.is_empty() {
            return Ok(None); // a repeated call that is already in effect
        }
        let txn = Txn {
            compares: vec![
                Compare::ModRevision(inner.keys.assignment(topic, partition), current.owner_revision),
                Compare::ModRevision(inner.keys.handoff(topic, partition), current.handoff_revision),
            ],
            ops: write_ops(inner, topic, &writes),
        };
        let outcome = inner.store.txn(txn).await?;
        if outcome.succeeded {
            return Ok(Some(outcome.revision));
        }
    }
    Err(CoordinatorError::Aborted(format!(
        "partition {partition} of topic '{topic}' kept changing while applying the call; retry"
    )))
}

/// `PartitionReady`: flips ownership to the caller and starts the release.
pub(super) async fn partition_ready(
    inner: &Inner,
    consumer: &str,
    topic: &str,
    partition: u32,
) -> Result<(), CoordinatorError> {
    let warm_since = from_cache(inner, topic, consumer, partition)
        .and_then(|s| s.state.handoffs.get(&partition).map(|h| h.since)); // metrics hook
    if apply_call(inner, consumer, topic, partition, apply_ready).await?.is_some() {
        inner.metrics.handoffs_ready.inc();
        inner.metrics.observe_warm_done(topic, partition, warm_since); // metrics hook
        tracing::info!(topic, partition, consumer, "handoff ready: ownership flipped, release requested");
    }
    Ok(())
}

/// `PartitionReleased`: completes the handoff.
pub(super) async fn partition_released(
    inner: &Inner,
    consumer: &str,
    topic: &str,
    partition: u32,
) -> Result<(), CoordinatorError> {
    fn released(s: &mut TopicState, c: &str, p: u32, _: Millis) -> Result<(), HandoffError> {
        apply_released(s, c, p)
    }
    apply_call(inner, consumer, topic, partition, released).await?;
    inner.metrics.handoffs_released.inc();
    inner.metrics.observe_handoff_done(topic, partition); // metrics hook
    tracing::info!(topic, partition, consumer, "handoff completed");
    Ok(())
}

/// `Deregister`: drain (when the policy says so and someone can take the partitions) or
/// hold the partitions for the consumer's return.
pub(super) async fn deregister(inner: &Inner, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
    validate_consumer_name(consumer)?;
    let registrations: Vec<(String, bool)> = {
        let cache = inner.mirror.read();
        cache
            .topics
            .iter()
            .filter(|(_, e)| e.consumers.contains_key(consumer))
            .map(|(t, e)| {
                let others = e
                    .consumers
                    .iter()
                    .any(|(n, r)| n != consumer && r.value.status == ConsumerStatus::Active);
                (t.clone(), others)
            })
            .collect()
    };
    if registrations.is_empty() {
        return Err(CoordinatorError::NotFound(format!("consumer '{consumer}' is not registered")));
    }
    let mut action = DeregisterAction::ShutdownNow;
    let wants_drain = crate::drain::wants_drain(
        inner.config.drain_decider.as_deref(),
        inner.config.drain_policy,
        consumer,
        &inner.metrics,
    )
    .await; // drain hook
    for (topic, others) in registrations {
        let drain = wants_drain && others; // drain hook
        let hold_until = now_ms() + inner.config.restart_grace.as_millis() as u64;
        let changed = update_consumer(inner, &topic, consumer, |r| {
            if drain {
                r.status = ConsumerStatus::Draining;
            } else {
                r.hold_until = Some(hold_until);
            }
        })
        .await?;
        if let Some(record) = &changed
            && !drain
        {
            // Refresh the session now: the instance holding the stream sees the hold
            // before the session could expire, even if the consumer already disconnected.
            let _ = inner.store.keep_alive(crate::store::SessionId(record.session)).await;
        }
        let changed = changed.is_some();
        if drain && changed {
            action = DeregisterAction::WaitForDrain;
            tracing::info!(topic, consumer, "consumer draining");
        } else if changed {
            tracing::info!(topic, consumer, grace = ?inner.config.restart_grace, "consumer shutting down; partitions held for its return");
        }
    }
    Ok(action)
}

/// Rewrites a consumer record (keeping its session binding) with compare-and-swap.
/// Returns the record written, or `None` when it is gone.
async fn update_consumer(
    inner: &Inner,
    topic: &str,
    consumer: &str,
    change: impl Fn(&mut ConsumerRecord),
) -> Result<Option<ConsumerRecord>, CoordinatorError> {
    let key = inner.keys.consumer(topic, consumer);
    let rewrite = |r: &mut ConsumerRecord| {
        change(r);
        true
    };
    match rewrite_bound(&*inner.store, &key, |r: &ConsumerRecord| r.session, rewrite).await? {
        Rewrite::Written(record) => Ok(Some(record)),
        Rewrite::Gone | Rewrite::Unchanged => Ok(None),
        Rewrite::Contended => {
            Err(CoordinatorError::Aborted(format!("consumer '{consumer}' kept changing; retry")))
        }
    }
}

/// The read-only status view.
pub(super) fn status(inner: &Inner) -> StatusView {
    let cache = inner.mirror.read();
    let topics = cache
        .topics
        .iter()
        .filter(|(_, e)| e.config.is_some())
        .map(|(topic, entry)| {
            let state = entry.state();
            TopicStatus {
                topic: topic.clone(),
                partition_count: state.partition_count,
                consumers: entry
                    .consumers
                    .iter()
                    .map(|(name, r)| ConsumerStatusView {
                        name: name.clone(),
                        status: format!("{:?}", r.value.status),
                        instance: r.value.instance.clone(),
                        partitions: state.owners.values().filter(|o| *o == name).count(),
                    })
                    .collect(),
                owners: (0..state.partition_count).map(|p| state.owners.get(&p).cloned()).collect(),
                handoffs: state
                    .handoffs
                    .iter()
                    .map(|(p, h)| HandoffStatusView {
                        partition: *p,
                        from: h.from.clone(),
                        to: h.to.clone(),
                        phase: format!("{:?}", h.phase),
                        since: h.since,
                    })
                    .collect(),
            }
        })
        .collect();
    StatusView {
        instance: inner.config.instance_id.clone(),
        backend: inner.config.backend.clone(),
        leader: cache.leader.as_ref().map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
        // `start` returns only once the first snapshot is loaded.
        ready: true,
        topics,
    }
}
