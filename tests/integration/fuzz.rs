//! Fuzzing through the real gRPC layer: arbitrary request bytes and arbitrary
//! structured requests, on all four RPCs, against a served assigner whose consumer `a`
//! owns every partition. For every call: the server keeps serving (no panic), a refusal
//! has a precise status, and a refused call changes nothing (store records, revision,
//! status view). A call may change state only when a model says it is valid (an accepted
//! call the model calls invalid must be a no-op, like a repeated `PartitionReady`).
//!
//! Also under mTLS with `--bind-consumer-identity`: every call naming anyone but the
//! connection's own identity is `PERMISSION_DENIED` and changes nothing.
//!
//! Bounded for CI: `FUZZ_CASES` cases per property (default 64), each a fresh server and
//! up to 6 calls. Raise it locally (`FUZZ_CASES=2000`) for a longer run.

use std::time::Duration;

use bytes::{Buf, BufMut};
use kafka_assigner::coordinator::validate_consumer_name;
use kafka_assigner::proto::v1::kafka_assigner_client::KafkaAssignerClient;
use kafka_assigner::proto::v1::{
    DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
};
use kafka_assigner::server::{ServerOptions, identity::IdentityRule, tls::TlsSettings};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message;
use tonic::{
    Code, Request, Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    transport::Channel,
};

use crate::support::assigner::{PROMPT, TOPIC, TestConsumer};
use crate::support::certs::{Leaf, TestCa};
use crate::support::secure::{Secured, tls_channel};

/// Sends and receives message bodies as raw bytes.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One call: which RPC, and its body.
#[derive(Clone, Debug)]
enum Call {
    Register(RegisterRequest),
    Ready(PartitionReadyRequest),
    Released(PartitionReleasedRequest),
    Deregister(DeregisterRequest),
    /// Bytes sent as the body of RPC number `.0` (0..4).
    Bytes(u8, Vec<u8>),
}

const METHODS: [&str; 4] = ["Register", "PartitionReady", "PartitionReleased", "Deregister"];

impl Call {
    /// The RPC and the wire body.
    fn encode(&self) -> (usize, Vec<u8>) {
        match self {
            Call::Register(r) => (0, r.encode_to_vec()),
            Call::Ready(r) => (1, r.encode_to_vec()),
            Call::Released(r) => (2, r.encode_to_vec()),
            Call::Deregister(r) => (3, r.encode_to_vec()),
            Call::Bytes(m, b) => (usize::from(*m % 4), b.clone()),
        }
    }

    /// The consumer the decoded request names (`None`: undecodable).
    fn consumer_name(&self) -> Option<String> {
        let (method, body) = self.encode();
        let body = body.as_slice();
        match method {
            0 => RegisterRequest::decode(body).ok().map(|r| r.consumer_name),
            1 => PartitionReadyRequest::decode(body).ok().map(|r| r.consumer_name),
            2 => PartitionReleasedRequest::decode(body).ok().map(|r| r.consumer_name),
            _ => DeregisterRequest::decode(body).ok().map(|r| r.consumer_name),
        }
    }

    /// The model: is this call valid against the starting state (consumer `a` owns every
    /// partition of [`TOPIC`]; no handoff, nobody releasing)? `None`: undecodable.
    fn valid(&self) -> Option<bool> {
        let (method, body) = self.encode();
        let known = |topic: &str| ["events", "small", "wide"].contains(&topic);
        Some(match method {
            0 => {
                let r = RegisterRequest::decode(body.as_slice()).ok()?;
                validate_consumer_name(&r.consumer_name).is_ok() && known(&r.topic)
            }
            1 => PartitionReadyRequest::decode(body.as_slice()).ok().map(|_| false)?,
            2 => PartitionReleasedRequest::decode(body.as_slice()).ok().map(|_| false)?,
            _ => DeregisterRequest::decode(body.as_slice()).ok()?.consumer_name == "a",
        })
    }
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just(String::new()),
        "[a-z0-9-]{1,12}",
        "[a-z]{250,256}",
        any::<String>(),
        "[a/ \n\t\u{0}\u{202e}é]{1,8}",
    ]
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![Just(TOPIC.to_string()), Just("small".to_string()), "[a-zA-Z0-9._-]{0,260}", any::<String>()]
}

fn partition() -> impl Strategy<Value = Option<TopicPartition>> {
    let number = prop_oneof![0u32..6, any::<u32>()];
    proptest::option::weighted(
        0.9,
        (topic(), number).prop_map(|(topic, partition)| TopicPartition { topic, partition }),
    )
}

fn structured() -> impl Strategy<Value = Call> {
    prop_oneof![
        (name(), topic())
            .prop_map(|(consumer_name, topic)| Call::Register(RegisterRequest { consumer_name, topic })),
        (name(), partition()).prop_map(|(consumer_name, partition)| Call::Ready(PartitionReadyRequest {
            consumer_name,
            partition
        })),
        (name(), partition()).prop_map(|(consumer_name, partition)| {
            Call::Released(PartitionReleasedRequest { consumer_name, partition })
        }),
        name().prop_map(|consumer_name| Call::Deregister(DeregisterRequest { consumer_name })),
    ]
}

fn bytes() -> impl Strategy<Value = Call> {
    (0u8..4, proptest::collection::vec(any::<u8>(), 0..600)).prop_map(|(m, b)| Call::Bytes(m, b))
}

