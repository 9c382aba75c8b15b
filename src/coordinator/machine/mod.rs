//! An instance of a store-backed backend as a state machine: one state, one
//! `step(now, input) -> effects` (issue 40).
//!
//! [`io`] holds the inputs and effects, shared by both store-backed backends; the handoff
//! backend's state and step are in `handoff_backend/machine/`. The whole-cluster
//! simulation drives instances through them today; the production driver switches over
//! to the same step next, so what the simulation checks is what runs.

pub mod io;
