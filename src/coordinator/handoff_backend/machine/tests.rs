//! One instance driven by hand over a store answered in the test (pure: a map of records
//! with revisions and compares, no tokio, no `MemoryStore`).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::Instance;
use crate::coordinator::handoff_backend::HandoffConfig;
use crate::coordinator::handoff_backend::records::Keys;
use crate::coordinator::machine::io::{
    Call, Effect, EndReason, Input, LeaseState, Micros, Replied, StoreReply, StoreRequest,
};
use crate::coordinator::{CoordinatorError, StreamEnd};
use crate::mutation::{Mutation, with_mutation};
use crate::proto::v1::assignment_command::Command;
use crate::store::{
    Compare, KeyValue, Op, PrefixSnapshot, Revision, SessionId, Txn, TxnOutcome, WatchBatch, WatchEvent,
    WatchEventKind,
};

/// A store in the test: records with their revisions, compare-and-swap, one watch.
#[derive(Default)]
struct TestStore {
    kvs: BTreeMap<String, KeyValue>,
    revision: Revision,
    /// The watch: its request id and the revision it delivers from.
    watch: Option<u64>,
    /// Every transaction asked for, in order, with whether it succeeded.
    txns: Vec<(Txn, bool)>,
}

impl TestStore {
    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, rev) => self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *rev,
            Compare::CreateRevision(key, rev) => self.kvs.get(key).map_or(0, |kv| kv.create_revision) == *rev,
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|kv| kv.value == *value),
        }
    }

    /// Applies `txn`; the watch's batch when it wrote.
    fn txn(&mut self, txn: &Txn) -> (TxnOutcome, Option<WatchBatch>) {
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
struct Harness {
    instance: Instance,
    store: TestStore,
    now: Micros,
    seen: Vec<Effect>,
    keys: Keys,
}

const START: Micros = 1_700_000_000_000_000;
const SESSION: SessionId = SessionId(100);

impl Harness {
    fn new() -> Self {
        let config = HandoffConfig {
            instance_id: "i0".into(),
            prefix: "/k/".into(),
            topic_partitions: BTreeMap::from([("t".to_string(), 2)]),
            ..HandoffConfig::default()
        };
        let keys = Keys::new(&config.prefix);
        let (instance, effects) = Instance::new(config, tokio::time::Instant::now(), START);
        let mut harness =
            Harness { instance, store: TestStore::default(), now: START, seen: Vec::new(), keys };
        harness.run(effects);
        harness.input(Input::Lease(LeaseState::Live(SESSION)));
        harness
    }

    /// Answers every store request at once (a write's watch batch right after its answer)
    /// and keeps the other effects.
    fn run(&mut self, effects: Vec<Effect>) {
        let mut queue: VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            let Effect::Store { request, op } = effect else {
                self.seen.push(effect);
                continue;
            };
            let mut batch = None;
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
            if let (Some(batch), Some(watch)) = (batch, self.store.watch) {
                queue.extend(self.instance.step(self.now, Input::Watched { watch, batch }));
            }
        }
    }

    fn input(&mut self, input: Input) {
        let effects = self.instance.step(self.now, input);
        self.run(effects);
    }

    /// Moves the clock on by `by` and fires the timer.
    fn advance(&mut self, by: Duration) {
        self.now += by.as_micros() as Micros;
        self.input(Input::TimerFired);
    }

    fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.seen)
    }

    fn register(&mut self, call: u64, stream: u64, consumer: &str) {
        let body = Call::Register { stream, consumer: consumer.into(), topic: "t".into(), incarnation: 0 };
        self.input(Input::Call { call, body });
    }
}

/// The commands sent on `stream`, in order.
fn commands(effects: &[Effect], stream: u64) -> Vec<Command> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Command { stream: s, command } if *s == stream => command.command.clone(),
            _ => None,
        })
        .collect()
}

fn reply(effects: &[Effect], call: u64) -> Option<&Result<Replied, CoordinatorError>> {
    effects.iter().find_map(|e| match e {
        Effect::Reply { call: c, reply } if *c == call => Some(reply),
        _ => None,
    })
}

/// Two consumers registered, `a` owning both partitions, then `b` warming one of them:
/// returns the partition being warmed.
fn handoff_under_way(h: &mut Harness) -> u32 {
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

#[test]
fn a_register_is_written_with_a_compare_and_answered_with_its_snapshot() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let effects = h.take();
    assert!(matches!(reply(&effects, 1), Some(Ok(Replied::Registered))), "{effects:?}");
    let key = h.keys.consumer("t", "a");
    let (txn, _) =
        h.store.txns.iter().find(|(t, _)| t.ops.iter().any(|op| op.key() == key)).expect("written");
    assert!(txn.compares.contains(&Compare::ModRevision(key.clone(), 0)), "{txn:?}");
    assert!(matches!(&txn.ops[0], Op::Put { session: Some(s), .. } if *s == SESSION), "bound to the lease");
    let first = commands(&effects, 11);
    assert!(
        matches!(first.first(), Some(Command::Assignment(u)) if u.assigned.is_empty() && u.unassigned.is_empty()),
        "the first message is the (empty) snapshot: {first:?}"
    );
}

