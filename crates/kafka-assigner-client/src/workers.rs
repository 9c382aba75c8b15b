//! One queue per partition: handler calls for a partition run one after another, in the
//! order the state machine asked for them; different partitions run concurrently (a long
//! `warm` must not hold up a `release`).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::{sync::mpsc, task::JoinSet};

use super::{ClientMetrics, Handler, Partition, state::Action, state::Input};

/// The per-partition queues of one client.
pub struct Workers<H> {
    handler: Arc<H>,
    topic: String,
    metrics: ClientMetrics,
    /// Where finished `warm` / `release` calls are reported.
    done: mpsc::UnboundedSender<Input>,
    queues: BTreeMap<u32, mpsc::UnboundedSender<Action>>,
    tasks: JoinSet<()>,
}

impl<H: Handler> Workers<H> {
    /// Queues for `handler`'s calls about `topic`; finished calls go to `done`.
    pub fn new(
        handler: Arc<H>,
        topic: String,
        metrics: ClientMetrics,
        done: mpsc::UnboundedSender<Input>,
    ) -> Self {
        Self { handler, topic, metrics, done, queues: BTreeMap::new(), tasks: JoinSet::new() }
    }

    /// Queues a handler call (`Warm`, `Assigned`, `Release`, `Unassigned`).
    pub fn queue(&mut self, action: Action) {
        let p = action.partition();
        if let Some(queue) = self.queues.get(&p)
            && queue.send(action.clone()).is_ok()
        {
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        // A fresh queue is open and its receiver alive: this send cannot fail.
        let _ = tx.send(action);
        self.queues.insert(p, tx);
        let (handler, topic, done, metrics) =
            (self.handler.clone(), self.topic.clone(), self.done.clone(), self.metrics.clone());
        self.tasks.spawn(run(handler, topic, p, rx, done, metrics));
    }

    /// Closes every queue and waits until the queued calls have run, but not past
    /// `bound`: a handler call that hangs must not hold the shutdown forever. Returns how
    /// many partitions still had a call running then; their tasks are aborted (the
    /// handler's future is dropped at its next await, and nothing queued behind it runs).
    pub async fn finish(mut self, bound: Duration) -> usize {
        self.queues.clear();
        drop(self.done);
        let all_ran = tokio::time::timeout(bound, async {
            while let Some(result) = self.tasks.join_next().await {
                report(result);
            }
        })
        .await;
        if all_ran.is_ok() {
            return 0;
        }
        // Calls that ended just as the bound ran out are not abandoned.
        while let Some(result) = self.tasks.try_join_next() {
            report(result);
        }
        let abandoned = self.tasks.len();
        self.tasks.abort_all();
        abandoned
    }
}

fn report(result: Result<(), tokio::task::JoinError>) {
    if let Err(error) = result {
        tracing::error!(%error, "a handler call panicked");
    }
}

async fn run<H: Handler>(
    handler: Arc<H>,
    topic: String,
    p: u32,
    mut queue: mpsc::UnboundedReceiver<Action>,
    done: mpsc::UnboundedSender<Input>,
    metrics: ClientMetrics,
) {
    // Each call carries the epoch the state machine gave it (docs/design.md §10).
    let at = |epoch: u64| Partition { topic: topic.clone(), partition: p, epoch };
    while let Some(action) = queue.recv().await {
        // The driver may have stopped listening (shutdown): reports are then moot.
        match action {
            Action::Warm(_, epoch) => {
                let partition = at(epoch);
                tracing::info!(%partition, epoch, "warming");
                let ok = match handler.warm(partition.clone()).await {
                    Ok(()) => true,
                    Err(error) => {
                        tracing::warn!(%partition, %error, "warm failed; the assigner will time it out");
                        false
                    }
                };
                ClientMetrics::count(&metrics.handler_calls, if ok { "warm_ok" } else { "warm_error" });
                let _ = done.send(Input::WarmFinished(p, ok));
            }
            Action::Assigned(_, epoch) => {
                let partition = at(epoch);
                tracing::info!(%partition, epoch, "assigned");
                handler.assigned(partition).await;
                ClientMetrics::count(&metrics.handler_calls, "assigned");
            }
            Action::Release(_, epoch) => {
                let partition = at(epoch);
                tracing::info!(%partition, epoch, "releasing");
                handler.release(partition).await;
                ClientMetrics::count(&metrics.handler_calls, "release");
                let _ = done.send(Input::ReleaseFinished(p));
            }
            Action::Unassigned(_, epoch) => {
                let partition = at(epoch);
                tracing::info!(%partition, epoch, "unassigned");
                handler.unassigned(partition).await;
                ClientMetrics::count(&metrics.handler_calls, "unassigned");
            }
            Action::SendReady(_) | Action::SendReleased(_) | Action::ReleaseAbandoned(_) => {
                tracing::error!(
                    topic,
                    partition = p,
                    ?action,
                    "not a handler call, but queued as one; ignored"
                );
            }
        }
    }
}
