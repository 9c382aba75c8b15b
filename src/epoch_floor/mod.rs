//! `--state-dir`: the epoch floor of the memory and static backends (docs/design.md §10).
//!
//! Those backends keep nothing across a restart, so without a floor their epochs rest on
//! the wall clock alone, and a clock stepped back by more than the last run's uptime hands
//! out epochs below the last run's. With `--state-dir`, the instance keeps a number in
//! `{state_dir}/epoch-floor` that is never below any epoch it handed out:
//!
//! * at start it reads the floor `F` (none: a first run) and starts at
//!   [`start_epoch`]`(F, now)` = max(now µs, F + 1): above everything any earlier run
//!   handed out, whatever the clock says;
//! * before serving it writes a reservation above that start ([`reserve`]: one
//!   [`BLOCK`] ahead), and while it runs it writes the next reservation whenever what it
//!   may hand out (the memory store's revision, or the clock, which the epochs follow) comes
//!   within half a block of the reserved one ([`needs_renewal`]). A crash at any moment
//!   leaves a floor above every epoch handed out, at the cost of one file write per half
//!   block (30 s of clock, or 30 million writes).
//!
//! The decisions are pure and take the clock as an input; [`FloorFile`] is the small
//! driver that reads and writes the file (write a temporary file, fsync it, rename it over
//! the floor, fsync the directory: a crash leaves the old floor or the new one, never a
//! torn one).

use std::{io, path::PathBuf};

/// How far ahead of what may be handed out a reservation reaches: one minute of clock
/// (the epochs follow the clock in microseconds), or a million writes of the memory store
/// beyond it, whichever comes first matters little: both renew long before they run out.
pub const BLOCK: u64 = 60_000_000;

/// The file under `--state-dir` that holds the floor.
pub const FILE_NAME: &str = "epoch-floor";

/// Errors of the floor file, named by cause. Every one stops the start: a floor that
/// cannot be read could be one that protects the epochs, and serving without it could
/// hand out lower ones.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    /// The state dir or the file cannot be read or written.
    #[error("--state-dir: cannot {action} {path}: {source}")]
    Io {
        /// What was being done (`read`, `write`, `create`...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file holds something other than a floor (a decimal number).
    #[error("--state-dir: {path} does not hold an epoch floor (a decimal number): {text:?}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What it holds (cut to 64 characters).
        text: String,
    },
}

/// The first epoch (or memory store revision) of a run that starts at `now_micros` with
/// the floor `floor` on disk (`None`: no earlier run): above the floor, so above every
/// epoch an earlier run handed out even if the clock went back, and at least the clock.
pub fn start_epoch(floor: Option<u64>, now_micros: u64) -> u64 {
    let above_floor = floor.map_or(1, |f| f.saturating_add(1));
    now_micros.max(above_floor)
}

/// The floor to write so that `high`, the highest epoch that may be handed out now, is
/// one [`BLOCK`] below it.
pub fn reserve(high: u64) -> u64 {
    high.saturating_add(BLOCK)
}

/// Whether the reservation `reserved` must be renewed now that `high` may be handed out:
/// when less than half a block is left, so a renewal that takes a while (a slow disk)
/// still lands before the counter reaches the reserved floor.
pub fn needs_renewal(reserved: u64, high: u64) -> bool {
    high.saturating_add(BLOCK / 2) >= reserved
}

/// Parses the file's text: one decimal number (surrounding whitespace allowed).
pub fn parse(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

mod file;
mod keeper;

pub use file::FloorFile;
pub use keeper::{Reservation, now_micros, spawn_keeper};

#[cfg(test)]
mod tests;
