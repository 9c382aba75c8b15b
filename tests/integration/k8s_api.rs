//! The `k8s` drain decider's Kubernetes client, run for real (kube-rs over HTTP) against
//! a local server that serves recorded API responses (`tests/fixtures/k8s/`): a
//! StatefulSet pod, a scale-down, a ReplicaSet pod, 403, 404, a timeout, and no server;
//! the rollout view's pod and ReplicaSet lists; and what the view knows of each consumer
//! pod from its node's zone labels and its capacity annotation (nodes listed, or refused).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, http::Uri, response::IntoResponse};
use kafka_assigner::assignment::{ConsumerInfo, Rollout};
use kafka_assigner::config::DrainPolicy;
use kafka_assigner::drain::generations::Generations;
use kafka_assigner::drain::{
    DrainDecider, DrainDecision, K8sDrainDecider, K8sRolloutView, K8sSettings, Reason, RolloutView,
};
use tokio::task::JoinHandle;

use crate::support::POLL_INTERVAL;
use crate::support::assigner::{Backend, PROMPT, TestCluster};

/// What the fake API answers on one path.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP `code` with a fixture file's JSON.
    Fixture(u16, &'static str),
    /// HTTP `code` with this JSON.
    Json(u16, String),
    /// Never answers (until the connection is dropped).
    Hang,
}

/// A local HTTP server answering Kubernetes API paths with recorded responses.
pub struct FakeApi {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The paths asked for, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    routes: Routes,
    task: JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Routes = Arc<Mutex<BTreeMap<String, Reply>>>;

async fn answer(
    State((routes, seen)): State<(Routes, Arc<Mutex<Vec<String>>>)>,
    uri: Uri,
) -> impl IntoResponse {
    let path = uri.path().to_string();
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(path.clone());
    let reply = routes.lock().unwrap_or_else(|p| p.into_inner()).get(&path).cloned();
    let (code, body) = match reply {
        Some(Reply::Fixture(code, file)) => (code, fixture(file)),
        Some(Reply::Json(code, body)) => (code, body),
        Some(Reply::Hang) => std::future::pending().await,
        None => (404, fixture("status-404.json")),
    };
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [("content-type", "application/json")], body)
}

