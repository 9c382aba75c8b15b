//! The fleet machine driven over the store model (`store::StoreModel`), every request
//! answered at once and every watch batch delivered after it: what each consumer is told,
//! against what the store holds. The whole-cluster simulation drives it under faults.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Instance;
use crate::coordinator::fleet_backend::FleetConfig;
use crate::coordinator::fleet_backend::records::{FleetKeys, LeaseRecord};
use crate::coordinator::machine::Start;
use crate::coordinator::machine::io::{
    Call, Effect, Input, LeaseState, Micros, Replied, StoreReply, StoreRequest, StreamId,
};
use crate::coordinator::shared::records::decode;
use crate::proto::v1::{DeregisterAction, assignment_command::Command};
use crate::store::{StoreModel, WatchCursor};

const TTL: Duration = Duration::from_secs(2);
const START: Micros = 1_760_000_000_000_000;

/// One fleet instance over a store model.
struct Rig {
    instance: Instance,
    store: StoreModel,
    watch: Option<(u64, WatchCursor)>,
    now: Micros,
    /// What each stream was told it owns, from the commands it was sent.
    owned: BTreeMap<StreamId, BTreeSet<u32>>,
    ended: BTreeSet<StreamId>,
    replies: BTreeMap<u64, Result<Replied, crate::coordinator::CoordinatorError>>,
    wake: Option<Micros>,
    keys: FleetKeys,
}

impl Rig {
    fn new(partitions: u32) -> Self {
        Self::watched(partitions, None)
    }

    /// A rig whose watches send a progress mark every `progress_every` (the store model
    /// sends none: a quiet watch is silent).
    fn watched(partitions: u32, progress_every: Option<Duration>) -> Self {
        let mut config = FleetConfig {
            lease_ttl: TTL,
            claim_interval: Duration::from_millis(200),
            ..FleetConfig::default()
        };
        config.instance_id = "i0".into();
        config.topic_partitions.insert("t".into(), partitions);
        let keys = FleetKeys::new(&config.prefix);
        let start = Start {
            origin: tokio::time::Instant::now(),
            nonce: 7,
            watch_progress_every: progress_every,
            plan_nanos_per_partition: 0,
            plans_timed: false,
        };
        let (instance, effects) = Instance::new(config, start, START);
        let mut rig = Rig {
            instance,
            store: StoreModel::new(),
            watch: None,
            now: START,
            owned: BTreeMap::new(),
            ended: BTreeSet::new(),
            replies: BTreeMap::new(),
            wake: None,
            keys,
        };
        rig.apply(effects);
        let session = rig.store.grant_session(rig.elapsed(), TTL * 10).expect("a session");
        rig.step(Input::Lease(LeaseState::Live(session)));
        rig
    }

    fn elapsed(&self) -> Duration {
        Duration::from_micros(self.now - START)
    }

    fn step(&mut self, input: Input) {
        let effects = self.instance.step(self.now, input);
        self.apply(effects);
    }

    /// Applies `effects`, answering store requests at once and delivering watch batches.
    fn apply(&mut self, effects: Vec<Effect>) {
        let mut inputs = Vec::new();
        for effect in effects {
            match effect {
                Effect::Store { request, op } => {
                    let now = self.elapsed();
                    let answer = match op {
                        StoreRequest::Txn(txn) => self.store.txn(now, &txn).map(StoreReply::Txn),
                        StoreRequest::Get(keys) => {
                            Ok(StoreReply::Values(keys.iter().map(|k| self.store.get(now, k)).collect()))
                        }
                        StoreRequest::GetPrefix(prefix) => {
                            Ok(StoreReply::Prefix(self.store.get_prefix(now, &prefix)))
                        }
                        StoreRequest::Watch { prefix, from } => {
                            let cursor = self.store.watch(&prefix, from).expect("watch");
                            self.watch = Some((request, cursor));
                            Ok(StoreReply::Watching)
                        }
                    };
                    inputs.push(Input::StoreAnswer { request, answer });
                }
                Effect::Command { stream, command } => {
                    let Some(Command::Assignment(update)) = command.command else { panic!("no handoffs") };
                    let owned = self.owned.entry(stream).or_default();
                    owned.extend(update.assigned.iter().map(|tp| tp.partition));
                    for tp in &update.unassigned {
                        owned.remove(&tp.partition);
                    }
                }
                Effect::EndStream { stream, .. } => {
                    self.ended.insert(stream);
                }
                Effect::Reply { call, reply } => {
                    self.replies.insert(call, reply);
                }
                Effect::WakeAt(at) => self.wake = Some(at),
                _ => {}
            }
        }
        for input in inputs {
            self.step(input);
            self.deliver();
        }
    }

