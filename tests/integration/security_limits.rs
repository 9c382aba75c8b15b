//! Every server limit is hit and answers with its precise status; a refused call changes
//! nothing, and a refused stream says which limit refused it and is counted.

use std::{net::SocketAddr, time::Duration};

use kafka_assigner::proto::v1::{
    DeregisterRequest, PartitionReadyRequest, RegisterRequest, TopicPartition,
    kafka_assigner_client::KafkaAssignerClient,
};
use kafka_assigner::server::{ServerOptions, limits::Limits};
use tokio::net::TcpSocket;
use tonic::{
    Code,
    transport::{Channel, Endpoint, Uri},
};

use crate::metrics::{http_get, parse_metrics};
use crate::support::assigner::{Backend, PROMPT, TOPIC, TestConsumer};
use crate::support::secure::{FreezingProxy, Secured};
use crate::support::{EtcdServer, wait_until};

fn with_limits(limits: Limits) -> ServerOptions {
    ServerOptions { limits, ..ServerOptions::default() }
}

/// A plaintext client whose connection comes from `local` (any 127.x.y.z works on Linux).
async fn client_from(local: [u8; 4], server: SocketAddr) -> KafkaAssignerClient<Channel> {
    let connector = tower::service_fn(move |_: Uri| async move {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((local, 0)))?;
        let stream = socket.connect(server).await?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
    });
    let endpoint = Endpoint::from_shared(format!("http://{server}")).unwrap_or_else(|e| panic!("{e}"));
    let channel = endpoint
        .connect_with_connector(connector)
        .await
        .unwrap_or_else(|e| panic!("connect from {local:?}: {e}"));
    KafkaAssignerClient::new(channel)
}

