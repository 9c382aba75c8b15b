//! The store side of the driver: each [`StoreRequest`] runs as a task of its own against
//! the real store and its answer comes back to the driver as an input; the one watch runs
//! as a task that forwards its revisions. These tasks write nothing of the instance's: a
//! lost or late answer is the machine's to time out (`machine/watchdog.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::Message;
use crate::coordinator::machine::io::{Input, RequestId, StoreReply, StoreRequest};
use crate::store::{LeaseStore, StoreError, Unreachable, WatchBroke};

/// Runs an instance's store requests.
pub(super) struct StoreIo {
    store: Arc<dyn LeaseStore>,
    to_driver: mpsc::UnboundedSender<Message>,
    /// The watch in use: a new one replaces it.
    watch: Option<AbortHandle>,
    /// Requests sent and not answered yet (a graceful stop waits for them); kept by the
    /// driver alone, as their answers reach it.
    outstanding: HashSet<RequestId>,
}

impl StoreIo {
    pub(super) fn new(store: Arc<dyn LeaseStore>, to_driver: mpsc::UnboundedSender<Message>) -> Self {
        Self { store, to_driver, watch: None, outstanding: HashSet::new() }
    }

    /// How many requests are still out.
    pub(super) fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// The answer to `request` reached the driver.
    pub(super) fn answered(&mut self, request: RequestId) {
        self.outstanding.remove(&request);
    }

    /// Sends `op`; its answer comes back carrying `request`.
    pub(super) fn send(&mut self, request: RequestId, op: StoreRequest) {
        let (store, to_driver) = (self.store.clone(), self.to_driver.clone());
        if let StoreRequest::Watch { prefix, from } = op {
            if let Some(old) = self.watch.take() {
                old.abort();
            }
            let task = tokio::spawn(watch(store, to_driver, request, prefix, from));
            self.watch = Some(task.abort_handle());
            return;
        }
        self.outstanding.insert(request);
        tokio::spawn(async move {
            let answer = run(&*store, op).await;
            let _ = to_driver.send(Message::Input(Input::StoreAnswer { request, answer }));
        });
    }

    /// Stops the watch (the instance ended).
    pub(super) fn stop(&mut self) {
        if let Some(old) = self.watch.take() {
            old.abort();
        }
    }
}

/// Runs one request that is not a watch.
async fn run(store: &dyn LeaseStore, op: StoreRequest) -> Result<StoreReply, StoreError> {
    match op {
        StoreRequest::Txn(txn) => store.txn(txn).await.map(StoreReply::Txn),
        // The keys at once (a `Deregister` reads the leaver's records and its candidates').
        StoreRequest::Get(keys) => {
            futures::future::try_join_all(keys.iter().map(|key| store.get(key))).await.map(StoreReply::Values)
        }
        StoreRequest::GetPrefix(prefix) => store.get_prefix(&prefix).await.map(StoreReply::Prefix),
        StoreRequest::Watch { .. } => Err(StoreError::Invalid(crate::store::Malformed::WrongAnswerKind)),
    }
}

/// Starts the watch and forwards its revisions until it ends.
async fn watch(
    store: Arc<dyn LeaseStore>,
    to_driver: mpsc::UnboundedSender<Message>,
    request: RequestId,
    prefix: String,
    from: crate::store::Revision,
) {
    let mut batches = match store.watch_prefix(&prefix, from).await {
        Ok(batches) => batches,
        Err(error) => {
            let _ = to_driver.send(Message::Input(Input::StoreAnswer { request, answer: Err(error) }));
            return;
        }
    };
    let started = Input::StoreAnswer { request, answer: Ok(StoreReply::Watching) };
    if to_driver.send(Message::Input(started)).is_err() {
        return;
    }
    let error = loop {
        match batches.next().await {
            Some(Ok(batch)) => {
                if to_driver.send(Message::Input(Input::Watched { watch: request, batch })).is_err() {
                    return;
                }
            }
            Some(Err(error)) => break error,
            None => {
                break StoreError::Unavailable(Unreachable::Watch(WatchBroke::Ended {
                    endpoints: "the store".into(),
                }));
            }
        }
    };
    let _ = to_driver.send(Message::Input(Input::WatchEnded { watch: request, error }));
}
