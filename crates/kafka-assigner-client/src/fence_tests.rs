use std::{
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use super::*;

/// How long a step another thread or task must take may take before the test fails.
const PROMPT: Duration = Duration::from_secs(5);

fn p(partition: u32, epoch: u64) -> Partition {
    Partition { topic: "events".into(), partition, epoch }
}

/// The writes that landed in a sink, in order, by epoch.
type Sink = Arc<Mutex<Vec<u64>>>;

fn written(sink: &Sink) -> Vec<u64> {
    sink.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn write(sink: &Sink, epoch: u64) {
    sink.lock().unwrap_or_else(|e| e.into_inner()).push(epoch);
}

/// Waits until `n` writers wait for partition 0's slot (another thread is blocked in it).
fn until_waiting(fence: &Fence, n: usize) {
    let deadline = Instant::now() + PROMPT;
    while fence.waiting("events", 0) != n {
        assert!(Instant::now() < deadline, "{n} writer(s) never waited for the slot");
        std::thread::yield_now();
    }
}

#[test]
fn lower_epochs_are_refused_equal_and_higher_pass() {
    let fence = Fence::new();
    assert_eq!(fence.highest("events", 0), None);
    assert_eq!(fence.admit(&p(0, 5)), Ok(()));
    assert_eq!(fence.admit(&p(0, 5)), Ok(()), "the same owner writes again");
    assert_eq!(fence.admit(&p(0, 9)), Ok(()), "a newer owner");
    let stale = fence.admit(&p(0, 5)).expect_err("the superseded owner is refused");
    assert_eq!(stale, StaleEpoch { topic: "events".into(), partition: 0, offered: 5, highest: 9 });
    assert_eq!(
        stale.to_string(),
        "stale epoch for events/0: offered 5, but epoch 9 was seen: a newer owner has taken the partition over"
    );
    assert_eq!(fence.highest("events", 0), Some(9), "a refused write changes nothing");
}

#[test]
fn partitions_and_topics_are_fenced_apart() {
    let fence = Fence::new();
    fence.admit(&p(0, 9)).expect("first");
    assert_eq!(fence.admit(&p(1, 2)), Ok(()), "another partition");
    assert_eq!(fence.admit_epoch("other", 0, 1), Ok(()), "another topic");
    assert_eq!(fence.highest("other", 0), Some(1));
}

#[test]
fn epoch_zero_passes_only_until_a_real_epoch_was_seen() {
    let fence = Fence::new();
    assert_eq!(fence.admit(&p(0, 0)), Ok(()));
    assert_eq!(fence.admit(&p(0, 0)), Ok(()), "no epochs at all: nothing to fence with");
    assert_eq!(fence.admit(&p(0, 3)), Ok(()));
    assert!(fence.admit(&p(0, 0)).is_err(), "a writer without epochs after one with them");
    assert!(fence.lock(&p(0, 0)).is_err(), "the guarded form refuses it too");
}

#[test]
fn racing_checks_the_highest_epoch_wins_for_good() {
    let fence = Arc::new(Fence::new());
    let threads: Vec<_> = (1..=8u64)
        .map(|epoch| {
            let fence = fence.clone();
            // How many of its 100 checks passed.
            std::thread::spawn(move || (0..100).filter(|_| fence.admit(&p(0, epoch)).is_ok()).count())
        })
        .collect();
    let admitted: Vec<usize> = threads.into_iter().map(|t| t.join().expect("thread")).collect();
    assert_eq!(fence.highest("events", 0), Some(8));
    assert_eq!(admitted[7], 100, "the highest epoch is never refused: {admitted:?}");
    assert_eq!(fence.admit(&p(0, 7)).map_err(|e| e.highest), Err(8));
}

/// Why the guarded form exists: with `admit`, the superseded owner (epoch 5) passes its
/// check, the new owner (epoch 9) passes its own and writes, and then the old owner's
/// write lands, after the new one's. The fence saw both epochs in the right order and
/// still could not stop it.
#[test]
fn a_check_alone_lets_the_older_write_land_last() {
    let fence = Arc::new(Fence::new());
    let sink: Sink = Arc::default();
    let (checked_tx, checked) = mpsc::channel();
    let (wrote_tx, wrote) = mpsc::channel();
    let old = {
        let (fence, sink) = (fence.clone(), sink.clone());
        std::thread::spawn(move || {
            fence.admit(&p(0, 5)).expect("nothing newer seen yet");
            checked_tx.send(()).expect("main");
            // Slow between its check and its write (a GC pause, a network hop).
            wrote.recv_timeout(PROMPT).expect("the new owner writes");
            write(&sink, 5);
        })
    };
    checked.recv_timeout(PROMPT).expect("the old owner checked");
    fence.admit(&p(0, 9)).expect("the new owner");
    write(&sink, 9);
    wrote_tx.send(()).expect("old owner");
    old.join().expect("old owner");
    assert_eq!(written(&sink), vec![9, 5], "the race the guard closes: the stale write landed last");
}

/// The same two writers with the guard: the old owner's check holds until its write is
/// done, so the new owner waits for it, writes after it, and from then on the old owner
/// is refused.
#[test]
fn a_guard_holds_the_check_across_the_write() {
    let fence = Arc::new(Fence::new());
    let sink: Sink = Arc::default();
    let (checked_tx, checked) = mpsc::channel();
    let new = {
        let (fence, sink) = (fence.clone(), sink.clone());
        std::thread::spawn(move || {
            checked.recv_timeout(PROMPT).expect("the old owner checked");
            let guard = fence.lock(&p(0, 9)).expect("the new owner");
            assert_eq!(guard.epoch(), 9);
            assert_eq!(written(&sink), vec![5], "admitted only once the old owner's write was done");
            write(&sink, 9);
        })
    };
    let guard = fence.lock(&p(0, 5)).expect("nothing newer seen yet");
    checked_tx.send(()).expect("new owner");
    // The new owner is blocked in the slot while the old owner is slow before its write.
    until_waiting(&fence, 1);
    write(&sink, 5);
    drop(guard);
    new.join().expect("new owner");
    let late = fence.admit_then(&p(0, 5), || write(&sink, 5));
    assert_eq!(late.map_err(|e| e.highest), Err(9), "the old owner's next write is refused");
    assert_eq!(written(&sink), vec![5, 9]);
}

/// While the new owner holds the slot, the old owner is refused at once (it does not wait
/// to be refused), and a writer of another partition does not wait at all.
#[test]
fn a_held_slot_refuses_lower_epochs_at_once_and_holds_no_other_partition() {
    let fence = Arc::new(Fence::new());
    let _guard = fence.lock(&p(0, 9)).expect("the new owner");
    let (done_tx, done) = mpsc::channel();
    let other = fence.clone();
    std::thread::spawn(move || {
        let stale = other.lock(&p(0, 5)).map(|g| g.epoch());
        let elsewhere = other.admit_then(&p(1, 1), || "written");
        let _ = done_tx.send((stale, elsewhere));
    });
    let (stale, elsewhere) = done.recv_timeout(PROMPT).expect("neither waited for partition 0's guard");
    assert_eq!(stale.map_err(|e| e.highest), Err(9));
    assert_eq!(elsewhere, Ok("written"));
}

/// Many writers with epochs 1..=8, each writing through `admit_then`: whatever the
/// interleaving, no write lands after a write of a higher epoch.
#[test]
fn guarded_writes_never_land_after_a_higher_epochs() {
    let fence = Arc::new(Fence::new());
    let sink: Sink = Arc::default();
    let threads: Vec<_> = (1..=8u64)
        .map(|epoch| {
            let (fence, sink) = (fence.clone(), sink.clone());
            std::thread::spawn(move || {
                // A write takes a while (the thread may be descheduled between check and write).
                let slow_write = || {
                    std::thread::yield_now();
                    write(&sink, epoch)
                };
                (0..200).filter(|_| fence.admit_then(&p(0, epoch), slow_write).is_ok()).count()
            })
        })
        .collect();
    let admitted: Vec<usize> = threads.into_iter().map(|t| t.join().expect("thread")).collect();
    let landed = written(&sink);
    assert_eq!(landed.len(), admitted.iter().sum::<usize>(), "every admitted write landed");
    assert!(landed.windows(2).all(|w| w[0] <= w[1]), "a stale write landed after a newer one: {landed:?}");
    assert_eq!(admitted[7], 200, "the highest epoch is never refused: {admitted:?}");
}

/// The async form: the new owner's task waits for the old owner's async write without
/// blocking the runtime (one thread runs both tasks), then the old owner is refused.
#[tokio::test(flavor = "current_thread")]
async fn the_async_guard_holds_across_an_async_write() {
    let fence = Arc::new(Fence::new());
    let sink: Sink = Arc::default();
    let guard = fence.lock_async(&p(0, 5)).await.expect("nothing newer seen yet");
    let new = {
        let (fence, sink) = (fence.clone(), sink.clone());
        tokio::spawn(async move {
            fence
                .admit_then_async(&p(0, 9), || async {
                    assert_eq!(written(&sink), vec![5], "admitted after the old owner's write");
                    write(&sink, 9);
                })
                .await
        })
    };
    let waits = async {
        while fence.waiting("events", 0) != 1 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(PROMPT, waits).await.expect("the new owner waits for the slot");
    // An async write while holding the slot: the runtime's only thread stays free.
    tokio::task::yield_now().await;
    write(&sink, 5);
    drop(guard);
    let new = tokio::time::timeout(PROMPT, new).await.expect("the new owner is let in");
    assert_eq!(new.expect("task"), Ok(()));
    let late = fence.lock_async(&p(0, 5)).await.map(|g| g.epoch());
    assert_eq!(late.map_err(|e| e.highest), Err(9));
    assert_eq!(written(&sink), vec![5, 9]);
}

/// A waiting `lock_async` that is given up (its future dropped) leaves no trace, and the
/// slot is still free to take once the guard is gone.
#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_async_wait_leaves_the_slot_usable() {
    let fence = Fence::new();
    let guard = fence.lock_async(&p(0, 5)).await.expect("first");
    let gave_up = tokio::time::timeout(Duration::from_millis(20), fence.lock_async(&p(0, 6))).await;
    assert!(gave_up.is_err(), "it waited for the held slot");
    assert_eq!(fence.waiting("events", 0), 0);
    drop(guard);
    let next = tokio::time::timeout(PROMPT, fence.lock_async(&p(0, 6))).await.expect("free");
    assert_eq!(next.map(|g| g.epoch()), Ok(6));
}
