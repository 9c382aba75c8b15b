//! Leader election and the leader's reconcile loop.
//!
//! The leader key is created (compare: absent) bound to this instance's session; its
//! create revision is the **fence**. Every write the leader makes is a transaction that
//! also compares the leader key's create revision with the fence: if the session expired
//! and another instance was elected, the key was re-created with another create revision,
//! and a deposed leader's write fails and changes nothing.
//!
//! With Kafka configured, the leader also refreshes the partition counts of the stored
//! topics every `topic_refresh_interval` (in a task of its own: Kafka may be slow) and
//! grows a topic's record when Kafka's count grew; the next reconcile assigns the new
//! partitions like any orphan.

use std::{collections::BTreeMap, sync::Arc, sync::atomic::Ordering, time::Duration};

use tokio::task::JoinHandle;

use super::{Inner, calls::write_ops, now_ms};
use crate::coordinator::records::{RECORD_VERSION, TopicRecord, decode, encode};
use crate::handoff::{Cooldowns, PlanReport, Write, diff_writes, plan};
use crate::kafka::KafkaError;
use crate::store::{Compare, Op, Revision, SessionId, StoreError, Txn};

/// etcd refuses transactions with more than 128 operations (or compares) by default; a
/// batch holds the writes of at most this many partitions (each: ≤ 2 ops, 2 compares),
/// plus the fence.
const PARTITIONS_PER_TXN: usize = 60;

/// Proof of leadership: the create revision of our leader key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The session the leader key is bound to.
    pub session: SessionId,
    /// The leader key's create revision.
    pub revision: Revision,
}

/// The leader loop's own state.
struct Leadership {
    session: Option<SessionId>,
    fence: Option<Fence>,
    cooldowns: BTreeMap<String, Cooldowns>,
    /// Revision our last write produced; reconcile again only once the cache has it.
    written: Revision,
    /// The running topic refresh, if any.
    refresh: Option<JoinHandle<()>>,
    /// When the next topic refresh is due.
    next_refresh: tokio::time::Instant,
}

