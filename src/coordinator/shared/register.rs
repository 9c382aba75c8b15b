//! `Register`, shared by the store-backed backends, and what happens when a stream ends.
//!
//! A registration is a record bound to this **instance's** lease (`lease.rs`), carrying a
//! registration id that tells this stream from earlier or later registrations of the same
//! name. Registering again under the same name (on any instance) rewrites the record with
//! compare-and-swap: the new id, bound to that instance's lease; the partitions (keyed by
//! name) stay put, and the stream of the old registration ends with `ABORTED`.
//!
//! When a stream ends, the instance's loop settles its registration
//! ([`departures`](super::departures)): deleted at once when the consumer left (drained or
//! deregistered) and its transport took its last commands; kept for the consumer TTL after
//! the client went away or the instance fenced itself, so a quick reconnect keeps the
//! partitions, then deleted with compare-and-swap if it is still this one. The stream's
//! own task (`enrolment.rs`) only waits for the end and hands the registration to the
//! loop: it calls no store.

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::oneshot;

use super::enrolment::Enrolment;
use super::registrar::{Caller, Registrar};
use super::validate::{validate_consumer_name, validate_topic_name};
use crate::coordinator::{CommandStream, CoordinatorError};
use crate::store::SessionId;

/// Starts the instance lease for `backend` (the instance's loop makes readiness and the
/// instance record follow it, `upkeep.rs`), and waits until the store granted the lease
/// (`UNAVAILABLE`, and every task stopped, if it does not within one TTL).
pub async fn start_lease<R: Registrar>(backend: &Arc<R>) -> Result<(), CoordinatorError> {
    super::lease::spawn_keeper(backend.clone(), |backend| backend.core());
    if let Err(error) = backend.core().lease_granted().await {
        backend.core().shutdown.cancel();
        return Err(error);
    }
    Ok(())
}

/// A fresh registration id: random, so ids of different instances never collide.
pub fn new_registration_id() -> SessionId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let hash = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    // Positive, as etcd lease ids are: the id is stored where a session id was before.
    SessionId((hash >> 1) as i64)
}

/// Registers `consumer` for `topic` through `backend` and returns its command stream, whose
/// first item is the snapshot.
///
/// The work runs in a task of its own (and the write and the admission in the instance's
/// loop), so a caller that goes away (a cancelled `Register`) cannot stop it between the
/// store write and the stream's admission: the stream is then admitted, its receiver
/// dropped, and its registration settled as after any disconnect.
/// But such a registration never replaces another one ([`Caller`]): the client that gave up
/// has sent its next attempt, and that one is the consumer's live stream.
///
/// `incarnation` is the number the client's process sent (0: none), which tells its own
/// reconnect from a new incarnation of the name (docs/design.md §10).
pub async fn register<R: Registrar>(
    backend: &Arc<R>,
    consumer: &str,
    topic: &str,
    incarnation: u64,
) -> Result<CommandStream, CoordinatorError> {
    validate_consumer_name(consumer)?;
    validate_topic_name(topic)?;
    if backend.core().shutdown.is_cancelled() {
        return Err(shutting_down());
    }
    let (caller, _gone_if_dropped) = Caller::waiting(backend.core().metrics.registers_abandoned.clone());
    let (backend, consumer, topic) = (backend.clone(), consumer.to_string(), topic.to_string());
    let work = async move {
        let result = register_to_the_end(&backend, &consumer, &topic, incarnation, &caller).await;
        caller.answered();
        result
    };
    match tokio::spawn(work).await {
        Ok(result) => result,
        // The task can only fail to finish when the runtime stops under it.
        Err(_) => Err(shutting_down()),
    }
}

/// [`register`], once the names are valid: hands the registration to the instance's loop,
/// which makes sure the topic is stored, writes the registration and admits its stream
/// (`enrolment.rs`), and waits for the answer.
async fn register_to_the_end<R: Registrar>(
    backend: &Arc<R>,
    consumer: &str,
    topic: &str,
    incarnation: u64,
    caller: &Caller,
) -> Result<CommandStream, CoordinatorError> {
    let core = backend.core();
    let _permit = core.register_permits.acquire().await.map_err(|_| shutting_down())?;
    let lease = core.live_lease()?;
    let key = (topic.to_string(), consumer.to_string(), new_registration_id());
    let (reply, answer) = oneshot::channel();
    let enrolment = Enrolment { key, lease, incarnation, caller: caller.clone(), reply };
    core.enrol(enrolment).map_err(|_| shutting_down())?;
    answer.await.map_err(|_| shutting_down())?
}

