//! A local consumer's ownership epochs as a stream (docs/design.md §10): the backend's
//! answer from its cache at once, then again after every change of the cache that alters
//! it. It ends when the consumer's stream on this instance ends (the epochs are served by
//! the instance that relays its commands, from the same cache) or the instance stops.

use std::sync::Arc;

use super::instance::Backend;
use crate::coordinator::{CoordinatorError, EpochStream, PartitionEpoch};

/// The epochs of `consumer`'s partitions of `topic` ([`EpochStream`]), as `backend` reads
/// them from its cache ([`Backend::epochs`]). `consumer` must hold a stream for `topic` on
/// this instance (`UnknownConsumer` otherwise); a backend without epochs answers
/// `NoEpochs`.
pub fn watch<B: Backend>(
    backend: &Arc<B>,
    consumer: &str,
    topic: &str,
) -> Result<EpochStream, CoordinatorError> {
    let core = backend.core();
    let Some(session) = core.streams().session_of(topic, consumer) else {
        return Err(CoordinatorError::UnknownConsumer(format!(
            "consumer '{consumer}' has no registration for topic '{topic}' on this assigner instance: \
             call Register first, on the instance you ask for its epochs"
        )));
    };
    let key = (topic.to_string(), consumer.to_string(), session);
    // Closed when the consumer's stream ends (its receiver is dropped).
    let Some(commands) = core.streams().with(&key, |stream| stream.tx.clone()) else {
        return Err(CoordinatorError::UnknownConsumer(format!(
            "consumer '{consumer}' of topic '{topic}' just left this assigner instance; register again"
        )));
    };
    if backend.epochs(topic, consumer).is_none() {
        return Err(CoordinatorError::NoEpochs(
            "this assigner's backend hands out no ownership epochs".into(),
        ));
    }
    let state = Watching {
        backend: backend.clone(),
        changed: core.mirror().subscribe(),
        stopping: core.shutdown().clone(),
        commands,
        key,
        last: None,
    };
    Ok(Box::pin(futures::stream::unfold(state, Watching::next)))
}

/// What one epochs stream keeps between snapshots.
struct Watching<B> {
    backend: Arc<B>,
    /// The cache's revision: every change of it may change the epochs.
    changed: tokio::sync::watch::Receiver<crate::store::Revision>,
    stopping: tokio_util::sync::CancellationToken,
    /// The consumer's command sender: its closing ends the epochs too.
    commands: super::outgoing::CommandSender,
    key: super::streams::StreamKey,
    /// The last snapshot sent.
    last: Option<Vec<PartitionEpoch>>,
}

impl<B: Backend> Watching<B> {
    /// The next snapshot that differs from the last one, or the end.
    async fn next(mut self) -> Option<(Vec<PartitionEpoch>, Self)> {
        loop {
            if !self.backend.core().streams().contains(&self.key) {
                return None;
            }
            let (topic, consumer, _) = &self.key;
            let now = self.backend.epochs(topic, consumer)?;
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                return Some((now, self));
            }
            tokio::select! {
                changed = self.changed.changed() => changed.ok()?,
                () = self.commands.closed() => return None,
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}
