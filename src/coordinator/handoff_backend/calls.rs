//! `PartitionReady`, `PartitionReleased`, `Deregister` and the status view.
//!
//! Ready and released are the fast path of a handoff (docs/design.md §9): the receiving
//! instance's loop (`driver.rs`) decides the call on its cache (`decide.rs`) and applies it
//! with one transaction guarded by the mod revisions of the partition's assignment and
//! handoff records. Only when the cache disagrees (it may lag the store by a watch
//! delivery) or the transaction loses a race does it re-read those records from the store
//! (`driver.rs`) and decide again, so a call is refused only on the store's current
//! state, and a refused call changes nothing. Calls that arrive together share
//! transactions (`shared/batch.rs`): a scale-out brings thousands at once.

use super::decide::CallResult;
use super::records::ConsumerRecord;
use super::{Handoff, now_ms};
use async_trait::async_trait;

use crate::coordinator::StatusView;
use crate::coordinator::shared::cas::{Rewrite, rewrite_bound};
use crate::coordinator::shared::instance::{Backend, HandoffCall, Report};
use crate::coordinator::{CoordinatorError, validate_consumer_name, validate_topic_name};
use crate::handoff::ConsumerStatus;
use crate::proto::v1::DeregisterAction;

/// Validates one consumer call and has the instance's loop apply it (`driver.rs`): decided
/// on the cache first ([`next_step`](super::decide::next_step), pure), on the store's
/// state when the cache may lag or the transaction lost a race.
async fn apply_call(inner: &Handoff, call: HandoffCall<'_>) -> CallResult {
    validate_consumer_name(call.consumer)?;
    validate_topic_name(call.topic)?;
    inner.driver.call(call).await
}

/// `PartitionReady` flips ownership to the caller and starts the release;
/// `PartitionReleased` completes the handoff.
async fn handoff_call(inner: &Handoff, call: HandoffCall<'_>) -> Result<(), CoordinatorError> {
    let HandoffCall { report, consumer, topic, partition } = call;
    let metrics = inner.core.metrics();
    match report {
        Report::Ready => {
            if let Some(applied) = apply_call(inner, call).await? {
                metrics.handoffs_ready.inc();
                metrics.observe_warm_done(topic, partition, applied.phase_since);
                tracing::info!(
                    topic,
                    partition,
                    consumer,
                    "handoff ready: ownership flipped, release requested"
                );
            }
        }
        Report::Released => {
            apply_call(inner, call).await?;
            metrics.handoffs_released.inc();
            metrics.observe_handoff_done(topic, partition);
            tracing::info!(topic, partition, consumer, "handoff completed");
        }
    }
    Ok(())
}

/// `Deregister`: drain (when the policy says so and someone can take the partitions) or
/// hold the partitions for the consumer's return.
pub(super) async fn deregister(
    inner: &Handoff,
    consumer: &str,
) -> Result<DeregisterAction, CoordinatorError> {
    validate_consumer_name(consumer)?;
    // (topic, the registration found, whether another active consumer can take over)
    let registrations: Vec<(String, i64, bool)> = {
        let cache = inner.core.mirror().read();
        cache
            .topics
            .iter()
            .filter_map(|(t, e)| {
                let registration = e.consumers.get(consumer)?.value.session;
                let others = e
                    .consumers
                    .iter()
                    .any(|(n, r)| n != consumer && r.value.status == ConsumerStatus::Active);
                Some((t.clone(), registration, others))
            })
            .collect()
    };
    if registrations.is_empty() {
        return Err(CoordinatorError::UnknownConsumer(format!("consumer '{consumer}' is not registered")));
    }
    let mut action = DeregisterAction::ShutdownNow;
    let decider = inner.config.drain_decider.as_deref();
    let wants_drain =
        crate::drain::wants_drain(decider, inner.config.drain_policy, consumer, inner.core.metrics()).await;
    for (topic, registration, others) in registrations {
        let drain = wants_drain && others;
        let hold_until = now_ms() + inner.config.restart_grace.as_millis() as u64;
        // Only the registration found: a newer one (a restart that raced this call) is
        // left alone.
        let changed = update_consumer(inner, &topic, consumer, |r| {
            if r.session != registration {
                return false;
            }
            if drain {
                r.status = ConsumerStatus::Draining;
            } else {
                r.hold_until = Some(hold_until);
            }
            true
        })
        .await?
        .is_some();
        if drain && changed {
            action = DeregisterAction::WaitForDrain;
            tracing::info!(topic, consumer, "consumer draining");
        } else if changed {
            tracing::info!(topic, consumer, grace = ?inner.config.restart_grace, "consumer shutting down; partitions held for its return");
        }
    }
    Ok(action)
}

