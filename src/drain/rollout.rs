//! The rollout view: what the leader plans with while a Deployment of consumers rolls out
//! (see [`crate::assignment::rollout`]).
//!
//! [`K8sRolloutView`] lists the namespace's pods and ReplicaSets in a background task every
//! refresh interval (and soon after the leader meets a consumer name it does not know),
//! and keeps the last [`Generations`] in memory. The leader reads that once per reconcile
//! pass and never waits on the Kubernetes API: when the API cannot be read the last view
//! stays (a warning is logged once), and before the first list there is no rollout.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};
use kube::{Api, Client, api::ListParams};
use tokio::sync::Notify;

use super::generations::Generations;
use crate::assignment::Rollout;

/// Answers, from memory, whether a topic's consumers are in a rollout.
pub trait RolloutView: Send + Sync + std::fmt::Debug + 'static {
    /// The rollout among one topic's consumers (`live`: registered; `active`: those not
    /// draining), if one is in progress. Must not wait on anything: the leader calls it
    /// while planning.
    fn rollout(&self, live: &BTreeSet<String>, active: &BTreeSet<String>) -> Option<Rollout>;
}

/// How long a pod that vanished from the list still counts with its generation.
const RETAIN: Duration = Duration::from_secs(300);

/// What the view and its refresh task share.
#[derive(Default)]
struct Shared {
    generations: RwLock<Arc<Generations>>,
    /// Asks the task for an early refresh (an unknown consumer name was met).
    wake: Notify,
}

/// The Kubernetes rollout view (module docs). Dropping it stops its refresh task.
pub struct K8sRolloutView {
    shared: Arc<Shared>,
    namespace: String,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for K8sRolloutView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sRolloutView").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl Drop for K8sRolloutView {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where and how often the refresh task lists.
struct Lister {
    client: Client,
    namespace: String,
    /// One list call not answered within this fails.
    timeout: Duration,
    /// Time between two lists.
    interval: Duration,
}

impl K8sRolloutView {
    /// Starts the refresh task (needs a Tokio runtime): lists pods and ReplicaSets of
    /// `namespace` every `interval`, each list call bounded by `timeout`.
    pub fn start(client: Client, namespace: &str, interval: Duration, timeout: Duration) -> Self {
        let shared = Arc::new(Shared::default());
        let lister = Lister { client, namespace: namespace.to_string(), timeout, interval };
        let task = tokio::spawn(refresh_loop(lister, shared.clone())).abort_handle();
        Self { shared, namespace: namespace.to_string(), task }
    }

    /// The view as of the last successful list.
    pub fn generations(&self) -> Arc<Generations> {
        self.shared.generations.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl RolloutView for K8sRolloutView {
    fn rollout(&self, live: &BTreeSet<String>, active: &BTreeSet<String>) -> Option<Rollout> {
        let generations = self.generations();
        if live.iter().any(|name| !generations.knows(name)) {
            // Perhaps a new pod the last list did not have yet. (Names that are not pods of
            // a Deployment at all wake it too; the task spaces its lists out.)
            self.shared.wake.notify_one();
        }
        generations.rollout(live, active)
    }
}

impl Lister {
    async fn list(&self) -> Result<(Vec<Pod>, Vec<ReplicaSet>), String> {
        let params = ListParams::default();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        let sets = Api::<ReplicaSet>::namespaced(self.client.clone(), &self.namespace);
        let both = async {
            let pods = pods.list(&params).await.map_err(|e| format!("listing pods: {e}"))?;
            let sets = sets.list(&params).await.map_err(|e| format!("listing ReplicaSets: {e}"))?;
            Ok((pods.items, sets.items))
        };
        tokio::time::timeout(self.timeout, both)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)))
    }
}

/// Lists, publishes, then waits for the next refresh: the interval, or an early wake-up
/// no sooner than a quarter of it.
async fn refresh_loop(lister: Lister, shared: Arc<Shared>) {
    let mut failing = false;
    loop {
        match lister.list().await {
            Ok((pods, sets)) => {
                let previous = shared.generations.read().unwrap_or_else(|p| p.into_inner()).clone();
                let next = Generations::observe(&pods, &sets, &previous, Instant::now(), RETAIN);
                log_changes(&lister.namespace, &previous, &next);
                *shared.generations.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
                if failing {
                    tracing::info!(namespace = %lister.namespace, "rollout view: the Kubernetes API answers again");
                }
                failing = false;
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(
                    namespace = %lister.namespace,
                    %error,
                    "rollout view: cannot read pods and ReplicaSets (needs list on both); planning with what it knew"
                );
            }
            Err(_) => {}
        }
        tokio::time::sleep(lister.interval / 4).await;
        let _ = tokio::time::timeout(lister.interval - lister.interval / 4, shared.wake.notified()).await;
    }
}

/// Logs rollouts that started or ended.
fn log_changes(namespace: &str, before: &Generations, after: &Generations) {
    for (deployment, rolling) in after.rolling() {
        if before.rolling().get(deployment) != Some(rolling) {
            tracing::info!(
                namespace,
                deployment,
                revision = rolling.newest,
                desired = rolling.desired,
                "Deployment rolling out: its old pods receive no partitions, the new ones fill to their final share"
            );
        }
    }
    for deployment in before.rolling().keys().filter(|d| !after.rolling().contains_key(*d)) {
        tracing::info!(namespace, deployment, "Deployment rollout over: plain assignment again");
    }
}
