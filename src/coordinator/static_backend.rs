//! The `static` backend: fixed partitions from the environment, for local development.
//!
//! No store, no leader, no etcd: the assignment is parsed once at start
//! ([`StaticAssignment`], from [`ASSIGNMENT_VAR`] or [`MEMBERS_VAR`]) and never changes.
//!
//! * `Register` answers with the snapshot of the consumer's configured partitions
//!   (`AssignmentUpdate{assigned, unassigned: []}`), and the stream then stays open until
//!   the consumer leaves or the server shuts down (`UNAVAILABLE`). A consumer or topic the
//!   configuration does not cover is `NOT_FOUND` naming it. A second `Register` with the
//!   same name and topic replaces the first, whose stream ends with `ABORTED` (as on the
//!   other backends).
//! * `PartitionReady` / `PartitionReleased` are `FAILED_PRECONDITION`: nothing ever moves.
//! * `Deregister` is `SHUTDOWN_NOW` for any consumer the configuration covers (there is
//!   nothing to drain); `NOT_FOUND` for others.
//!
//! Two consumers the configuration maps to the same partitions (round-robin names with the
//! same ordinal, `pod-1` and `web-1`) both get them: the backend trusts the developer's
//! naming, as the environment is all it knows.

mod parse;

pub use parse::{ASSIGNMENT_VAR, ExplicitAssignment, MEMBERS_VAR, StaticAssignment, ordinal};

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{
    CommandStream, ConsumerGroupCoordinator, ConsumerStatusView, CoordinatorError, StatusView, TopicStatus,
    validate_consumer_name, validate_topic_name,
};
use crate::metrics::Metrics;
use crate::proto::v1::{AssignmentCommand, DeregisterAction};

/// Settings of a [`StaticCoordinator`].
#[derive(Clone, Debug)]
pub struct StaticConfig {
    /// This instance's id (status view).
    pub instance_id: String,
    /// Partition counts by topic (`--topic-partitions`); other topics are `NOT_FOUND`.
    pub topic_partitions: BTreeMap<String, u32>,
    /// Who gets which partitions.
    pub assignment: StaticAssignment,
}

impl StaticConfig {
    /// Parses the settings (`--static-assignment` / `--static-members`, or their
    /// environment variables) against the partition counts. The error names the variable
    /// and the bad part.
    pub fn from_settings(
        instance_id: String,
        topic_partitions: BTreeMap<String, u32>,
        assignment: Option<&str>,
        members: Option<&str>,
    ) -> Result<Self, String> {
        let assignment = StaticAssignment::from_settings(assignment, members, &topic_partitions)?;
        Ok(Self { instance_id, topic_partitions, assignment })
    }
}

type Sender = mpsc::UnboundedSender<Result<AssignmentCommand, CoordinatorError>>;