/// Campaigns, keeps the instance session alive, and reconciles while leading.
pub(super) async fn leader_loop(inner: Arc<Inner>) {
    let mut changed = inner.mirror.subscribe();
    let mut me = Leadership {
        session: None,
        fence: None,
        cooldowns: BTreeMap::new(),
        written: 0,
        refresh: None,
        next_refresh: tokio::time::Instant::now(),
    };
    let keep_alive_every = (inner.config.lease_ttl / 3).max(Duration::from_millis(100));
    let mut next_keep_alive = tokio::time::Instant::now();
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
        if let Err(error) = keep_session(&inner, &mut me, &mut next_keep_alive, keep_alive_every).await {
            tracing::warn!(%error, "instance session unavailable");
        }
        check_leadership(&inner, &mut me);
        if me.fence.is_none() {
            campaign(&inner, &mut me).await;
        }
        if let Some(fence) = me.fence
            && inner.mirror.read().revision >= me.written
        {
            reconcile_all(&inner, &mut me, fence).await;
        }
        if let Some(fence) = me.fence {
            start_topic_refresh(&inner, &mut me, fence);
        }
        let wait = inner.config.reconcile_interval.min(keep_alive_every);
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = changed.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn keep_session(
    inner: &Inner,
    me: &mut Leadership,
    next: &mut tokio::time::Instant,
    every: Duration,
) -> Result<(), StoreError> {
    match me.session {
        None => {
            me.session = Some(inner.store.grant_session(inner.config.lease_ttl).await?);
            *next = tokio::time::Instant::now() + every;
        }
        Some(session) if tokio::time::Instant::now() >= *next => {
            *next = tokio::time::Instant::now() + every;
            if let Err(error) = inner.store.keep_alive(session).await {
                if matches!(error, StoreError::SessionExpired(_)) {
                    me.session = None;
                    step_down(inner, me, "instance session expired");
                }
                return Err(error);
            }
        }
        Some(_) => {}
    }
    Ok(())
}

fn step_down(inner: &Inner, me: &mut Leadership, why: &str) {
    if me.fence.take().is_some() {
        inner.leading.store(false, Ordering::SeqCst);
        inner.metrics.is_leader.set(0);
        me.cooldowns.clear();
        if let Some(refresh) = me.refresh.take() {
            refresh.abort();
        }
        tracing::warn!(instance = %inner.config.instance_id, why, "leadership lost");
    }
}

/// Steps down when the cache shows the leader key gone or re-created by someone else.
fn check_leadership(inner: &Inner, me: &mut Leadership) {
    let Some(fence) = me.fence else { return };
    let cache = inner.mirror.read();
    if cache.revision < fence.revision {
        return; // our own election is not in the cache yet
    }
    let ours = cache.leader.as_ref().is_some_and(|kv| kv.create_revision == fence.revision);
    drop(cache);
    if !ours {
        step_down(inner, me, "leader key changed");
    }
}

async fn campaign(inner: &Inner, me: &mut Leadership) {
    let Some(session) = me.session else { return };
    if inner.mirror.read().leader.is_some() {
        return;
    }
    let key = inner.keys.leader();
    let txn = Txn::new().when(Compare::CreateRevision(key.clone(), 0)).then(crate::store::Op::put_in(
        &key,
        inner.config.instance_id.as_bytes().to_vec(),
        session,
    ));
    match inner.store.txn(txn).await {
        Ok(outcome) if outcome.succeeded => {
            me.fence = Some(Fence { session, revision: outcome.revision });
            me.written = outcome.revision;
            me.next_refresh = tokio::time::Instant::now(); // a new leader refreshes at once
            inner.leading.store(true, Ordering::SeqCst);
            inner.metrics.is_leader.set(1);
            tracing::info!(instance = %inner.config.instance_id, revision = outcome.revision, "leadership won");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "campaign failed"),
    }
}

/// Starts a topic refresh when one is due and none is running.
fn start_topic_refresh(inner: &Arc<Inner>, me: &mut Leadership, fence: Fence) {
    if inner.config.kafka.is_none() || me.refresh.as_ref().is_some_and(|task| !task.is_finished()) {
        return;
    }
    let now = tokio::time::Instant::now();
    if now < me.next_refresh {
        return;
    }
    me.next_refresh = now + inner.config.topic_refresh_interval;
    me.refresh = Some(tokio::spawn(refresh_topics(inner.clone(), fence)));
}

/// Asks Kafka for the partition count of every stored topic not configured with
/// `--topic-partitions`, and grows the records of those that grew. Gives up the round
/// at the first `UNAVAILABLE` (each request is bounded by the Kafka timeout).
async fn refresh_topics(inner: Arc<Inner>, fence: Fence) {
    let Some(kafka) = inner.config.kafka.clone() else { return };
    let topics: Vec<String> = inner
        .mirror
        .read()
        .topics
        .iter()
        .filter(|(topic, entry)| {
            entry.config.is_some() && !inner.config.topic_partitions.contains_key(*topic)
        })
        .map(|(topic, _)| topic.clone())
        .collect();
    for topic in topics {
        if inner.shutdown.is_cancelled() || !inner.leading.load(Ordering::SeqCst) {
            return;
        }
        let answer = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            answer = kafka.partition_count(&topic) => answer,
        };
        match answer {
            Ok(count) => grow_topic(&inner, fence, &topic, count).await,
            Err(KafkaError::UnknownTopic(_)) => {
                tracing::warn!(
                    topic,
                    "topic refresh: the topic no longer exists in Kafka; its partition count is kept"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "topic refresh: Kafka unavailable; trying again at the next refresh");
                return;
            }
        }
    }
}

/// Stores Kafka's `count` for `topic` if it is larger than the stored one (compare-and-
/// swap on the record, fenced by our leadership). A smaller count is logged and ignored:
/// Kafka cannot shrink a topic.
async fn grow_topic(inner: &Inner, fence: Fence, topic: &str, count: u32) {
    let cached = inner
        .mirror
        .read()
        .topics
        .get(topic)
        .and_then(|t| t.config.as_ref().map(|c| c.value.partition_count));
    if cached == Some(count) {
        return;
    }
    let key = inner.keys.topic(topic);
    let (stored, revision) = match inner.store.get(&key).await {
        Ok(Some(kv)) => match decode::<TopicRecord>(&key, &kv.value) {
            Ok(record) => (record.partition_count, kv.mod_revision),
            Err(error) => return tracing::warn!(%error, topic, "topic refresh: unreadable topic record"),
        },
        Ok(None) => return,
        Err(error) => return tracing::warn!(%error, topic, "topic refresh: cannot read the topic record"),
    };
    if count < stored {
        tracing::warn!(
            topic,
            stored,
            kafka = count,
            "Kafka reports fewer partitions than stored; ignored (Kafka cannot shrink a topic)"
        );
        return;
    }
    if count == stored {
        return;
    }
    let record = TopicRecord { v: RECORD_VERSION, partition_count: count };
    let txn = Txn::new()
        .when(Compare::CreateRevision(inner.keys.leader(), fence.revision))
        .when(Compare::ModRevision(key.clone(), revision))
        .then(Op::put(&key, encode(&record)));
    match inner.store.txn(txn).await {
        Ok(outcome) if outcome.succeeded => {
            tracing::info!(
                topic,
                from = stored,
                to = count,
                "topic grew in Kafka; its new partitions will be assigned"
            );
        }
        Ok(_) => tracing::debug!(
            topic,
            "topic refresh raced a change (or leadership was lost); next refresh retries"
        ),
        Err(error) => tracing::warn!(%error, topic, "topic refresh: cannot store the new partition count"),
    }
}

