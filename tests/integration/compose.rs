//! `docker-compose.yml` and `Dockerfile`, checked without Docker: the compose file is
//! parsed (serde-saphyr), every assigner `command:` is parsed by the binary's own flags
//! (`kafka_assigner::config::Cli`), and every endpoint, broker and port refers to a
//! service that exists and listens there.

use std::collections::{BTreeMap, BTreeSet};

use clap::Parser;
use kafka_assigner::client::kafka_example::ConsumerArgs;
use kafka_assigner::config::{Backend, Cli, Command, ServeArgs};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Service {
    image: Option<String>,
    build: Option<String>,
    entrypoint: Vec<String>,
    command: Vec<String>,
    ports: Vec<String>,
    environment: BTreeMap<String, String>,
    depends_on: BTreeMap<String, Dependency>,
}

#[derive(Debug, Deserialize)]
struct Dependency {
    condition: String,
}

const CONSUMER_BINARY: &str = "kafka-assigner-example-consumer";

fn root(file: &str) -> String {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn compose() -> Compose {
    serde_saphyr::from_str(&root("docker-compose.yml")).unwrap_or_else(|e| panic!("docker-compose.yml: {e}"))
}

fn is_assigner(s: &Service) -> bool {
    s.image.as_deref() == Some("kafka-assigner:local") && s.entrypoint.is_empty()
}

fn is_consumer(s: &Service) -> bool {
    s.entrypoint == [CONSUMER_BINARY]
}

/// The assigner's flags, parsed exactly as the binary parses them.
fn serve_args(name: &str, s: &Service) -> ServeArgs {
    let argv = std::iter::once("kafka-assigner".to_string()).chain(s.command.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(Cli { command: Command::Serve(args), .. }) => args,
        Ok(other) => panic!("{name}: its command is not `serve`: {other:?}"),
        Err(e) => panic!("{name}: its command is refused by kafka-assigner's flags: {e}"),
    }
}

/// `host:port` (optionally `scheme://host:port`) → (host, port).
fn host_port(what: &str, text: &str) -> (String, u16) {
    let bare = text.split_once("://").map_or(text, |(_, rest)| rest).trim_end_matches('/');
    let (host, port) = bare.rsplit_once(':').unwrap_or_else(|| panic!("{what}: '{text}' has no port"));
    (host.to_string(), port.parse().unwrap_or_else(|_| panic!("{what}: bad port in '{text}'")))
}

/// The value of `--flag=value` in a command.
fn flag<'a>(command: &'a [String], name: &str) -> Option<&'a str> {
    command.iter().find_map(|arg| arg.strip_prefix(&format!("{name}=")))
}

/// The port the etcd service serves clients on, and the Kafka service's PLAINTEXT port.
fn listen_port(compose: &Compose, service: &str) -> u16 {
    let s = &compose.services[service];
    if let Some(urls) = flag(&s.command, "--listen-client-urls") {
        return host_port(service, urls.split(',').next().unwrap_or(urls)).1;
    }
    let listeners =
        s.environment.get("KAFKA_LISTENERS").unwrap_or_else(|| panic!("{service} listens nowhere"));
    let plaintext =
        listeners.split(',').find(|l| l.starts_with("PLAINTEXT://")).expect("a PLAINTEXT listener");
    host_port(service, plaintext).1
}

#[test]
fn production_shape_is_there() {
    let compose = compose();
    let etcd: Vec<&String> = compose
        .services
        .iter()
        .filter(|(_, s)| s.image.as_deref().is_some_and(|i| i.contains("etcd")))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(etcd.len(), 1, "one etcd");
    let kafka = &compose.services["kafka"];
    let roles = kafka.environment.get("KAFKA_PROCESS_ROLES").expect("KRaft roles");
    assert!(roles.contains("broker") && roles.contains("controller"), "one KRaft broker+controller: {roles}");
    assert!(!kafka.environment.keys().any(|k| k.contains("ZOOKEEPER")), "no ZooKeeper");
    assert_eq!(compose.services.values().filter(|s| is_assigner(s)).count(), 2, "two assigner instances");
    assert_eq!(compose.services.values().filter(|s| is_consumer(s)).count(), 2, "two example consumers");
    assert_eq!(
        compose.services.values().filter(|s| s.build.is_some()).count(),
        1,
        "the image is built once and shared"
    );
    for (name, s) in &compose.services {
        for (dep, d) in &s.depends_on {
            assert!(compose.services.contains_key(dep), "{name} depends on missing service {dep}");
            let known = ["service_started", "service_healthy", "service_completed_successfully"];
            assert!(known.contains(&d.condition.as_str()), "{name}: unknown condition {}", d.condition);
        }
    }
}

