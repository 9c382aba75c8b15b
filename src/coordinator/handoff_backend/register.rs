//! `Register` for the handoff backend: the consumer record, and the restart hold.
//!
//! The shared registration ([`crate::coordinator::shared::register`]) gives each stream its
//! own session; the consumer record is bound to it, so when the stream drops and nobody
//! keeps the session alive, the record vanishes after the TTL and the leader reassigns the
//! partitions. Registering again under the same name rewrites the record with the new
//! session: the partitions (keyed by name) stay put, and the instance holding the old
//! stream sees the record change and ends it.

use std::time::Duration;

use async_trait::async_trait;

use super::records::{ConsumerRecord, RECORD_VERSION, encode};
use super::{Handoff, now_ms, relay, state::Cache};
use crate::coordinator::CoordinatorError;
use crate::coordinator::shared::{
    Core,
    cas::CAS_ATTEMPTS,
    register::Registrar,
    streams::{Ending, LocalStream, StreamKey},
};
use crate::handoff::{ConsumerStatus, ConsumerView};
use crate::store::{Compare, Op, Revision, SessionId, Txn};

#[async_trait]
impl Registrar for Handoff {
    type Cache = Cache;
    type Told = ConsumerView;

    fn core(&self) -> &Core<Cache, ConsumerView> {
        &self.core
    }

    async fn write_registration(
        &self,
        consumer: &str,
        topic: &str,
        session: SessionId,
    ) -> Result<Revision, CoordinatorError> {
        let core = &self.core;
        let key = core.keys.consumer(topic, consumer);
        let record = ConsumerRecord {
            v: RECORD_VERSION,
            status: ConsumerStatus::Active,
            session: session.0,
            instance: core.instance_id.clone(),
            hold_until: None,
        };
        for _ in 0..CAS_ATTEMPTS {
            let existing = core.store.get(&key).await?.map_or(0, |kv| kv.mod_revision);
            let txn = Txn::new().when(Compare::ModRevision(key.clone(), existing)).then(Op::put_in(
                &key,
                encode(&record),
                session,
            ));
            let outcome = core.store.txn(txn).await?;
            if outcome.succeeded {
                return Ok(outcome.revision);
            }
        }
        Err(CoordinatorError::Aborted(format!(
            "consumer '{consumer}' is being registered concurrently elsewhere; retry"
        )))
    }

    fn relay_one(
        &self,
        cache: &Cache,
        topic: &str,
        consumer: &str,
        stream: &mut LocalStream<ConsumerView>,
    ) -> Option<Ending> {
        let entry = cache.topics.get(topic);
        let view = entry.map(|e| e.view_of(consumer)).unwrap_or_default();
        relay::relay_one(topic, consumer, stream, entry, view, cache.revision)
    }

    async fn after_disconnect(&self, key: &StreamKey, alive_at: tokio::time::Instant) {
        hold_for_restart(self, key, alive_at).await;
    }
}

/// After the stream drops, the session lives on for its TTL: a quick reconnect keeps the
/// partitions. If a `SHUTDOWN_NOW` deregistration sets `hold_until` on the record (before
/// or during that window, through any instance), keep the session (and so the partitions)
/// alive until then, waiting for the consumer's return; then revoke it.
async fn hold_for_restart(inner: &Handoff, key: &StreamKey, alive_at: tokio::time::Instant) {
    let core = &inner.core;
    let (topic, consumer, session) = key;
    let period = core.keep_alive_period();
    let mut changed = core.mirror.subscribe();
    let mut expires_at = alive_at + core.lease_ttl;
    loop {
        let hold_until = {
            let cache = core.mirror.read();
            let record = cache.topics.get(topic).and_then(|t| t.consumers.get(consumer));
            match record {
                Some(r) if r.value.session == session.0 => r.value.hold_until,
                _ => return, // replaced by a new registration, or gone
            }
        };
        let wait = match hold_until {
            Some(until) if now_ms() >= until => {
                tracing::info!(topic, consumer, "restart grace over; releasing the consumer's partitions");
                let _ = core.store.revoke_session(*session).await;
                return;
            }
            Some(until) => {
                let asked_at = tokio::time::Instant::now();
                if core.store.keep_alive(*session).await.is_err() {
                    return;
                }
                expires_at = asked_at + core.lease_ttl;
                Duration::from_millis(until.saturating_sub(now_ms())).min(period)
            }
            // No hold (yet): watch the record until the session would expire by itself.
            None if tokio::time::Instant::now() >= expires_at => return,
            None => expires_at - tokio::time::Instant::now(),
        };
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            _ = changed.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