fn shutting_down() -> CoordinatorError {
    CoordinatorError::ShuttingDown
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::register;
    use crate::coordinator::CoordinatorError;
    use crate::coordinator::causes::EndOfStream;
    use crate::coordinator::shared::test_backend::{TestBackend, registration};
    use crate::proto::v1::assignment_command::Command;
    use crate::store::LeaseStore;
    use crate::store::StoreError;

    const TTL: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn an_open_stream_keeps_its_session_for_many_ttls() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events", 0).await.expect("registers");
        let first = stream.next().await.expect("snapshot").expect("not an error");
        assert!(matches!(first.command, Some(Command::Assignment(_))), "the snapshot comes first: {first:?}");
        tokio::time::sleep(TTL * 5).await;
        let record = store.get(&registration("events", "a")).await.expect("read");
        assert!(record.is_some(), "kept alive while the stream is open");
        assert!(backend.core.streams.names().contains(&("events".into(), "a".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_stream_loses_its_registration_after_the_ttl() {
        let (backend, store) = TestBackend::start(TTL).await;
        let stream = register(&backend, "a", "events", 0).await.expect("registers");
        drop(stream);
        tokio::time::sleep(TTL / 2).await;
        assert!(store.get(&registration("events", "a")).await.expect("read").is_some(), "kept for the TTL");
        assert!(backend.core.streams.names().is_empty(), "the registry forgets the stream at once");
        tokio::time::sleep(TTL).await;
        assert!(store.get(&registration("events", "a")).await.expect("read").is_none(), "gone after the TTL");
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_registration_replaces_the_first() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut first = register(&backend, "a", "events", 0).await.expect("registers");
        first.next().await.expect("snapshot").expect("not an error");
        let first_id = store.get(&registration("events", "a")).await.expect("read").map(|kv| kv.value);
        let mut second = register(&backend, "a", "events", 0).await.expect("registers again");
        second.next().await.expect("snapshot").expect("not an error");
        let error = first.next().await.expect("an error item").expect_err("replaced");
        assert!(matches!(error, CoordinatorError::Replaced { .. }), "{error}");
        assert!(first.next().await.is_none(), "then the stream ends");
        tokio::time::sleep(TTL * 2).await;
        let record =
            store.get(&registration("events", "a")).await.expect("read").expect("the second is alive");
        assert_ne!(Some(record.value), first_id);
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_cut_off_from_its_store_fences_before_its_lease_can_expire() {
        let (backend, cut) = TestBackend::start_faulty(TTL, crate::store::MemoryStore::new()).await;
        let mut stream = register(&backend, "a", "events", 0).await.expect("registers");
        stream.next().await.expect("snapshot").expect("not an error");
        let cut_at = tokio::time::Instant::now();
        cut.cut_off();
        let error = stream.next().await.expect("an error item").expect_err("fenced");
        let fenced_after = cut_at.elapsed();
        // Whichever noticed first, the lease keeper or the relay, fenced it.
        assert!(matches!(error, CoordinatorError::StreamEnded(EndOfStream::Fenced(_))), "{error}");
        // The last renewal was before the cut: the fence came at most 3/4 TTL after it, a
        // quarter TTL before the lease could expire.
        assert!(fenced_after <= TTL * 3 / 4, "fenced {fenced_after:?} after the cut");
        assert!(!backend.core.readiness.get(), "not ready while cut off");
        assert!(register(&backend, "b", "events", 0).await.is_err(), "no registration while fenced");
        // Back in touch after the lease expired: a new lease, ready again.
        tokio::time::sleep(TTL * 2).await;
        cut.restore();
        let mut readiness = backend.core.readiness.subscribe();
        tokio::time::timeout(TTL, readiness.wait_for(|ready| *ready))
            .await
            .expect("ready again")
            .expect("open");
        assert!(register(&backend, "a", "events", 0).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_the_store_expires_early_is_replaced_without_ending_the_stream() {
        let (backend, store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events", 0).await.expect("registers");
        stream.next().await.expect("snapshot").expect("not an error");
        let before = store.get(&registration("events", "a")).await.expect("read").expect("registered");
        let old_lease = before.session.expect("bound to the instance lease");
        // The store expires the instance lease while the instance still thinks it is live.
        store.revoke_session(old_lease).await.expect("revoked");
        let mut readiness = backend.core.readiness.subscribe();
        let written_again = async {
            loop {
                let now = store.get(&registration("events", "a")).await.expect("read");
                if let Some(kv) = now.filter(|kv| kv.session != Some(old_lease)) {
                    return kv;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let after = tokio::time::timeout(TTL / 2, written_again).await.expect("written again within TTL/2");
        assert_eq!(after.value, before.value, "the same registration, bound to the new lease");
        tokio::time::timeout(TTL, readiness.wait_for(|ready| *ready))
            .await
            .expect("ready again")
            .expect("open");
        // The stream stays open, and the consumer is told nothing: nothing changed for it.
        assert!(tokio::time::timeout(TTL * 3, stream.next()).await.is_err(), "the stream is quiet and open");
        assert!(backend.core.streams.lost().is_empty(), "no stream is left lost");
        let kept = store.get(&registration("events", "a")).await.expect("read").expect("kept alive");
        assert_eq!(kept.session, after.session, "kept alive on the new lease");
    }

    /// Waits (on paused time) until the registration of `a` is gone from `store`, up to
    /// `within`, then one more second for the answer of the delete that removed it to
    /// arrive (so the sweep's count, if it deleted it, is up to date); returns whether it
    /// went.
    async fn gone_within(store: &crate::store::MemoryStore, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < until {
            if store.get(&registration("events", "a")).await.expect("read").is_none() {
                tokio::time::sleep(Duration::from_secs(1)).await;
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test(start_paused = true)]
    async fn a_register_cancelled_after_its_write_leaves_no_registration_behind() {
        let memory = crate::store::MemoryStore::new();
        let (backend, faults) = TestBackend::start_faulty(TTL, memory.clone()).await;
        // Another consumer first: the topic's record is written, only `a`'s write is left.
        let _b = register(&backend, "b", "events", 0).await.expect("registers");
        // Every answer takes 100 ms: 50 ms to reach the store, 50 ms back.
        faults.delay(Duration::from_millis(100), Duration::from_millis(100));
        let mut call = Box::pin(register(&backend, "a", "events", 0));
        // The caller goes away once the write was applied, before its answer came.
        loop {
            tokio::select! {
                _ = &mut call => panic!("answered before the write could be seen"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            if memory.get(&registration("events", "a")).await.expect("read").is_some() {
                break;
            }
        }
        drop(call);
        assert!(gone_within(&memory, TTL * 2).await, "the registration of a cancelled Register must end");
        assert_eq!(backend.core.metrics.registrations_swept.get(), 0, "ended by its own path, not the sweep");
    }

    #[tokio::test(start_paused = true)]
    async fn a_registration_whose_answer_was_lost_ends_after_the_ttl() {
        let memory = crate::store::MemoryStore::new();
        let (backend, faults) = TestBackend::start_faulty(TTL, memory.clone()).await;
        let _b = register(&backend, "b", "events", 0).await.expect("registers");
        faults.lose_next_txn_answers(1);
        let error = register(&backend, "a", "events", 0).await.err().expect("the answer was lost");
        assert!(matches!(error, CoordinatorError::Store(StoreError::Unavailable(_))), "{error}");
        assert!(
            memory.get(&registration("events", "a")).await.expect("read").is_some(),
            "written all the same"
        );
        assert!(gone_within(&memory, TTL * 2).await, "a registration nobody streams for must end");
        assert_eq!(backend.core.metrics.registrations_swept.get(), 0, "ended by its own path, not the sweep");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_ends_a_registration_no_stream_holds_and_counts_it() {
        let memory = crate::store::MemoryStore::new();
        let (backend, _faults) = TestBackend::start_faulty(TTL, memory.clone()).await;
        let lease = backend.core.live_lease().expect("live");
        // A record of this instance that no path of this instance wrote, so none settles it.
        let orphan = crate::store::Op::put_in(registration("events", "a"), "42", lease);
        memory.txn(crate::store::Txn::new().then(orphan)).await.expect("written");
        assert!(!gone_within(&memory, TTL / 2).await, "not before a whole TTL without a stream");
        assert!(gone_within(&memory, TTL * 2).await, "swept");
        assert_eq!(backend.core.metrics.registrations_swept.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bad_names_and_unknown_topics_are_refused_and_store_nothing() {
        let (backend, store) = TestBackend::start(TTL).await;
        let before = store.revision();
        for (consumer, topic, bad_name) in
            [("", "events", true), ("a/b", "events", true), ("a", "", true), ("a", "unknown", false)]
        {
            let error = register(&backend, consumer, topic, 0).await.err().expect("refused");
            let expected = if bad_name {
                matches!(error, CoordinatorError::InvalidName(_))
            } else {
                matches!(error, CoordinatorError::UnknownTopic(_))
            };
            assert!(expected, "{consumer:?}/{topic:?}: {error}");
        }
        assert_eq!(store.revision(), before, "nothing written");
    }

    #[tokio::test(start_paused = true)]
    async fn no_registration_after_shutdown() {
        let (backend, _store) = TestBackend::start(TTL).await;
        let mut stream = register(&backend, "a", "events", 0).await.expect("registers");
        stream.next().await.expect("snapshot").expect("not an error");
        assert!(backend.core.begin_shutdown());
        assert!(!backend.core.begin_shutdown(), "a second shutdown does nothing");
        assert!(!backend.core.readiness.get());
        let error = stream.next().await.expect("an error item").expect_err("shutting down");
        assert!(matches!(error, CoordinatorError::StreamEnded(EndOfStream::Shutdown { .. })), "{error}");
        let error = register(&backend, "b", "events", 0).await.err().expect("refused");
        assert!(matches!(error, CoordinatorError::ShuttingDown), "{error}");
    }
}
