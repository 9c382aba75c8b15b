//! The driver against a scripted assigner over real gRPC: the test decides what each of the
//! two streams (`Register`'s commands, `WatchEpochs`' snapshots) says and when, which a
//! real assigner cannot be made to do on cue (an epoch snapshot delayed past a release).

use std::{pin::Pin, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::Stream;
use tokio::sync::{Mutex, mpsc, watch};
use tonic::{Request, Response, Status};

use crate::proto::v1::{
    AssignmentCommand, AssignmentUpdate, DeregisterAction, DeregisterRequest, DeregisterResponse,
    EpochSnapshot, PartitionEpoch, PartitionReadyRequest, PartitionReadyResponse, PartitionReleasedRequest,
    PartitionReleasedResponse, RegisterRequest, ReleasePartition, TopicPartition, WatchEpochsRequest,
    assignment_command::Command,
    kafka_assigner_server::{KafkaAssigner, KafkaAssignerServer},
    ownership_epochs_server::{OwnershipEpochs, OwnershipEpochsServer},
};
use crate::{AssignerClient, ClientConfig, Handler, Partition, WarmError};

/// How long anything the test waits for may take before it counts as a failure.
const PROMPT: Duration = Duration::from_secs(5);

type Messages<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The streams of one registration, fed by the test.
struct Scripted {
    commands: Mutex<Option<mpsc::UnboundedReceiver<AssignmentCommand>>>,
    epochs: Mutex<Option<mpsc::UnboundedReceiver<EpochSnapshot>>>,
}

fn stream_of<T: Send + 'static>(rx: Option<mpsc::UnboundedReceiver<T>>) -> Result<Messages<T>, Status> {
    // One registration only: a reconnect would mean the test's session was dropped.
    let rx = rx.ok_or_else(|| Status::unavailable("the scripted assigner serves one session"))?;
    Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move { Some((Ok(rx.recv().await?), rx)) })))
}

#[async_trait]
impl KafkaAssigner for Arc<Scripted> {
    type RegisterStream = Messages<AssignmentCommand>;

    async fn register(&self, _: Request<RegisterRequest>) -> Result<Response<Self::RegisterStream>, Status> {
        Ok(Response::new(stream_of(self.commands.lock().await.take())?))
    }

    async fn partition_ready(
        &self,
        _: Request<PartitionReadyRequest>,
    ) -> Result<Response<PartitionReadyResponse>, Status> {
        Ok(Response::new(PartitionReadyResponse {}))
    }

    async fn partition_released(
        &self,
        _: Request<PartitionReleasedRequest>,
    ) -> Result<Response<PartitionReleasedResponse>, Status> {
        Ok(Response::new(PartitionReleasedResponse {}))
    }

    async fn deregister(
        &self,
        _: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        Ok(Response::new(DeregisterResponse { action: DeregisterAction::ShutdownNow.into() }))
    }
}

#[async_trait]
impl OwnershipEpochs for Arc<Scripted> {
    type WatchEpochsStream = Messages<EpochSnapshot>;

    async fn watch_epochs(
        &self,
        _: Request<WatchEpochsRequest>,
    ) -> Result<Response<Self::WatchEpochsStream>, Status> {
        Ok(Response::new(stream_of(self.epochs.lock().await.take())?))
    }
}

/// Serves `scripted` on a free local port; returns its URL.
async fn serve(scripted: Arc<Scripted>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let incoming = futures::stream::unfold(listener, |listener| async move {
        Some((listener.accept().await.map(|(socket, _)| socket), listener))
    });
    let server = tonic::transport::Server::builder()
        .add_service(KafkaAssignerServer::new(scripted.clone()))
        .add_service(OwnershipEpochsServer::new(scripted))
        .serve_with_incoming(incoming);
    tokio::spawn(server);
    url
}

/// Records `assigned` and `release` calls with their epochs.
struct Calls(watch::Sender<Vec<(&'static str, u32, u64)>>);

#[async_trait]
impl Handler for Calls {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        self.0.send_modify(|calls| calls.push(("assigned", p.partition, p.epoch)));
    }

    async fn release(&self, p: Partition) {
        self.0.send_modify(|calls| calls.push(("release", p.partition, p.epoch)));
    }

    async fn unassigned(&self, _: Partition) {}
}

fn owned(partitions: &[u32], unassigned: &[u32]) -> AssignmentCommand {
    let tps =
        |ps: &[u32]| ps.iter().map(|p| TopicPartition { topic: "events".into(), partition: *p }).collect();
    AssignmentCommand {
        command: Some(Command::Assignment(AssignmentUpdate {
            assigned: tps(partitions),
            unassigned: tps(unassigned),
        })),
    }
}

fn epochs(revision: u64, partitions: &[(u32, u64)]) -> EpochSnapshot {
    EpochSnapshot {
        topic: "events".into(),
        partitions: partitions
            .iter()
            .map(|(p, e)| PartitionEpoch { partition: *p, epoch: *e, warming: false })
            .collect(),
        revision,
    }
}

/// Partition 0 is owned at epoch 7, released, then assigned again. Between the release and
/// the new assignment, a snapshot computed before the handover arrives (revision 10, still
/// 0 at 7: above every revision applied, so its revision does not give it away). The new
/// ownership must reach the handler with the new epoch (9), not the ended one's 7: before
/// the gate's floor, `assigned(0, 7)` came first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_epoch_snapshot_after_a_release_is_not_handed_to_the_handler() {
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let (snapshots, epochs_rx) = mpsc::unbounded_channel();
    let scripted =
        Arc::new(Scripted { commands: Mutex::new(Some(commands_rx)), epochs: Mutex::new(Some(epochs_rx)) });
    let url = serve(scripted).await;
    let (calls_tx, calls) = watch::channel(Vec::new());
    let config = ClientConfig::new([url], "a", "events");
    let client = AssignerClient::start(config, Arc::new(Calls(calls_tx)), None).expect("client");
    let seen = |n: usize| {
        let mut calls = calls.clone();
        async move {
            let got = tokio::time::timeout(PROMPT, calls.wait_for(|c| c.len() >= n)).await;
            got.expect("the handler is called in time").expect("client alive").clone()
        }
    };

    let send = |sent: Result<(), String>| sent.expect("the scripted stream is open");
    send(commands.send(owned(&[0], &[])).map_err(|e| e.to_string()));
    send(snapshots.send(epochs(9, &[(0, 7)])).map_err(|e| e.to_string()));
    assert_eq!(seen(1).await, vec![("assigned", 0, 7)]);
    let release = ReleasePartition {
        partition: Some(TopicPartition { topic: "events".into(), partition: 0 }),
        new_owner: "b".into(),
    };
    send(
        commands
            .send(AssignmentCommand { command: Some(Command::Release(release)) })
            .map_err(|e| e.to_string()),
    );
    assert_eq!(seen(2).await[1], ("release", 0, 7), "the release was applied");

    send(snapshots.send(epochs(10, &[(0, 7)])).map_err(|e| e.to_string()));
    send(commands.send(owned(&[0], &[])).map_err(|e| e.to_string()));
    // Nothing to hand over yet: the only epoch known for 0 is the ended ownership's.
    let mut watcher = calls.clone();
    let early = tokio::time::timeout(Duration::from_millis(500), watcher.wait_for(|c| c.len() >= 3)).await;
    assert!(early.is_err(), "handed over before the new epoch arrived: {:?}", *calls.borrow());
    send(snapshots.send(epochs(12, &[(0, 9)])).map_err(|e| e.to_string()));
    assert_eq!(seen(3).await[2], ("assigned", 0, 9));
    let _ = client.shutdown().await;
}
