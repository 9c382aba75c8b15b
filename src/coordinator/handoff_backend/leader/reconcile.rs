//! Reconcile: plan every topic from one consistent read of the cache with
//! [`crate::handoff::plan`], and write each topic's changes in batched transactions fenced
//! by our leadership, each write also guarded by the revision of the record it replaces.

use std::collections::BTreeMap;

use super::election::still_leading;
use super::{Fence, Leadership};
use crate::coordinator::handoff_backend::{Handoff, calls::write_ops, now_ms};
use crate::handoff::{PlanReport, Write, diff_writes, plan};
use crate::store::{Compare, Revision, Txn};

/// etcd refuses transactions with more than 128 operations (or compares) by default; a
/// batch holds the writes of at most this many partitions (each: ≤ 2 ops, 2 compares),
/// plus the fence.
const PARTITIONS_PER_TXN: usize = 60;

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

pub(super) async fn reconcile_all(inner: &Handoff, me: &mut Leadership, fence: Fence) {
    let now = now_ms();
    // Plan every topic from one consistent cache read.
    let plans: Vec<TopicPlan> = {
        let cache = inner.core.mirror.read();
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
    let leader_key = inner.core.keys.leader();
    for TopicPlan { topic, writes, report, revisions } in plans {
        let guard = |w: &Write| {
            let (owner_rev, handoff_rev) = revisions.get(&w.partition()).copied().unwrap_or_default();
            match w {
                Write::SetOwner { partition, .. } | Write::ClearOwner { partition } => {
                    Compare::ModRevision(inner.core.keys.assignment(&topic, *partition), owner_rev)
                }
                Write::PutHandoff { partition, .. } | Write::DeleteHandoff { partition } => {
                    Compare::ModRevision(inner.core.keys.handoff(&topic, *partition), handoff_rev)
                }
            }
        };
        let batches = fenced_batches(&leader_key, fence, &writes, guard, |w| write_ops(inner, &topic, w));
        let count = batches.len();
        let mut all_applied = true;
        for txn in batches {
            match inner.core.store.txn(txn).await {
                Ok(outcome) if outcome.succeeded => me.written = me.written.max(outcome.revision),
                Ok(_) => {
                    all_applied = false;
                    inner.core.metrics.reconcile_conflicts.inc();
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
        if inner.fence().is_none() {
            return;
        }
    }
}

fn record(inner: &Handoff, topic: &str, report: &PlanReport, writes: usize, txns: usize) {
    let m = &inner.core.metrics;
    m.handoffs_started.inc_by(report.started.len() as u64);
    m.direct_assignments.inc_by(report.assigned_directly.len() as u64);
    m.handoffs_cancelled.inc_by(report.cancelled.len() as u64);
    m.warm_timeouts.inc_by(report.warm_timeouts.len() as u64);
    m.release_timeouts.inc_by(report.release_timeouts.len() as u64);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::{Handoff, Phase};
    use crate::store::{Op, SessionId};

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