/// The text of fixture `file`.
pub fn fixture(file: &str) -> String {
    let path = format!("{}/tests/fixtures/k8s/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

impl FakeApi {
    /// Serves `routes` (path → reply); other paths answer the recorded 404.
    pub async fn start(routes: &[(&str, Reply)]) -> FakeApi {
        let routes: Routes =
            Arc::new(Mutex::new(routes.iter().map(|(p, r)| (p.to_string(), r.clone())).collect()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new().fallback(answer).with_state((routes.clone(), requests.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        FakeApi { addr, requests, routes, task }
    }

    /// Answers `path` with `reply` from now on (`None`: the recorded 404).
    pub fn set(&self, path: &str, reply: Option<Reply>) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        match reply {
            Some(reply) => routes.insert(path.to_string(), reply),
            None => routes.remove(path),
        };
    }

    /// A decider talking to this server, in namespace `streams`.
    pub fn decider(&self, timeout: Duration) -> K8sDrainDecider {
        decider_at(&format!("http://{}", self.addr), timeout)
    }

    /// The paths asked for so far.
    pub fn seen(&self) -> Vec<String> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn decider_at(url: &str, timeout: Duration) -> K8sDrainDecider {
    let config = kube::Config::new(url.parse().expect("url"));
    let settings = K8sSettings { namespace: Some("streams".into()), timeout };
    K8sDrainDecider::from_config(config, &settings).expect("client")
}

/// Pod path in namespace `streams`.
pub const PODS: &str = "/api/v1/namespaces/streams/pods/";
/// StatefulSet `consumer` in namespace `streams`.
pub const STS: &str = "/apis/apps/v1/namespaces/streams/statefulsets/consumer";
/// The pod list of namespace `streams`.
pub const POD_LIST: &str = "/api/v1/namespaces/streams/pods";
/// The ReplicaSet list of namespace `streams`.
pub const RS_LIST: &str = "/apis/apps/v1/namespaces/streams/replicasets";
/// The node list (cluster-scoped).
pub const NODE_LIST: &str = "/api/v1/nodes";

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn statefulset_pod_below_desired_replicas_is_held() {
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[
        (&pod, Reply::Fixture(200, "pod-statefulset.json")),
        (STS, Reply::Fixture(200, "statefulset.json")),
    ])
    .await;
    let decision = api.decider(TIMEOUT).decide("consumer-1").await;
    assert_eq!(decision, DrainDecision::ShutdownNow(Reason::StatefulSetRestart));
    assert_eq!(api.seen(), [pod.as_str(), STS]);
}

#[tokio::test]
async fn statefulset_scale_down_drains() {
    let pod = format!("{PODS}consumer-2");
    let api = FakeApi::start(&[
        (&pod, Reply::Fixture(200, "pod-statefulset-scaled-down.json")),
        (STS, Reply::Fixture(200, "statefulset-scaled-down.json")),
    ])
    .await;
    let decision = api.decider(TIMEOUT).decide("consumer-2").await;
    assert_eq!(decision, DrainDecision::WaitForDrain(Reason::StatefulSetScaleDown));
}

#[tokio::test]
async fn replicaset_pod_drains_without_more_lookups() {
    let pod = format!("{PODS}consumer-7d9f8b6c5-x2lqp");
    let api = FakeApi::start(&[(&pod, Reply::Fixture(200, "pod-replicaset.json"))]).await;
    let decision = api.decider(TIMEOUT).decide("consumer-7d9f8b6c5-x2lqp").await;
    assert_eq!(decision, DrainDecision::WaitForDrain(Reason::ReplicaSetPod));
    assert_eq!(api.seen(), [pod.as_str()]);
}

#[tokio::test]
async fn forbidden_is_unknown_so_shutdown_now() {
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[(&pod, Reply::Fixture(403, "status-403.json"))]).await;
    let decision = api.decider(TIMEOUT).decide("consumer-1").await;
    assert_eq!(decision, DrainDecision::ShutdownNow(Reason::Forbidden));
}

#[tokio::test]
async fn missing_pod_or_statefulset_is_unknown_so_shutdown_now() {
    let api = FakeApi::start(&[]).await;
    let decision = api.decider(TIMEOUT).decide("consumer-9").await;
    assert_eq!(decision, DrainDecision::ShutdownNow(Reason::NotFound));
    // The pod exists but its StatefulSet does not (deleted meanwhile).
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[(&pod, Reply::Fixture(200, "pod-statefulset.json"))]).await;
    let decision = api.decider(TIMEOUT).decide("consumer-1").await;
    assert_eq!(decision, DrainDecision::ShutdownNow(Reason::NotFound));
}

#[tokio::test]
async fn a_hanging_api_times_out_to_shutdown_now() {
    let pod = format!("{PODS}consumer-1");
    let api = FakeApi::start(&[(&pod, Reply::Hang)]).await;
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let decision = api.decider(timeout).decide("consumer-1").await;
    let took = started.elapsed();
    assert_eq!(decision.reason(), Reason::Timeout, "{decision:?}");
    assert!(!decision.drains());
    assert!(took >= timeout && took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(api.seen(), [pod.as_str()], "the request did reach the server");
}

#[tokio::test]
async fn an_unreachable_api_is_shutdown_now() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let decider = decider_at(&format!("http://127.0.0.1:{port}"), TIMEOUT);
    assert_eq!(decider.decide("consumer-1").await, DrainDecision::ShutdownNow(Reason::ApiError));
}

#[tokio::test]
async fn serve_with_the_k8s_policy_and_no_kubernetes_config_fails_at_start() {
    let empty = tempfile::tempdir().expect("temp dir");
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
            .args([
                "serve",
                "--drain-policy",
                "k8s",
                "--grpc-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
            ])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("KUBECONFIG", empty.path().join("missing-kubeconfig"))
            .env("HOME", empty.path())
            .output(),
    )
    .await
    .expect("the server gave up at start")
    .expect("ran");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--drain-policy k8s: no Kubernetes configuration"), "{stderr}");
}

/// Waits (up to [`PROMPT`]) until what `view` knows satisfies `pred`.
pub async fn wait_view(view: &K8sRolloutView, what: &str, pred: impl Fn(&Generations) -> bool) {
    let give_up = Instant::now() + PROMPT;
    while !pred(&view.generations()) {
        assert!(Instant::now() < give_up, "the rollout view never saw {what}: {:?}", view.generations());
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

const REFRESH: Duration = Duration::from_millis(100);

#[tokio::test]
async fn the_rollout_view_lists_pods_and_replicasets_and_sees_two_generations() {
    let api = FakeApi::start(&[
        (POD_LIST, Reply::Fixture(200, "podlist-rollout.json")),
        (RS_LIST, Reply::Fixture(200, "replicasetlist-rollout.json")),
    ])
    .await;
    let view = api.decider(TIMEOUT).rollout_view(REFRESH);
    wait_view(&view, "the rollout", |g| !g.rolling().is_empty()).await;
    let (old, draining, new) =
        ("consumer-7d9f8b6c5-b8k2m", "consumer-7d9f8b6c5-x2lqp", "consumer-5c4b8f7d9-m7wfn");
    let rollout = view.rollout(&names(&[old, draining, new]), &names(&[old, new])).expect("rolling out");
    assert_eq!(rollout, Rollout { outgoing: names(&[old, draining]), final_members: 3 });
    let seen = api.seen();
    assert!(seen.iter().any(|p| p == POD_LIST) && seen.iter().any(|p| p == RS_LIST), "{seen:?}");
}

#[tokio::test]
async fn the_rollout_view_keeps_what_it_knew_when_the_api_refuses() {
    let api = FakeApi::start(&[
        (POD_LIST, Reply::Fixture(200, "podlist-rollout.json")),
        (RS_LIST, Reply::Fixture(403, "status-403.json")),
    ])
    .await;
    let view = api.decider(TIMEOUT).rollout_view(REFRESH);
    let lists = |api: &FakeApi| api.seen().iter().filter(|p| *p == RS_LIST).count();
    let give_up = Instant::now() + PROMPT;
    while lists(&api) < 2 {
        assert!(Instant::now() < give_up, "the view did not retry: {:?}", api.seen());
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let consumers = names(&["consumer-7d9f8b6c5-b8k2m", "consumer-5c4b8f7d9-m7wfn"]);
    assert_eq!(view.rollout(&consumers, &consumers), None, "RBAC refuses: no rollout known, plain planning");
    // Allowed: the rollout is seen; refused again: what it knew stays.
    api.set(RS_LIST, Some(Reply::Fixture(200, "replicasetlist-rollout.json")));
    wait_view(&view, "the rollout", |g| !g.rolling().is_empty()).await;
    api.set(RS_LIST, Some(Reply::Hang));
    let before = lists(&api);
    while lists(&api) < before + 1 {
        assert!(Instant::now() < give_up + PROMPT, "no list after the change: {:?}", api.seen());
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert!(view.rollout(&consumers, &consumers).is_some(), "the last view stays while the API hangs");
}

/// The pod of `podlist-attributes.json` that a ReplicaSet owns.
pub const RS_POD: &str = "consumer-5c4b8f7d9-m7wfn";

/// Waits (up to [`PROMPT`]) until `view` has info on `consumer` that satisfies `pred`.
pub async fn wait_info(view: &K8sRolloutView, consumer: &str, pred: impl Fn(&ConsumerInfo) -> bool) {
    let give_up = Instant::now() + PROMPT;
    while !view.info(consumer).is_some_and(|info| pred(&info)) {
        assert!(Instant::now() < give_up, "the view never knew {consumer}: {:?}", view.info(consumer));
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A consumer's info, briefly.
pub fn info(zone: Option<&str>, capacity: u32, generation: Option<&str>) -> ConsumerInfo {
    ConsumerInfo { zone: zone.map(String::from), capacity, generation: generation.map(String::from) }
}

/// How often the fake API was asked for `path`.
fn asked(api: &FakeApi, path: &str) -> usize {
    api.seen().iter().filter(|p| *p == path).count()
}

/// The fake API listing `podlist-attributes.json`, its ReplicaSets, and answering the node
/// list with `nodes`.
pub async fn attributes_api(nodes: Reply) -> FakeApi {
    FakeApi::start(&[
        (POD_LIST, Reply::Fixture(200, "podlist-attributes.json")),
        (RS_LIST, Reply::Fixture(200, "replicasetlist-rollout.json")),
        (NODE_LIST, nodes),
    ])
    .await
}

/// A cluster of one instance under `--drain-policy k8s`: `decider` answers `Deregister`,
/// `view` tells the leader and `Register` about the consumers' pods.
pub async fn k8s_cluster(
    backend: Backend,
    decider: K8sDrainDecider,
    view: &Arc<K8sRolloutView>,
) -> TestCluster {
    let view: Arc<K8sRolloutView> = view.clone();
    TestCluster::start(backend, 1, move |c| {
        c.drain_policy = DrainPolicy::K8s;
        c.drain_decider = Some(Arc::new(decider));
        c.rollout = Some(view);
    })
    .await
}

#[tokio::test]
async fn the_view_knows_each_pods_zone_capacity_and_generation() {
    let api = attributes_api(Reply::Fixture(200, "nodelist-zones.json")).await;
    let view = api.decider(TIMEOUT).rollout_view(REFRESH);
    wait_info(&view, "consumer-0", |i| i.zone.is_some()).await;
    // node-a has both zone labels; node-b only the older one; node-c neither.
    assert_eq!(view.info("consumer-0"), Some(info(Some("eu-west-1a"), 3, None)));
    assert_eq!(view.info("consumer-1"), Some(info(Some("eu-west-1b"), 1, None)), "capacity \"0\" is 1");
    assert_eq!(view.info("consumer-2"), Some(info(None, 1, None)), "no zone label, no annotation");
    assert_eq!(view.info("consumer-3"), Some(info(None, 1, None)), "pending: no node; \"lots\" is 1");
    assert_eq!(view.info(RS_POD), Some(info(Some("eu-west-1a"), 2, Some("5c4b8f7d9"))));
    assert_eq!(view.info("not-a-pod"), None);
    wait_view(&view, "the ReplicaSet pod", |g| g.knows(RS_POD)).await;
}

#[tokio::test]
async fn nodes_refused_leave_zones_unknown_and_the_rest_works() {
    let api = attributes_api(Reply::Fixture(403, "status-403-nodes.json")).await;
    let view = api.decider(TIMEOUT).rollout_view(REFRESH);
    wait_info(&view, RS_POD, |_| true).await;
    assert_eq!(view.info("consumer-0"), Some(info(None, 3, None)), "capacity known, zone not");
    assert_eq!(view.info(RS_POD), Some(info(None, 2, Some("5c4b8f7d9"))));
    wait_view(&view, "the ReplicaSet pod", |g| g.knows(RS_POD)).await;
    // Pods go on being listed; a refused node list is not asked again at every refresh.
    let give_up = Instant::now() + PROMPT;
    while asked(&api, POD_LIST) < 4 {
        assert!(Instant::now() < give_up, "the view stopped listing pods: {:?}", api.seen());
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert_eq!(asked(&api, NODE_LIST), 1, "{:?}", api.seen());
    assert_eq!(view.info("consumer-0").and_then(|i| i.zone), None);
}
