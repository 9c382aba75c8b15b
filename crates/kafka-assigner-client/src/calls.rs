//! The client's RPCs: opening a `Register` stream and, beside it, the `WatchEpochs`
//! stream, and `PartitionReady` / `PartitionReleased` / `Deregister` with retries of
//! transient errors.

use std::time::Duration;

use tokio::sync::watch;
use tonic::{
    Code, Status, Streaming,
    metadata::MetadataMap,
    transport::{Channel, Endpoint},
};

use super::Backoff;
use crate::proto::v1::{
    AssignmentCommand, DeregisterAction, DeregisterRequest, EpochSnapshot, PartitionReadyRequest,
    PartitionReleasedRequest, RegisterRequest, TopicPartition, WatchEpochsRequest,
    kafka_assigner_client::KafkaAssignerClient, ownership_epochs_client::OwnershipEpochsClient,
};
use crate::proto::{INCARNATION_HEADER, SESSION_TTL_HEADER};

/// A gRPC client on one connection.
pub type Rpc = KafkaAssignerClient<Channel>;

/// Whether a status is worth retrying (the server's transient answers, `UNAVAILABLE` and
/// `ABORTED`; a call cut by a connection that died shows up as `UNKNOWN` or `CANCELLED` in
/// tonic).
pub fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Aborted | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

/// A `Register` stream just opened.
pub struct Registered {
    /// The contract's client on the stream's connection.
    pub rpc: Rpc,
    /// The connection itself (`WatchEpochs` goes to the same instance).
    pub channel: Channel,
    /// The commands.
    pub stream: Streaming<AssignmentCommand>,
    /// The session TTL the assigner announced, if it did.
    pub announced_ttl: Option<Duration>,
}

/// A number for one client (its process's incarnation, [`INCARNATION_HEADER`]): random, never
/// 0, drawn from the standard library's randomly seeded hasher.
pub fn new_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}

/// Connects to `endpoint` and opens the `Register` stream, sent as client `incarnation`.
pub async fn register(
    endpoint: &Endpoint,
    consumer: &str,
    topic: &str,
    incarnation: u64,
    timeout: Duration,
) -> Result<Registered, Status> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("cannot connect to {}: {e}", endpoint.uri())))?;
    let mut rpc = KafkaAssignerClient::new(channel.clone());
    let mut request = tonic::Request::new(RegisterRequest {
        consumer_name: consumer.to_string(),
        topic: topic.to_string(),
    });
    request.metadata_mut().insert(INCARNATION_HEADER, incarnation.into());
    let response = tokio::time::timeout(timeout, rpc.register(request))
        .await
        .map_err(|_| Status::unavailable(format!("Register not answered within {timeout:?}")))??;
    let announced_ttl = announced_session_ttl(response.metadata());
    Ok(Registered { rpc, channel, stream: response.into_inner(), announced_ttl })
}

/// Opens `WatchEpochs` on `channel` (the `Register` stream's: the instance that holds the
/// registration answers). `UNIMPLEMENTED` from an assigner without epochs is returned as is.
pub async fn watch_epochs(
    channel: Channel,
    consumer: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Streaming<EpochSnapshot>, Status> {
    let mut client = OwnershipEpochsClient::new(channel);
    let request = WatchEpochsRequest { consumer_name: consumer.to_string(), topic: topic.to_string() };
    let response = tokio::time::timeout(timeout, client.watch_epochs(request))
        .await
        .map_err(|_| Status::unavailable(format!("WatchEpochs not answered within {timeout:?}")))??;
    Ok(response.into_inner())
}

/// The session TTL in the `Register` response headers ([`SESSION_TTL_HEADER`]). A missing,
/// malformed or zero value is ignored (an older server, or one whose sessions never expire).
pub fn announced_session_ttl(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get(SESSION_TTL_HEADER)?;
    match value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()).filter(|ms| *ms > 0) {
        Some(ms) => Some(Duration::from_millis(ms)),
        None => {
            tracing::warn!(?value, "ignoring a malformed {SESSION_TTL_HEADER} header");
            None
        }
    }
}

/// Who calls, and how patiently.
#[derive(Clone, Debug)]
pub struct CallSettings {
    /// The consumer name.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// Waits between retries.
    pub backoff: Backoff,
    /// Bound of one attempt.
    pub call_timeout: Duration,
    /// Bound of all attempts (waiting for a connection included).
    pub limit: Duration,
}

/// Which acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// `PartitionReady`.
    Ready,
    /// `PartitionReleased`.
    Released,
}

