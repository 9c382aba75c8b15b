//! The instance never waits forever and never moves back: a late re-read, a restart under
//! the same id, a lost answer, a silent watch (`test_harness.rs` drives it).

use std::time::Duration;

use super::test_harness::{Harness, TestStore, commands, handoff_under_way, reply};
use crate::coordinator::CoordinatorError;
use crate::coordinator::causes::{EndOfStream, Fence};
use crate::coordinator::handoff_backend::records::{ConsumerRecord, decode};
use crate::coordinator::machine::io::{Call, Effect, Input, Replied, StoreReply, StoreRequest};
use crate::proto::v1::assignment_command::Command;
use crate::store::{PrefixSnapshot, StoreError, Unreachable, WatchBatch, WatchBroke};

fn watch_broke() -> StoreError {
    StoreError::Unavailable(Unreachable::Watch(WatchBroke::Ended { endpoints: "test".into() }))
}

/// The request of the first `GetPrefix` among `effects`.
fn prefix_read(effects: &[Effect]) -> Option<u64> {
    effects.iter().find_map(|e| match e {
        Effect::Store { request, op: StoreRequest::GetPrefix(_) } => Some(*request),
        _ => None,
    })
}

#[test]
fn a_reread_answered_after_an_own_write_does_not_move_the_consumers_back() {
    let mut h = Harness::new();
    let partition = handoff_under_way(&mut h);
    let Some(watch) = h.store.watch else { panic!("watching") };
    // The watch breaks: the re-read is sent, and its answer (the store as it is now) is
    // held back until after the instance's own flip.
    let effects = h.instance.step(h.now, Input::WatchEnded { watch, error: watch_broke() });
    let Some(read) = prefix_read(&effects) else { panic!("re-read: {effects:?}") };
    h.seen.extend(effects.into_iter().filter(|e| !matches!(e, Effect::Store { .. })));
    let old = PrefixSnapshot { kvs: h.store.kvs.values().cloned().collect(), revision: h.store.revision };
    let ready = Call::PartitionReady { consumer: "b".into(), topic: "t".into(), partition };
    h.input(Input::Call { call: 3, body: ready });
    let owns = |c: &Command| matches!(c, Command::Assignment(u) if u.assigned.iter().any(|p| p.partition == partition));
    let told = h.take();
    assert!(matches!(reply(&told, 3), Some(Ok(Replied::Applied))), "{told:?}");
    assert!(commands(&told, 12).iter().any(owns), "b is told it owns the partition: {told:?}");
    h.input(Input::StoreAnswer { request: read, answer: Ok(StoreReply::Prefix(old)) });
    let after = h.take();
    let b = commands(&after, 12);
    assert!(!b.iter().any(|c| matches!(c, Command::Warm(_))), "b is not told to warm it again: {b:?}");
    let cache = h.instance.cache().map(|c| c.revision);
    assert_eq!(cache, Some(h.store.revision), "the cache is not behind the store");
}