/// Rewrites a consumer record (keeping its lease binding) with compare-and-swap; `change`
/// says whether it applies. Returns the record written, or `None` when it is gone or
/// `change` refused it.
async fn update_consumer(
    inner: &Handoff,
    topic: &str,
    consumer: &str,
    change: impl Fn(&mut ConsumerRecord) -> bool,
) -> Result<Option<ConsumerRecord>, CoordinatorError> {
    let key = inner.core.keys().consumer(topic, consumer);
    match rewrite_bound(inner.core.store(), &key, change).await? {
        Rewrite::Written(record) => Ok(Some(record)),
        Rewrite::Gone | Rewrite::Unchanged => Ok(None),
        Rewrite::Contended => {
            Err(CoordinatorError::Contended(format!("consumer '{consumer}' kept changing; retry")))
        }
    }
}

/// The handoff backend's calls, as the shared instance ([`StoreCoordinator`]) runs them.
///
/// [`StoreCoordinator`]: crate::coordinator::StoreCoordinator
#[async_trait]
impl Backend for Handoff {
    async fn handoff_call(&self, call: HandoffCall<'_>) -> Result<(), CoordinatorError> {
        handoff_call(self, call).await
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        deregister(self, consumer).await
    }

    fn status(&self) -> StatusView {
        super::status::status(self)
    }

    fn epochs(&self, topic: &str, consumer: &str) -> Option<Vec<crate::coordinator::PartitionEpoch>> {
        let cache = self.core.mirror().read();
        Some(cache.topics.get(topic).map(|entry| entry.epochs_of(consumer)).unwrap_or_default())
    }

    fn placement(&self) -> Vec<crate::coordinator::TopicPlacement> {
        super::placement::placement(self)
    }

    async fn on_shutdown(&self) {
        super::leader::resign(self).await;
    }

