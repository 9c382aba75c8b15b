//! The claim step of a local consumer, which the loop runs on every change and on a timer
//! (`driver.rs`): give back what exceeds its fair share, claim free leases up to it
//! ([`super::share`]). Also the periodic Kafka topic refresh of the fleet backend.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Fleet;
use super::claim_decide::{self, AtRevision, LeaseAt};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{GiveBackStall, NotReadingStream};
use crate::coordinator::shared::{
    outgoing::PassGate,
    outgoing::update,
    streams::{EndReason, StreamKey},
};
use crate::store::{Revision, StoreError};

/// One claim step of the local consumer `key` (see [`claim_step`]), as the loop runs it
/// (`driver.rs`): `seen` is the revision of its last write, and the step returns the key
/// and the revision of its own last write. `done` is cancelled when the stream ended.
pub(super) async fn step(
    inner: Arc<Fleet>,
    key: StreamKey,
    mut seen: Revision,
    done: CancellationToken,
) -> (StreamKey, Revision) {
    match claim_step(&inner, &key, &mut seen, &done).await {
        Ok(()) => {}
        // The instance lease ended: the lease task starts a new one (and the stream's
        // registration is written again, `shared/rebind.rs`); the next step claims.
        Err(StoreError::SessionExpired(_)) => {}
        Err(error) => {
            tracing::warn!(%error, topic = %key.0, consumer = %key.1, "claim step failed; retrying")
        }
    }
    (key, seen)
}

/// One claim step of a local consumer: give back what exceeds its fair share, claim free
/// leases up to it. Acts on the cache, writes with compare-and-swap; a write that loses a
/// race changes nothing, and the watch delivery of whatever won triggers the next step.
/// `done` is cancelled when the consumer's stream ended.
async fn claim_step(
    inner: &Arc<Fleet>,
    key: &StreamKey,
    seen: &mut Revision,
    done: &CancellationToken,
) -> Result<(), StoreError> {
    let (topic, consumer, registration) = key;
    let Some(instance_lease) = inner.core.lease().borrow().live() else { return Ok(()) };
    // Partitions hidden from the consumer because they were given back (read before the
    // cache: the relay only ever shrinks this set, and only this task grows it).
    let hidden = inner.core.streams().with(key, |stream| stream.told.releasing.clone()).unwrap_or_default();
    let (decision, decided_at) = {
        let cache = inner.core.mirror().read();
        if cache.revision < *seen {
            return Ok(()); // our last write is not in the cache yet
        }
        let Some(entry) = cache.topics.get(topic) else { return Ok(()) };
        (claim_decide::decide(entry, consumer, *registration, &hidden), cache.revision)
    };
    // Not registered yet, leaving, or replaced (the relay handles those), or a stream
    // that ended.
    let Some(decision) = decision.filter(|_| inner.core.streams().contains(key)) else { return Ok(()) };
    let keys = inner.core.keys();

    if !decision.show.is_empty() {
        show_kept(inner, key, &decision.show, seen).await?;
    }

    if !decision.give_back.is_empty() {
        let partitions: Vec<u32> = decision.give_back.iter().map(|(p, _)| *p).collect();
        // Tell the consumer first, then free the leases: it has heard `unassigned` before
        // anyone can claim them.
        if !tell_giver(inner, key, &partitions, done).await {
            return Ok(());
        }
        // A delete that fails its compare leaves the partition hidden: the lease changed
        // since the cache was read, so the cache cannot say whose it is now. The store's
        // revision in the answer (failed or not) is what the next step waits for the cache
        // to reach; by then the relay shows the partition again if it is still ours (and
        // the next plan may give it back again), or drops it if it is not. A lost answer
        // (`?`) leaves it hidden too: the next step's compare, or `show_kept`, finds out.
        let outcome =
            inner.core.store().txn(claim_decide::give_back_txn(keys, topic, &decision.give_back)).await?;
        *seen = (*seen).max(outcome.revision);
        if !outcome.succeeded {
            for one in &decision.give_back {
                let outcome =
                    inner.core.store().txn(claim_decide::give_back_txn(keys, topic, &[*one])).await?;
                *seen = (*seen).max(outcome.revision);
            }
        }
        tracing::info!(topic, consumer, ?partitions, quota = decision.quota, "leases given back");
    }

    if !decision.claim.is_empty() {
        let now_micros = crate::coordinator::shared::records::now_micros();
        let member = &decision.member;
        let claim = claim_decide::Claim { topic, consumer, member, instance_lease, decided_at, now_micros };
        let txn = |partitions: &[LeaseAt]| claim_decide::claim_txn(keys, claim, partitions);
        let mut claimed = Vec::new();
        let outcome = inner.core.store().txn(txn(&decision.claim)).await?;
        if outcome.succeeded {
            *seen = outcome.revision;
            claimed.extend(decision.claim.iter().map(|free| free.partition));
        } else {
            // Someone else claimed one of them first: take the others one by one.
            for one in &decision.claim {
                let outcome = inner.core.store().txn(txn(&[*one])).await?;
                if outcome.succeeded {
                    *seen = outcome.revision;
                    claimed.push(one.partition);
                }
            }
        }
        if !claimed.is_empty() {
            tracing::info!(topic, consumer, partitions = ?claimed, quota = decision.quota, "leases claimed");
        }
    }
    Ok(())
}

