//! What the two seeded simulations share (`tests/coordinator_sim`, the handoff backend, and
//! `tests/fleet_sim`, the fleet backend). Both run two or three coordinator instances over
//! ONE `MemoryStore`, each behind its own `FaultyStore`, on paused tokio time, with
//! consumers that call the `ConsumerGroupCoordinator` trait directly; they differ in the
//! backend, its faults and its invariants, not in how a run is driven. So the driving is
//! here once, and a fix to it (a draw, the loop, a consumer's reaction) reaches both:
//!
//! * [`draws`]: the seeded generator and the steps of shaping a schedule both take;
//! * [`world`]: the instances, consumers, streams, agenda and log of a run, and the
//!   [`world::Backend`] a simulation plugs in;
//! * [`run`]: the loop that delivers every revision, answer, command and timed step, and
//!   settles each instant before the invariants are checked;
//! * [`cast`]: what consumers and instances do the same way (register, deregister,
//!   reconnect, cut-offs and their fence, restarts, the settle deadline);
//! * [`runner`]: the mains' knobs, seeds, watchdog, survey and failure reports.
//!
//! Every draw keeps its order and its tags, so each seed draws what it drew before.

/// Returns `Err(message)` from the enclosing function unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

pub mod cast;
pub mod draws;
pub mod run;
pub mod runner;
pub mod world;
