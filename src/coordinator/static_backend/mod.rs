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

mod calls;
mod parse;
mod register;
mod status;

pub use parse::{ASSIGNMENT_VAR, ExplicitAssignment, MEMBERS_VAR, StaticAssignment, ordinal};

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::AtomicI64},
};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::shared::{
    Readiness,
    streams::{LocalStream, Streams},
};
use super::{CommandStream, ConsumerGroupCoordinator, CoordinatorError, EpochStream, StatusView};
use crate::metrics::Metrics;
use crate::proto::v1::DeregisterAction;

/// Settings of a [`StaticCoordinator`].
#[derive(Clone, Debug)]
pub struct StaticConfig {
    /// This instance's id (status view).
    pub instance_id: String,
    /// Partition counts by topic (`--topic-partitions`); other topics are `NOT_FOUND`.
    pub topic_partitions: BTreeMap<String, u32>,
    /// Who gets which partitions.
    pub assignment: StaticAssignment,
    /// The epoch of every ownership for this run (docs/design.md §10): 1 by default; above
    /// the floor kept in `--state-dir` when it is set, so a restart raises it.
    pub epoch: u64,
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
        Ok(Self { instance_id, topic_partitions, assignment, epoch: register::STATIC_EPOCH })
    }

    /// The same settings with every ownership at `epoch` (at least 1: a served epoch is
    /// never 0).
    #[must_use]
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch.max(1);
        self
    }
}

/// The static backend's state: its settings and the streams it holds (the shared
/// registry; a stream's "session" is a local registration number, since there is no store).
struct Static {
    config: StaticConfig,
    streams: Streams<LocalStream<()>>,
    /// The number of the next registration.
    next_id: AtomicI64,
    shutdown: CancellationToken,
    readiness: Readiness,
}

/// The static coordinator (see the module docs).
#[derive(Clone)]
pub struct StaticCoordinator {
    inner: Arc<Static>,
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
        let inner = Static {
            config,
            streams: Streams::new(metrics),
            next_id: AtomicI64::new(1),
            shutdown: CancellationToken::new(),
            readiness: Readiness::new(true),
        };
        Self { inner: Arc::new(inner) }
    }
}

#[async_trait]
impl ConsumerGroupCoordinator for StaticCoordinator {
    async fn register(&self, consumer: &str, topic: &str) -> Result<CommandStream, CoordinatorError> {
        register::register(&self.inner, consumer, topic)
    }

    async fn partition_ready(
        &self,
        consumer: &str,
        topic: &str,
        _partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::no_handoffs(consumer, topic)
    }

    async fn partition_released(
        &self,
        consumer: &str,
        topic: &str,
        _partition: u32,
    ) -> Result<(), CoordinatorError> {
        calls::no_handoffs(consumer, topic)
    }

    async fn deregister(&self, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
        calls::deregister(&self.inner, consumer)
    }

    async fn watch_epochs(&self, consumer: &str, topic: &str) -> Result<EpochStream, CoordinatorError> {
        register::watch_epochs(&self.inner, consumer, topic)
    }

    async fn status(&self) -> StatusView {
        status::status(&self.inner)
    }

    fn readiness(&self) -> watch::Receiver<bool> {
        self.inner.readiness.subscribe()
    }

    async fn shutdown(&self) {
        if self.inner.shutdown.is_cancelled() {
            return;
        }
        self.inner.readiness.set(false);
        self.inner.shutdown.cancel();
        let instance = self.inner.config.instance_id.clone();
        self.inner.streams.stop(crate::coordinator::shared::transport::Stop::Shutdown { instance });
        self.inner.streams.drop_all();
    }
}
