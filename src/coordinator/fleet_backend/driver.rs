//! The fleet instance's loop: the one task that follows the store, relays each change to
//! the local streams and runs the local consumers' claim steps.
//!
//! Its inputs are events: the store's changes (the mirror's [`Follower`]), the local
//! streams that open ([`Claims::start`], from the shared registration) and those that
//! end without their consumer leaving, the consumers' calls (`PartitionReady` and
//! `PartitionReleased` are refused; a `Deregister` runs among the loop's store calls), the instance lease's state, the mirror's health,
//! the claim and upkeep timers
//! (`shared/upkeep.rs`: settling the ended streams' registrations after the TTL, writing
//! again those the store lost, fencing the streams while the mirror cannot follow the
//! store, the sweep of orphaned registrations), and the claim steps and the upkeep's
//! store calls that end. The loop relays a change in the turn that applied it,
//! before any claim step can look at the cache: a step decides on a cache whose every
//! change its consumer was told, so what it gives back is what the consumer was told it
//! owns.
//!
//! A claim step decides on the cache and then writes, and to give back waits for the
//! giver's transport (`claim.rs`, up to one TTL). It runs as a future the loop polls
//! beside its other inputs, one step per consumer at a time; a consumer woken while its
//! step runs steps again once it ended. With Kafka configured, the loop also refreshes the
//! stored topics' partition counts every `topic_refresh_interval`, one refresh at a time,
//! run among its store calls since Kafka may be slow (compare-and-swap: growth is
//! monotonic, so any instance may grow a topic).
//!
//! [`Follower`]: crate::coordinator::shared::mirror::Follower

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Fleet, calls, claim, relay};
use crate::coordinator::shared::instance::Call;
use crate::coordinator::shared::streams::StreamKey;
use crate::coordinator::shared::upkeep::{self, Upkeep, Worked};
use crate::store::Revision;

/// A local stream that opened: whose claim steps the loop runs from now on.
pub(super) struct Opened {
    key: StreamKey,
    registered_at: Revision,
    done: CancellationToken,
}

/// The way into the loop for the shared registration.
pub(super) struct Claims(mpsc::UnboundedSender<Opened>);

/// The receiving end of [`Claims`], for [`run`].
pub(super) struct Openings(mpsc::UnboundedReceiver<Opened>);

/// A loop's [`Claims`] and its receiving end.
pub(super) fn channel() -> (Claims, Openings) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Claims(tx), Openings(rx))
}

impl Claims {
    /// Has the loop run the claim steps of the stream `key`, registered at
    /// `registered_at`, until `done` (the stream's session ended).
    pub fn start(&self, key: StreamKey, registered_at: Revision, done: CancellationToken) {
        // Only a loop that ended (the instance stopped) refuses it; the stream ends too.
        let _ = self.0.send(Opened { key, registered_at, done });
    }
}

/// What the loop keeps of one local consumer.
struct Claimer {
    /// The revision of its last write: a step waits for the cache to reach it.
    seen: Revision,
    done: CancellationToken,
    /// A step of its is under way.
    running: bool,
    /// Something changed since its last step began: it steps (again).
    due: bool,
}

/// A store call of the loop's that ended.
enum Ended {
    /// A claim step of this consumer, whose last write was at this revision.
    Step(StreamKey, Revision),
    /// The upkeep's.
    Upkeep(Worked),
    /// A `Deregister`'s, answered already.
    Answered,
    /// The topic refresh's (it logged what it did).
    Refreshed,
}

