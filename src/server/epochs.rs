//! The `OwnershipEpochs` service (`proto/kafka_assigner/v1/epochs.proto`): the epochs of a
//! registered consumer's partitions, beside the original contract (docs/design.md §10).
//! Same checks as the contract's calls (identity, counting); the answers come from the
//! coordinator.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::grpc::AssignerService;
use super::status::to_status;
use crate::coordinator::EpochsAt;
use crate::proto::v1::{self, EpochSnapshot, WatchEpochsRequest, ownership_epochs_server::OwnershipEpochs};

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<EpochSnapshot, Status>> + Send>>;

#[tonic::async_trait]
impl OwnershipEpochs for AssignerService {
    type WatchEpochsStream = SnapshotStream;

    async fn watch_epochs(
        &self,
        request: Request<WatchEpochsRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let call = async {
            self.authorize(&request, &request.get_ref().consumer_name, "WatchEpochs")?;
            let WatchEpochsRequest { consumer_name, topic } = request.into_inner();
            crate::coordinator::validate_consumer_name(&consumer_name).map_err(to_status)?;
            crate::coordinator::validate_topic_name(&topic).map_err(to_status)?;
            let stream = self.coordinator.watch_epochs(&consumer_name, &topic).await.map_err(to_status)?;
            Ok((stream, topic))
        };
        let (stream, topic) = self.counted("WatchEpochs", call).await?;
        let snapshots = stream.map(move |epochs| Ok(snapshot(&topic, &epochs)));
        Ok(Response::new(Box::pin(snapshots)))
    }
}

/// The wire form of a consumer's epochs, with the revision they were read at.
fn snapshot(topic: &str, epochs: &EpochsAt) -> EpochSnapshot {
    EpochSnapshot {
        topic: topic.to_string(),
        partitions: epochs
            .partitions
            .iter()
            .map(|p| v1::PartitionEpoch { partition: p.partition, epoch: p.epoch, warming: p.warming })
            .collect(),
        revision: epochs.revision,
    }
}