    fn on_crash(&self) {
        self.leadership.send_replace(None);
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use futures::StreamExt;

    use crate::coordinator::{
        CommandStream, ConsumerGroupCoordinator, CoordinatorError, HandoffConfig, HandoffCoordinator,
    };
    use crate::handoff::{HandoffError, Phase};
    use crate::metrics::Metrics;
    use crate::proto::v1::assignment_command::Command;
    use crate::store::MemoryStore;

    async fn next(stream: &mut CommandStream) -> Command {
        let item =
            tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("a command in time");
        item.expect("stream open").expect("not an error").command.expect("a command")
    }

    /// `a` owns all `partitions` of `t`, on a coordinator planned with `max_warming`.
    async fn owning_all(
        partitions: u32,
        max_warming: usize,
    ) -> (HandoffCoordinator, MemoryStore, CommandStream) {
        let store = MemoryStore::new();
        let config = HandoffConfig {
            topic_partitions: [("t".to_string(), partitions)].into(),
            lease_ttl: Duration::from_secs(3),
            reconcile_interval: Duration::from_millis(100),
            plan: crate::handoff::PlanConfig { max_warming_per_consumer: max_warming, ..Default::default() },
            ..HandoffConfig::default()
        };
        let coordinator =
            HandoffCoordinator::start(Arc::new(store.clone()), config, Arc::new(Metrics::new()))
                .await
                .expect("starts");
        let mut a = coordinator.register("a", "t").await.expect("a registers");
        let mut owned = 0;
        while owned < partitions as usize {
            if let Command::Assignment(update) = next(&mut a).await {
                owned += update.assigned.len();
            }
        }
        (coordinator, store, a)
    }

    /// `a` owns both partitions of `t`; `b` joins and is asked to warm one of them.
    async fn warming() -> (HandoffCoordinator, MemoryStore, CommandStream, CommandStream, u32) {
        let (coordinator, store, a) =
            owning_all(2, crate::handoff::PlanConfig::default().max_warming_per_consumer).await;
        let mut b = coordinator.register("b", "t").await.expect("b registers");
        let partition = loop {
            if let Command::Warm(warm) = next(&mut b).await {
                assert_eq!(warm.current_owner, "a");
                break warm.partition.expect("a partition").partition;
            }
        };
        (coordinator, store, a, b, partition)
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_arrive_together_share_transactions() {
        let (coordinator, store, mut a) = owning_all(40, 20).await;
        let mut b = coordinator.register("b", "t").await.expect("b registers");
        let mut warms = Vec::new();
        while warms.len() < 20 {
            if let Command::Warm(warm) = next(&mut b).await {
                warms.push(warm.partition.expect("a partition").partition);
            }
        }
        let before = store.revision();
        let readies = warms.iter().map(|p| coordinator.partition_ready("b", "t", *p));
        for result in futures::future::join_all(readies).await {
            result.expect("ready");
        }
        let transactions = store.revision() - before;
        assert!(transactions <= 5, "20 readies at once took {transactions} transactions");
        let mut released = 0;
        while released < 20 {
            if let Command::Release(release) = next(&mut a).await {
                assert!(warms.contains(&release.partition.expect("a partition").partition));
                released += 1;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refused_calls_name_the_problem_and_change_nothing() {
        let (coordinator, store, _a, _b, p) = warming().await;
        let before = store.revision();
        use CoordinatorError::{Handoff, InvalidName, UnknownTopic};
        type Cause = fn(&CoordinatorError) -> bool;
        let cases: [(&str, &str, u32, Cause, bool); 6] = [
            (
                "a",
                "t",
                p,
                |e| matches!(e, Handoff { source: HandoffError::NotWarmingTarget { .. }, .. }),
                true,
            ),
            (
                "b",
                "t",
                7,
                |e| matches!(e, Handoff { source: HandoffError::PartitionOutOfRange { .. }, .. }),
                true,
            ),
            (
                "ghost",
                "t",
                p,
                |e| matches!(e, Handoff { source: HandoffError::UnknownConsumer(_), .. }),
                true,
            ),
            ("b", "nope", p, |e| matches!(e, UnknownTopic(_)), true),
            ("", "t", p, |e| matches!(e, InvalidName(_)), true),
            ("b", "t", p, |e| matches!(e, Handoff { source: HandoffError::NotReleasing { .. }, .. }), false),
        ];
        for (consumer, topic, partition, cause, ready) in cases {
            let result = if ready {
                coordinator.partition_ready(consumer, topic, partition).await
            } else {
                coordinator.partition_released(consumer, topic, partition).await
            };
            let error = result.expect_err("refused");
            assert!(cause(&error), "{consumer}/{topic}/{partition}: {error}");
        }
        assert_eq!(store.revision(), before, "a refused call writes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn ready_flips_ownership_in_one_step_and_released_completes_the_handoff() {
        let (coordinator, _store, mut a, mut b, p) = warming().await;
        coordinator.partition_ready("b", "t", p).await.expect("ready");
        coordinator.partition_ready("b", "t", p).await.expect("a repeated ready is already in effect");
        match next(&mut b).await {
            Command::Assignment(update) => {
                assert_eq!(update.assigned.iter().map(|tp| tp.partition).collect::<Vec<_>>(), [p])
            }
            other => panic!("the new owner hears `assigned` first: {other:?}"),
        }
        let release = loop {
            if let Command::Release(release) = next(&mut a).await {
                break release;
            }
        };
        assert_eq!((release.partition.map(|tp| tp.partition), release.new_owner.as_str()), (Some(p), "b"));
        let status = coordinator.status().await;
        let handoff = &status.topics[0].handoffs[0];
        assert_eq!((handoff.partition, handoff.phase), (p, Phase::Releasing));
        assert_eq!(status.topics[0].owners[p as usize].as_deref(), Some("b"));
        coordinator.partition_released("a", "t", p).await.expect("released");
        let error = coordinator.partition_released("a", "t", p).await.expect_err("the handoff is gone");
        assert!(
            matches!(error, CoordinatorError::Handoff { source: HandoffError::NotReleasing { .. }, .. }),
            "{error}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(coordinator.status().await.topics[0].handoffs.is_empty());
    }
}