/// Runs the loop until the instance stops (see the module docs).
pub(super) async fn run(inner: Arc<Fleet>, Openings(mut openings): Openings) {
    // Taken once, by this loop (the backend starts one).
    let Some(mut inbox) = inner.core.calls() else { return };
    let mut follower = inner.core.follower(inner.config.resync_interval);
    let mut timer = tokio::time::interval(inner.config.claim_interval);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut upkeep = Upkeep::new(inner.core.lease_ttl(), Instant::now());
    let mut upkept = upkeep::Inputs::new(&*inner);
    let every = inner.config.topic_refresh_interval;
    let mut refresh_timer = tokio::time::interval_at(Instant::now() + every, every);
    refresh_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let refreshes = inner.core.topics().source.is_some();
    let mut refreshing = false;
    let mut claimers: HashMap<StreamKey, Claimer> = HashMap::new();
    let mut steps: FuturesUnordered<BoxFuture<'static, Ended>> = FuturesUnordered::new();
    loop {
        for work in upkeep::run_due(&mut upkeep, &inner, Instant::now()) {
            steps.push(Box::pin(async move { Ended::Upkeep(work.await) }));
        }
        tokio::select! {
            changes = follower.next() => {
                let Some(changes) = changes else { break };
                let cache = inner.core.mirror().read();
                relay::relay(&inner, &cache, &changes);
                inner.core.mirror().announce(&cache);
                claimers.values_mut().for_each(|c| c.due = true);
            }
            Some(Opened { key, registered_at, done }) = openings.recv() => {
                // Its first step waits for the cache to hold its registration.
                let claimer = Claimer { seen: registered_at, done, running: false, due: true };
                claimers.insert(key, claimer);
            }
            Some(call) = inbox.recv() => match call {
                Call::Handoff { reply, .. } => {
                    let _ = reply.send(Err(calls::no_handoffs()));
                }
                Call::Leave { consumer, reply, .. } => {
                    let inner = inner.clone();
                    steps.push(Box::pin(async move {
                        let _ = reply.send(calls::deregister(&inner, &consumer).await);
                        Ended::Answered
                    }));
                }
            },
            _ = timer.tick() => claimers.values_mut().for_each(|c| c.due = true),
            _ = refresh_timer.tick(), if refreshes && !refreshing => {
                refreshing = true;
                let inner = inner.clone();
                steps.push(Box::pin(async move {
                    inner.core.grow_topics(None, |_| true, || !inner.core.shutdown().is_cancelled()).await;
                    Ended::Refreshed
                }));
            }
            (_, work) = upkept.next(&mut upkeep, &inner) => if let Some(work) = work {
                steps.push(Box::pin(async move { Ended::Upkeep(work.await) }));
            },
            Some(ended) = steps.next(), if !steps.is_empty() => match ended {
                Ended::Step(key, seen) => if let Some(claimer) = claimers.get_mut(&key) {
                    claimer.running = false;
                    claimer.seen = claimer.seen.max(seen);
                },
                Ended::Upkeep(worked) => upkeep.worked(worked),
                Ended::Answered => {}
                Ended::Refreshed => refreshing = false,
            },
        }
        claimers.retain(|_, c| c.running || !c.done.is_cancelled());
        for (key, claimer) in claimers.iter_mut().filter(|(_, c)| c.due && !c.running) {
            claimer.due = false;
            claimer.running = true;
            let step = claim::step(inner.clone(), key.clone(), claimer.seen, claimer.done.clone());
            steps.push(Box::pin(async move {
                let (key, seen) = step.await;
                Ended::Step(key, seen)
            }));
        }
    }
    // Their transports end the streams (`Core::begin_shutdown`, `crash`); no more relay.
    inner.core.streams().drop_all();
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use futures::StreamExt;

    use super::super::{FleetConfig, FleetCoordinator};
    use crate::coordinator::ConsumerGroupCoordinator;
    use crate::coordinator::shared::outgoing::update;
    use crate::coordinator::shared::topics::testing::HeldCounts;
    use crate::metrics::Metrics;
    use crate::store::{LeaseStore, MemoryStore};

    const TTL: Duration = Duration::from_secs(3);

    /// The topic refresh runs among the loop's store calls: while Kafka holds its answer
    /// back, the loop goes on (a consumer of another topic is told its partitions at
    /// once), and once Kafka answers, the topic's new partitions reach its consumer.
    #[tokio::test(start_paused = true)]
    async fn a_slow_topic_refresh_holds_up_nothing_and_its_growth_reaches_the_consumer() {
        let counts = Arc::new(HeldCounts::new(2));
        let every = Duration::from_secs(1);
        let mut config = FleetConfig {
            lease_ttl: TTL,
            kafka: Some(counts.clone()),
            topic_refresh_interval: every,
            ..FleetConfig::default()
        };
        config.topic_partitions.insert("u".to_string(), 2);
        let fleet = FleetCoordinator::start(Arc::new(MemoryStore::new()), config, Arc::new(Metrics::new()))
            .await
            .expect("starts");
        let mut grown = fleet.register("a", "t").await.expect("a registers");
        assert_eq!(grown.next().await.expect("snapshot").expect("not an error"), update("t", [], []));
        let told = grown.next().await.expect("a command").expect("not an error");
        assert_eq!(told, update("t", [0, 1], []));

        // Kafka now has 4 partitions, and holds its answer to the next refresh back.
        counts.grow_and_hold(4, every / 10).await;
        let h = async {
            let mut other = fleet.register("h", "u").await.expect("h registers");
            let snapshot = other.next().await.expect("snapshot").expect("not an error");
            (snapshot, other.next().await.expect("a command").expect("not an error"))
        };
        let told = tokio::time::timeout(TTL / 2, h).await;
        let told = told.expect("h registers and is told its partitions while the refresh waits for Kafka");
        assert_eq!(told, (update("u", [], []), update("u", [0, 1], [])));
        assert!(tokio::time::timeout(every * 5, grown.next()).await.is_err(), "a grew before Kafka answered");

        counts.hold(false);
        let told = tokio::time::timeout(every * 5, grown.next()).await;
        let told = told.expect("the growth reaches a").expect("a command").expect("not an error");
        assert_eq!(told, update("t", [2, 3], []));
    }

    /// A give-back waits, up to one TTL, for the giver's transport to take its
    /// `unassigned`. The loop runs that step beside everything else: while `g`, which
    /// does not read, holds its give-back to `c` up, `h` on another topic is told its
    /// partitions at once. (A loop that awaited its steps in turn would tell `h` one TTL
    /// late.)
    #[tokio::test(start_paused = true)]
    async fn a_give_back_waiting_for_its_giver_holds_up_no_other_consumer() {
        let store = MemoryStore::new();
        let mut config = FleetConfig { lease_ttl: TTL, ..FleetConfig::default() };
        config.topic_partitions.extend([("t".to_string(), 4), ("u".to_string(), 2)]);
        let fleet = FleetCoordinator::start(Arc::new(store.clone()), config, Arc::new(Metrics::new()))
            .await
            .expect("starts");
        let leases = fleet.backend().core.keys().leases("t");
        // g is told it owns all of t's partitions, and never reads.
        let _giver = fleet.register("g", "t").await.expect("g registers");
        while store.get_prefix(&leases).await.expect("read").kvs.len() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _taker = fleet.register("c", "t").await.expect("c registers");
        // g's step now waits for g's transport to take its `unassigned`.
        tokio::time::sleep(TTL / 10).await;

        let asked = tokio::time::Instant::now();
        let mut other = fleet.register("h", "u").await.expect("h registers");
        let snapshot = other.next().await.expect("snapshot").expect("not an error");
        assert_eq!(snapshot, update("u", [], []));
        let told = tokio::time::timeout(TTL / 2, other.next()).await;
        let told = told.expect("h is told its partitions while g's give-back waits");
        assert_eq!(told.expect("a command").expect("not an error"), update("u", [0, 1], []));
        assert!(asked.elapsed() < TTL / 2, "{:?}", asked.elapsed());
        let held = store.get_prefix(&leases).await.expect("read").kvs.len();
        assert_eq!(held, 4, "g's give-back is still waiting: every lease of t stands");
    }

    /// A give-back that waited its whole bound (one TTL) for a giver that does not read
    /// is counted, not only logged.
    #[tokio::test(start_paused = true)]
    async fn a_give_back_that_waited_until_its_bound_is_counted() {
        let store = MemoryStore::new();
        let mut config = FleetConfig { lease_ttl: TTL, ..FleetConfig::default() };
        config.topic_partitions.insert("t".to_string(), 4);
        let metrics = Arc::new(Metrics::new());
        let fleet =
            FleetCoordinator::start(Arc::new(store.clone()), config, metrics.clone()).await.expect("starts");
        let leases = fleet.backend().core.keys().leases("t");
        let _giver = fleet.register("g", "t").await.expect("g registers");
        while store.get_prefix(&leases).await.expect("read").kvs.len() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _taker = fleet.register("c", "t").await.expect("c registers");
        let counted = "kafka_assigner_give_backs_timed_out_total 1";
        let deadline = tokio::time::Instant::now() + TTL * 3;
        while !metrics.encode().lines().any(|line| line == counted) {
            assert!(tokio::time::Instant::now() < deadline, "not counted within 3 TTLs");
            tokio::time::sleep(TTL / 10).await;
        }
    }

    /// A registration written and lost again before the instance's cache saw it (its
    /// session revoked while the watch lagged), and then a re-read whose snapshot holds the
    /// same of the topic as the cache before it: the stream, admitted before its record was
    /// seen, must still be relayed, found lost and its registration written again. (Relaying
    /// only the topics whose records differ left it waiting for good, with no snapshot and no
    /// registration: the simulation's fleet seed 33,686.)
    #[tokio::test(start_paused = true)]
    async fn a_registration_lost_before_the_cache_saw_it_is_written_again_after_a_reread() {
        let memory = MemoryStore::new();
        let faulty = crate::store::FaultyStore::new(Arc::new(memory.clone()), 3);
        let config = |id: &str| {
            let mut config = FleetConfig { instance_id: id.into(), lease_ttl: TTL, ..FleetConfig::default() };
            config.topic_partitions.insert("t".to_string(), 1);
            config
        };
        let other = FleetCoordinator::start(Arc::new(memory.clone()), config("y"), Arc::new(Metrics::new()))
            .await
            .expect("y starts");
        let here = FleetCoordinator::start(Arc::new(faulty.clone()), config("x"), Arc::new(Metrics::new()))
            .await
            .expect("x starts");
        // `a`, on the other instance, holds the one partition; this instance's cache has seen
        // it (and `a` keeps it: the extra share goes to the first name).
        let mut a = other.register("a", "t").await.expect("a registers");
        assert_eq!(a.next().await.expect("snapshot").expect("not an error"), update("t", [], []));
        assert_eq!(a.next().await.expect("a command").expect("not an error"), update("t", [0], []));
        let lease = here.backend().core.keys().lease("t", 0);
        while here.backend().core.mirror().read().topics.get("t").is_none_or(|t| t.leases.is_empty()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(memory.get(&lease).await.expect("read").is_some());
        // From now on this instance's watch shows nothing for far longer than the test.
        faulty.lag_watch(TTL * 10);
        let member = here.backend().core.keys().member("t", "z");
        let mut z = here.register("z", "t").await.expect("z registers");
        let session = here.backend().core.lease().borrow().live().expect("a live session");
        faulty.expire_session(session).await.expect("revoked");
        assert!(memory.get(&member).await.expect("read").is_none(), "gone with the session");
        // The watch breaks and the instance reads the whole prefix again: as before, `a`
        // holds the partition and `z` has no registration.
        faulty.cut_reads();
        tokio::time::sleep(TTL / 20).await;
        faulty.lag_watch(Duration::ZERO);
        faulty.restore_reads();

        let told = tokio::time::timeout(TTL * 2, z.next()).await;
        let snapshot = told.expect("z is told its snapshot").expect("a command").expect("not an error");
        assert_eq!(snapshot, update("t", [], []));
        assert!(memory.get(&member).await.expect("read").is_some(), "z's registration is written again");
    }
}
