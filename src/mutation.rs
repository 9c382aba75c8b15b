//! Deliberate bugs, switched on by tests only, to prove that a test can see them.
//!
//! The whole-cluster simulation (issue 40) claims to find ownership bugs; the way to show
//! that claim is true is to put a known bug in and watch the simulation fail. Each
//! [`Mutation`] names one safety decision of the coordinator (a compare, a fence, a
//! floor), and the code that makes that decision asks [`is_active`] at that exact place,
//! in the code production runs and the instance's state machine shares. So a mutation
//! weakens production's path and the simulated one alike, and the simulation failing under
//! it shows that the decision it removes is needed and watched.
//!
//! The switch is thread-local and off by default: [`with_mutation`] turns one on for the
//! closure it runs, on the calling thread alone, so tests running in parallel are not
//! affected. Nothing in the service ever sets it; asking it costs a thread-local read.

use std::cell::Cell;

/// One safety decision, removed (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutation {
    /// A `PartitionReady` / `PartitionReleased` transaction no longer compares the
    /// partition's assignment and handoff records (`handoff_backend/decide.rs`).
    HandoffCompareDropped,
    /// A `PartitionReady` / `PartitionReleased` transaction no longer compares the
    /// caller's registration record (`handoff_backend/decide.rs`).
    CallerRegistrationCompareDropped,
    /// A fenced instance lease no longer ends the instance's streams: consumers go on
    /// processing what may be moved elsewhere (`shared/lease.rs`, `fences_streams`).
    SelfFenceSkipped,
    /// The leader's settle period after an interruption is zero: partitions of consumers
    /// whose registrations vanished in an outage move at once (`handoff_backend/leader`).
    SettleZero,
    /// The leader's plan transactions no longer compare its fence (the leader key's create
    /// revision): a deposed leader's writes land (`leader/reconcile.rs`).
    LeaderUnfenced,
    /// A lost registration is written again without comparing that no record is there:
    /// it may replace a newer registration of the name (`shared/cas.rs`).
    RebindCompareDropped,
    /// A fleet partition claim no longer compares what it was decided from
    /// (`fleet_backend/claim_decide.rs`).
    FleetClaimCompareDropped,
    /// A new epoch is built from the clock and revision alone, without the floor of the
    /// epochs already stored (`shared/records.rs::next_epoch`).
    EpochFloorDropped,
    /// An instance whose relay cannot follow the store no longer fences its streams
    /// (`shared/upkeep.rs`).
    StaleRelayNotFenced,
}

impl Mutation {
    /// Every mutation, in a fixed order (the simulation's mutation table).
    pub const ALL: [Mutation; 9] = [
        Mutation::HandoffCompareDropped,
        Mutation::CallerRegistrationCompareDropped,
        Mutation::SelfFenceSkipped,
        Mutation::SettleZero,
        Mutation::LeaderUnfenced,
        Mutation::RebindCompareDropped,
        Mutation::FleetClaimCompareDropped,
        Mutation::EpochFloorDropped,
        Mutation::StaleRelayNotFenced,
    ];
}

thread_local! {
    /// The mutation active on this thread, if any.
    static ACTIVE: Cell<Option<Mutation>> = const { Cell::new(None) };
}

/// Whether `mutation` is switched on for this thread (never, outside a test's
/// [`with_mutation`]).
pub fn is_active(mutation: Mutation) -> bool {
    ACTIVE.with(|active| active.get() == Some(mutation))
}

/// Runs `f` with `mutation` switched on for this thread, and off again afterwards (even if
/// `f` panics); what was active before is restored.
pub fn with_mutation<T>(mutation: Mutation, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Mutation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ACTIVE.with(|active| active.set(self.0));
        }
    }
    let _restore = Restore(ACTIVE.with(|active| active.replace(Some(mutation))));
    f()
}

#[cfg(test)]
mod tests {
    use super::{Mutation, is_active, with_mutation};

    #[test]
    fn a_mutation_is_on_only_inside_its_closure_and_only_on_its_thread() {
        assert!(Mutation::ALL.iter().all(|m| !is_active(*m)), "off by default");
        with_mutation(Mutation::SettleZero, || {
            assert!(is_active(Mutation::SettleZero));
            assert!(!is_active(Mutation::LeaderUnfenced));
            let elsewhere = std::thread::spawn(|| is_active(Mutation::SettleZero)).join();
            assert_eq!(elsewhere.ok(), Some(false), "another thread does not see it");
        });
        assert!(!is_active(Mutation::SettleZero), "off again after the closure");
        let panicked =
            std::panic::catch_unwind(|| with_mutation(Mutation::EpochFloorDropped, || panic!("boom")));
        assert!(panicked.is_err());
        assert!(!is_active(Mutation::EpochFloorDropped), "off again after a panic");
    }
}