/// Shows the consumer again the `kept` partitions (with the lease revisions its cache
/// holds) that it was told to give back, whose leases are still its own: the give-back was
/// called off (the quota changed) or its delete failed its compare. Only what the store
/// confirms is shown: a lease whose stored revision differs from the cache's (a delete
/// whose answer was lost, a claim by another consumer) stays hidden, and the next step waits
/// for the cache to reach the store's revision, when the relay shows it or drops it.
async fn show_kept(
    inner: &Arc<Fleet>,
    key: &StreamKey,
    kept: &[AtRevision],
    seen: &mut Revision,
) -> Result<(), StoreError> {
    let topic = &key.0;
    let stored = inner.core.store().get_prefix(&inner.core.keys().leases(topic)).await?;
    let confirmed: Vec<u32> = kept
        .iter()
        .filter(|(p, revision)| {
            let lease = inner.core.keys().lease(topic, *p);
            stored.kvs.iter().any(|kv| kv.key == lease && kv.mod_revision == *revision)
        })
        .map(|(p, _)| *p)
        .collect();
    if confirmed.len() < kept.len() {
        *seen = (*seen).max(stored.revision);
    }
    if !confirmed.is_empty() {
        inner.core.streams().with(key, |stream| stream.told.releasing.retain(|p| !confirmed.contains(p)));
        let cache = inner.core.mirror().read();
        let mut changes = super::super::shared::mirror::Changes::default();
        changes.consumers(topic, [key.1.as_str()]);
        super::relay::relay(inner, &cache, &changes);
    }
    Ok(())
}

/// Sends `unassigned` for `partitions` on the consumer's stream, hides them from its view
/// until their leases are gone, and waits until the stream's transport took it (the gate
/// of [`crate::coordinator::shared::outgoing`]). True when the leases may be deleted now.
///
/// The command queues behind up to [`STREAM_BUFFER`] unread ones, so the wait is bounded
/// by one session TTL, the time the fleet already gives a silent consumer before its
/// partitions move. A consumer that has not taken a command for that long, or whose buffer
/// is full, is treated as one that went away: its stream ends (`RESOURCE_EXHAUSTED`) and
/// its registration, with every lease it holds, is kept for the TTL and then deleted, or
/// taken over by its reconnect, whose claim step gives back again. Either way nobody else
/// gets the partitions while the stream that was never told is open.
///
/// [`STREAM_BUFFER`]: crate::coordinator::shared::outgoing::STREAM_BUFFER
async fn tell_giver(inner: &Fleet, key: &StreamKey, partitions: &[u32], done: &CancellationToken) -> bool {
    let gate = PassGate::new();
    let queued = inner.core.streams().with(key, |stream| {
        stream.told.releasing.extend(partitions.iter().copied());
        let told: Vec<u32> = partitions.iter().copied().filter(|p| stream.told.owned.remove(p)).collect();
        // Never told it owns them: there is nothing to hear first.
        !stream.activated || told.is_empty() || stream.send_held(&gate, [update(&key.0, [], told)])
    });
    match queued {
        // The stream ended: how its registration ends decides what becomes of the leases.
        None => return false,
        Some(false) => {
            not_reading(inner, key, partitions, GiveBackStall::BufferFull);
            return false;
        }
        Some(true) => {}
    }
    let bound = inner.core.lease_ttl();
    tokio::select! {
        _ = done.cancelled() => false,
        taken = tokio::time::timeout(bound, gate.taken()) => match taken {
            // Taken, or dropped with its channel: only a stream still open heard it.
            Ok(()) => inner.core.streams().with(key, |stream| !stream.tx.is_closed()).unwrap_or(false),
            Err(_) => {
                inner.core.metrics().give_backs_timed_out.inc();
                not_reading(inner, key, partitions, GiveBackStall::NotTaken { waited: bound });
                false
            }
        }
    }
}

