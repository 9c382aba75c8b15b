//! The weights refresh of each leader group's leader (docs/design.md §11; the running
//! leader's `leader/weights.rs`): every `weights_refresh` while it leads, the leader asks
//! the weight source for its group's topics ([`Effect::LookUpWeights`]) and queues, for
//! each topic whose weights changed meaningfully (`leader/weights.rs::to_store`), a write
//! fenced by its leadership and compare-and-swap on the record as cached.

use std::collections::BTreeMap;

use super::leader::Step;
use super::{Instance, Waiting};
use crate::coordinator::handoff_backend::leader::weights::to_store;
use crate::coordinator::handoff_backend::records::{TopicRecord, encode};
use crate::coordinator::machine::io::{Effect, Micros, RequestId};
use crate::store::{Compare, Op, StoreError, Txn, TxnOutcome};

impl Instance {
    /// Group `g`'s leader asks for its topics' weights when due.
    pub(super) fn ask_weights(&mut self, g: usize) {
        let Some(fence) = self.leaders[g].fence else { return };
        if self.config.weights.is_none() || self.now < self.leaders[g].next_weights {
            return;
        }
        let Some(cache) = self.cache.as_ref() else { return };
        let group = self.leaders[g].group();
        self.leaders[g].next_weights = self.now + self.config.weights_refresh.as_micros() as Micros;
        let topics: Vec<String> = cache
            .topics
            .iter()
            .filter(|(topic, entry)| group.plans(topic) && entry.config.is_some())
            .map(|(topic, _)| topic.clone())
            .collect();
        if topics.is_empty() {
            return;
        }
        let request = self.next_request;
        self.next_request += 1;
        self.waiting.insert(request, Waiting::Weights(g, fence));
        self.out.push(Effect::LookUpWeights { request, topics });
    }

    /// The weight source's answer: the meaningful changes are queued as fenced writes.
    pub(super) fn weights_given(
        &mut self,
        request: RequestId,
        weights: BTreeMap<String, BTreeMap<u32, u64>>,
    ) {
        let Some(Waiting::Weights(g, fence)) = self.waiting.remove(&request) else { return };
        let Some(cache) = self.cache.as_ref() else { return };
        let Some(me) = self.leaders.get_mut(g).filter(|me| me.fence == Some(fence)) else { return };
        let leader_key = self.keys.leader(me.group());
        for (topic, wanted) in weights {
            let Some(config) = cache.topics.get(&topic).and_then(|entry| entry.config.as_ref()) else {
                continue;
            };
            let Some(stored) = to_store(&config.value.weights, &wanted, config.value.partition_count) else {
                continue;
            };
            let weighted = stored.len();
            let record = TopicRecord { weights: stored, ..config.value.clone() };
            let key = self.keys.topic(&topic);
            let txn = Txn::new()
                .when(Compare::CreateRevision(leader_key.clone(), fence.revision))
                .when(Compare::ModRevision(key.clone(), config.mod_revision))
                .then(Op::put(&key, encode(&record)));
            me.queue.push_back(Step::Weights(topic, txn, weighted));
        }
    }

    /// What the store answered group `g`'s weights write of `topic`.
    pub(super) fn weights_answered(
        &mut self,
        g: usize,
        topic: &str,
        weighted: usize,
        outcome: Result<TxnOutcome, StoreError>,
    ) {
        match outcome {
            Ok(outcome) if outcome.succeeded => {
                self.leaders[g].written = self.leaders[g].written.max(outcome.revision);
                tracing::info!(topic, weighted, "partition weights stored");
            }
            Ok(_) => tracing::debug!(topic, "weights refresh raced a change (or leadership was lost)"),
            Err(error) => tracing::warn!(%error, topic, "weights refresh: cannot store the weights"),
        }
    }

    /// When a leader's next weights refresh is due.
    pub(super) fn weights_wake(&self) -> impl Iterator<Item = Micros> + '_ {
        let weighs = self.config.weights.is_some() && self.cache.is_some();
        self.leaders.iter().filter(move |me| weighs && me.fence.is_some()).map(|me| me.next_weights)
    }
}
