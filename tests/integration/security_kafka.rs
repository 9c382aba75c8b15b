//! `--kafka-config` TLS / SASL settings: with the `kafka-tls` feature librdkafka
//! accepts `SSL` / `SASL_SSL` and SCRAM (and a broker that does not speak TLS is
//! `UNAVAILABLE` within the timeout, not a hang); without it, asking for them stops the
//! start with librdkafka's reason.
//!
//! Run with the feature: `cargo test --features kafka-tls --test integration security_kafka::`

use std::time::Duration;

use kafka_assigner::kafka::KafkaMetadata;

use crate::support::certs::TestCa;

fn sasl_ssl(ca_file: &str) -> Vec<(String, String)> {
    [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "assigner"),
        ("sasl.password", "secret"),
        ("ssl.ca.location", ca_file),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(feature = "kafka-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_settings_are_accepted_and_a_plaintext_broker_is_unavailable() {
    use rdkafka::{mocking::MockCluster, producer::DefaultProducerContext};
    let ca = TestCa::new("kafka-ca");
    let ca_file = ca.write_ca("kafka-ca").display().to_string();
    // The mock cluster speaks PLAINTEXT only: the TLS handshake cannot succeed there.
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("events", 4, 1).expect("topic");
    let brokers = vec![mock.bootstrap_servers()];
    let timeout = Duration::from_secs(2);
    let kafka =
        KafkaMetadata::new(&brokers, &sasl_ssl(&ca_file), timeout).expect("SASL_SSL + SCRAM is accepted");
    let started = std::time::Instant::now();
    match kafka.partition_count("events").await {
        Err(kafka_assigner::kafka::KafkaError::Unavailable(_)) => {}
        other => panic!("expected UNAVAILABLE from a broker that does not speak TLS, got {other:?}"),
    }
    assert!(started.elapsed() < timeout + Duration::from_secs(2), "took {:?}", started.elapsed());
}

#[cfg(not(feature = "kafka-tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_feature_tls_is_refused_at_start_with_the_reason() {
    let ca = TestCa::new("kafka-ca");
    let ca_file = ca.write_ca("kafka-ca").display().to_string();
    let brokers = vec!["127.0.0.1:9".to_string()];
    let error = match KafkaMetadata::new(&brokers, &sasl_ssl(&ca_file), Duration::from_secs(1)) {
        Ok(_) => panic!("SASL_SSL accepted by a build without OpenSSL"),
        Err(error) => error.to_string(),
    };
    // librdkafka names the first setting it cannot take (the order is its own).
    let named = ["security.protocol", "sasl.mechanism", "ssl.ca.location"].iter().any(|k| error.contains(k));
    assert!(named && error.contains("OpenSSL not available"), "{error}");
}
