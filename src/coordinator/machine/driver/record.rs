//! What the driver does with an [`Observation`]: the metrics of that decision point, with
//! the [`Metrics`] methods, and its log line.

use std::time::Duration;

use crate::coordinator::machine::observe::Observation;
use crate::handoff::PlanReport;
use crate::metrics::Metrics;

/// Records `observation` into `metrics` and logs it; `step_took` is how long the step that
/// said it ran (a step that planned counts as planning time).
pub(super) fn record(metrics: &Metrics, observation: Observation, step_took: Duration) {
    match observation {
        Observation::LeaderGroups { groups } => {
            metrics.leader_groups.set(i64::from(groups));
        }
        Observation::Leadership { group, won, led } => {
            metrics.leader_groups_led.set(i64::from(led));
            if won {
                tracing::info!(group, "leadership won");
            } else {
                tracing::info!(group, "leadership given up");
            }
        }
        Observation::Planned { .. } => {
            metrics.plan_seconds.inc_by(step_took.as_secs_f64());
        }
        Observation::Deferred { topic, partition, why } => {
            metrics.observe_move_deferred(&topic, why.name());
            tracing::debug!(topic, partition, why = why.name(), "balance move deferred");
        }
        Observation::Conflict { .. } => {
            metrics.reconcile_conflicts.inc();
        }
        Observation::Written { topic, moves, report, rollout } => {
            for (_, reason) in &moves {
                metrics.observe_partition_move(&topic, reason.name());
            }
            if let Some(report) = report {
                metrics.observe_plan_written(&report);
                log_plan(&topic, &report, rollout);
            }
        }
        Observation::Ready { topic, partition, consumer, warm_since, at } => {
            metrics.handoffs_ready.inc();
            metrics.observe_warm_done_at(&topic, partition, warm_since, at);
            tracing::info!(topic, partition, consumer, "handoff ready: ownership flipped, release requested");
        }
        Observation::Released { topic, partition, consumer, at } => {
            metrics.handoffs_released.inc();
            metrics.observe_handoff_done_at(&topic, partition, at);
            tracing::info!(topic, partition, consumer, "handoff completed");
        }
        Observation::ReleaseSent { ready_since, at, .. } => metrics.observe_release_sent_at(ready_since, at),
        Observation::Left { consumer, topic, draining: true } => {
            tracing::info!(topic, consumer, "consumer draining")
        }
        Observation::Left { consumer, topic, draining: false } => {
            tracing::info!(topic, consumer, "consumer shutting down; partitions held for its return")
        }
        Observation::Swept { topic, consumer } => {
            metrics.registrations_swept.inc();
            tracing::warn!(topic, consumer, "swept a registration no stream held");
        }
        Observation::GaveBack { topic, consumer, partitions, quota } => {
            tracing::info!(topic, consumer, ?partitions, quota, "leases given back")
        }
        Observation::Claimed { topic, consumer, partitions, quota } => {
            tracing::info!(topic, consumer, ?partitions, quota, "leases claimed")
        }
    }
}

/// The leader's log of a plan written whole.
fn log_plan(topic: &str, report: &PlanReport, rollout: bool) {
    for (p, from, to) in &report.started {
        tracing::info!(topic, partition = p, from = %from, to = %to, rollout, "handoff started: warming");
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
}