#[test]
fn assigner_commands_parse_and_point_at_services() {
    let compose = compose();
    let mut instance_ids = BTreeSet::new();
    for (name, s) in compose.services.iter().filter(|(_, s)| is_assigner(s)) {
        let args = serve_args(name, s);
        assert_eq!(args.backend, Backend::Etcd, "{name}: etcd backend");
        assert!(args.topic_partitions.0.is_empty(), "{name}: partition counts come from Kafka");
        assert!(instance_ids.insert(args.instance_id.clone()), "{name}: instance ids differ");
        for endpoint in &args.etcd_endpoints {
            let (host, port) = host_port(name, endpoint);
            assert!(
                compose.services.contains_key(&host),
                "{name}: etcd endpoint {endpoint} is not a service"
            );
            assert_eq!(port, listen_port(&compose, &host), "{name}: {endpoint} is not where etcd listens");
        }
        assert!(!args.kafka_brokers.is_empty(), "{name}: asks Kafka for partition counts");
        for broker in &args.kafka_brokers {
            let (host, port) = host_port(name, broker);
            assert!(compose.services.contains_key(&host), "{name}: broker {broker} is not a service");
            assert_eq!(port, listen_port(&compose, &host), "{name}: {broker} is not where Kafka listens");
        }
        assert!(
            !args.grpc_addr.ip().is_loopback() && !args.admin_addr.ip().is_loopback(),
            "{name}: reachable"
        );
        let listening = [args.grpc_addr.port(), args.admin_addr.port()];
        for mapping in &s.ports {
            let container: u16 = mapping.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
            assert!(listening.contains(&container), "{name}: port {mapping} maps to nothing it listens on");
        }
    }
    let host_ports: Vec<&str> = compose
        .services
        .values()
        .flat_map(|s| s.ports.iter().filter_map(|p| p.rsplit_once(':').map(|(h, _)| h)))
        .collect();
    let unique: BTreeSet<&&str> = host_ports.iter().collect();
    assert_eq!(unique.len(), host_ports.len(), "host ports are published once: {host_ports:?}");
}

/// The example consumer's flags, parsed exactly as the binary parses them.
fn consumer_args(name: &str, s: &Service) -> ConsumerArgs {
    let argv = std::iter::once(CONSUMER_BINARY.to_string()).chain(s.command.iter().cloned());
    ConsumerArgs::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{name}: its command is refused by the example consumer's flags: {e}"))
}

#[test]
fn consumers_point_at_assigners_and_kafka() {
    let compose = compose();
    let mut names = BTreeSet::new();
    for (name, s) in compose.services.iter().filter(|(_, s)| is_consumer(s)) {
        let args = consumer_args(name, s);
        let mut seen = BTreeSet::new();
        for url in &args.endpoints {
            let (host, port) = host_port(name, url);
            let assigner =
                compose.services.get(&host).unwrap_or_else(|| panic!("{name}: {url} is not a service"));
            assert!(is_assigner(assigner), "{name}: {url} is not an assigner");
            let serve = serve_args(&host, assigner);
            assert_eq!(port, serve.grpc_addr.port(), "{name}: {url} is not {host}'s gRPC port");
            assert_eq!(
                args.lease_ttl, serve.lease_ttl,
                "{name}: its client lease follows {host}'s --lease-ttl"
            );
            seen.insert(host);
        }
        assert_eq!(seen.len(), 2, "{name}: both instances, to fail over");
        assert!(!args.log_only, "{name}: consumes Kafka");
        let brokers = args.kafka_brokers.as_deref().unwrap_or_else(|| panic!("{name}: no --kafka-brokers"));
        let (host, port) = host_port(name, brokers);
        assert_eq!(port, listen_port(&compose, &host), "{name}: {brokers}");
        let consumer = args.consumer_name.unwrap_or_else(|| panic!("{name}: a stable --consumer-name"));
        assert!(names.insert(consumer.clone()), "{name}: consumer names differ ({consumer})");
        let init = &compose.services["kafka-init"].command;
        assert!(init.contains(&format!("--topic={}", args.topic)), "{name}: topic {} is created", args.topic);
    }
}