    /// Delivers what the watch has.
    fn deliver(&mut self) {
        let Some((watch, mut cursor)) = self.watch.take() else { return };
        let batches = self.store.poll(&mut cursor).expect("poll");
        self.watch = Some((watch, cursor));
        for batch in batches {
            self.step(Input::Watched { watch, batch });
        }
    }

    /// Lets `d` pass, firing the timer on the way.
    fn run_for(&mut self, d: Duration) {
        let until = self.now + d.as_micros() as Micros;
        while let Some(at) = self.wake.filter(|at| *at <= until) {
            self.wake = None;
            self.now = self.now.max(at);
            self.store.expire_due(self.elapsed());
            self.step(Input::TimerFired);
            self.deliver();
        }
        self.now = until;
    }

    fn register(&mut self, call: u64, stream: StreamId, consumer: &str) {
        let body = Call::Register { stream, consumer: consumer.into(), topic: "t".into(), incarnation: 0 };
        self.step(Input::Call { call, body });
        self.deliver();
    }

    /// The stored lease owners.
    fn leases(&mut self) -> BTreeMap<u32, String> {
        let stored = self.store.get_prefix(self.elapsed(), &self.keys.leases("t"));
        stored
            .kvs
            .iter()
            .filter_map(|kv| {
                let p = kv.key.rsplit('/').next()?.parse().ok()?;
                Some((p, decode::<LeaseRecord>("lease", &kv.value).ok()?.owner))
            })
            .collect()
    }
}

#[test]
fn two_consumers_split_the_partitions_and_each_is_told_exactly_its_leases() {
    let mut rig = Rig::new(4);
    rig.register(1, 10, "a");
    assert!(matches!(rig.replies.get(&1), Some(Ok(Replied::Registered))), "{:?}", rig.replies);
    rig.run_for(Duration::from_secs(1));
    assert_eq!(rig.owned[&10], BTreeSet::from([0, 1, 2, 3]), "a alone claims everything");
    rig.register(2, 20, "b");
    rig.run_for(Duration::from_secs(2));
    let leases = rig.leases();
    let held =
        |name: &str| leases.iter().filter(|(_, o)| *o == name).map(|(p, _)| *p).collect::<BTreeSet<_>>();
    assert_eq!((held("a").len(), held("b").len()), (2, 2), "{leases:?}");
    assert_eq!(rig.owned[&10], held("a"));
    assert_eq!(rig.owned[&20], held("b"));
}

#[test]
fn a_deregistered_consumer_hears_unassigned_its_stream_ends_and_its_leases_move() {
    let mut rig = Rig::new(4);
    rig.register(1, 10, "a");
    rig.register(2, 20, "b");
    rig.run_for(Duration::from_secs(2));
    assert_eq!(rig.owned[&10].len(), 2);
    rig.step(Input::Call { call: 3, body: Call::Deregister { consumer: "a".into(), wants_drain: true } });
    rig.deliver();
    assert!(
        matches!(rig.replies.get(&3), Some(Ok(Replied::Deregistered(DeregisterAction::ShutdownNow)))),
        "{:?}",
        rig.replies
    );
    rig.run_for(Duration::from_secs(1));
    assert!(rig.ended.contains(&10), "a's stream ends");
    assert!(rig.owned[&10].is_empty(), "a was told it owns nothing");
    assert_eq!(rig.owned[&20], BTreeSet::from([0, 1, 2, 3]), "b has them well within the TTL");
    let member = rig.store.get(rig.elapsed(), &rig.keys.member("t", "a"));
    assert!(member.is_none(), "a's registration is deleted");
}