/// Builds the fenced transactions for one topic's writes, a batch per
/// [`PARTITIONS_PER_TXN`] partitions; each write is also guarded by the mod revision of
/// the record it replaces, as the leader saw it.
pub fn fenced_batches(
    leader_key: &str,
    fence: Fence,
    writes: &[Write],
    guard: impl Fn(&Write) -> Compare,
    ops: impl Fn(&[Write]) -> Vec<crate::store::Op>,
) -> Vec<Txn> {
    let mut batches: Vec<Vec<Write>> = Vec::new();
    let mut partitions = 0;
    let mut last = None;
    for write in writes {
        if last != Some(write.partition()) {
            last = Some(write.partition());
            if partitions % PARTITIONS_PER_TXN == 0 {
                batches.push(Vec::new());
            }
            partitions += 1;
        }
        if let Some(batch) = batches.last_mut() {
            batch.push(write.clone());
        }
    }
    batches
        .into_iter()
        .map(|batch| {
            let mut compares = vec![Compare::CreateRevision(leader_key.to_string(), fence.revision)];
            compares.extend(batch.iter().map(&guard));
            Txn { compares, ops: ops(&batch) }
        })
        .collect()
}

/// One topic's reconcile result, planned under the cache lock and written after it.
struct TopicPlan {
    topic: String,
    writes: Vec<Write>,
    report: PlanReport,
    /// (assignment, handoff) mod revisions by partition, as the plan saw them.
    revisions: BTreeMap<u32, (Revision, Revision)>,
}

async fn reconcile_all(inner: &Inner, me: &mut Leadership, fence: Fence) {
    let now = now_ms();
    // Plan every topic from one consistent cache read.
    let plans: Vec<TopicPlan> = {
        let cache = inner.mirror.read();
        cache
            .topics
            .iter()
            .filter(|(_, e)| e.config.is_some())
            .filter_map(|(topic, entry)| {
                let before = entry.state();
                let mut after = before.clone();
                let cooldowns = me.cooldowns.entry(topic.clone()).or_default();
                let report = plan(&mut after, now, &inner.config.plan, cooldowns);
                let writes = diff_writes(&before, &after);
                if writes.is_empty() {
                    return None;
                }
                let revisions = writes
                    .iter()
                    .map(|w| {
                        (
                            w.partition(),
                            (entry.owner_revision(w.partition()), entry.handoff_revision(w.partition())),
                        )
                    })
                    .collect();
                Some(TopicPlan { topic: topic.clone(), writes, report, revisions })
            })
            .collect()
    };
    let leader_key = inner.keys.leader();
    for TopicPlan { topic, writes, report, revisions } in plans {
        let guard = |w: &Write| {
            let (owner_rev, handoff_rev) = revisions.get(&w.partition()).copied().unwrap_or_default();
            match w {
                Write::SetOwner { partition, .. } | Write::ClearOwner { partition } => {
                    Compare::ModRevision(inner.keys.assignment(&topic, *partition), owner_rev)
                }
                Write::PutHandoff { partition, .. } | Write::DeleteHandoff { partition } => {
                    Compare::ModRevision(inner.keys.handoff(&topic, *partition), handoff_rev)
                }
            }
        };
        let batches = fenced_batches(&leader_key, fence, &writes, guard, |w| write_ops(inner, &topic, w));
        let count = batches.len();
        let mut all_applied = true;
        for txn in batches {
            match inner.store.txn(txn).await {
                Ok(outcome) if outcome.succeeded => me.written = me.written.max(outcome.revision),
                Ok(_) => {
                    all_applied = false;
                    inner.metrics.reconcile_conflicts.inc();
                    still_leading(inner, me, fence).await;
                    break;
                }
                Err(error) => {
                    all_applied = false;
                    tracing::warn!(%error, topic, "reconcile write failed");
                    break;
                }
            }
        }
        if all_applied {
            record(inner, &topic, &report, writes.len(), count);
        }
        if me.fence.is_none() {
            return;
        }
    }
}

