//! What the fleet's loop answers to the consumers' calls (`driver.rs`): `PartitionReady` /
//! `PartitionReleased` are refused, `Deregister` marks the consumer leaving; and the
//! backend's face to the shared instance ([`Backend`]).

use async_trait::async_trait;

use super::Fleet;
use super::records::{FleetKey, MemberRecord};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{ConsumerUnknown, Contention, HandoffFreeBackend};
use crate::coordinator::shared::cas::{Rewrite, rewrite_bound};
use crate::coordinator::shared::instance::Backend;
use crate::coordinator::{PartitionEpoch, StatusView};
use crate::proto::v1::DeregisterAction;
use crate::store::StoreError;

/// The fleet moves partitions without handoffs, so there is nothing to be ready for or to
/// release: `FAILED_PRECONDITION` (the names were checked before).
pub(super) fn no_handoffs() -> CoordinatorError {
    CoordinatorError::NoHandoffs(HandoffFreeBackend::Fleet)
}

/// `Deregister`: marks every registration of `consumer` as leaving. It leaves the fair
/// share at once; the instance holding its stream tells it `unassigned` for everything,
/// ends the stream cleanly and revokes its session, so its leases are free right away.
/// There is nothing to drain: the answer is `SHUTDOWN_NOW`. Run by the loop, among its
/// store calls.
pub(super) async fn deregister(inner: &Fleet, consumer: &str) -> Result<DeregisterAction, CoordinatorError> {
    // The store, not the cache: the registration may have been made a moment ago elsewhere.
    let members = inner.core.store().get_prefix(&inner.core.keys().all_members()).await?;
    let registrations: Vec<String> = members
        .kvs
        .iter()
        .filter_map(|kv| match inner.core.keys().parse(&kv.key) {
            Some(FleetKey::Member(_, name)) if name == consumer => Some(kv.key.clone()),
            _ => None,
        })
        .collect();
    if registrations.is_empty() {
        return Err(CoordinatorError::UnknownConsumer(ConsumerUnknown::NotRegistered {
            consumer: consumer.to_string(),
        }));
    }
    for key in registrations {
        mark_leaving(inner, &key, consumer).await?;
    }
    tracing::info!(consumer, "consumer deregistered; its leases are given back");
    Ok(DeregisterAction::ShutdownNow)
}

/// Rewrites one member record with `leaving` set (keeping its session) with compare-and-swap.
async fn mark_leaving(inner: &Fleet, key: &str, consumer: &str) -> Result<(), CoordinatorError> {
    let leave = |r: &mut MemberRecord| !std::mem::replace(&mut r.leaving, true);
    match rewrite_bound(inner.core.store(), key, leave).await {
        Ok(Rewrite::Written(_) | Rewrite::Unchanged | Rewrite::Gone) => Ok(()),
        Ok(Rewrite::Contended) => {
            Err(CoordinatorError::Contended(Contention::Consumer { consumer: consumer.to_string() }))
        }
        // The instance lease ended meanwhile: the record and leases are gone already.
        Err(StoreError::SessionExpired(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The fleet backend's calls, as the shared instance ([`StoreCoordinator`]) runs them.
///
/// [`StoreCoordinator`]: crate::coordinator::StoreCoordinator
#[async_trait]
impl Backend for Fleet {
    fn status(&self) -> StatusView {
        super::status::status(self)
    }

    fn epochs(
        &self,
        topic: &str,
        consumer: &str,
        since: crate::store::Revision,
    ) -> Option<Vec<PartitionEpoch>> {
        let cache = self.core.mirror().read();
        Some(cache.topics.get(topic).map(|entry| entry.epochs_of(consumer, since)).unwrap_or_default())
    }
}
