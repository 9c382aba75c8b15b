//! The benchmark's own consumers: many `Register` streams multiplexed over a few shared
//! HTTP/2 connections (tonic `Channel`s), answering `WarmPartition` with `PartitionReady`
//! and `ReleasePartition` with `PartitionReleased` at once, and reporting everything they
//! are told into the shared [`Shared`] views.

use std::time::{Duration, Instant};

use kafka_assigner::proto::v1::{
    AssignmentCommand, PartitionReadyRequest, PartitionReleasedRequest, RegisterRequest, TopicPartition,
    assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
};
use tokio::task::JoinSet;
use tonic::transport::Channel;

use super::{error::BenchError, grpc_clients::connect, world::Shared};

/// First wait before registering again after a lost stream (doubles up to the max).
const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Longest wait between `Register` attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// Consumers of one topic, over shared connections to one server.
pub struct Fleet {
    clients: Vec<KafkaAssignerClient<Channel>>,
    shared: Shared,
    topic: String,
    /// Dropping the fleet aborts every consumer task, which closes their streams.
    tasks: JoinSet<()>,
}

impl Fleet {
    /// Opens `connections` HTTP/2 connections to `url`.
    pub async fn connect(
        url: &str,
        connections: usize,
        topic: &str,
        shared: Shared,
    ) -> Result<Self, BenchError> {
        let clients = connect(url, connections).await?;
        Ok(Self { clients, shared, topic: topic.to_string(), tasks: JoinSet::new() })
    }

    /// Starts consumer `id` (named `c-{id}`): its `Register` is sent right away.
    pub fn spawn(&mut self, id: u32) {
        let client = self.clients[id as usize % self.clients.len()].clone();
        let consumer =
            Consumer { client, id, name: name(id), topic: self.topic.clone(), shared: self.shared.clone() };
        self.tasks.spawn(consumer.run());
    }

    /// Starts consumers `ids` at once.
    pub fn spawn_all(&mut self, ids: std::ops::Range<u32>) {
        for id in ids {
            self.spawn(id);
        }
    }
}

/// A status as the report shows it: code, message and, for a status the client made from a
/// transport error, that error's chain (tonic's message alone, "h2 protocol error: http2
/// error", hides a GOAWAY's reason and who sent it).
fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{:?} {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(&format!(": {error}"));
        source = error.source();
    }
    text
}

/// A consumer's name.
pub fn name(id: u32) -> String {
    format!("c-{id:05}")
}

struct Consumer {
    client: KafkaAssignerClient<Channel>,
    id: u32,
    name: String,
    topic: String,
    shared: Shared,
}

impl Consumer {
    /// Registers and reads commands; when the stream is refused, ends or fails, drops its
    /// partitions (it must stop processing them) and registers again with backoff, as a
    /// real client does. Runs until the fleet is dropped.
    async fn run(mut self) {
        let id = self.id;
        let mut backoff = RECONNECT_MIN;
        loop {
            let why = self.serve_one_stream(&mut backoff).await;
            self.shared.update(|w| w.stream_ended(id, why, Instant::now()));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_MAX);
        }
    }

    /// One `Register` stream until it ends; returns why it ended.
    async fn serve_one_stream(&mut self, backoff: &mut Duration) -> String {
        let request = RegisterRequest { consumer_name: self.name.clone(), topic: self.topic.clone() };
        let id = self.id;
        self.shared.update(|w| w.register_sent(id, Instant::now()));
        let mut stream = match self.client.register(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return format!("Register refused: {}", describe(&status)),
        };
        let mut first = true;
        loop {
            let message = stream.message().await;
            let at = Instant::now();
            match message {
                Ok(Some(command)) => {
                    self.handle(command, first, at);
                    if first {
                        *backoff = RECONNECT_MIN;
                    }
                    first = false;
                }
                Ok(None) => return "stream ended by the server".into(),
                Err(status) => return format!("stream failed: {}", describe(&status)),
            }
        }
    }

    fn handle(&self, command: AssignmentCommand, first: bool, at: Instant) {
        let id = self.id;
        let partition_of = |tp: Option<&TopicPartition>| tp.map(|tp| tp.partition);
        match command.command {
            Some(Command::Assignment(update)) => self.shared.update(|w| {
                if first {
                    w.snapshot(id, at);
                }
                for tp in &update.assigned {
                    w.assigned(id, tp.partition, at);
                }
                for tp in &update.unassigned {
                    w.released(id, tp.partition, at);
                }
            }),
            Some(Command::Warm(warm)) => {
                let Some(partition) = partition_of(warm.partition.as_ref()) else {
                    self.shared.update(|w| w.rpc_error(format!("consumer {id}: warm without a partition")));
                    return;
                };
                self.shared.update(|w| {
                    if first {
                        w.snapshot(id, at);
                    }
                    w.warm(id, at);
                });
                self.answer(partition, true);
            }
            Some(Command::Release(release)) => {
                let Some(partition) = partition_of(release.partition.as_ref()) else {
                    self.shared
                        .update(|w| w.rpc_error(format!("consumer {id}: release without a partition")));
                    return;
                };
                self.shared.update(|w| {
                    if first {
                        w.snapshot(id, at);
                    }
                    w.released(id, partition, at);
                });
                self.answer(partition, false);
            }
            None => self.shared.update(|w| w.rpc_error(format!("consumer {id}: empty command"))),
        }
    }

    /// Sends `PartitionReady` (`ready`) or `PartitionReleased` for `partition` in its own
    /// task, so the stream keeps being read while the call is in flight.
    fn answer(&self, partition: u32, ready: bool) {
        let (id, shared, mut client) = (self.id, self.shared.clone(), self.client.clone());
        let tp = TopicPartition { topic: self.topic.clone(), partition };
        let consumer_name = self.name.clone();
        shared.update(|w| w.call_started(id, partition, ready, Instant::now()));
        tokio::spawn(async move {
            let result = if ready {
                client
                    .partition_ready(PartitionReadyRequest { consumer_name, partition: Some(tp) })
                    .await
                    .map(drop)
            } else {
                client
                    .partition_released(PartitionReleasedRequest { consumer_name, partition: Some(tp) })
                    .await
                    .map(drop)
            };
            shared.update(|w| {
                w.call_finished();
                if let Err(status) = result {
                    let call = if ready { "PartitionReady" } else { "PartitionReleased" };
                    let text = format!("consumer {id} {call}({partition}): {}", describe(&status));
                    if ready && status.code() == tonic::Code::FailedPrecondition {
                        w.ready_refused(text);
                    } else {
                        w.rpc_error(text);
                    }
                }
            });
        });
    }
}
