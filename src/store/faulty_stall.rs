//! Stalls of a [`FaultyStore`]'s connection (see its module docs): requests wait at the
//! door, answers and watch batches on the way back, until the stall ends; then the held
//! requests reach the store late, and their answers arrive late or are lost.
//!
//! A stall that starts while one is in force extends it (never shortens it), so a test that
//! arms one at a precise write cannot cut short one already holding everything.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{FaultyStore, State};
use crate::store::Txn;

/// One stall of the connection (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// Counts the stalls of this wrapper, from 1.
    pub id: u64,
    /// When it began.
    pub since: Instant,
    /// When it ends (or ended).
    pub until: Instant,
    /// What becomes of the calls it held.
    pub then: AfterStall,
}

/// What becomes of the calls a stall held, when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterStall {
    /// They go on: the held requests reach the store late, their answers arrive late.
    Deliver,
    /// The connection resets: the held requests still reach the store, late, but their
    /// answers are lost, and every open watch breaks.
    Lose,
}

/// Which transaction starts an armed stall.
type PickTxn = Arc<dyn Fn(&Txn) -> bool + Send + Sync>;

/// A stall waiting for the transaction that starts it.
pub(super) struct Armed {
    pub(super) period: Duration,
    pub(super) then: AfterStall,
    pub(super) pick: PickTxn,
}

impl State {
    /// The stall in force, if any.
    pub(super) fn stall_now(&self) -> Option<Stall> {
        self.stall.filter(|stall| Instant::now() < stall.until)
    }
}

impl FaultyStore {
    /// Stalls the connection from now for `period` (of tokio time); see the module docs.
    /// A stall in force is extended, never shortened (and loses its answers if either
    /// does).
    pub fn stall(&self, period: Duration, then: AfterStall) {
        self.start_stall(period, then);
    }

    /// Stalls the connection for `period` from the next transaction `pick` accepts (that
    /// transaction is the first one held): to hold one precise write, such as a leader's
    /// plan or a consumer's call, past what happens meanwhile.
    pub fn stall_at_txn(
        &self,
        period: Duration,
        then: AfterStall,
        pick: impl Fn(&Txn) -> bool + Send + Sync + 'static,
    ) {
        self.state().armed = Some(Armed { period, then, pick: Arc::new(pick) });
    }

    /// Ends the stall in force now (the held calls go on as it says) and disarms a pending
    /// one.
    pub fn end_stall(&self) {
        {
            let mut state = self.state();
            state.armed = None;
            let now = Instant::now();
            if let Some(stall) = state.stall.as_mut().filter(|s| now < s.until) {
                stall.until = now;
            }
        }
        self.shared.stalls.send_modify(|count| *count += 1);
    }

    /// The latest stall (in force or over), to learn when an armed one began.
    pub fn last_stall(&self) -> Option<Stall> {
        self.state().stall
    }

    fn start_stall(&self, period: Duration, then: AfterStall) {
        let stall = {
            let mut state = self.state();
            let now = Instant::now();
            let id = state.stall.map_or(1, |s| s.id + 1);
            let stall = match state.stall_now() {
                Some(current) => Stall {
                    id,
                    since: current.since,
                    until: current.until.max(now + period),
                    then: if current.then == AfterStall::Lose { AfterStall::Lose } else { then },
                },
                None => Stall { id, since: now, until: now + period, then },
            };
            state.stall = Some(stall);
            stall
        };
        self.shared.stalls.send_modify(|count| *count += 1);
        if stall.then == AfterStall::Lose {
            // The reset breaks every watch open when the stall ends.
            let store = self.clone();
            tokio::spawn(async move {
                let mut changes = store.shared.stalls.subscribe();
                loop {
                    let Some(current) = store.state().stall_now() else { break };
                    tokio::select! {
                        () = tokio::time::sleep_until(current.until) => {}
                        _ = changes.changed() => {}
                    }
                }
                store.shared.cuts.send_modify(|count| *count += 1);
            });
        }
    }

    /// Starts the armed stall if `txn` is the one it waits for.
    pub(super) fn trigger(&self, txn: &Txn) {
        let Some(pick) = self.state().armed.as_ref().map(|armed| armed.pick.clone()) else { return };
        if !pick(txn) {
            return;
        }
        let Some(armed) = self.state().armed.take() else { return };
        self.start_stall(armed.period, armed.then);
    }

    /// Waits while a stall is in force; returns the stall that held the caller, if any.
    pub(super) async fn wait_out_stall(&self) -> Option<Stall> {
        let mut changes = self.shared.stalls.subscribe();
        let mut held = None;
        loop {
            let Some(stall) = self.state().stall_now() else { return held };
            if held.is_none() {
                self.state().stats.stalled_calls += 1;
            }
            held = Some(stall);
            tokio::select! {
                () = tokio::time::sleep_until(stall.until) => {}
                _ = changes.changed() => {}
            }
        }
    }
}
