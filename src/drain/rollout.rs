//! The Kubernetes view: what the leader plans with while a Deployment of consumers rolls
//! out (see [`crate::assignment::rollout`]), and what placement knows of each consumer
//! ([`ConsumerInfo`]: its zone, capacity and generation, [`super::info`]).
//!
//! [`K8sRolloutView`] lists the namespace's pods and ReplicaSets in a background task every
//! refresh interval (and soon after a consumer name it does not know is asked about), and
//! now and then the cluster's nodes ([`super::nodes`]), and keeps the last [`Generations`]
//! and consumers' info in memory. The leader and `Register` read those from memory and
//! never wait on the Kubernetes API: when the API cannot be read the last view stays (a
//! warning is logged once), and before the first list there is no rollout and no info.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};
use kube::{Api, Client, api::ListParams};
use tokio::sync::Notify;

use super::generations::Generations;
use super::info::Attributes;
use super::nodes::Zones;
use crate::assignment::{ConsumerInfo, Rollout};

/// Answers, from memory, whether a topic's consumers are in a rollout, and what is known
/// of each consumer.
pub trait RolloutView: Send + Sync + std::fmt::Debug + 'static {
    /// The rollout among one topic's consumers (`live`: registered; `active`: those not
    /// draining), if one is in progress. Must not wait on anything: the leader calls it
    /// while planning.
    fn rollout(&self, live: &BTreeSet<String>, active: &BTreeSet<String>) -> Option<Rollout>;

    /// What is known of `consumer` (a pod name), if the last list had that pod. Must not
    /// wait on anything: `Register` and the leader call it.
    fn info(&self, consumer: &str) -> Option<ConsumerInfo>;
}

/// How long a pod that vanished from the list still counts with its generation.
const RETAIN: Duration = Duration::from_secs(300);

/// What the view and its refresh task share.
#[derive(Default)]
struct Shared {
    generations: RwLock<Arc<Generations>>,
    /// The consumers' info by pod name, as of the last pod list.
    info: RwLock<Arc<BTreeMap<String, ConsumerInfo>>>,
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
    /// `namespace` every `interval`, and the nodes now and then, each list call bounded by
    /// `timeout`.
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

    fn info(&self, consumer: &str) -> Option<ConsumerInfo> {
        let info = self.shared.info.read().unwrap_or_else(|p| p.into_inner()).get(consumer).cloned();
        if info.is_none() {
            // A pod that registers before the next list: list soon, so the leader has it.
            self.shared.wake.notify_one();
        }
        info
    }
}

impl Lister {
    /// The namespace's objects of kind `K`, within the timeout.
    async fn list<K>(&self, what: &str) -> Result<Vec<K>, String>
    where
        K: kube::Resource<Scope = NamespaceResourceScope> + Clone + serde::de::DeserializeOwned,
        K: std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api = Api::<K>::namespaced(self.client.clone(), &self.namespace);
        match tokio::time::timeout(self.timeout, api.list(&ListParams::default())).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(error)) => Err(format!("listing {what}: {error}")),
            Err(_) => Err(format!("listing {what}: no answer within {:?}", self.timeout)),
        }
    }
}

/// What the refresh task remembers between two lists.
#[derive(Default)]
struct Memory {
    /// Whether the last pod or ReplicaSet list failed (warned once until one succeeds).
    failing: bool,
    /// The nodes' zones.
    zones: Zones,
    /// Pods with a bad capacity annotation already warned about, with the value.
    warned: BTreeMap<String, String>,
}

/// Lists, publishes, then waits for the next refresh: the interval, or an early wake-up
/// no sooner than a quarter of it.
async fn refresh_loop(lister: Lister, shared: Arc<Shared>) {
    let mut memory = Memory::default();
    loop {
        let listed = async {
            let pods = lister.list::<Pod>("pods").await?;
            observe_pods(&lister, &shared, &mut memory, &pods).await;
            let sets = lister.list::<ReplicaSet>("ReplicaSets").await?;
            Ok::<_, String>((pods, sets))
        };
        match listed.await {
            Ok((pods, sets)) => {
                let previous = shared.generations.read().unwrap_or_else(|p| p.into_inner()).clone();
                let next = Generations::observe(&pods, &sets, &previous, Instant::now(), RETAIN);
                log_changes(&lister.namespace, &previous, &next);
                *shared.generations.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
                if memory.failing {
                    tracing::info!(namespace = %lister.namespace, "rollout view: the Kubernetes API answers again");
                }
                memory.failing = false;
            }
            Err(error) if !memory.failing => {
                memory.failing = true;
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

/// Publishes the consumers' info from the pods just listed (listing the nodes first when
/// due), and warns once about each pod whose capacity annotation is not a positive integer.
async fn observe_pods(lister: &Lister, shared: &Shared, memory: &mut Memory, pods: &[Pod]) {
    memory.zones.refresh(&lister.client, pods, lister.timeout).await;
    let attributes = Attributes::observe(pods, &memory.zones.known);
    for (pod, value) in &attributes.bad_capacity {
        if memory.warned.get(pod) != Some(value) {
            tracing::warn!(
                namespace = %lister.namespace,
                pod = %pod,
                value = %value,
                annotation = super::info::CAPACITY_ANNOTATION,
                "the pod's capacity annotation is not a positive integer; its capacity is 1"
            );
        }
    }
    memory.warned = attributes.bad_capacity;
    *shared.info.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(attributes.info);
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