/// Ends the stream of a consumer that does not read it while `partitions` are given back;
/// its registration is kept for the TTL ([`EndReason::Disconnected`]).
fn not_reading(inner: &Fleet, key: &StreamKey, partitions: &[u32], why: GiveBackStall) {
    let (topic, consumer, _) = key;
    tracing::warn!(
        topic,
        consumer,
        ?partitions,
        %why,
        "consumer does not read its stream while giving partitions back; ending it"
    );
    let error = CoordinatorError::NotReading(NotReadingStream::GivingBack {
        consumer: consumer.to_string(),
        topic: topic.to_string(),
        partitions: partitions.to_vec(),
        stall: why,
    });
    inner.core.streams().end(key, EndReason::Disconnected, Some(error));
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc, time::Duration};

    use futures::{FutureExt, StreamExt};

    use super::super::{FleetConfig, FleetCoordinator, LeaseRecord, MemberRecord};
    use crate::coordinator::shared::outgoing::STREAM_BUFFER;
    use crate::coordinator::shared::{outgoing::update, records::decode};
    use crate::coordinator::{ConsumerGroupCoordinator, CoordinatorError};
    use crate::metrics::Metrics;
    use crate::proto::v1::{AssignmentCommand, assignment_command::Command};
    use crate::store::{LeaseStore, MemoryStore, SessionId};

    const TTL: Duration = Duration::from_secs(3);

    async fn leases(store: &MemoryStore, fleet: &FleetCoordinator) -> BTreeMap<u32, String> {
        let keys = fleet.backend().core.keys();
        let stored = store.get_prefix(&keys.leases("t")).await.expect("read");
        let owner = |value: &[u8]| decode::<LeaseRecord>("lease", value).map(|l| l.owner).expect("lease");
        stored
            .kvs
            .iter()
            .map(|kv| (kv.key.rsplit('/').next().unwrap().parse().unwrap(), owner(&kv.value)))
            .collect()
    }

    /// A giver whose buffer is full cannot be told `unassigned`: its stream ends at once
    /// (`RESOURCE_EXHAUSTED`), it keeps its leases until its registration ends one TTL
    /// later, and only then does the other consumer get them.
    #[tokio::test(start_paused = true)]
    async fn a_giver_whose_buffer_is_full_is_ended_and_keeps_its_leases_for_the_ttl() {
        let store = MemoryStore::new();
        let mut config = FleetConfig { lease_ttl: TTL, ..FleetConfig::default() };
        config.topic_partitions.insert("t".into(), 4);
        let fleet = FleetCoordinator::start(Arc::new(store.clone()), config, Arc::new(Metrics::new()))
            .await
            .expect("starts");
        let mut giver = fleet.register("g", "t").await.expect("g registers");
        while leases(&store, &fleet).await.len() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // g reads nothing: its channel fills up to the slots kept for the farewell and the error.
        let member =
            store.get(&fleet.backend().core.keys().member("t", "g")).await.expect("read").expect("g");
        let session = decode::<MemberRecord>("member", &member.value).expect("member").session;
        let key = ("t".to_string(), "g".to_string(), SessionId(session));
        let filled = fleet.backend().core.streams().with(&key, |stream| {
            while stream.tx.capacity() > 2 {
                stream.send([update("t", [], [])]);
            }
        });
        assert!(filled.is_some(), "g's stream is held");

        let mut other = fleet.register("c", "t").await.expect("c registers");
        let snapshot = other.next().await.expect("snapshot").expect("not an error");
        assert_eq!(snapshot, update("t", [], []), "g holds everything");
        tokio::time::sleep(TTL / 2).await;
        let held = leases(&store, &fleet).await;
        assert!(held.values().all(|o| o == "g"), "g keeps its leases for the TTL: {held:?}");
        assert!(other.next().now_or_never().is_none(), "c is told nothing while g's leases stand");
        let assigned = tokio::time::timeout(TTL * 2, other.next()).await.expect("c gets them after the TTL");
        let Some(Ok(command)) = assigned else { panic!("c: {assigned:?}") };
        assert!(matches!(command.command, Some(Command::Assignment(u)) if !u.assigned.is_empty()));

        // g's stream: what was queued, then why it ended; never an `unassigned` it missed.
        let items: Vec<_> =
            tokio::time::timeout(TTL, giver.by_ref().collect()).await.expect("g's stream ends");
        let Some(Err(error)) = items.last() else {
            panic!("g's stream ends with an error: {:?}", items.last())
        };
        assert_eq!(items.len(), STREAM_BUFFER + 1, "every command queued, then the error");
        let unassigned = items.iter().any(|item| {
            matches!(item, Ok(AssignmentCommand { command: Some(Command::Assignment(u)) }) if !u.unassigned.is_empty())
        });
        assert!(!unassigned, "no unassigned was queued");
        let buffer_full = matches!(
            &error,
            CoordinatorError::NotReading(super::NotReadingStream::GivingBack {
                stall: super::GiveBackStall::BufferFull,
                ..
            })
        );
        assert!(buffer_full, "{error}");
    }

    /// What one consumer was told, in order: `(assigned, unassigned)` per update.
    type Told = Arc<std::sync::Mutex<Vec<(Vec<u32>, Vec<u32>)>>>;

    /// Reads a consumer's stream in the background, logging every update it is told.
    fn listen(
        mut stream: impl futures::Stream<Item = Result<AssignmentCommand, CoordinatorError>>
        + Send
        + Unpin
        + 'static,
    ) -> Told {
        let told = Told::default();
        let log = told.clone();
        tokio::spawn(async move {
            while let Some(Ok(AssignmentCommand { command: Some(Command::Assignment(u)) })) =
                stream.next().await
            {
                let partitions =
                    |tps: &[crate::proto::v1::TopicPartition]| tps.iter().map(|tp| tp.partition).collect();
                log.lock().expect("log").push((partitions(&u.assigned), partitions(&u.unassigned)));
            }
        });
        told
    }

    /// What a consumer owns after everything it was told.
    fn owned(told: &Told) -> std::collections::BTreeSet<u32> {
        let mut owned = std::collections::BTreeSet::new();
        for (assigned, unassigned) in told.lock().expect("log").iter() {
            owned.extend(assigned);
            unassigned.iter().for_each(|p| {
                owned.remove(p);
            });
        }
        owned
    }

    /// The store deletes the leases a giver gives back but the answer is lost, and the
    /// instance's cache learns of the deletes only later (watch batches are slow). The
    /// claim step, running again on its timer with that stale cache, must not tell the
    /// giver it owns the given-back partitions again: their leases are gone (and soon the
    /// other consumer's). Told state is what is checked: the giver hears `unassigned` once
    /// and never `assigned` for them again.
    #[tokio::test(start_paused = true)]
    async fn a_lost_give_back_answer_never_gives_the_partitions_back_to_the_giver() {
        let memory = MemoryStore::new();
        let faulty = crate::store::FaultyStore::new(Arc::new(memory.clone()), 7);
        // A TTL well above the delays below, so they never fence the instance.
        let ttl = Duration::from_secs(20);
        let mut config = FleetConfig {
            lease_ttl: ttl,
            claim_interval: Duration::from_millis(100),
            ..FleetConfig::default()
        };
        config.topic_partitions.insert("t".into(), 4);
        let fleet = FleetCoordinator::start(Arc::new(faulty.clone()), config, Arc::new(Metrics::new()))
            .await
            .expect("starts");
        let giver = listen(fleet.register("g", "t").await.expect("g registers"));
        let deadline = tokio::time::Instant::now() + ttl;
        while owned(&giver).len() < 4 {
            assert!(tokio::time::Instant::now() < deadline, "g is told it owns everything");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // From now on watch batches take 2 s, answers none: the cache lags the store by
        // many claim intervals. The next transaction, the give-back's delete, is applied
        // and its answer lost.
        faulty.lag_watch(Duration::from_secs(2));
        faulty.record_writes(true);
        let taker = listen(fleet.register("c", "t").await.expect("c registers"));
        faulty.lose_next_txn_answers(1);

        let deadline = tokio::time::Instant::now() + ttl;
        while owned(&taker).len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "c is told it owns half: {:?}", taker.lock());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let the giver's claim steps and relays run over the caught-up cache too.
        tokio::time::sleep(ttl / 4).await;
        assert!(faulty.stats().lost_answers >= 1, "the give-back's answer was lost");
        let given: std::collections::BTreeSet<u32> = owned(&taker);
        let told = giver.lock().expect("log").clone();
        let released_at = told
            .iter()
            .position(|(_, unassigned)| unassigned.iter().any(|p| given.contains(p)))
            .expect("g was told to stop what c owns");
        for (assigned, _) in &told[released_at..] {
            assert!(
                !assigned.iter().any(|p| given.contains(p)),
                "g was told it owns {assigned:?} again after giving back {given:?} (c owns them): {told:?}"
            );
        }
        assert!(owned(&giver).is_disjoint(&given), "g: {told:?}, c: {given:?}");
        assert_eq!(leases(&memory, &fleet).await.values().filter(|o| *o == "c").count(), 2);
    }
}
