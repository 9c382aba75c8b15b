//! Smoke: two consumers split a topic through warm handoffs (memory backend).

use std::time::Duration;

use kafka_assigner::coordinator::HandoffConfig;
use kafka_assigner::proto::v1::{
    PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition, assignment_command::Command,
    kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::AssignerServer;

use crate::support::next_within;

#[tokio::test]
async fn smoke_two_consumers_split() {
    let mut config = HandoffConfig::default();
    config.topic_partitions.insert("events".into(), 4);
    config.reconcile_interval = Duration::from_millis(100);
    let server = AssignerServer::start_memory(config).await.unwrap();
    let mut client = KafkaAssignerClient::connect(server.grpc_url()).await.unwrap();
    let mut a = client
        .register(RegisterRequest { consumer_name: "a".into(), topic: "events".into() })
        .await
        .unwrap()
        .into_inner();
    let first = next_within(&mut a, Duration::from_secs(5), "a snapshot").await.unwrap();
    eprintln!("a first: {first:?}");
    let second = next_within(&mut a, Duration::from_secs(5), "a assignment").await.unwrap();
    eprintln!("a second: {second:?}");
    let mut b = client
        .register(RegisterRequest { consumer_name: "b".into(), topic: "events".into() })
        .await
        .unwrap()
        .into_inner();
    let mut warms = vec![];
    while warms.len() < 2 {
        let cmd = next_within(&mut b, Duration::from_secs(5), "b").await.unwrap();
        eprintln!("b: {cmd:?}");
        if let Some(Command::Warm(w)) = cmd.command {
            warms.push(w.partition.unwrap().partition);
        }
    }
    for p in &warms {
        let t0 = std::time::Instant::now();
        client
            .partition_ready(PartitionReadyRequest {
                consumer_name: "b".into(),
                partition: Some(TopicPartition { topic: "events".into(), partition: *p }),
            })
            .await
            .unwrap();
        let cmd = next_within(&mut a, Duration::from_secs(5), "a release").await.unwrap();
        eprintln!("a: {cmd:?} after {:?}", t0.elapsed());
        client
            .partition_released(PartitionReleasedRequest {
                consumer_name: "a".into(),
                partition: Some(TopicPartition { topic: "events".into(), partition: *p }),
            })
            .await
            .unwrap();
    }
    let status = server.coordinator.status().await;
    eprintln!("{}", serde_json::to_string(&status).unwrap());
    server.stop().await;
}