/// How an acknowledgement ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Accepted.
    Done,
    /// Refused in a way that means "nothing left to do": a repeated `PartitionReleased`
    /// (`FAILED_PRECONDITION`, or `NOT_FOUND` once the session is gone).
    AlreadyDone(String),
    /// Refused: a `PartitionReady` for a warm that was cancelled meanwhile (an unassign
    /// follows on the stream), or a permanent error.
    Refused(Code, String),
    /// Still failing transiently when the retry limit ran out.
    GaveUp(String),
}

impl AckOutcome {
    /// A short metric label suffix.
    pub fn label(&self) -> &'static str {
        match self {
            AckOutcome::Done => "ok",
            AckOutcome::AlreadyDone(_) => "already_done",
            AckOutcome::Refused(..) => "refused",
            AckOutcome::GaveUp(_) => "gave_up",
        }
    }
}

/// Waits for a connection (the stream's), sends `ack`, retries transient errors with
/// `backoff` until `limit` has passed.
pub async fn acknowledge(
    mut rpc: watch::Receiver<Option<Rpc>>,
    settings: CallSettings,
    ack: Ack,
    partition: u32,
) -> AckOutcome {
    let CallSettings { consumer, topic, backoff, call_timeout, limit } = settings;
    let give_up = tokio::time::Instant::now() + limit;
    let mut attempt = 0u32;
    let mut last = String::from("never connected");
    loop {
        // Wait for a connection, but not past the limit.
        let Some(mut client) = current_rpc(&mut rpc, give_up).await else { return AckOutcome::GaveUp(last) };
        let tp = Some(TopicPartition { topic: topic.clone(), partition });
        let call = async {
            match ack {
                Ack::Ready => client
                    .partition_ready(PartitionReadyRequest { consumer_name: consumer.clone(), partition: tp })
                    .await
                    .map(|_| ()),
                Ack::Released => client
                    .partition_released(PartitionReleasedRequest {
                        consumer_name: consumer.clone(),
                        partition: tp,
                    })
                    .await
                    .map(|_| ()),
            }
        };
        let result = tokio::time::timeout(call_timeout, call)
            .await
            .unwrap_or_else(|_| Err(Status::unavailable(format!("not answered within {call_timeout:?}"))));
        match result {
            Ok(()) => return AckOutcome::Done,
            Err(status) if is_transient(&status) => {
                last = format!("{:?}: {}", status.code(), status.message())
            }
            Err(status)
                if ack == Ack::Released
                    && matches!(status.code(), Code::FailedPrecondition | Code::NotFound) =>
            {
                return AckOutcome::AlreadyDone(status.message().to_string());
            }
            Err(status) => return AckOutcome::Refused(status.code(), status.message().to_string()),
        }
        let wait = backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        if tokio::time::Instant::now() + wait >= give_up {
            return AckOutcome::GaveUp(last);
        }
        tokio::time::sleep(wait).await;
    }
}

/// Sends `Deregister` on the current connection, retrying transient errors until `limit`.
pub async fn deregister(
    mut rpc: watch::Receiver<Option<Rpc>>,
    settings: CallSettings,
) -> Result<DeregisterAction, Status> {
    let CallSettings { consumer, backoff, call_timeout, limit, .. } = settings;
    let give_up = tokio::time::Instant::now() + limit;
    let mut attempt = 0u32;
    loop {
        let Some(mut client) = current_rpc(&mut rpc, give_up).await else {
            return Err(Status::unavailable("no connection to any assigner before the drain deadline"));
        };
        let call = client.deregister(DeregisterRequest { consumer_name: consumer.clone() });
        match tokio::time::timeout(call_timeout, call).await {
            Ok(Ok(response)) => {
                // An unknown value is treated as UNSPECIFIED (= SHUTDOWN_NOW), as the proto says.
                let action = response.into_inner().action;
                return Ok(DeregisterAction::try_from(action).unwrap_or(DeregisterAction::Unspecified));
            }
            Ok(Err(status)) if !is_transient(&status) => return Err(status),
            Ok(Err(_)) | Err(_) => {}
        }
        let wait = backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        if tokio::time::Instant::now() + wait >= give_up {
            return Err(Status::unavailable("Deregister kept failing until the drain deadline"));
        }
        tokio::time::sleep(wait).await;
    }
}