/// After a refused transaction: was it a stale read, or were we deposed?
async fn still_leading(inner: &Inner, me: &mut Leadership, fence: Fence) {
    match inner.store.get(&inner.keys.leader()).await {
        Ok(Some(kv)) if kv.create_revision == fence.revision => {
            tracing::debug!("reconcile raced a concurrent change; will retry on the next revision");
        }
        Ok(_) => step_down(inner, me, "deposed: leader key belongs to another election"),
        Err(error) => tracing::warn!(%error, "cannot check leadership"),
    }
}

fn record(inner: &Inner, topic: &str, report: &PlanReport, writes: usize, txns: usize) {
    let m = &inner.metrics;
    m.handoffs_started.inc_by(report.started.len() as u64);
    m.direct_assignments.inc_by(report.assigned_directly.len() as u64);
    m.handoffs_cancelled.inc_by(report.cancelled.len() as u64);
    m.warm_timeouts.inc_by(report.warm_timeouts.len() as u64);
    m.release_timeouts.inc_by(report.release_timeouts.len() as u64);
    m.observe_rebalance(report.started.len() + report.assigned_directly.len()); // metrics hook
    for (p, from, to) in &report.started {
        tracing::info!(topic, partition = p, from = %from, to = %to, "handoff started: warming");
    }
    if !report.assigned_directly.is_empty() {
        tracing::info!(topic, moves = ?report.assigned_directly, "partitions assigned directly (no live owner)");
    }
    for p in &report.cancelled {
        tracing::info!(topic, partition = p, "warming handoff cancelled");
    }
    for p in &report.warm_timeouts {
        tracing::warn!(topic, partition = p, "warming handoff timed out; cancelled, will retry later");
    }
    for p in &report.release_timeouts {
        tracing::warn!(topic, partition = p, "release not acknowledged in time; handoff completed anyway");
    }
    tracing::debug!(topic, writes, txns, "rebalance written");
}

/// Gives up leadership on shutdown (deletes our leader key if it is still ours), so
/// another instance takes over at once instead of after the TTL.
pub(super) async fn resign(inner: &Inner) {
    if !inner.leading.swap(false, Ordering::SeqCst) {
        return;
    }
    inner.metrics.is_leader.set(0);
    let key = inner.keys.leader();
    let Ok(Some(kv)) = inner.store.get(&key).await else { return };
    let txn = Txn::new()
        .when(Compare::CreateRevision(key.clone(), kv.create_revision))
        .when(Compare::Value(key.clone(), inner.config.instance_id.as_bytes().to_vec()))
        .then(crate::store::Op::delete(&key));
    let _ = inner.store.txn(txn).await;
    tracing::info!(instance = %inner.config.instance_id, "resigned leadership");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::{Handoff, Phase};
    use crate::store::Op;

    #[test]
    fn rebalance_writes_are_batched_fenced_and_keep_a_partition_together() {
        // 300 partitions, each with an owner change and a handoff change: 600 writes.
        let mut writes = Vec::new();
        for partition in 0..300 {
            writes.push(Write::SetOwner { partition, owner: "b".into() });
            let handoff = Handoff { from: "a".into(), to: "b".into(), phase: Phase::Releasing, since: 0 };
            writes.push(Write::PutHandoff { partition, handoff });
        }
        let fence = Fence { session: SessionId(1), revision: 42 };
        let guard = |w: &Write| Compare::ModRevision(format!("k/{}", w.partition()), 7);
        let ops = |ws: &[Write]| ws.iter().map(|w| Op::delete(format!("k/{}", w.partition()))).collect();
        let txns = fenced_batches("leader", fence, &writes, guard, ops);
        assert_eq!(
            txns.len(),
            300usize.div_ceil(PARTITIONS_PER_TXN),
            "one txn per {PARTITIONS_PER_TXN} partitions"
        );
        let mut seen = 0;
        for txn in &txns {
            assert_eq!(txn.compares[0], Compare::CreateRevision("leader".into(), 42), "every txn is fenced");
            assert!(txn.compares.len() <= 128 && txn.ops.len() <= 128, "within etcd's default max-txn-ops");
            seen += txn.ops.len();
        }
        assert_eq!(seen, 600);
        // No partition is split across two transactions.
        for pair in txns.windows(2) {
            let last = pair[0].ops.last().cloned();
            let first = pair[1].ops.first().cloned();
            assert_ne!(last, first);
        }
    }
}
