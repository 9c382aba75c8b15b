//! `Register` on the static backend: the snapshot of the configured partitions, then a
//! stream that stays open until the consumer leaves or the server shuts down.

use std::sync::{Arc, atomic::Ordering};

use futures::StreamExt;

use super::Static;
use crate::coordinator::causes::{ConsumerUnknown, TopicUnknown};
use crate::coordinator::shared::{
    outgoing::command_channel,
    outgoing::update,
    streams::{EndReason, LocalStream},
    transport::command_stream,
};
use crate::coordinator::{
    CommandStream, CoordinatorError, EpochStream, EpochsAt, PartitionEpoch, validate_consumer_name,
    validate_topic_name,
};
use crate::store::SessionId;

/// Registers `consumer` for `topic`: `NOT_FOUND` for a topic or consumer the configuration
/// does not cover; a second registration of the name replaces the first (`ABORTED`).
pub(super) fn register(
    inner: &Arc<Static>,
    consumer: &str,
    topic: &str,
) -> Result<CommandStream, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    if inner.shutdown.is_cancelled() {
        return Err(CoordinatorError::ShuttingDown);
    }
    let count = inner.config.topic_partitions.get(topic).copied().ok_or_else(|| {
        CoordinatorError::UnknownTopic(TopicUnknown::NotInStaticConfig { topic: topic.to_string() })
    })?;
    let partitions = inner.config.assignment.partitions(topic, consumer, count)?;
    let (tx, rx) = command_channel();
    // No store: a local registration number stands in for the session and its revision,
    // so the registry keeps the newest of two registrations of one name.
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let (mut stream, _end) = LocalStream::<()>::new(SessionId(id), id, tx.clone());
    stream.activated = true;
    stream.send([update(topic, partitions, [])]);
    let ends = inner.streams.end_watch();
    inner.streams.insert(topic, consumer, stream);
    tracing::info!(topic, consumer, "consumer registered (static)");
    // Forget the stream once the consumer goes away (unless a newer one replaced it).
    let inner = inner.clone();
    let key = (topic.to_string(), consumer.to_string(), SessionId(id));
    tokio::spawn(async move {
        tokio::select! {
            _ = tx.closed() => {}
            _ = inner.shutdown.cancelled() => return,
        }
        tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected (static)");
        inner.streams.end(&key, EndReason::Shutdown, None);
    });
    Ok(command_stream(rx, ends))
}

/// The static backend's epoch of every ownership without `--state-dir` (docs/design.md
/// §10): the configuration decides who owns what, and nothing ever moves while it runs.
pub(super) const STATIC_EPOCH: u64 = 1;

/// The revision of every static epoch snapshot: there is no store, and the one snapshot a
/// stream sends never changes.
const STATIC_REVISION: u64 = 1;

/// The epochs of a registered consumer's configured partitions: one snapshot, every
/// partition at this run's epoch (`config.epoch`); the stream ends with the consumer's
/// registration.
pub(super) fn watch_epochs(
    inner: &Arc<Static>,
    consumer: &str,
    topic: &str,
) -> Result<EpochStream, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    let registered = inner
        .streams
        .session_of(topic, consumer)
        .map(|session| (topic.to_string(), consumer.to_string(), session));
    let commands = registered.as_ref().and_then(|key| inner.streams.with(key, |stream| stream.tx.clone()));
    let (Some(commands), Some(&count)) = (commands, inner.config.topic_partitions.get(topic)) else {
        return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegisteredStatic {
            consumer: consumer.to_string(),
            topic: topic.to_string(),
        }));
    };
    let partitions: Vec<PartitionEpoch> = inner
        .config
        .assignment
        .partitions(topic, consumer, count)?
        .into_iter()
        .map(|partition| PartitionEpoch { partition, epoch: inner.config.epoch, warming: false })
        .collect();
    let shutdown = inner.shutdown.clone();
    let end = async move {
        tokio::select! {
            () = commands.closed() => {}
            () = shutdown.cancelled() => {}
        }
        None::<EpochsAt>
    };
    let rest = futures::stream::once(end).filter_map(std::future::ready);
    let epochs = EpochsAt { revision: STATIC_REVISION, partitions };
    Ok(Box::pin(futures::stream::once(std::future::ready(epochs)).chain(rest)))
}
