//! The cluster bench's consumers: light in-process gRPC clients on shared HTTP/2
//! connections to one instance, obeying their commands (`WarmPartition` → `PartitionReady`,
//! `ReleasePartition` → `PartitionReleased`, at once), and, when the bench says so,
//! leaving with `Deregister` and serving releases until the server ends the drained stream.

use std::time::{Duration, Instant};

use kafka_assigner::proto::v1::{
    AssignmentCommand, DeregisterAction, DeregisterRequest, PartitionReadyRequest, PartitionReleasedRequest,
    RegisterRequest, TopicPartition, assignment_command::Command, kafka_assigner_client::KafkaAssignerClient,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::views::Shared;

/// Wait before registering again after a stream lost without a drain.
const RECONNECT: Duration = Duration::from_millis(200);

/// One consumer process: slot `slot` of topic number `topic`, in its `generation`.
pub struct Consumer {
    /// The instance's client (a shared connection).
    pub client: KafkaAssignerClient<Channel>,
    /// Its slot in the views.
    pub slot: u32,
    /// Its topic's number.
    pub topic: u32,
    /// Its name: a restarted consumer is a new pod, under a new name.
    pub name: String,
    /// The views it reports into.
    pub shared: Shared,
}

/// A topic's name.
pub fn topic_name(topic: u32) -> String {
    format!("t{topic:03}")
}

impl Consumer {
    /// Registers and serves commands until `leave` fires; then `Deregister`, serving the
    /// releases until the server ends the stream. A stream lost otherwise is an error: the
    /// consumer registers again.
    pub async fn run(self, mut leave: oneshot::Receiver<()>) {
        let mut leaving = false;
        loop {
            let request = RegisterRequest { consumer_name: self.name.clone(), topic: topic_name(self.topic) };
            let mut client = self.client.clone();
            let mut stream = match client.register(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    self.ended(leaving, &format!("Register refused: {}", status.message()));
                    tokio::time::sleep(RECONNECT).await;
                    continue;
                }
            };
            let mut first = true;
            let why = loop {
                let message = tokio::select! {
                    message = stream.message() => message,
                    _ = &mut leave, if !leaving => {
                        leaving = true;
                        self.deregister();
                        continue;
                    }
                };
                match message {
                    Ok(Some(command)) => {
                        self.handle(command, first);
                        first = false;
                    }
                    Ok(None) => break "stream ended by the server".to_string(),
                    Err(status) => break format!("stream failed: {:?} {}", status.code(), status.message()),
                }
            };
            self.ended(leaving, &why);
            if leaving {
                return;
            }
            tokio::time::sleep(RECONNECT).await;
        }
    }

    fn ended(&self, expected: bool, why: &str) {
        let (slot, at) = (self.slot, Instant::now());
        self.shared.update(|v| v.stream_ended(slot, expected, why, at));
    }

    fn handle(&self, command: AssignmentCommand, first: bool) {
        let (slot, topic, at) = (self.slot, self.topic, Instant::now());
        let partition_of = |tp: Option<&TopicPartition>| tp.map(|tp| tp.partition);
        match command.command {
            Some(Command::Assignment(update)) => self.shared.update(|v| {
                if first {
                    v.snapshot(slot);
                }
                for tp in &update.assigned {
                    if let Some(index) = v.index(topic, tp.partition) {
                        v.assigned(slot, index, at);
                    }
                }
                for tp in &update.unassigned {
                    if let Some(index) = v.index(topic, tp.partition) {
                        v.released(slot, index, at);
                    }
                }
            }),
            Some(Command::Warm(warm)) => {
                if first {
                    self.shared.update(|v| v.snapshot(slot));
                }
                match partition_of(warm.partition.as_ref()) {
                    Some(partition) => self.answer(partition, true),
                    None => {
                        self.shared.update(|v| v.rpc_error(format!("slot {slot}: warm without a partition")))
                    }
                }
            }
            Some(Command::Release(release)) => {
                let Some(partition) = partition_of(release.partition.as_ref()) else {
                    self.shared.update(|v| v.rpc_error(format!("slot {slot}: release without a partition")));
                    return;
                };
                self.shared.update(|v| {
                    if first {
                        v.snapshot(slot);
                    }
                    if let Some(index) = v.index(topic, partition) {
                        v.released(slot, index, at);
                    }
                });
                self.answer(partition, false);
            }
            None => self.shared.update(|v| v.rpc_error(format!("slot {slot}: empty command"))),
        }
    }

    /// Sends `PartitionReady` (`ready`) or `PartitionReleased` in its own task, so the
    /// stream keeps being read while the call is in flight.
    fn answer(&self, partition: u32, ready: bool) {
        let (slot, shared, mut client) = (self.slot, self.shared.clone(), self.client.clone());
        let tp = TopicPartition { topic: topic_name(self.topic), partition };
        let consumer_name = self.name.clone();
        shared.update(|v| v.call_started());
        tokio::spawn(async move {
            let result = if ready {
                let request = PartitionReadyRequest { consumer_name, partition: Some(tp) };
                client.partition_ready(request).await.map(drop)
            } else {
                let request = PartitionReleasedRequest { consumer_name, partition: Some(tp) };
                client.partition_released(request).await.map(drop)
            };
            shared.update(|v| {
                v.call_finished();
                if let Err(status) = result {
                    let call = if ready { "PartitionReady" } else { "PartitionReleased" };
                    let text =
                        format!("slot {slot} {call}({partition}): {:?} {}", status.code(), status.message());
                    if ready && status.code() == tonic::Code::FailedPrecondition {
                        v.ready_refused(text);
                    } else {
                        v.rpc_error(text);
                    }
                }
            });
        });
    }

    /// `Deregister` in its own task; anything but `WAIT_FOR_DRAIN` is an error (the
    /// instances run `--drain-policy drain`).
    fn deregister(&self) {
        let (slot, shared, mut client) = (self.slot, self.shared.clone(), self.client.clone());
        let request = DeregisterRequest { consumer_name: self.name.clone() };
        shared.update(|v| v.call_started());
        tokio::spawn(async move {
            let result = client.deregister(request).await;
            shared.update(|v| {
                v.call_finished();
                match result {
                    Ok(answer) if answer.get_ref().action() == DeregisterAction::WaitForDrain => {}
                    Ok(answer) => {
                        v.rpc_error(format!("slot {slot} Deregister: {:?}", answer.get_ref().action()))
                    }
                    Err(status) => v.rpc_error(format!(
                        "slot {slot} Deregister: {:?} {}",
                        status.code(),
                        status.message()
                    )),
                }
            });
        });
    }
}
