//! Consumers' attributes from Kubernetes, end to end: an assigner under `--drain-policy k8s`
//! (its view is kube-rs against the recorded-response server of `k8s_api`, which lists
//! `podlist-attributes.json` and `nodelist-zones.json`) stores, in the record `Register`
//! writes, the zone of the consumer pod's node and its capacity annotation.
//!
//! * In process, on memory and on a real etcd: the stored record read back from the store.
//! * The real binary (`serve --drain-policy k8s`, a kubeconfig naming the fake API), on the
//!   handoff and the fleet backends: `/status` shows each consumer's zone and capacity, and
//!   a bad capacity annotation is a warning naming the pod.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_assigner::coordinator::records::Keys;
use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::k8s_api::{FakeApi, NODE_LIST, POD_LIST, RS_POD, Reply, attributes_api, k8s_cluster, wait_info};
use crate::metrics::http_get;
use crate::support::assigner::{Backend, PROMPT, TOPIC, TestConsumer, on_both_backends};
use crate::support::wait_until;

on_both_backends!(the_consumer_record_holds_its_pods_zone_and_capacity);

async fn the_consumer_record_holds_its_pods_zone_and_capacity(backend: Backend) {
    let api = attributes_api(Reply::Fixture(200, "nodelist-zones.json")).await;
    let decider = api.decider(Duration::from_secs(5));
    let view = Arc::new(decider.rollout_view(Duration::from_millis(100)));
    wait_info(&view, "consumer-0", |i| i.zone.is_some()).await;
    let cluster = k8s_cluster(backend, decider, &view).await;
    let mut consumers = Vec::new();
    for name in ["consumer-0", RS_POD, "consumer-2", "not-a-pod"] {
        let mut consumer = cluster.consumer_on(0, name, TOPIC).await;
        consumer.expect_snapshot().await;
        consumers.push(consumer);
    }

    let keys = Keys::new(&cluster.config.prefix);
    let mut stored = Vec::new();
    for name in ["consumer-0", RS_POD, "consumer-2", "not-a-pod"] {
        let kv = cluster.store.get(&keys.consumer(TOPIC, name)).await.expect("read the record");
        let kv = kv.unwrap_or_else(|| panic!("no record for {name}"));
        let record: Value = serde_json::from_slice(&kv.value).expect("the record is JSON");
        stored.push(record);
    }
    assert_eq!(stored[0]["info"], json!({"zone": "eu-west-1a", "capacity": 3}), "{stored:?}");
    assert_eq!(
        stored[1]["info"],
        json!({"zone": "eu-west-1a", "capacity": 2, "generation": "5c4b8f7d9"}),
        "{stored:?}"
    );
    // A pod with every attribute at its default, and a name that is no pod: no info stored.
    assert!(stored[2].get("info").is_none() && stored[3].get("info").is_none(), "{stored:?}");

    let status = cluster.status().await;
    let topic = status.topics.iter().find(|t| t.topic == TOPIC).expect("the topic");
    let shown: Vec<(&str, Option<&str>, u32)> =
        topic.consumers.iter().map(|c| (c.name.as_str(), c.zone.as_deref(), c.capacity)).collect();
    assert!(shown.contains(&("consumer-0", Some("eu-west-1a"), 3)), "{shown:?}");
    assert!(shown.contains(&("not-a-pod", None, 1)), "{shown:?}");
}

/// A kubeconfig whose one cluster is the fake API.
fn kubeconfig(dir: &std::path::Path, api: &FakeApi) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: streams\n\
         current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
        api.addr
    );
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

