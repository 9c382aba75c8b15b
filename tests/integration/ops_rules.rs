//! The alert rules and the dashboard of `deploy/` (docs/operating.md "Alerts"):
//! * `promtool check rules` and `promtool test rules` (every alert has a unit test with a
//!   series that fires it and one that does not, kafka-assigner.rules.test.yml);
//! * every alert has a `runbook_url` whose anchor is a section of docs/operating.md;
//! * the PrometheusRule is the rules file, wrapped: generated here from the one source and
//!   compared (`UPDATE_DEPLOY=1` rewrites it);
//! * every dashboard expression parses (promtool) and every metric name in the rules and the
//!   dashboard is one a running assigner exports (its `/metrics`).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use std::{net::SocketAddr, sync::Arc};

use kafka_assigner::{
    coordinator::HandoffConfig,
    metrics::{
        Metrics,
        labels::{ReasonLabels, StoreErrorLabels},
    },
    proto::v1::kafka_assigner_client::KafkaAssignerClient,
    server::AssignerServer,
    store::{LeaseStore, MemoryStore, MeteredStore},
};
use serde_json::Value;

use crate::metrics::http_get;
use crate::support::assigner::{PROMPT, TestConsumer};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rules_path() -> PathBuf {
    repo().join("deploy/prometheus/kafka-assigner.rules.yml")
}

/// Runs `promtool` with `args`; panics with its output unless it succeeds.
fn promtool(args: &[&str], dir: &Path) -> String {
    let binary = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let output = Command::new(&binary)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary} (Debian: apt-get install prometheus): {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{binary} {args:?} failed:\n{text}");
    text
}

/// The rules file as JSON.
fn rules() -> Value {
    let text = std::fs::read_to_string(rules_path()).expect("rules file");
    serde_yaml_ng::from_str(&text).expect("the rules file is YAML")
}