struct Inner {
    config: StaticConfig,
    /// Open streams by (topic, consumer): a registration id and the stream's sender.
    streams: Mutex<BTreeMap<(String, String), (u64, Sender)>>,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Inner {
    fn lock_streams(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), (u64, Sender)>> {
        self.streams.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The static coordinator (see the module docs).
#[derive(Clone)]
pub struct StaticCoordinator {
    inner: Arc<Inner>,
}

impl StaticCoordinator {
    /// A coordinator serving `config`. Logs the partitions nobody is configured to get.
    pub fn new(config: StaticConfig, metrics: Arc<Metrics>) -> Self {
        if let StaticAssignment::Explicit(topics) = &config.assignment {
            for (topic, &count) in &config.topic_partitions {
                let covered: usize = topics.get(topic).map_or(0, |c| c.values().map(|p| p.len()).sum());
                if covered < count as usize {
                    tracing::warn!(
                        topic,
                        partitions = count,
                        assigned = covered,
                        "{ASSIGNMENT_VAR} leaves partitions of this topic to nobody"
                    );
                }
            }
        }
        tracing::info!(assignment = ?config.assignment, "static assignment loaded");
        let inner = Inner {
            config,
            streams: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            metrics,
            shutdown: CancellationToken::new(),
        };
        Self { inner: Arc::new(inner) }
    }

    fn partition_count(&self, topic: &str) -> Result<u32, CoordinatorError> {
        self.inner.config.topic_partitions.get(topic).copied().ok_or_else(|| {
            CoordinatorError::NotFound(format!(
                "topic '{topic}' is unknown to the static backend: configure its partition count with \
                 --topic-partitions {topic}=<count>"
            ))
        })
    }

    fn no_handoffs(&self, consumer: &str, topic: &str) -> Result<(), CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        Err(CoordinatorError::FailedPrecondition(
            "static backend performs no handoffs: partitions never move, so there is nothing to be ready \
             for or to release"
                .into(),
        ))
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for StaticCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        validate_consumer_name(consumer)?;
        validate_topic_name(topic)?;
        if self.inner.shutdown.is_cancelled() {
            return Err(CoordinatorError::Unavailable("this assigner instance is shutting down".into()));
        }
        let count = self.partition_count(topic)?;
        let partitions = self.inner.config.assignment.partitions(topic, consumer, count)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(Ok(super::wire::update(topic, partitions, [])));
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let key = (topic.to_string(), consumer.to_string());
        {
            let mut streams = self.inner.lock_streams();
            if let Some((_, old)) = streams.insert(key.clone(), (id, tx.clone())) {
                let _ = old.send(Err(CoordinatorError::Aborted(format!(
                    "consumer '{consumer}' registered again for topic '{topic}'; this stream was replaced"
                ))));
            }
            self.inner.metrics.streams.set(streams.len() as i64);
        }
        tracing::info!(topic, consumer, "consumer registered (static)");
        // Forget the stream once the consumer goes away (unless a newer one replaced it).
        let inner = self.inner.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tx.closed() => {}
                _ = inner.shutdown.cancelled() => return,
            }
            let mut streams = inner.lock_streams();
            if streams.get(&key).is_some_and(|(current, _)| *current == id) {
                streams.remove(&key);
                tracing::info!(topic = %key.0, consumer = %key.1, "consumer disconnected (static)");
            }
            inner.metrics.streams.set(streams.len() as i64);
        });
        Ok(Box::pin(UnboundedReceiverStream::new(rx)))
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        _partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.no_handoffs(consumer, topic)
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        _partition: u32,
    ) -> Result<(), CoordinatorError> {
        self.no_handoffs(consumer, topic)
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        validate_consumer_name(consumer)?;
        let registered = self.inner.lock_streams().keys().any(|(_, c)| c == consumer);
        if !registered && !self.inner.config.assignment.covers(consumer) {
            return Err(CoordinatorError::NotFound(format!(
                "consumer '{consumer}' is not covered by the static assignment"
            )));
        }
        // Nothing moves, so there is nothing to drain: the consumer may exit at once.
        Ok(DeregisterAction::ShutdownNow)
    }

    async fn status(&self) -> StatusView {
        let config = &self.inner.config;
        let streams = self.inner.lock_streams();
        let topics = config
            .topic_partitions
            .iter()
            .map(|(topic, &count)| {
                let connected: Vec<&str> =
                    streams.keys().filter(|(t, _)| t == topic).map(|(_, c)| c.as_str()).collect();
                let mut owners: Vec<Option<String>> = vec![None; count as usize];
                match &config.assignment {
                    StaticAssignment::Explicit(topics) => {
                        for (consumer, partitions) in topics.get(topic).into_iter().flatten() {
                            for &p in partitions {
                                owners[p as usize] = Some(consumer.clone());
                            }
                        }
                    }
                    // Round-robin knows members by ordinal only: show the connected ones.
                    StaticAssignment::RoundRobin { .. } => {
                        for consumer in &connected {
                            for p in config.assignment.partitions(topic, consumer, count).unwrap_or_default()
                            {
                                owners[p as usize].get_or_insert_with(|| consumer.to_string());
                            }
                        }
                    }
                }
                let consumers = connected
                    .iter()
                    .map(|consumer| ConsumerStatusView {
                        name: consumer.to_string(),
                        status: "Active".into(),
                        instance: config.instance_id.clone(),
                        partitions: config
                            .assignment
                            .partitions(topic, consumer, count)
                            .map_or(0, |p| p.len()),
                    })
                    .collect();
                TopicStatus {
                    topic: topic.clone(),
                    partition_count: count,
                    consumers,
                    owners,
                    handoffs: vec![],
                }
            })
            .collect();
        StatusView {
            instance: config.instance_id.clone(),
            backend: "static".into(),
            leader: None,
            ready: !self.inner.shutdown.is_cancelled(),
            topics,
        }
    }

    async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let mut streams = self.inner.lock_streams();
        for ((topic, consumer), (_, tx)) in std::mem::take(&mut *streams) {
            let _ = tx.send(Err(CoordinatorError::Unavailable(format!(
                "assigner instance '{}' is shutting down; consumer '{consumer}' of topic '{topic}': \
                 reconnect to another instance",
                self.inner.config.instance_id
            ))));
        }
        self.inner.metrics.streams.set(0);
    }
}