#[test]
fn dockerfile_is_multi_stage_non_root_with_a_ready_healthcheck() {
    let dockerfile = root("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    assert!(lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2, "multi-stage");
    // scripts/images builds everything from this line down with its own `rootfs` stage.
    let runtime = dockerfile.split("\n# ---- runtime").nth(1).expect("a '# ---- runtime' stage");
    assert!(
        runtime.contains("\nFROM scratch\nCOPY --from=rootfs / /\n"),
        "the shared runtime stage: {runtime}"
    );
    let user = lines.iter().rev().find_map(|l| l.strip_prefix("USER ")).expect("a USER");
    assert!(!["root", "0", "0:0"].contains(&user.trim()), "non-root: {user}");
    let at = lines.iter().position(|l| l.starts_with("HEALTHCHECK ")).expect("a HEALTHCHECK");
    let healthcheck = lines[at..].iter().take(2).copied().collect::<Vec<_>>().join(" ");
    // The image has no shell and no curl: the binary's own probe, which reads the admin
    // address from the same variable as `serve` and asks it on loopback.
    assert!(healthcheck.contains(r#"CMD ["kafka-assigner", "probe"]"#), "HEALTHCHECK: {healthcheck}");
    let admin = dockerfile
        .split("KAFKA_ASSIGNER_ADMIN_ADDR=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the admin address in ENV");
    let admin_addr = admin.parse().unwrap_or_else(|e| panic!("{admin}: {e}"));
    let probe = format!("http://127.0.0.1:{}/ready", host_port("Dockerfile", admin).1);
    assert_eq!(kafka_assigner::cli::probe::ready_url(admin_addr), probe, "the probe asks /ready");
    assert!(
        dockerfile.contains(r#"ENTRYPOINT ["kafka-assigner"]"#) && dockerfile.contains(r#"CMD ["serve"]"#)
    );
    assert!(dockerfile.contains(&format!("/usr/local/bin/{CONSUMER_BINARY}")), "ships the example consumer");
    // The image's listen addresses are valid flags.
    let grpc = dockerfile.split("KAFKA_ASSIGNER_GRPC_ADDR=").nth(1).and_then(|r| r.split_whitespace().next());
    let argv =
        ["kafka-assigner", "serve", "--grpc-addr", grpc.expect("gRPC address in ENV"), "--admin-addr", admin];
    assert!(Cli::try_parse_from(argv).is_ok(), "{argv:?}");
}

/// `docker-compose.local.yml` (what `compose_up` starts): the same two instances on etcd
/// with partition counts from flags, consumers that need no broker; the example consumer
/// still insists on brokers without `--log-only`.
#[test]
fn local_override_runs_without_kafka() {
    let local: Compose = serde_saphyr::from_str(&root("docker-compose.local.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.local.yml: {e}"));
    let production = compose();
    for name in ["assigner-0", "assigner-1"] {
        let args = serve_args(name, &local.services[name]);
        assert_eq!(args.backend, Backend::Etcd, "{name}: etcd backend");
        assert!(args.kafka_brokers.is_empty(), "{name}: asks no broker");
        assert_eq!(args.topic_partitions.0.get("events"), Some(&6), "{name}: events has 6 partitions");
        assert_eq!(
            args.instance_id,
            serve_args(name, &production.services[name]).instance_id,
            "{name}: same instance"
        );
    }
    for name in ["consumer-0", "consumer-1"] {
        let args = consumer_args(name, &local.services[name]);
        assert!(args.log_only && args.kafka_brokers.is_none(), "{name}: --log-only, no broker");
        let same = consumer_args(name, &production.services[name]);
        assert_eq!(
            (args.endpoints, args.consumer_name),
            (same.endpoints, same.consumer_name),
            "{name}: same consumer"
        );
    }
    let no_brokers = [CONSUMER_BINARY, "--endpoints=http://a:50051", "--topic=events"];
    assert!(ConsumerArgs::try_parse_from(no_brokers).is_err(), "brokers are required without --log-only");
}