fn expect_status(result: Result<TestConsumer, tonic::Status>, code: Code, needle: &str) {
    match result {
        Ok(consumer) => panic!("{} was accepted; expected {code:?}", consumer.name),
        Err(status) => {
            assert_eq!(status.code(), code, "{status:?}");
            assert!(status.message().contains(needle), "{:?} lacks {needle:?}", status.message());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_instance_and_per_client_ip() {
    let limits = Limits { max_streams: 3, max_streams_per_ip: 2, ..Limits::default() };
    let served = Secured::memory(with_limits(limits)).await;
    let addr = served.server.grpc_addr;
    let mut first =
        TestConsumer::register(client_from([127, 0, 0, 1], addr).await, "c1", TOPIC).await.expect("c1");
    let _c2 = TestConsumer::register(client_from([127, 0, 0, 1], addr).await, "c2", TOPIC).await.expect("c2");
    let before = served.fingerprint().await;
    let third = TestConsumer::register(client_from([127, 0, 0, 1], addr).await, "c3", TOPIC).await;
    expect_status(third, Code::ResourceExhausted, "--max-streams-per-ip 2");
    // Another address still gets in, up to the instance's limit.
    let _c4 = TestConsumer::register(client_from([127, 0, 0, 2], addr).await, "c4", TOPIC).await.expect("c4");
    let fifth = TestConsumer::register(client_from([127, 0, 0, 3], addr).await, "c5", TOPIC).await;
    expect_status(fifth, Code::ResourceExhausted, "--max-streams 3");
    // c4 registered in between: compare only what the refused calls could have touched.
    let after = served.fingerprint().await;
    assert!(!after.1.contains("\"c3\"") && !after.1.contains("\"c5\""), "a refused consumer was registered");
    assert!(before.0.kvs.iter().all(|kv| !kv.key.ends_with("/c3")), "c3 stored");
    assert!(after.0.kvs.iter().all(|kv| !kv.key.ends_with("/c3") && !kv.key.ends_with("/c5")));

    // A stream that ends gives its place back.
    first.crash().await;
    wait_until(PROMPT, "c1's place is free again", || async {
        TestConsumer::register(client_from([127, 0, 0, 1], addr).await, "c6", TOPIC).await.is_ok()
    })
    .await;
    served.stop().await;
}

/// Behind a sidecar proxy every consumer connects from the proxy's address (Istio's is
/// 127.0.0.6). The consumer beyond `--max-streams-per-ip` is told which limit refused it,
/// its value, the peer, how to raise it and why a loopback peer hits it; one beyond
/// `--max-streams` is told that limit. `/metrics` counts each refusal by its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_says_which_limit_and_is_counted() {
    let limits = Limits { max_streams: 3, max_streams_per_ip: 2, ..Limits::default() };
    let served = Secured::memory(with_limits(limits)).await;
    let addr = served.server.grpc_addr;
    const SIDECAR: [u8; 4] = [127, 0, 0, 6];
    let _c1 = TestConsumer::register(client_from(SIDECAR, addr).await, "c1", TOPIC).await.expect("c1");
    let _c2 = TestConsumer::register(client_from(SIDECAR, addr).await, "c2", TOPIC).await.expect("c2");
    let refused = TestConsumer::register(client_from(SIDECAR, addr).await, "c3", TOPIC).await;
    let status = refused.err().unwrap_or_else(|| panic!("a third stream from one address was accepted"));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for needle in [
        "per-IP limit",
        "peer 127.0.0.6",
        "--max-streams-per-ip 2",
        "KAFKA_ASSIGNER_MAX_STREAMS_PER_IP",
        "--max-streams 3",
        "sidecar",
        "Istio",
        "Linkerd",
        "set --max-streams-per-ip to --max-streams",
    ] {
        assert!(status.message().contains(needle), "{needle:?} missing: {}", status.message());
    }
    let _c4 = TestConsumer::register(client_from([127, 0, 0, 7], addr).await, "c4", TOPIC).await.expect("c4");
    let refused = TestConsumer::register(client_from([127, 0, 0, 8], addr).await, "c5", TOPIC).await;
    let status = refused.err().unwrap_or_else(|| panic!("a stream beyond --max-streams was accepted"));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for needle in ["instance limit", "peer 127.0.0.8", "--max-streams 3", "KAFKA_ASSIGNER_MAX_STREAMS;"] {
        assert!(status.message().contains(needle), "{needle:?} missing: {}", status.message());
    }

    let (code, body) = http_get(served.server.admin_addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    let samples = parse_metrics(&body);
    for limit in ["max_streams_per_ip", "max_streams"] {
        let series = format!("kafka_assigner_streams_refused_total{{limit=\"{limit}\"}}");
        assert_eq!(samples.get(&series), Some(&1.0), "{series} in {body}");
    }
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_size_and_name_lengths() {
    let served = Secured::memory(with_limits(Limits { max_request_bytes: 1024, ..Limits::default() })).await;
    let mut client = served.plain().await;
    let before = served.fingerprint().await;
    let huge = RegisterRequest { consumer_name: "x".repeat(2000), topic: TOPIC.into() };
    let status =
        client.register(huge).await.err().unwrap_or_else(|| panic!("an oversized request was accepted"));
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("1024"), "{status:?}");
    let partition = Some(TopicPartition { topic: "t".repeat(1500), partition: 0 });
    let status = client.partition_ready(PartitionReadyRequest { consumer_name: "c".into(), partition }).await;
    assert_eq!(status.err().map(|s| s.code()), Some(Code::OutOfRange));

    let long_name = TestConsumer::register(client.clone(), &"n".repeat(254), TOPIC).await;
    expect_status(long_name, Code::InvalidArgument, "at most 253");
    let long_topic = TestConsumer::register(client.clone(), "c", &"t".repeat(250)).await;
    expect_status(long_topic, Code::InvalidArgument, "at most 249");
    assert_eq!(served.fingerprint().await, before, "a refused call changed state");
    // The longest allowed name is accepted.
    let mut longest = TestConsumer::register(client, &"n".repeat(253), TOPIC).await.expect("253 characters");
    longest.expect_snapshot().await;
    served.stop().await;
}

/// etcd stops answering: a unary call ends at `--unary-timeout` with DEADLINE_EXCEEDED
/// instead of waiting out the store's own retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_end_at_the_deadline() {
    let mut etcd = EtcdServer::start().await;
    let prefix = etcd.unique_prefix("unary-deadline");
    let store = std::sync::Arc::new(etcd.store().await);
    let limit = Duration::from_millis(300);
    let options = with_limits(Limits { unary_timeout: limit, ..Limits::default() });
    let served = Secured::on(store, Backend::Etcd, prefix, options).await;
    let mut consumer = TestConsumer::register(served.plain().await, "c1", TOPIC).await.expect("registers");
    consumer.expect_snapshot().await;
    consumer.wait_owned(4, PROMPT).await;
    etcd.stop();
    let mut client = served.plain().await;
    let started = std::time::Instant::now();
    let result = client.deregister(DeregisterRequest { consumer_name: "c1".into() }).await;
    let took = started.elapsed();
    let status = result.err().unwrap_or_else(|| panic!("Deregister succeeded without etcd"));
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("--unary-timeout"), "{status:?}");
    assert!(took < limit + Duration::from_secs(2), "took {took:?}");
    etcd.restart().await;
    served.stop().await;
}

/// A peer that vanishes without closing its connection is found by HTTP/2 keepalive
/// pings, and its stream's place is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_finds_a_dead_peer() {
    let limits = Limits {
        max_streams: 1,
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let served = Secured::memory(with_limits(limits)).await;
    let proxy = FreezingProxy::start(served.server.grpc_addr).await;
    let url = format!("http://{}", proxy.addr);
    let through_proxy = KafkaAssignerClient::connect(url).await.expect("connect through the proxy");
    let mut vanishing = TestConsumer::register(through_proxy, "vanishing", TOPIC).await.expect("registers");
    vanishing.expect_snapshot().await;
    let refused = TestConsumer::register(served.plain().await, "next", TOPIC).await;
    expect_status(refused, Code::ResourceExhausted, "--max-streams 1");
    proxy.freeze();
    let started = std::time::Instant::now();
    wait_until(PROMPT, "the dead peer's stream is dropped by keepalive", || async {
        TestConsumer::register(served.plain().await, "next", TOPIC).await.is_ok()
    })
    .await;
    // interval + timeout, with slack for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    served.stop().await;
}
