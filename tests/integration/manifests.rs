//! The `deploy/` manifests: each parses (YAML, then the typed Kubernetes objects), the
//! container args parse with the binary's own clap parser, the probes and the scrape
//! annotation point at the admin server's port and at paths it serves, and the Service,
//! PodDisruptionBudget and RBAC objects (the namespace's Role, the nodes' ClusterRole) fit
//! the Deployment.

use std::{collections::BTreeMap, path::PathBuf};

use clap::Parser;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, Service, ServiceAccount},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kafka_assigner::config::{Backend, Cli, Command, DrainPolicy, LogFormat, ServeArgs};
use kafka_assigner::coordinator::HandoffConfig;
use kafka_assigner::server::AssignerServer;
use serde::Deserialize;

use crate::metrics::http_get;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every document of every `deploy/*.yaml` except the kustomization, by kind.
fn documents() -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut by_kind: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .expect("deploy/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
            let kind = value["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: a document without kind", path.display()));
            by_kind.entry(kind.to_string()).or_default().push(value);
        }
    }
    by_kind
}

/// The one object of `kind`, as its typed Kubernetes struct.
fn one<T: serde::de::DeserializeOwned>(docs: &BTreeMap<String, Vec<serde_json::Value>>, kind: &str) -> T {
    let values = docs.get(kind).unwrap_or_else(|| panic!("no {kind} in deploy/"));
    assert_eq!(values.len(), 1, "one {kind}");
    serde_json::from_value(values[0].clone())
        .unwrap_or_else(|e| panic!("{kind} does not fit the Kubernetes schema: {e}"))
}

/// The container's args, parsed as `kafka-assigner` parses them.
fn serve_args(container: &Container) -> ServeArgs {
    let mut argv = vec!["kafka-assigner".to_string()];
    argv.extend(container.args.clone().unwrap_or_default());
    let cli =
        Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("container args {argv:?} do not parse: {e}"));
    assert_eq!(cli.log_format, LogFormat::Json, "logs for a pipeline");
    let Command::Serve(args) = cli.command else { panic!("the container must run `serve`: {argv:?}") };
    args
}

fn port_named(container: &Container, name: &str) -> i32 {
    let ports = container.ports.clone().unwrap_or_default();
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no port named {name}"))
        .container_port
}

/// A probe's port (a name or a number) as a number.
fn resolve(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => port_named(container, name),
    }
}