/// `kafka-assigner serve --drain-policy k8s` with `backend_flags`, its JSON log lines
/// collected as they come.
struct Served {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Served {
    async fn start(backend_flags: &[&str], kubeconfig: &std::path::Path, home: &std::path::Path) -> Served {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
            .arg("serve")
            .args(backend_flags)
            .args(["--topic-partitions", "events=4", "--drain-policy", "k8s"])
            .args(["--k8s-rollout-refresh", "100ms", "--instance-id", "k8s-info", "--log-format", "json"])
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", home)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("kafka-assigner serve starts");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(doc) = serde_json::from_str::<Value>(&line) {
                    collected.lock().unwrap_or_else(|p| p.into_inner()).push(doc);
                }
            }
        });
        Served { child, lines }
    }

    /// The first log line `pred` accepts, waiting up to `deadline`.
    async fn line(&self, deadline: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            let found =
                self.lines.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|l| pred(l)).cloned();
            if let Some(line) = found {
                return line;
            }
            assert!(tokio::time::Instant::now() < give_up, "no log line: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The addresses of the `serving` line: (gRPC URL, admin address).
    async fn addresses(&self) -> (String, std::net::SocketAddr) {
        let serving = self.line(Duration::from_secs(30), "serving", |l| l["message"] == "serving").await;
        let field =
            |name: &str| serving[name].as_str().unwrap_or_else(|| panic!("{name}: {serving}")).to_string();
        (format!("http://{}", field("grpc_addr")), field("admin_addr").parse().expect("admin address"))
    }
}

/// The fake API has been asked for the nodes, and for the pods after that: the view has
/// published what it knows with the zones.
async fn view_has_zones(api: &FakeApi) {
    wait_until(PROMPT, "the view listed nodes, then pods again", || async {
        let seen = api.seen();
        let nodes = seen.iter().position(|p| p == NODE_LIST);
        nodes.is_some_and(|at| seen[at..].iter().any(|p| p == POD_LIST))
    })
    .await;
}

/// The consumers `/status` shows for the one topic, once there are `count` of them.
async fn consumers_shown(admin: std::net::SocketAddr, count: usize) -> Vec<Value> {
    let give_up = tokio::time::Instant::now() + PROMPT;
    loop {
        let (code, body) = http_get(admin, "/status").await;
        let doc: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let shown = doc["topics"][0]["consumers"].as_array().cloned().unwrap_or_default();
        if code == 200 && shown.len() == count {
            return shown;
        }
        assert!(tokio::time::Instant::now() < give_up, "/status never showed {count} consumers: {body}");
        tokio::time::sleep(crate::support::POLL_INTERVAL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_the_k8s_policy_stores_zone_and_capacity() {
    for flags in [&["--backend", "memory"][..], &["--backend", "fleet", "--store", "memory"][..]] {
        let api = attributes_api(Reply::Fixture(200, "nodelist-zones.json")).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let served = Served::start(flags, &kubeconfig(dir.path(), &api), dir.path()).await;
        let (grpc, admin) = served.addresses().await;
        view_has_zones(&api).await;
        let client = KafkaAssignerClient::connect(grpc).await.expect("connect");
        let mut consumers = Vec::new();
        for name in ["consumer-0", "consumer-1"] {
            let consumer = TestConsumer::register(client.clone(), name, TOPIC).await;
            consumers.push(consumer.unwrap_or_else(|s| panic!("{flags:?}: Register({name}): {s:?}")));
        }

        let shown = consumers_shown(admin, 2).await;
        let of = |name: &str| {
            let c = shown.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{name}: {shown:?}"));
            (c["zone"].clone(), c["capacity"].clone())
        };
        assert_eq!(of("consumer-0"), (json!("eu-west-1a"), json!(3)), "{flags:?}");
        assert_eq!(of("consumer-1"), (json!("eu-west-1b"), json!(1)), "{flags:?}: \"0\" is no capacity");
        let warning = served
            .line(PROMPT, "a warning naming consumer-1", |l| l["level"] == "WARN" && l["pod"] == "consumer-1")
            .await;
        assert_eq!(warning["value"], "0", "{warning}");
        drop(consumers);
        let mut child = served.child;
        let _ = child.kill().await;
    }
}
