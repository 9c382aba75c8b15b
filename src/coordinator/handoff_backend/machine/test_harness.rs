//! What the tests drive one instance with: a store answered in the test (pure: a map of
//! records with revisions and compares, no tokio, no `MemoryStore`) and a harness that
//! answers every request at once.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{Instance, Start};
use crate::coordinator::CoordinatorError;
use crate::coordinator::handoff_backend::HandoffConfig;
use crate::coordinator::handoff_backend::records::Keys;
use crate::coordinator::machine::io::{
    Call, Effect, Input, LeaseState, Micros, Replied, StoreReply, StoreRequest,
};
use crate::proto::v1::assignment_command::Command;
use crate::store::{
    Compare, KeyValue, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn, TxnOutcome, WatchBatch,
    WatchEvent, WatchEventKind,
};

/// A store in the test: records with their revisions, compare-and-swap, one watch.
#[derive(Default)]
pub(super) struct TestStore {
    pub(super) kvs: BTreeMap<String, KeyValue>,
    pub(super) revision: Revision,
    /// The watch: its request id and the revision it delivers from.
    pub(super) watch: Option<u64>,
    /// Every transaction asked for, in order, with whether it succeeded.
    pub(super) txns: Vec<(Txn, bool)>,
    /// Out of reach: every request fails.
    pub(super) down: bool,
    /// While `Some`, the watch lags: its batches wait here.
    pub(super) lagging: Option<Vec<WatchBatch>>,
    /// Answers are lost: requests are taken and never answered.
    pub(super) vanish: bool,
}

impl TestStore {
    pub(super) fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, rev) => self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *rev,
            Compare::CreateRevision(key, rev) => self.kvs.get(key).map_or(0, |kv| kv.create_revision) == *rev,
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|kv| kv.value == *value),
        }
    }

    /// Applies `txn`; the watch's batch when it wrote.
    pub(super) fn txn(&mut self, txn: &Txn) -> (TxnOutcome, Option<WatchBatch>) {
        let succeeded = txn.compares.iter().all(|c| self.holds(c));
        self.txns.push((txn.clone(), succeeded));
        if !succeeded || txn.ops.is_empty() {
            return (TxnOutcome { succeeded, revision: self.revision }, None);
        }
        self.revision += 1;
        let revision = self.revision;
        let mut events = Vec::new();
        for op in &txn.ops {
            let kind = match op {
                Op::Put { key, value, session } => {
                    let create_revision = self.kvs.get(key).map_or(revision, |kv| kv.create_revision);
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision,
                        mod_revision: revision,
                        session: *session,
                    };
                    self.kvs.insert(key.clone(), kv.clone());
                    WatchEventKind::Put(kv)
                }
                Op::Delete { key } => {
                    self.kvs.remove(key);
                    WatchEventKind::Delete
                }
            };
            events.push(WatchEvent { key: op.key().to_string(), revision, kind });
        }
        (TxnOutcome { succeeded: true, revision }, Some(WatchBatch { revision, events }))
    }
}

/// An instance, its store, and the effects it produced that are not store requests.
pub(super) struct Harness {
    pub(super) instance: Instance,
    pub(super) store: TestStore,
    pub(super) now: Micros,
    pub(super) seen: Vec<Effect>,
    pub(super) keys: Keys,
    /// The instance's last `WakeAt`, until the timer fires for it.
    pub(super) wake: Option<Micros>,
}

pub(super) const START: Micros = 1_700_000_000_000_000;
pub(super) const SESSION: SessionId = SessionId(100);

impl Harness {
    pub(super) fn new() -> Self {
        Self::life(1, TestStore::default(), None)
    }

    /// An instance in its life `nonce` over `store`, whose watches send a progress mark
    /// every `progress_every`, once its first read (if answered) and its lease are in.
    pub(super) fn life(nonce: u64, store: TestStore, progress_every: Option<Duration>) -> Self {
        Self::configured(nonce, store, progress_every, |_| {})
    }

    /// [`Harness::life`] with its config changed by `change` first.
    pub(super) fn configured(
        nonce: u64,
        store: TestStore,
        progress_every: Option<Duration>,
        change: impl FnOnce(&mut HandoffConfig),
    ) -> Self {
        let mut config = HandoffConfig {
            instance_id: "i0".into(),
            prefix: "/k/".into(),
            topic_partitions: BTreeMap::from([("t".to_string(), 2)]),
            ..HandoffConfig::default()
        };
        change(&mut config);
        let keys = Keys::new(&config.prefix);
        let start = Start {
            origin: tokio::time::Instant::now(),
            nonce,
            watch_progress_every: progress_every,
            plan_nanos_per_partition: 0,
            plans_timed: false,
        };
        let (instance, effects) = Instance::new(config, start, START);
        let mut harness = Harness { instance, store, now: START, seen: Vec::new(), keys, wake: None };
        harness.run(effects);
        harness.input(Input::Lease(LeaseState::Live(SESSION)));
        harness
    }