/// Whether `rules` allow `verb` on `resource` of API group `group`.
fn allowed(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_manifests_fit_the_binary_and_each_other() {
    let docs = documents();
    let deployment: Deployment = one(&docs, "Deployment");
    let service: Service = one(&docs, "Service");
    let pdb: PodDisruptionBudget = one(&docs, "PodDisruptionBudget");
    let account: ServiceAccount = one(&docs, "ServiceAccount");
    let role: Role = one(&docs, "Role");
    let binding: RoleBinding = one(&docs, "RoleBinding");
    let cluster_role: ClusterRole = one(&docs, "ClusterRole");
    let cluster_binding: ClusterRoleBinding = one(&docs, "ClusterRoleBinding");

    let spec = deployment.spec.as_ref().expect("deployment spec");
    assert_eq!(spec.replicas, Some(3));
    let template = &spec.template;
    let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).expect("pod labels");
    let selector = spec.selector.match_labels.clone().expect("deployment selector");
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the selector matches the pods");
    let pod = template.spec.as_ref().expect("pod spec");
    let container = &pod.containers[0];
    let args = serve_args(container);
    assert_eq!(args.backend, Backend::Etcd);
    assert_eq!(args.drain_policy, DrainPolicy::K8s);
    assert!(!args.k8s_rollout_refresh.is_zero(), "rollouts move each partition once: the view is on");

    // Ports: the args' listen ports are the container's named ports.
    let admin_port = port_named(container, "admin");
    assert_eq!(i32::from(args.admin_addr.port()), admin_port);
    assert_eq!(i32::from(args.grpc_addr.port()), port_named(container, "grpc"));
    assert!(
        args.admin_addr.ip().is_unspecified() && args.grpc_addr.ip().is_unspecified(),
        "listen on the pod IP"
    );

    // Probes and the scrape annotation: the admin port, and paths the admin server serves.
    let ready =
        container.readiness_probe.as_ref().and_then(|p| p.http_get.clone()).expect("readiness httpGet");
    let live = container.liveness_probe.as_ref().and_then(|p| p.http_get.clone()).expect("liveness httpGet");
    assert_eq!(ready.path.as_deref(), Some("/ready"));
    assert_eq!(live.path.as_deref(), Some("/live"));
    assert_eq!(resolve(container, &ready.port), admin_port);
    assert_eq!(resolve(container, &live.port), admin_port);
    let annotations = template.metadata.as_ref().and_then(|m| m.annotations.clone()).expect("annotations");
    assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"));
    assert_eq!(annotations.get("prometheus.io/port"), Some(&admin_port.to_string()));
    let metrics_path = annotations.get("prometheus.io/path").cloned().unwrap_or_else(|| "/metrics".into());
    let server = AssignerServer::start_memory(HandoffConfig::default()).await.expect("server");
    for path in
        [ready.path.clone().unwrap_or_default(), live.path.clone().unwrap_or_default(), metrics_path.clone()]
    {
        // The probes' paths answer 200 once the server is up: readiness turns on a moment
        // after the listeners do, as a kubelet's retried probe allows.
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let (code, body) = loop {
            let (code, body) = http_get(server.admin_addr, &path).await;
            if code == 200 || tokio::time::Instant::now() >= give_up {
                break (code, body);
            }
            tokio::time::sleep(crate::support::POLL_INTERVAL).await;
        };
        assert_eq!(code, 200, "GET {path}: {body}");
        if path == metrics_path {
            assert!(body.contains("kafka_assigner_"), "{body}");
        }
    }
    server.stop().await;

    // The grace covers a stop and one lease TTL (see the manifest's comment).
    let grace = pod.termination_grace_period_seconds.expect("terminationGracePeriodSeconds");
    assert!(grace as u64 >= args.lease_ttl.as_secs() + 5, "grace {grace}s vs lease TTL {:?}", args.lease_ttl);

    // Service: selects the pods, targets the named ports.
    let svc = service.spec.as_ref().expect("service spec");
    let svc_selector = svc.selector.clone().expect("service selector");
    assert!(svc_selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    for port in svc.ports.clone().unwrap_or_default() {
        let target = port.target_port.expect("targetPort");
        assert_eq!(resolve(container, &target), port.port, "service port {:?}", port.name);
    }
    // PDB: selects the pods and still lets one go at a time.
    let pdb_spec = pdb.spec.as_ref().expect("pdb spec");
    let pdb_labels = pdb_spec.selector.as_ref().and_then(|s| s.match_labels.clone()).expect("pdb selector");
    assert!(pdb_labels.iter().all(|(k, v)| labels.get(k) == Some(v)));
    assert_eq!(pdb_spec.min_available, Some(IntOrString::Int(2)));

    // RBAC: the pods run as the account the binding gives the role to, and the role can
    // read what the k8s drain policy reads (Deregister: get pods, StatefulSets and
    // ReplicaSets; the rollout view: list pods and ReplicaSets).
    let account_name = account.metadata.name.clone().expect("account name");
    assert_eq!(pod.service_account_name.as_deref(), Some(account_name.as_str()));
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(Some(binding.role_ref.name.clone()), role.metadata.name);
    let subjects = binding.subjects.clone().unwrap_or_default();
    assert!(subjects.iter().any(|s| s.kind == "ServiceAccount" && s.name == account_name));
    let rules = role.rules.clone().unwrap_or_default();
    let allows = |group: &str, resource: &str, verb: &str| allowed(&rules, group, resource, verb);
    for verb in ["get", "list", "watch"] {
        assert!(allows("", "pods", verb), "pods {verb}");
    }
    assert!(allows("apps", "replicasets", "get") && allows("apps", "statefulsets", "get"));
    assert!(allows("apps", "replicasets", "list"), "the rollout view lists ReplicaSets");
    // Nodes are cluster-scoped: the consumers' zones need a ClusterRole, bound to the same
    // account (its namespace in the subject: `default`, which a kustomization's namespace
    // replaces).
    let cluster_rules = cluster_role.rules.clone().unwrap_or_default();
    for verb in ["get", "list"] {
        assert!(allowed(&cluster_rules, "", "nodes", verb), "nodes {verb}");
    }
    assert_eq!(cluster_binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(cluster_binding.role_ref.name.clone()), cluster_role.metadata.name);
    let subjects = cluster_binding.subjects.clone().unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == account_name
            && s.namespace.as_deref() == Some("default")),
        "{subjects:?}"
    );

    // kustomization.yaml lists every manifest.
    let kustomization =
        std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).expect("kustomization");
    let k: serde_json::Value = serde_yaml_ng::from_str(&kustomization).expect("kustomization parses");
    let listed: Vec<&str> =
        k["resources"].as_array().expect("resources").iter().filter_map(|r| r.as_str()).collect();
    assert_eq!(listed, ["rbac.yaml", "deployment.yaml", "service.yaml", "pdb.yaml"]);
}