#[test]
fn a_stream_that_closes_keeps_its_leases_for_the_ttl_then_they_move() {
    let mut rig = Rig::new(4);
    rig.register(1, 10, "a");
    rig.register(2, 20, "b");
    rig.run_for(Duration::from_secs(2));
    rig.step(Input::StreamClosed { stream: 10 });
    rig.run_for(TTL / 2);
    assert_eq!(rig.leases().values().filter(|o| *o == "a").count(), 2, "held for the TTL");
    assert_eq!(rig.owned[&20].len(), 2);
    rig.run_for(TTL * 2);
    assert_eq!(rig.owned[&20], BTreeSet::from([0, 1, 2, 3]));
    assert!(rig.leases().values().all(|o| o == "b"));
}

#[test]
fn handoff_calls_are_refused_and_a_new_incarnation_keeps_its_leases_with_higher_epochs() {
    let mut rig = Rig::new(2);
    rig.register(1, 10, "a");
    rig.run_for(Duration::from_secs(1));
    let body = Call::PartitionReady { consumer: "a".into(), topic: "t".into(), partition: 0 };
    rig.step(Input::Call { call: 2, body });
    assert!(matches!(rig.replies.get(&2), Some(Err(crate::coordinator::CoordinatorError::NoHandoffs(_)))));
    let epoch = |rig: &mut Rig, p: u32| {
        let kv = rig.store.get(rig.elapsed(), &rig.keys.lease("t", p)).expect("leased");
        decode::<LeaseRecord>("lease", &kv.value).expect("lease").epoch
    };
    let before = epoch(&mut rig, 0);
    rig.now += 1_000;
    rig.register(3, 11, "a");
    assert!(matches!(rig.replies.get(&3), Some(Ok(Replied::Registered))), "{:?}", rig.replies);
    assert!(rig.ended.contains(&10), "the old stream ends replaced");
    assert_eq!(rig.owned[&11], BTreeSet::from([0, 1]), "nothing moved");
    assert!(epoch(&mut rig, 0) > before, "the new incarnation's epoch is raised");
}

/// A busy instance does not fence itself for being busy: a step long after the silence
/// bound it asked to be woken by finds the instance, not the watch, slow, and the bound
/// starts afresh from it; a watch silent for that bound, noticed on time, fences.
#[test]
fn a_silence_noticed_late_keeps_the_streams_and_one_noticed_on_time_fences_them() {
    let every = TTL / 4;
    let mut rig = Rig::watched(4, Some(every));
    rig.register(1, 10, "a");
    rig.run_for(Duration::from_secs(1));
    assert_eq!(rig.owned[&10].len(), 4);
    let bound = crate::coordinator::shared::mirror::silence_bound(TTL * 3 / 4, every);
    // Stalled for twice the TTL (the timer too): the first step after is late.
    rig.now += (TTL * 2).as_micros() as Micros;
    rig.step(Input::TimerFired);
    assert!(!rig.ended.contains(&10), "a silence noticed late keeps the stream");
    assert!(rig.instance.renews(), "the lease is kept alive");
    rig.run_for(bound - Duration::from_micros(1));
    assert!(!rig.ended.contains(&10), "within a fresh bound of the late step");
    rig.run_for(Duration::from_micros(1));
    assert!(rig.ended.contains(&10), "silent for a bound, noticed on time: fenced");
}