    /// Answers every store request at once (a write's watch batch right after its answer)
    /// and keeps the other effects.
    pub(super) fn run(&mut self, effects: Vec<Effect>) {
        let mut queue: VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            let Effect::Store { request, op } = effect else {
                if let Effect::WakeAt(at) = effect {
                    self.wake = Some(at);
                }
                self.seen.push(effect);
                continue;
            };
            let mut batch = None;
            if self.store.vanish {
                continue;
            }
            if self.store.down && !matches!(op, StoreRequest::Watch { .. }) {
                let answer =
                    Err(StoreError::Unavailable(crate::store::InjectedFault::CutOff { what: "txn" }.into()));
                queue.extend(self.instance.step(self.now, Input::StoreAnswer { request, answer }));
                continue;
            }
            let answer = match &op {
                StoreRequest::Txn(txn) => {
                    let (outcome, written) = self.store.txn(txn);
                    batch = written;
                    StoreReply::Txn(outcome)
                }
                StoreRequest::Get(keys) => {
                    StoreReply::Values(keys.iter().map(|k| self.store.kvs.get(k).cloned()).collect())
                }
                StoreRequest::GetPrefix(prefix) => StoreReply::Prefix(PrefixSnapshot {
                    kvs: self.store.kvs.values().filter(|kv| kv.key.starts_with(prefix)).cloned().collect(),
                    revision: self.store.revision,
                }),
                StoreRequest::Watch { .. } => {
                    self.store.watch = Some(request);
                    StoreReply::Watching
                }
            };
            queue.extend(self.instance.step(self.now, Input::StoreAnswer { request, answer: Ok(answer) }));
            if let (Some(batch), Some(lagging)) = (&batch, &mut self.store.lagging) {
                lagging.push(batch.clone());
            } else if let (Some(batch), Some(watch)) = (batch, self.store.watch) {
                queue.extend(self.instance.step(self.now, Input::Watched { watch, batch }));
            }
        }
    }

    pub(super) fn input(&mut self, input: Input) {
        let effects = self.instance.step(self.now, input);
        self.run(effects);
    }

    /// Moves the clock on by `by` and fires the timer (then, late or early).
    pub(super) fn advance(&mut self, by: Duration) {
        self.now += by.as_micros() as Micros;
        self.input(Input::TimerFired);
    }

    /// Lets `by` pass with the timer firing on time, at each wake the instance asks for.
    pub(super) fn run_for(&mut self, by: Duration) {
        let until = self.now + by.as_micros() as Micros;
        while let Some(at) = self.wake.filter(|at| *at <= until) {
            self.wake = None;
            self.now = self.now.max(at);
            self.input(Input::TimerFired);
        }
        self.now = until;
    }

    pub(super) fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.seen)
    }

    pub(super) fn register(&mut self, call: u64, stream: u64, consumer: &str) {
        let body = Call::Register { stream, consumer: consumer.into(), topic: "t".into(), incarnation: 0 };
        self.input(Input::Call { call, body });
    }
}

/// The commands sent on `stream`, in order.
pub(super) fn commands(effects: &[Effect], stream: u64) -> Vec<Command> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Command { stream: s, command } if *s == stream => command.command.clone(),
            _ => None,
        })
        .collect()
}

pub(super) fn reply(effects: &[Effect], call: u64) -> Option<&Result<Replied, CoordinatorError>> {
    effects.iter().find_map(|e| match e {
        Effect::Reply { call: c, reply } if *c == call => Some(reply),
        _ => None,
    })
}

/// Two consumers registered, `a` owning both partitions, then `b` warming one of them:
/// returns the partition being warmed.
pub(super) fn handoff_under_way(h: &mut Harness) -> u32 {
    h.register(1, 11, "a");
    h.advance(Duration::from_millis(400)); // the first joins settle, then the plan
    let a = commands(&h.take(), 11);
    assert!(
        a.iter().any(|c| matches!(c, Command::Assignment(u) if u.assigned.len() == 2)),
        "a owns both partitions: {a:?}"
    );
    h.register(2, 12, "b");
    h.advance(Duration::from_millis(10));
    let b = commands(&h.take(), 12);
    b.iter()
        .find_map(|c| match c {
            Command::Warm(w) => w.partition.as_ref().map(|p| p.partition),
            _ => None,
        })
        .unwrap_or_else(|| panic!("b is told to warm a partition: {b:?}"))
}

/// The revision `txn` compares `key` with.
pub(super) fn txn_rev(txn: &Txn, key: &str) -> Revision {
    txn.compares
        .iter()
        .find_map(|c| match c {
            Compare::ModRevision(k, r) if k == key => Some(*r),
            _ => None,
        })
        .unwrap_or(-1)
}

/// Deletes `key` in the store as its lease's expiry would, and delivers it on the watch.
pub(super) fn lose(h: &mut Harness, key: &str) {
    let (_, batch) = h.store.txn(&Txn::new().then(Op::delete(key)));
    let (Some(batch), Some(watch)) = (batch, h.store.watch) else { panic!("deleted and watched") };
    let effects = h.instance.step(h.now, Input::Watched { watch, batch });
    h.run(effects);
}