#[test]
fn a_ready_commits_and_the_new_owner_hears_assigned_before_the_old_owner_hears_its_release() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let effects = h.take();
    assert!(matches!(reply(&effects, 3), Some(Ok(Replied::Applied))), "{effects:?}");
    let (txn, ok) = h.store.txns.last().expect("written");
    assert!(ok);
    assert!(txn.compares.contains(&Compare::ModRevision(
        h.keys.handoff("t", partition),
        txn_rev(txn, &h.keys.handoff("t", partition))
    )));
    let order: Vec<(u64, &Command)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Command { stream, command } => command.command.as_ref().map(|c| (*stream, c)),
            _ => None,
        })
        .collect();
    let assigned = order.iter().position(|(s, c)| {
        *s == 12 && matches!(c, Command::Assignment(u) if u.assigned.iter().any(|p| p.partition == partition))
    });
    let released = order.iter().position(|(s, c)| *s == 11 && matches!(c, Command::Release(_)));
    assert!(assigned.is_some() && released.is_some(), "{order:?}");
    assert!(assigned < released, "the new owner hears first: {order:?}");
}

/// The revision `txn` compares `key` with.
fn txn_rev(txn: &Txn, key: &str) -> Revision {
    txn.compares
        .iter()
        .find_map(|c| match c {
            Compare::ModRevision(k, r) if k == key => Some(*r),
            _ => None,
        })
        .unwrap_or(-1)
}

#[test]
fn without_its_handoff_compare_a_ready_writes_unguarded() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    with_mutation(Mutation::HandoffCompareDropped, || h.input(Input::Call { call: 3, body: ready }));
    let (txn, _) = h.store.txns.last().expect("written");
    assert_eq!(
        txn_rev(txn, &h.keys.handoff("t", partition)),
        -1,
        "the mutation reaches the machine: {txn:?}"
    );
}

#[test]
fn a_fenced_lease_ends_the_streams_and_refuses_calls() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    h.input(Input::Lease(LeaseState::Fenced(SESSION)));
    let effects = h.take();
    for stream in [11, 12] {
        let ended = effects.iter().any(|e| {
            matches!(e, Effect::EndStream { stream: s, reason: EndReason::Disconnected, error: Some(CoordinatorError::StreamEnded(StreamEnd::Fenced, _)) } if *s == stream)
        });
        assert!(ended, "stream {stream} ends fenced: {effects:?}");
    }
    assert!(effects.iter().any(|e| matches!(e, Effect::Ready(false))), "not ready: {effects:?}");
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let effects = h.take();
    assert!(matches!(reply(&effects, 3), Some(Err(CoordinatorError::NoSession(_)))), "{effects:?}");
}

#[test]
fn with_self_fencing_skipped_a_fenced_lease_leaves_the_streams_open() {
    let mut h = Harness::new();
    handoff_under_way(&mut h);
    with_mutation(Mutation::SelfFenceSkipped, || h.input(Input::Lease(LeaseState::Fenced(SESSION))));
    let effects = h.take();
    assert!(!effects.iter().any(|e| matches!(e, Effect::EndStream { .. })), "{effects:?}");
}

#[test]
fn a_leader_campaigns_on_absence_and_every_plan_batch_compares_its_fence() {
    let mut h = Harness::new();
    let leader = h.keys.leader();
    let campaign =
        h.store.txns.iter().find(|(t, _)| t.ops.iter().any(|op| op.key() == leader)).expect("campaigned");
    assert_eq!(campaign.0.compares, vec![Compare::CreateRevision(leader.clone(), 0)]);
    assert!(h.take().iter().any(|e| matches!(e, Effect::Leading(true))));
    let fence = h.store.kvs.get(&leader).expect("the key").create_revision;
    handoff_under_way(&mut h);
    let plans: Vec<&Txn> = h
        .store
        .txns
        .iter()
        .map(|(t, _)| t)
        .filter(|t| {
            t.ops
                .iter()
                .any(|op| op.key().starts_with("/k/assignments/") || op.key().starts_with("/k/handoffs/"))
        })
        .collect();
    assert!(plans.len() >= 2, "the direct assignment and the handoff were planned: {plans:?}");
    for plan in plans {
        assert_eq!(plan.compares.first(), Some(&Compare::CreateRevision(leader.clone(), fence)), "{plan:?}");
    }
}

#[test]
fn without_its_fence_the_leaders_plan_is_unguarded() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    let leader = h.keys.leader();
    with_mutation(Mutation::LeaderUnfenced, || h.advance(Duration::from_millis(400)));
    let (plan, _) = h.store.txns.last().expect("planned");
    assert!(plan.ops.iter().any(|op| op.key().starts_with("/k/assignments/")), "{plan:?}");
    assert!(
        !plan.compares.iter().any(|c| matches!(c, Compare::CreateRevision(k, _) if *k == leader)),
        "{plan:?}"
    );
}

#[test]
fn a_stream_that_closes_keeps_its_registration_for_the_ttl_then_it_is_deleted() {
    let mut h = Harness::new();
    h.register(1, 11, "a");
    h.input(Input::StreamClosed { stream: 11 });
    let key = h.keys.consumer("t", "a");
    h.advance(Duration::from_secs(5));
    assert!(h.store.kvs.contains_key(&key), "kept within the TTL");
    h.advance(Duration::from_secs(6));
    assert!(!h.store.kvs.contains_key(&key), "deleted after the TTL");
}

#[test]
fn the_same_inputs_give_the_same_effects() {
    let trace = || {
        let mut h = Harness::new();
        handoff_under_way(&mut h);
        format!("{:?}", h.store.txns)
    };
    assert_eq!(trace(), trace());
}
