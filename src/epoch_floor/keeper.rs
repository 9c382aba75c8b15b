//! The running reservation: the first one written before the instance serves, the next
//! ones written by a task while it runs (see the module docs of [`super`]).

use std::{sync::Weak, time::Duration};

use super::{FloorError, FloorFile, needs_renewal, reserve, start_epoch};

/// How often the task compares what may be handed out with the reservation: a small
/// fraction of a half block (30 s of clock), so the renewal lands long before it is due.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The floor reserved on disk, and the file it is in.
#[derive(Debug)]
pub struct Reservation {
    file: FloorFile,
    reserved: u64,
}

impl Reservation {
    /// Reads the floor, picks the run's first epoch ([`start_epoch`] at `now_micros`) and
    /// writes the first reservation above it before anything is handed out. Returns the
    /// first epoch and the reservation.
    pub fn begin(file: FloorFile, now_micros: u64) -> Result<(u64, Reservation), FloorError> {
        let floor = file.read()?;
        let start = start_epoch(floor, now_micros);
        let reserved = reserve(start);
        file.write(reserved)?;
        tracing::info!(
            path = %file.path().display(),
            stored = ?floor,
            start,
            reserved,
            "epochs start above the floor kept in --state-dir"
        );
        Ok((start, Reservation { file, reserved }))
    }

    /// The floor on disk.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Writes the next reservation if `high`, the highest epoch that may be handed out
    /// now, has come within half a block of the reserved floor. Returns whether it wrote.
    pub fn keep_ahead(&mut self, high: u64) -> Result<bool, FloorError> {
        if !needs_renewal(self.reserved, high) {
            return Ok(false);
        }
        let next = reserve(high).max(self.reserved);
        self.file.write(next)?;
        self.reserved = next;
        Ok(true)
    }
}

/// Keeps `reservation` ahead of `high()` (the memory store's revision and the clock, the
/// two things the memory backend's epochs follow) every second, until the thing `alive`
/// points to is dropped (the store the coordinator used). The file writes run off the
/// runtime (`spawn_blocking`: fsync blocks). A failed write is logged as an error, counted
/// by `failed` (the `epoch_floor_renewal_failures_total` metric, which pages: half a block
/// later epochs run past the floor on disk) and tried again on the next check: the
/// previous reservation still covers half a block.
pub fn spawn_keeper<T: Send + Sync + 'static>(
    mut reservation: Reservation,
    alive: Weak<T>,
    high: impl Fn(&T) -> u64 + Send + Sync + 'static,
    failed: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(CHECK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(value) = alive.upgrade().map(|store| high(&store)) else { return };
            let renewal = tokio::task::spawn_blocking(move || {
                let result = reservation.keep_ahead(value);
                (reservation, result)
            })
            .await;
            let Ok((back, result)) = renewal else { return };
            reservation = back;
            if let Err(error) = result {
                failed();
                tracing::error!(%error, reserved = reservation.reserved(), high = value,
                    "cannot renew the epoch floor in --state-dir; epochs past the reserved floor \
                     could be handed out again after a crash and a clock stepped back");
            }
        }
    })
}

/// Wall-clock microseconds since the Unix epoch: the clock the epochs follow (the same
/// reading as the coordinators' `records::now_micros`). Read here, in the driver, never by
/// the pure decisions.
pub fn now_micros() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