/// The registration id (session) of `consumer`'s record on topic `t`.
fn registration(h: &Harness, consumer: &str) -> i64 {
    let key = h.keys.consumer("t", consumer);
    let kv = h.store.kvs.get(&key).unwrap_or_else(|| panic!("{key} written"));
    decode::<ConsumerRecord>(&kv.key, &kv.value).map(|r| r.session).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn another_life_under_the_same_instance_id_hands_out_other_registration_ids() {
    let first_of = |nonce| {
        let mut h = Harness::life(nonce, TestStore::default(), None);
        h.register(1, 11, "a");
        registration(&h, "a")
    };
    assert_eq!(first_of(7), first_of(7), "a replay of one life gives the same ids");
    assert_ne!(first_of(7), first_of(8), "a restart does not hand out its previous life's ids");
}

#[test]
fn a_lost_answer_fails_its_request_at_its_deadline_and_a_late_one_is_ignored() {
    let store = TestStore { vanish: true, ..TestStore::default() };
    let mut h = Harness::life(1, store, None);
    h.register(1, 11, "a");
    let refused = h.take();
    assert!(matches!(reply(&refused, 1), Some(Err(_))), "not loaded yet: {refused:?}");
    h.store.vanish = false;
    // The first read's answer never comes: past the deadline it counts as failed, and the
    // read is tried again.
    h.advance(super::STORE_ANSWER_WITHIN);
    h.advance(Duration::from_millis(200)); // a failed read's pause
    h.register(2, 12, "a");
    let effects = h.take();
    assert!(matches!(reply(&effects, 2), Some(Ok(Replied::Registered))), "loaded: {effects:?}");
    // The first read's answer, arriving now, finds nothing waiting for it.
    let before = h.instance.cache().map(|c| c.revision);
    let stale = PrefixSnapshot { kvs: Vec::new(), revision: 0 };
    h.input(Input::StoreAnswer { request: 1, answer: Ok(StoreReply::Prefix(stale)) });
    assert_eq!(h.instance.cache().map(|c| c.revision), before, "the late answer is ignored");
    assert!(h.take().is_empty(), "and changes nothing");
}

#[test]
fn a_watch_silent_for_three_quarters_of_the_ttl_fences_the_streams_and_watches_again() {
    let every = Duration::from_millis(500);
    let mut h = Harness::life(1, TestStore::default(), Some(every));
    h.register(1, 11, "a");
    let stale_after = h.instance.config.lease_ttl * 3 / 4;
    // Progress marks keep a quiet watch alive, however long.
    for _ in 0..(2 * stale_after.as_millis() / every.as_millis()) {
        let Some(watch) = h.store.watch else { panic!("watching") };
        let mark = WatchBatch { revision: h.store.revision, events: Vec::new() };
        h.input(Input::Watched { watch, batch: mark });
        h.advance(every);
    }
    let ended = |e: &Effect| {
        matches!(
            e,
            Effect::EndStream {
                stream: 11,
                error: Some(CoordinatorError::StreamEnded(EndOfStream::Fenced(Fence::CannotFollow { .. }))),
                ..
            }
        )
    };
    let marked = h.take();
    assert!(!marked.iter().any(ended), "marks keep the stream: {marked:?}");
    let old_watch = h.store.watch;
    // Then nothing at all, not even a mark, the instance's timer firing on time.
    h.run_for(stale_after);
    let silent = h.take();
    assert!(silent.iter().any(ended), "the stream is fenced: {silent:?}");
    assert!(silent.iter().any(|e| matches!(e, Effect::Ready(false))), "not ready: {silent:?}");
    assert_ne!(h.store.watch, old_watch, "watching again");
    // Following again only once the new watch speaks.
    let Some(watch) = h.store.watch else { panic!("watching") };
    h.input(Input::Watched { watch, batch: WatchBatch { revision: h.store.revision, events: Vec::new() } });
    let spoke = h.take();
    assert!(spoke.iter().any(|e| matches!(e, Effect::Ready(true))), "ready again: {spoke:?}");
}

/// Whether `e` ends stream 11 fenced because the instance cannot follow its store.
fn fenced_stale(e: &Effect) -> bool {
    matches!(
        e,
        Effect::EndStream {
            stream: 11,
            error: Some(CoordinatorError::StreamEnded(EndOfStream::Fenced(Fence::CannotFollow { .. }))),
            ..
        }
    )
}

/// A busy instance delivers late; it does not fence itself for being busy. Its first step
/// after a long stall finds the watch's silence bound long past: the instance, not the
/// watch, was slow (it asked to be woken by that bound), so the bound starts afresh from
/// that step. A watch that still says nothing is then silent, noticed on time, and fences
/// the streams one bound after the late step.
#[test]
fn a_silence_noticed_late_is_the_instance_being_busy_and_one_noticed_on_time_fences() {
    let every = Duration::from_millis(500);
    let mut h = Harness::life(1, TestStore::default(), Some(every));
    h.register(1, 11, "a");
    h.run_for(Duration::from_secs(1));
    let ttl = h.instance.config.lease_ttl;
    let bound = crate::coordinator::shared::mirror::silence_bound(ttl * 3 / 4, every);
    let watch = h.store.watch;
    let _ = h.take();
    // Stalled for twice the TTL: not even the timer ran; the first step after is late for
    // the silence bound by far more than a progress period.
    h.advance(ttl * 2);
    let late = h.take();
    assert!(!late.iter().any(fenced_stale), "a silence noticed late keeps the stream: {late:?}");
    assert!(!late.iter().any(|e| matches!(e, Effect::Ready(false))), "still ready: {late:?}");
    assert!(h.instance.renews(), "the lease is kept alive");
    assert_eq!(h.store.watch, watch, "the watch is kept");
    // The watch still says nothing; the timer now fires on time.
    h.run_for(bound - Duration::from_micros(1));
    let quiet = h.take();
    assert!(!quiet.iter().any(fenced_stale), "within a fresh bound of the late step: {quiet:?}");
    h.run_for(Duration::from_micros(1));
    let silent = h.take();
    assert!(silent.iter().any(fenced_stale), "silent for a bound, noticed on time: fenced: {silent:?}");
    assert_ne!(h.store.watch, watch, "watching again");
}

/// The same for a store request: an answer overdue when the instance notices it late may
/// be queued behind the instance, so the request gets a fresh deadline from then and its
/// answer is still taken; past that deadline, noticed on time, it fails.
#[test]
fn a_deadline_noticed_late_gives_the_answer_a_fresh_deadline_and_one_noticed_on_time_fails_it() {
    // The first read's answer is lost, and the instance is busy past its deadline.
    let busy_past_the_first_read = || {
        let store = TestStore { vanish: true, ..TestStore::default() };
        let mut h = Harness::life(1, store, None);
        h.store.vanish = false;
        h.advance(super::STORE_ANSWER_WITHIN * 2);
        h
    };
    let mut h = busy_past_the_first_read();
    let snapshot = PrefixSnapshot { kvs: Vec::new(), revision: h.store.revision };
    h.input(Input::StoreAnswer { request: 1, answer: Ok(StoreReply::Prefix(snapshot)) });
    assert!(h.instance.cache().is_some(), "the answer that came after the late step is taken");
    // An answer that never comes: the fresh deadline, noticed on time, fails the read, and
    // it is tried again.
    let mut h = busy_past_the_first_read();
    h.run_for(super::STORE_ANSWER_WITHIN - Duration::from_micros(1));
    assert!(h.instance.cache().is_none(), "waited for until its fresh deadline");
    h.run_for(Duration::from_micros(1));
    h.run_for(Duration::from_millis(200)); // a failed read's pause
    assert!(h.instance.cache().is_some(), "failed at its fresh deadline, read again and loaded");
}

/// A first read that fails, on an instance with nothing else to wake it for (no stream, no
/// cache for its leader to look at), is tried again: the leader's timer, due at once but
/// unable to look before a cache exists, no longer holds the wake in the past. (Found by the
/// leader groups' schedules: such an instance, preferred for a group, never campaigned.)
#[test]
fn a_first_read_that_fails_is_tried_again() {
    use super::{Instance, Start};
    use crate::coordinator::handoff_backend::HandoffConfig;
    use crate::coordinator::machine::io::LeaseState;

    let start = Start {
        origin: tokio::time::Instant::now(),
        nonce: 1,
        watch_progress_every: None,
        plan_nanos_per_partition: 0,
        plans_timed: false,
    };
    let now = 1_700_000_000_000_000;
    let (mut instance, effects) = Instance::new(HandoffConfig::default(), start, now);
    let Some(first) = prefix_read(&effects) else { panic!("the first read: {effects:?}") };
    let _ = instance.step(now, Input::Lease(LeaseState::Live(crate::store::SessionId(7))));
    let failed = Err(StoreError::Unavailable(Unreachable::NotLoaded));
    let effects = instance.step(now + 1_000, Input::StoreAnswer { request: first, answer: failed });
    let wake = effects.iter().find_map(|e| match e {
        Effect::WakeAt(at) => Some(*at),
        _ => None,
    });
    let Some(wake) = wake.filter(|at| *at > now + 1_000) else { panic!("no wake ahead: {effects:?}") };
    let effects = instance.step(wake, Input::TimerFired);
    assert!(prefix_read(&effects).is_some(), "the read is tried again: {effects:?}");
}
