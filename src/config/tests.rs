//! Tests of the command line and its settings (`config/mod.rs`).

use super::*;

/// The arguments of `kafka-assigner serve` with `args`.
fn serve(args: &[&str]) -> ServeArgs {
    let mut all = vec!["kafka-assigner", "serve"];
    all.extend_from_slice(args);
    let Command::Serve(args) = Cli::try_parse_from(all).unwrap().command else { unreachable!() };
    args
}

#[test]
fn topic_partitions() {
    let parsed = parse_topic_partitions("events=12, orders=4").unwrap();
    assert_eq!(parsed.0.get("events"), Some(&12));
    assert_eq!(parsed.0.get("orders"), Some(&4));
    assert_eq!(parse_topic_partitions("").unwrap(), TopicPartitions::default());
    for bad in ["events", "events=x", "events=0", "a/b=1", "e=1,e=2"] {
        assert!(parse_topic_partitions(bad).is_err(), "{bad}");
    }
}

#[test]
fn kafka_config() {
    let parsed = parse_kafka_config("security.protocol=SASL_SSL, sasl.mechanism=PLAIN").unwrap();
    assert_eq!(
        parsed.0,
        vec![("security.protocol".into(), "SASL_SSL".into()), ("sasl.mechanism".into(), "PLAIN".into())]
    );
    // A comma inside a value, and '=' inside a value.
    let parsed = parse_kafka_config("ssl.cipher.suites=A,B,sasl.password=x=y").unwrap();
    assert_eq!(
        parsed.0,
        vec![("ssl.cipher.suites".into(), "A,B".into()), ("sasl.password".into(), "x=y".into())]
    );
    for bad in ["", "debug", "=x", "a=1,=2"] {
        assert!(parse_kafka_config(bad).is_err(), "{bad}");
    }
    assert!(!format!("{parsed:?}").contains("x=y"), "Debug must not show values: {parsed:?}");
}

#[test]
fn kafka_flags() {
    let defaults = serve(&[]);
    assert!(defaults.kafka_brokers.is_empty());
    assert!(defaults.kafka_settings().is_empty());
    assert_eq!(defaults.kafka_timeout, Duration::from_secs(10));
    assert_eq!(defaults.topic_refresh_interval, Duration::from_secs(60));
    let args = serve(&[
        "--kafka-brokers",
        "k1:9092,k2:9092",
        "--kafka-config",
        "security.protocol=SASL_SSL",
        "--kafka-config",
        "sasl.username=u,sasl.password=p",
        "--kafka-timeout",
        "2s",
        "--topic-refresh-interval",
        "500ms",
    ]);
    assert_eq!(args.kafka_brokers, vec!["k1:9092", "k2:9092"]);
    let keys: Vec<String> = args.kafka_settings().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec!["security.protocol", "sasl.username", "sasl.password"]);
    assert_eq!(args.kafka_timeout, Duration::from_secs(2));
    assert_eq!(args.topic_refresh_interval, Duration::from_millis(500));
    for (flag, value) in
        [("--kafka-config", "debug"), ("--kafka-timeout", "0s"), ("--topic-refresh-interval", "x")]
    {
        let err = Cli::try_parse_from(["kafka-assigner", "serve", flag, value]).unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
    }
}

#[test]
fn placement_flags() {
    let defaults = serve(&[]);
    assert_eq!(defaults.placement, PlacementArg::Shadow);
    assert_eq!((defaults.load_tolerance, defaults.load_min_gain), (0.10, 0.01));
    assert_eq!(defaults.max_moves_per_minute, 10);
    assert_eq!(defaults.move_cooldown, Duration::from_secs(300));
    assert_eq!((defaults.partition_weights, defaults.partition_weights_file), (None, None));
    assert_eq!(defaults.weights_refresh, Duration::from_secs(10));
    let args = serve(&[
        "--placement",
        "load",
        "--load-tolerance",
        "0.2",
        "--max-moves-per-minute",
        "3",
        "--move-cooldown",
        "0s",
        "--partition-weights",
        "events:0=10,1=3;orders:5=2",
    ]);
    assert_eq!(args.placement, PlacementArg::Load);
    assert_eq!(args.load_tolerance, 0.2);
    assert_eq!(args.max_moves_per_minute, 3);
    assert_eq!(args.move_cooldown, Duration::ZERO);
    let weights = args.partition_weights.expect("weights");
    assert_eq!(weights.0["events"], [(0, 10), (1, 3)].into_iter().collect());
    for (flag, value) in [
        ("--placement", "weight"),
        ("--load-tolerance", "nan"),
        ("--load-min-gain", "much"),
        ("--max-moves-per-minute", "0"),
        ("--move-cooldown", "soon"),
        ("--partition-weights", "events:0=ten"),
        ("--weights-refresh", "0s"),
    ] {
        let err = Cli::try_parse_from(["kafka-assigner", "serve", flag, value]).unwrap_err().to_string();
        assert!(err.contains(flag), "{flag}: {err}");
    }
}

#[test]
fn bad_flags_name_the_flag() {
    let err =
        Cli::try_parse_from(["kafka-assigner", "serve", "--lease-ttl", "soon"]).unwrap_err().to_string();
    assert!(err.contains("--lease-ttl"), "{err}");
    let err = Cli::try_parse_from(["kafka-assigner", "serve", "--backend", "zk"]).unwrap_err().to_string();
    assert!(err.contains("--backend"), "{err}");
}

#[test]
fn fleet_and_static_flags() {
    let args = serve(&["--backend", "fleet", "--store", "etcd"]);
    assert_eq!((args.backend, args.store), (Backend::Fleet, StoreKind::Etcd));
    assert_eq!(serve(&["--backend", "fleet"]).store, StoreKind::Memory);
    let args =
        serve(&["--backend", "static", "--static-assignment", "a=0-5;b=6-11", "--static-members", "2"]);
    assert_eq!(args.backend, Backend::Static);
    assert_eq!(args.static_assignment.as_deref(), Some("a=0-5;b=6-11"));
    assert_eq!(args.static_members.as_deref(), Some("2"));
    let err = Cli::try_parse_from(["kafka-assigner", "serve", "--store", "zk"]).unwrap_err().to_string();
    assert!(err.contains("--store"), "{err}");
}

#[test]
fn state_dir() {
    assert_eq!(serve(&[]).state_dir, None, "unset by default: today's epochs");
    let args = serve(&["--backend", "static", "--state-dir", "/var/lib/kafka-assigner"]);
    assert_eq!(args.state_dir, Some(PathBuf::from("/var/lib/kafka-assigner")));
}

#[test]
fn engine_machine_is_accepted_and_no_other_engine_is() {
    assert_eq!(serve(&[]).engine, None);
    assert_eq!(serve(&["--engine", "machine"]).engine, Some(Engine::Machine));
    let err = Cli::try_parse_from(["kafka-assigner", "serve", "--engine", "loop"]).unwrap_err().to_string();
    assert!(err.contains("loop"), "{err}");
}
