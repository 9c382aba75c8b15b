//! The floor's decisions, with the clock as an input, and the file on a temp dir.

use super::*;

/// A clock reading: 2026-12-06 in microseconds since the Unix epoch.
const NOW: u64 = 1_796_520_000_000_000;

#[test]
fn a_first_run_starts_at_the_clock() {
    assert_eq!(start_epoch(None, NOW), NOW);
    // A clock at (or before) the Unix epoch still gives a served epoch, never 0.
    assert_eq!(start_epoch(None, 0), 1);
}

#[test]
fn a_restart_starts_above_the_floor_even_with_the_clock_stepped_back() {
    let floor = NOW + 5;
    // The clock went back an hour: the floor wins.
    assert_eq!(start_epoch(Some(floor), NOW - 3_600_000_000), floor + 1);
    // The clock is ahead of the floor: the clock wins.
    assert_eq!(start_epoch(Some(floor), NOW + 10), NOW + 10);
    assert_eq!(start_epoch(Some(u64::MAX), NOW), u64::MAX, "saturates instead of wrapping");
}

#[test]
fn a_reservation_is_one_block_ahead_and_renewed_at_half_a_block() {
    let reserved = reserve(NOW);
    assert_eq!(reserved, NOW + BLOCK);
    assert!(!needs_renewal(reserved, NOW));
    assert!(!needs_renewal(reserved, NOW + BLOCK / 2 - 1));
    assert!(needs_renewal(reserved, NOW + BLOCK / 2));
    assert!(needs_renewal(reserved, NOW + BLOCK + 7), "past the floor: renew at once");
}

#[test]
fn the_file_round_trips_and_a_missing_one_is_a_first_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = FloorFile::open(&dir.path().join("state")).expect("creates the state dir");
    assert_eq!(file.read().expect("reads"), None);
    file.write(NOW).expect("writes");
    assert_eq!(file.read().expect("reads"), Some(NOW));
    file.write(NOW + 1).expect("replaces");
    assert_eq!(file.read().expect("reads"), Some(NOW + 1));
    assert!(!dir.path().join("state").join(format!("{FILE_NAME}.tmp")).exists(), "no temporary file left");
}

#[test]
fn a_corrupt_file_stops_the_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join(FILE_NAME), "twelve\n").expect("write");
    let file = FloorFile::open(dir.path()).expect("opens");
    match file.read() {
        Err(FloorError::Corrupt { text, .. }) => assert_eq!(text, "twelve\n"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(Reservation::begin(file, NOW).is_err(), "no run starts on a floor it cannot read");
}

/// Two runs on one state dir: the second's clock is an hour behind the first's, and the
/// first crashed after handing out epochs up to just below its reservation. The second
/// still starts above all of them.
#[test]
fn a_crash_and_a_clock_stepped_back_never_reuse_an_epoch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (first, mut run) =
        Reservation::begin(FloorFile::open(dir.path()).expect("opens"), NOW).expect("begins");
    assert_eq!(first, NOW);
    assert_eq!(run.reserved(), NOW + BLOCK);
    // The first run hands out epochs up to `high`; the keeper renews as it goes.
    let mut high = first;
    let mut renewals = 0;
    while high < NOW + 5 * BLOCK {
        high += BLOCK / 10;
        if run.keep_ahead(high).expect("renews") {
            renewals += 1;
        }
        assert!(run.reserved() > high, "the floor on disk stays above what is handed out");
    }
    assert!(renewals >= 5, "renewed {renewals} times");
    let handed_out = high;
    drop(run); // the crash: nothing more is written

    let stepped_back = NOW - 3_600_000_000;
    let (second, run) =
        Reservation::begin(FloorFile::open(dir.path()).expect("opens"), stepped_back).expect("begins");
    assert!(second > handed_out, "the second run starts at {second}, above {handed_out}");
    assert!(run.reserved() > second);
}

/// The running keeper renews the file once what may be handed out nears the reservation,
/// and ends when the store it watches is dropped.
#[tokio::test]
async fn the_keeper_renews_ahead_and_ends_with_its_store() {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = FloorFile::open(dir.path()).expect("opens");
    let (start, run) = Reservation::begin(file.clone(), NOW).expect("begins");
    let high = Arc::new(AtomicU64::new(start + BLOCK * 3 / 4));
    let keeper = spawn_keeper(
        run,
        Arc::downgrade(&high),
        |h: &AtomicU64| h.load(Ordering::SeqCst),
        || panic!("no write fails here"),
    );
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while file.read().expect("reads") != Some(start + BLOCK * 3 / 4 + BLOCK) {
        assert!(std::time::Instant::now() < give_up, "no renewal: {:?}", file.read());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(high);
    tokio::time::timeout(std::time::Duration::from_secs(5), keeper)
        .await
        .expect("the keeper ends with its store")
        .expect("and does not panic");
}

/// A renewal that cannot be written is counted at every check while it keeps failing (the
/// alert's input), and the keeper goes on: a later check that can write renews.
#[tokio::test]
async fn a_renewal_that_cannot_be_written_is_counted_and_tried_again() {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let state_dir = dir.path().join("state");
    let file = FloorFile::open(&state_dir).expect("opens");
    let (start, run) = Reservation::begin(file.clone(), NOW).expect("begins");
    // The state dir is gone (a volume unmounted, say): the temporary file cannot be created.
    std::fs::remove_dir_all(&state_dir).expect("removes the state dir");
    let high = Arc::new(AtomicU64::new(start + BLOCK * 3 / 4));
    let failures = Arc::new(AtomicU64::new(0));
    let counted = failures.clone();
    let _keeper = spawn_keeper(
        run,
        Arc::downgrade(&high),
        |h: &AtomicU64| h.load(Ordering::SeqCst),
        move || {
            counted.fetch_add(1, Ordering::SeqCst);
        },
    );
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while failures.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < give_up, "failures counted: {failures:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The dir is back: the next check renews.
    std::fs::create_dir_all(&state_dir).expect("creates the state dir again");
    while file.read().ok().flatten() != Some(start + BLOCK * 3 / 4 + BLOCK) {
        assert!(std::time::Instant::now() < give_up, "no renewal once writable: {:?}", file.read());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