/// Sends `call`; `Ok` carries an open `Register` stream (kept open by the caller).
async fn send(channel: Channel, call: &Call) -> Result<Option<tonic::Streaming<Vec<u8>>>, Status> {
    let (method, body) = call.encode();
    let path = format!("/kafka_assigner.v1.KafkaAssigner/{}", METHODS[method]);
    let path = path.parse().map_err(|e| Status::internal(format!("path: {e:?}")))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    if method == 0 {
        Ok(Some(grpc.server_streaming(Request::new(body), path, Raw).await?.into_inner()))
    } else {
        grpc.unary(Request::new(body), path, Raw).await.map(|_| None)
    }
}

/// How the fuzzed calls reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Plaintext, no identity.
    Plain,
    /// mTLS with `--bind-consumer-identity`; the fuzzing connection's certificate is `a`'s.
    BoundToA,
}

/// One case: a fresh server where `a` owns everything, then `calls` in order.
async fn run_case(calls: Vec<Call>, mode: Mode) -> Result<(), TestCaseError> {
    let ca = TestCa::new("fuzz-ca");
    let a_cert = ca.issue(Leaf::ClientDns("a"));
    let options = match mode {
        Mode::Plain => ServerOptions::default(),
        Mode::BoundToA => {
            let (cert, key) = ca.issue(Leaf::Server).write(ca.dir.path(), "server");
            let client_ca = Some(ca.write_ca("ca"));
            ServerOptions {
                tls: Some(TlsSettings { cert, key, client_ca, reload_interval: Duration::from_secs(60) }),
                bind_identity: Some(IdentityRule::default()),
                ..ServerOptions::default()
            }
        }
    };
    let served = Secured::memory(options).await;
    let addr = served.server.grpc_addr;
    let channel = match mode {
        Mode::Plain => {
            Channel::from_shared(format!("http://{addr}")).expect("url").connect().await.expect("connect")
        }
        Mode::BoundToA => tls_channel(addr, &ca.cert_pem(), Some(&a_cert)).await.expect("mTLS connect"),
    };
    let mut a =
        TestConsumer::register(KafkaAssignerClient::new(channel.clone()), "a", TOPIC).await.expect("a");
    a.expect_snapshot().await;
    a.wait_owned(4, PROMPT).await;
    let mut open = Vec::new();
    // After an accepted call the state moves on by itself (a rebalance): stop comparing.
    let mut quiet = true;
    for call in &calls {
        let before = served.fingerprint().await;
        let result = send(channel.clone(), call).await;
        let valid = call.valid();
        // Bound to `a`: any other name is PERMISSION_DENIED, whatever else is wrong with it.
        let foreign = mode == Mode::BoundToA && call.consumer_name().is_some_and(|name| name != "a");
        if foreign {
            let status = result.as_ref().err().map(|s| (s.code(), s.message().to_string()));
            prop_assert!(
                matches!(&status, Some((Code::PermissionDenied, m)) if m.contains("'a'")),
                "{:?} under the identity of 'a' got {:?}",
                call,
                status
            );
            if quiet {
                prop_assert_eq!(&served.fingerprint().await, &before, "refused {:?} changed state", call);
            }
            continue;
        }
        match result {
            // Accepted although the model calls it invalid: only as a no-op (a repeated
            // call already in effect, e.g. `PartitionReady` from the owner).
            Ok(stream) if valid != Some(true) => {
                open.extend(stream);
                if quiet {
                    prop_assert_eq!(
                        &served.fingerprint().await,
                        &before,
                        "accepted {:?} changed state",
                        call
                    );
                }
            }
            Ok(stream) => {
                open.extend(stream);
                quiet = false;
            }
            Err(status) => {
                let allowed = match valid {
                    // A body that is not the RPC's message (src/server/codec.rs).
                    None => {
                        status.code() == Code::InvalidArgument
                            && status.message().contains("not a valid message")
                    }
                    Some(_) => matches!(
                        status.code(),
                        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::OutOfRange
                    ),
                };
                prop_assert!(allowed, "{:?} got {:?}", call, status);
                prop_assert!(
                    valid != Some(true) || !quiet,
                    "a valid call was refused: {:?} {:?}",
                    call,
                    status
                );
                if quiet {
                    prop_assert_eq!(&served.fingerprint().await, &before, "refused {:?} changed state", call);
                }
            }
        }
    }
    // Still serving: a well-formed refusal comes back promptly.
    let mut probe = KafkaAssignerClient::new(channel);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        probe.deregister(DeregisterRequest { consumer_name: "nobody".into() }),
    )
    .await;
    let expected = if mode == Mode::Plain { Code::NotFound } else { Code::PermissionDenied };
    prop_assert!(matches!(answer, Ok(Err(ref s)) if s.code() == expected), "server unhealthy: {:?}", answer);
    drop(open);
    served.stop().await;
    Ok(())
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

fn fuzz(strategy: impl Strategy<Value = Call>, mode: Mode) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut runner =
        TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let calls = proptest::collection::vec(strategy, 1..6);
    let result = runner.run(&calls, |calls| runtime.block_on(run_case(calls, mode)));
    if let Err(error) = result {
        panic!("{error}");
    }
}

#[test]
fn arbitrary_structured_requests() {
    fuzz(structured(), Mode::Plain);
}

#[test]
fn arbitrary_requests_under_a_bound_identity() {
    fuzz(prop_oneof![structured(), bytes()], Mode::BoundToA);
}

#[test]
fn arbitrary_request_bytes() {
    let mutated = prop_oneof![
        bytes(),
        structured().prop_map(|c| {
            // Valid messages with their last byte flipped.
            let (method, mut body) = c.encode();
            if let Some(last) = body.last_mut() {
                *last ^= 0x5a;
            }
            Call::Bytes(method as u8, body)
        })
    ];
    fuzz(mutated, Mode::Plain);
}
