//! The `k8s` drain decider's Kubernetes client, run for real (kube-rs over HTTP) against
//! a local server that serves recorded API responses (`tests/fixtures/k8s/`): a
//! StatefulSet pod, a scale-down, a ReplicaSet pod, 403, 404, a timeout, and no server.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, http::Uri, response::IntoResponse};
use kafka_assigner::drain::{DrainDecider, DrainDecision, K8sDrainDecider, K8sSettings, Reason};
use tokio::task::JoinHandle;

/// What the fake API answers on one path.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP `code` with a fixture file's JSON.
    Fixture(u16, &'static str),
    /// Never answers (until the connection is dropped).
    Hang,
}

/// A local HTTP server answering Kubernetes API paths with recorded responses.
pub struct FakeApi {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The paths asked for, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Routes = Arc<BTreeMap<String, Reply>>;

async fn answer(
    State((routes, seen)): State<(Routes, Arc<Mutex<Vec<String>>>)>,
    uri: Uri,
) -> impl IntoResponse {
    let path = uri.path().to_string();
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(path.clone());
    let (code, file) = match routes.get(&path) {
        Some(Reply::Fixture(code, file)) => (*code, *file),
        Some(Reply::Hang) => std::future::pending().await,
        None => (404, "status-404.json"),
    };
    let path = format!("{}/tests/fixtures/k8s/{file}", env!("CARGO_MANIFEST_DIR"));
    let body = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [("content-type", "application/json")], body)
}

impl FakeApi {
    /// Serves `routes` (path → reply); other paths answer the recorded 404.
    pub async fn start(routes: &[(&str, Reply)]) -> FakeApi {
        let routes: Routes = Arc::new(routes.iter().map(|(p, r)| (p.to_string(), r.clone())).collect());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new().fallback(answer).with_state((routes, requests.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        FakeApi { addr, requests, task }
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