/// The stream's connection, waiting for one until `give_up`.
async fn current_rpc(rpc: &mut watch::Receiver<Option<Rpc>>, give_up: tokio::time::Instant) -> Option<Rpc> {
    match tokio::time::timeout_at(give_up, rpc.wait_for(Option::is_some)).await {
        Ok(Ok(guard)) => guard.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    // The real assigner, in-process: the server crate is a dev-dependency of this one.
    use super::*;
    use kafka_assigner::coordinator::HandoffConfig;
    use kafka_assigner::server::AssignerServer;

    fn settings(limit: Duration) -> CallSettings {
        CallSettings {
            consumer: "c".into(),
            topic: "events".into(),
            backoff: Backoff { initial: Duration::from_millis(10), max: Duration::from_millis(50) },
            call_timeout: Duration::from_secs(2),
            limit,
        }
    }

    async fn server() -> AssignerServer {
        let mut config = HandoffConfig::default();
        config.topic_partitions.insert("events".into(), 2);
        AssignerServer::start_memory(config).await.expect("in-process server")
    }

    async fn rpc(url: String) -> Rpc {
        KafkaAssignerClient::new(Endpoint::from_shared(url).expect("url").connect_lazy())
    }

    /// A repeated `PartitionReleased` (nothing is releasing) is done, as is a repeated
    /// `PartitionReady` of an owned partition; a `PartitionReady` from an unknown consumer
    /// is refused (`NOT_FOUND`), not retried. All after a real round trip.
    #[tokio::test]
    async fn refusals_that_mean_done_and_refused() {
        let server = server().await;
        let endpoint = Endpoint::from_shared(server.grpc_url()).expect("url");
        let Registered { mut stream, announced_ttl: ttl, .. } =
            register(&endpoint, "c", "events", Duration::from_secs(2)).await.expect("Register");
        assert_eq!(ttl, Some(HandoffConfig::default().lease_ttl), "the server announces its session TTL");
        // The snapshot, then (the leader plans the new group after its rebalance delay)
        // every partition.
        let owns_zero = async {
            loop {
                let command = stream.message().await.expect("stream").expect("open").command;
                if let Some(crate::proto::v1::assignment_command::Command::Assignment(update)) = command
                    && update.assigned.iter().any(|tp| tp.partition == 0)
                {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), owns_zero).await.expect("c owns partition 0");
        let (_tx, rx) = watch::channel(Some(rpc(server.grpc_url()).await));
        let released = acknowledge(rx.clone(), settings(Duration::from_secs(2)), Ack::Released, 0).await;
        assert!(matches!(released, AckOutcome::AlreadyDone(_)), "{released:?}");
        let ready = acknowledge(rx.clone(), settings(Duration::from_secs(2)), Ack::Ready, 0).await;
        assert_eq!(ready, AckOutcome::Done, "c owns partition 0: a repeated ready succeeds");
        let stranger = CallSettings { consumer: "stranger".into(), ..settings(Duration::from_secs(2)) };
        let ready = acknowledge(rx, stranger, Ack::Ready, 0).await;
        assert!(matches!(ready, AckOutcome::Refused(Code::NotFound, _)), "{ready:?}");
        server.stop().await;
    }

    #[test]
    fn the_announced_session_ttl_is_read_and_nonsense_ignored() {
        let with = |value: &'static str| {
            let mut metadata = MetadataMap::new();
            metadata.insert(SESSION_TTL_HEADER, tonic::metadata::MetadataValue::from_static(value));
            announced_session_ttl(&metadata)
        };
        assert_eq!(with("3000"), Some(Duration::from_secs(3)));
        assert_eq!(with(" 1500 "), Some(Duration::from_millis(1500)));
        for nonsense in ["0", "-1", "3s", "", "99999999999999999999999"] {
            assert_eq!(with(nonsense), None, "{nonsense:?}");
        }
        assert_eq!(announced_session_ttl(&MetadataMap::new()), None, "an older server says nothing");
    }

    /// `UNAVAILABLE` (nothing listens) is retried; once the connection is replaced by a
    /// working one the retry goes through. Without any connection the call gives up at
    /// its limit.
    #[tokio::test]
    async fn transient_errors_are_retried_on_the_current_connection() {
        let server = server().await;
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let dead_url = format!("http://{}", dead.local_addr().expect("addr"));
        drop(dead);
        let (tx, rx) = watch::channel(Some(rpc(dead_url).await));
        let call = tokio::spawn(acknowledge(rx, settings(Duration::from_secs(10)), Ack::Released, 1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!call.is_finished(), "still retrying UNAVAILABLE");
        tx.send_replace(Some(rpc(server.grpc_url()).await));
        let outcome = tokio::time::timeout(Duration::from_secs(5), call).await.expect("ends").expect("task");
        // The consumer is unknown to the server: a released with nothing to release is done.
        assert!(matches!(outcome, AckOutcome::AlreadyDone(_)), "{outcome:?}");

        let (_tx, none) = watch::channel(None);
        let outcome = acknowledge(none, settings(Duration::from_millis(100)), Ack::Ready, 0).await;
        assert!(matches!(outcome, AckOutcome::GaveUp(_)), "{outcome:?}");
        server.stop().await;
    }
}
