//! [`MeteredStore`]: a [`LeaseStore`] that records the latency and the errors of every
//! request of the store it wraps, by operation, and counts watch re-reads.
//!
//! A re-read is seen here rather than in the coordinator: the mirror re-reads the whole
//! prefix (`get_prefix`) and then watches again (`watch_prefix`) after a broken watch and
//! at every resync interval, so every `watch_prefix` on a prefix after the first one is a
//! re-read.

use std::{collections::HashSet, sync::Arc, sync::Mutex, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use super::{
    KeyValue, LeaseStore, PrefixSnapshot, Revision, SessionId, StoreError, Txn, TxnOutcome, WatchStream,
};
use crate::metrics::{
    Metrics,
    labels::{OpLabels, StoreErrorLabels},
};

/// Wraps a store and meters it into [`Metrics`].
pub struct MeteredStore {
    inner: Arc<dyn LeaseStore>,
    metrics: Arc<Metrics>,
    /// Prefixes watched at least once (the next watch of one is a re-read).
    watched: Mutex<HashSet<String>>,
}

impl MeteredStore {
    /// Meters `inner` into `metrics`.
    pub fn new(inner: Arc<dyn LeaseStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics, watched: Mutex::new(HashSet::new()) }
    }

    /// Runs one request, recording its latency, and its error if it fails.
    async fn metered<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = request.await;
        self.metrics.store_latency.get_or_create(&OpLabels { op }).observe(start.elapsed().as_secs_f64());
        if let Err(error) = &result {
            record_error(&self.metrics, op, error);
        }
        result
    }
}

/// The `kind` label of a store error.
fn kind(error: &StoreError) -> &'static str {
    match error {
        StoreError::SessionExpired(_) => "session_expired",
        StoreError::Compacted { .. } => "compacted",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Invalid(_) => "invalid",
        StoreError::Closed => "closed",
    }
}

fn record_error(metrics: &Metrics, op: &'static str, error: &StoreError) {
    metrics.store_errors.get_or_create(&StoreErrorLabels { op, kind: kind(error) }).inc();
}

#[async_trait]
impl LeaseStore for MeteredStore {
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError> {
        self.metered("grant_session", self.inner.grant_session(ttl)).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError> {
        self.metered("keep_alive", self.inner.keep_alive(session)).await
    }

    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError> {
        self.metered("revoke_session", self.inner.revoke_session(session)).await
    }

    async fn connect_again(&self) -> Result<Option<Arc<dyn LeaseStore>>, StoreError> {
        let again = self.inner.connect_again().await?;
        Ok(again.map(|inner| Arc::new(MeteredStore::new(inner, self.metrics.clone())) as Arc<dyn LeaseStore>))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.metered("get", self.inner.get(key)).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError> {
        self.metered("get_prefix", self.inner.get_prefix(prefix)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        self.metered("txn", self.inner.txn(txn)).await
    }

    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError> {
        let again = !self.watched.lock().unwrap_or_else(|p| p.into_inner()).insert(prefix.to_string());
        if again {
            self.metrics.watch_resyncs.inc();
        }
        let stream = self.metered("watch_prefix", self.inner.watch_prefix(prefix, from_revision)).await?;
        // Errors arriving on the stream (a broken watch) count as `watch` errors.
        let metrics = self.metrics.clone();
        Ok(stream
            .inspect(move |item| {
                if let Err(error) = item {
                    record_error(&metrics, "watch", error);
                }
            })
            .boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.metered("compact", self.inner.compact(revision)).await
    }

    fn watch_progress_every(&self) -> Option<Duration> {
        self.inner.watch_progress_every()
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        session: Option<SessionId>,
    ) -> Result<Revision, StoreError> {
        self.metered("put", self.inner.put(key, value, session)).await
    }

    async fn delete(&self, key: &str) -> Result<Revision, StoreError> {
        self.metered("delete", self.inner.delete(key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, Op};

    #[tokio::test]
    async fn records_latency_errors_and_rereads() {
        let metrics = Arc::new(Metrics::new());
        let store = MeteredStore::new(Arc::new(MemoryStore::new()), metrics.clone());
        store.txn(Txn::new().then(Op::put("/p/a", b"1".to_vec()))).await.unwrap();
        store.get("/p/a").await.unwrap();
        let err = store.keep_alive(SessionId(12345)).await.unwrap_err();
        assert!(matches!(err, StoreError::SessionExpired(_)), "{err}");
        let _first = store.watch_prefix("/p/", 1).await.unwrap();
        let _again = store.watch_prefix("/p/", 1).await.unwrap();
        let text = metrics.encode();
        for line in [
            "kafka_assigner_store_request_duration_seconds_count{op=\"txn\"} 1",
            "kafka_assigner_store_request_duration_seconds_count{op=\"get\"} 1",
            "kafka_assigner_store_errors_total{op=\"keep_alive\",kind=\"session_expired\"} 1",
            "kafka_assigner_watch_resyncs_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