/// Every alerting rule: (alert, expr, runbook_url).
fn alerts() -> Vec<(String, String, String)> {
    let rules = rules();
    let groups = rules["groups"].as_array().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (field(&r["alert"]), field(&r["expr"]), field(&r["annotations"]["runbook_url"]))
        })
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_unit_tests_every_alert() {
    let dir = repo().join("deploy/prometheus");
    let checked = promtool(&["check", "rules", "kafka-assigner.rules.yml"], &dir);
    assert!(checked.contains("SUCCESS: 12 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "kafka-assigner.rules.test.yml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a test that expects it to fire (the same tests hold series that must
    // not fire it: exp_alerts lists exactly what fires).
    let text = std::fs::read_to_string(dir.join("kafka-assigner.rules.test.yml")).expect("tests file");
    let tests: Value = serde_yaml_ng::from_str(&text).expect("tests YAML");
    let mut fired = BTreeSet::new();
    for test in tests["tests"].as_array().expect("tests") {
        let series = test["input_series"].as_array().map_or(0, Vec::len);
        assert!(series >= 2, "a test needs a series that fires and one that does not: {test}");
        for case in test["alert_rule_test"].as_array().expect("alert_rule_test") {
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fired.insert(case["alertname"].as_str().expect("alertname").to_string());
            }
        }
    }
    let names: BTreeSet<String> = alerts().into_iter().map(|(name, _, _)| name).collect();
    assert_eq!(names.len(), 12, "{names:?}");
    assert_eq!(fired, names, "alerts with no firing unit test, or tests of unknown alerts");
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_links_its_runbook_section() {
    let operating = std::fs::read_to_string(repo().join("docs/operating.md")).expect("operating.md");
    let anchors: BTreeSet<String> = operating
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| anchor(h.trim_start_matches('#')))
        .collect();
    for (alert, _, runbook) in alerts() {
        let (page, section) =
            runbook.split_once('#').unwrap_or_else(|| panic!("{alert}: {runbook} has no anchor"));
        assert!(page.ends_with("/docs/operating.md"), "{alert}: {runbook}");
        assert_eq!(section, alert.to_lowercase(), "{alert}: its section is named after it");
        assert!(anchors.contains(section), "{alert}: docs/operating.md has no section #{section}");
        // The section says what it means, what to look at first, and what to do.
        let start = operating.find(&format!("### {alert}\n")).expect("section");
        let body = &operating[start..];
        let body = &body[..body[4..].find("\n### ").map_or(body.len(), |i| i + 4)];
        for part in ["**Means**", "**Look first**", "**Do**"] {
            assert!(body.contains(part), "{alert}'s runbook has no {part}:\n{body}");
        }
    }
}

/// The PrometheusRule: the rules file's `groups` under `spec`, comments and all.
fn prometheus_rule(rules: &str) -> String {
    let mut out = String::from(
        "# Generated from kafka-assigner.rules.yml by tests/integration/ops_rules.rs\n\
         # (UPDATE_DEPLOY=1 cargo test --test integration ops_rules::); edit that file, not this one.\n\
         # For the Prometheus operator: kubectl apply -f deploy/prometheus/kafka-assigner.prometheusrule.yaml\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: kafka-assigner\n  labels:\n    app.kubernetes.io/name: kafka-assigner\n\
         spec:\n",
    );
    let body = rules.split_once("\ngroups:\n").map(|(_, b)| b).expect("the rules file has groups:");
    out.push_str("  groups:\n");
    for line in body.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn the_prometheus_rule_is_the_rules_file() {
    let text = std::fs::read_to_string(rules_path()).expect("rules file");
    let generated = prometheus_rule(&text);
    let path = repo().join("deploy/prometheus/kafka-assigner.prometheusrule.yaml");
    if std::env::var_os("UPDATE_DEPLOY").is_some() {
        std::fs::write(&path, &generated).expect("write the PrometheusRule");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is not generated from the rules file: run UPDATE_DEPLOY=1 cargo test --test integration ops_rules::",
        path.display()
    );
    // And it says the same to a YAML reader.
    let object: Value = serde_yaml_ng::from_str(&generated).expect("PrometheusRule YAML");
    assert_eq!(object["kind"], "PrometheusRule");
    assert_eq!(object["spec"]["groups"], rules()["groups"]);
}

/// Every `expr` of the dashboard's panels, with Grafana's variables replaced by values
/// Prometheus accepts.
fn dashboard_exprs() -> Vec<String> {
    let path = repo().join("deploy/grafana/kafka-assigner.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    out.push(expr.clone());
                }
                map.values().for_each(|v| collect(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    collect(&dashboard["panels"], &mut exprs);
    exprs
        .into_iter()
        .map(|e| {
            e.replace("$__rate_interval", "5m").replace("$topic", "events").replace("$job", "kafka-assigner")
        })
        .collect()
}

/// The sample names a running assigner's `/metrics` carries, from its `# TYPE` lines. A
/// family shows only once it has a series, so a consumer registers (the fleet and
/// placement gauges, moves, handoff and gRPC counters fill by themselves) and the families
/// only an incident fills (refusals, store errors, TLS reloads, drain answers, deferred
/// moves) get one sample each, through the calls the service makes.
async fn exported_names() -> BTreeSet<String> {
    let mut config = HandoffConfig::default();
    config.topic_partitions.insert("events".into(), 4);
    let metrics = Arc::new(Metrics::new());
    let store: Arc<dyn LeaseStore> =
        Arc::new(MeteredStore::new(Arc::new(MemoryStore::new()), metrics.clone()));
    let coordinator = crate::support::assigner::TestCoordinator::start(store, config, metrics.clone())
        .await
        .expect("memory backend");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = AssignerServer::start(coordinator.served(), metrics.clone(), any, any).await.expect("serve");
    let client = KafkaAssignerClient::connect(server.grpc_url()).await.expect("connect");
    let mut a = TestConsumer::register(client, "a", "events").await.expect("Register");
    a.wait_owned(4, PROMPT).await;
    metrics.observe_stream_refused("max_streams");
    metrics.store_errors.get_or_create(&StoreErrorLabels { op: "txn", kind: "unavailable" }).inc();
    metrics.streams_ended.get_or_create(&ReasonLabels { reason: "drained" }).inc();
    metrics.observe_tls_reload(false);
    metrics.observe_drain_decision(true, "policy");
    metrics.observe_move_deferred("events", "budget");
    let (code, text) = http_get(server.admin_addr, "/metrics").await;
    drop(a);
    server.stop().await;
    assert_eq!(code, 200, "{text}");
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

fn metric_names(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\bkafka_assigner_[a-z0-9_]+").expect("regex");
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_rules_parse_and_name_only_exported_metrics() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 10, "the dashboard has its panels' queries: {exprs:?}");
    // promtool parses each expression as a recording rule's.
    let dir = tempfile::tempdir().expect("tmp");
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        file.push_str(&format!(
            "      - record: dashboard:expr_{i}\n        expr: {}\n",
            serde_json::to_string(expr).expect("quote")
        ));
    }
    std::fs::write(dir.path().join("dashboard.yml"), file).expect("write");
    let checked = promtool(&["check", "rules", "dashboard.yml"], dir.path());
    assert!(checked.contains(&format!("SUCCESS: {} rules found", exprs.len())), "{checked}");

    let exported = exported_names().await;
    assert!(exported.contains("kafka_assigner_partitions_unowned"), "{exported:?}");
    let mut used = BTreeSet::new();
    for expr in exprs.iter().chain(alerts().iter().map(|(_, e, _)| e)) {
        used.extend(metric_names(expr));
    }
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard or the rules name metrics the service does not export: {unknown:?}"
    );

    // The panels the on-call engineer needs (issue: owners, unowned, handoffs and their
    // durations, store latency and errors, leader, streams, imbalance and the shadow plan).
    let dashboard_names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for needed in [
        "kafka_assigner_partitions_owned",
        "kafka_assigner_partitions_unowned",
        "kafka_assigner_handoffs_in_flight",
        "kafka_assigner_handoff_duration_seconds_bucket",
        "kafka_assigner_handoff_warm_duration_seconds_bucket",
        "kafka_assigner_handoff_release_delivery_seconds_bucket",
        "kafka_assigner_store_request_duration_seconds_bucket",
        "kafka_assigner_store_errors_total",
        "kafka_assigner_is_leader",
        "kafka_assigner_streams",
        "kafka_assigner_load_imbalance",
        "kafka_assigner_shadow_load_imbalance",
        "kafka_assigner_shadow_moves",
    ] {
        assert!(dashboard_names.contains(needed), "no dashboard panel shows {needed}");
    }
}
