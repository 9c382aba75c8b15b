//! The instance lease's keeper, modelled on the virtual clock: it grants a session, keeps
//! it alive every [`keep_alive_period`], fences at [`fence_after`] without a renewal
//! (timed from when the renewing keep-alive was sent), lifts the fence when a keep-alive
//! succeeds again, and replaces a session the store expired. What it decides is what
//! `shared/lease.rs` decides (the same two functions give its periods); it reports each
//! change of [`LeaseState`] to its instance, and its requests travel through the
//! simulated network to the store model like every other request.

use std::time::Duration;

use crate::coordinator::machine::io::{LeaseState, Micros};
use crate::coordinator::{fence_after, keep_alive_period};
use crate::store::{SessionId, StoreError};

/// What the keeper asks of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeeperAsk {
    /// Grant a session of the TTL.
    Grant,
    /// Keep this session alive.
    KeepAlive(SessionId),
}

/// One instance's lease keeper.
#[derive(Clone, Debug)]
pub struct Keeper {
    ttl: Micros,
    period: Micros,
    fence_after: Micros,
    session: Option<SessionId>,
    /// What it last reported.
    state: LeaseState,
    /// When the last successful keep-alive (or the grant) was sent.
    renewed_at: Micros,
    next_at: Micros,
    /// After the store expired a live session: when to fence (naming it) if no new one came.
    fence_due: Option<(Micros, SessionId)>,
    backoff: Micros,
    /// The request in flight: its token, when it was sent, and when to give up on it.
    waiting: Option<(u64, KeeperAsk, Micros, Micros)>,
    tokens: u64,
}

impl Keeper {
    /// A keeper that grants its first session at `now`.
    pub fn new(ttl: Duration, now: Micros) -> Self {
        Self {
            ttl: ttl.as_micros() as Micros,
            period: keep_alive_period(ttl).as_micros() as Micros,
            fence_after: fence_after(ttl).as_micros() as Micros,
            session: None,
            state: LeaseState::Pending,
            renewed_at: now,
            next_at: now,
            fence_due: None,
            backoff: 50_000,
            waiting: None,
            tokens: 0,
        }
    }

    /// What it last reported.
    pub fn state(&self) -> LeaseState {
        self.state
    }

    /// When it next needs waking.
    pub fn next_wake(&self) -> Micros {
        let mut wake = self.next_at;
        if let Some((_, _, _, give_up)) = self.waiting {
            wake = give_up;
        }
        if matches!(self.state, LeaseState::Live(_)) {
            wake = wake.min(self.renewed_at + self.fence_after);
        }
        if let Some((due, _)) = self.fence_due {
            wake = wake.min(due);
        }
        wake
    }

    /// A keep-alive at once (the instance asked: `KeepLeaseAliveNow`).
    pub fn check_now(&mut self, now: Micros) {
        self.next_at = self.next_at.min(now);
    }

    /// Time passed: fences when due, gives up on a request that took too long, and sends
    /// the next request when one is due and the instance `renews` (`LeaseHolder::renews`:
    /// otherwise the session lapses). Returns a new state to report and a request to send
    /// (with its token).
    pub fn wake(&mut self, now: Micros, renews: bool) -> (Option<LeaseState>, Option<(u64, KeeperAsk)>) {
        let mut report = None;
        if let LeaseState::Live(session) = self.state
            && now >= self.renewed_at + self.fence_after
        {
            report = self.set(LeaseState::Fenced(session));
        }
        if let Some((due, session)) = self.fence_due
            && now >= due
        {
            self.fence_due = None;
            report = self.set(LeaseState::Fenced(session)).or(report);
        }
        if let Some((_, ask, _, give_up)) = self.waiting {
            if now < give_up {
                return (report, None);
            }
            // Given up: a keep-alive of a fenced session past its TTL means it is surely
            // gone; anything else is tried again.
            self.waiting = None;
            if matches!(ask, KeeperAsk::KeepAlive(_)) && now >= self.renewed_at + self.ttl {
                self.session = None;
                report = self.set(LeaseState::Pending).or(report);
            }
            self.next_at = now;
        }
        if now < self.next_at {
            return (report, None);
        }
        if !renews {
            let lapses_at = self.renewed_at + self.ttl;
            if self.session.is_some() && now >= lapses_at {
                self.session = None;
                report = self.set(LeaseState::Pending).or(report);
            }
            self.next_at = match self.session {
                Some(_) => (now + self.period).min(lapses_at),
                None => now + self.period,
            };
            return (report, None);
        }
        let ask = match self.session {
            Some(session) => KeeperAsk::KeepAlive(session),
            None => KeeperAsk::Grant,
        };
        let give_up = match (ask, self.state) {
            (KeeperAsk::KeepAlive(_), LeaseState::Live(_)) => self.renewed_at + self.fence_after,
            (KeeperAsk::KeepAlive(_), _) => self.renewed_at + self.ttl,
            (KeeperAsk::Grant, _) => now + self.period,
        };
        self.tokens += 1;
        self.waiting = Some((self.tokens, ask, now, give_up.max(now + 1)));
        (report, Some((self.tokens, ask)))
    }

    /// The store answered request `token`: `Ok(Some(session))` for a grant, `Ok(None)` for
    /// a keep-alive. Returns a new state to report.
    pub fn answered(
        &mut self,
        now: Micros,
        token: u64,
        answer: Result<Option<SessionId>, StoreError>,
    ) -> Option<LeaseState> {
        let (waited, ask, sent_at, _) = self.waiting?;
        if waited != token {
            return None;
        }
        self.waiting = None;
        match (ask, answer) {
            (KeeperAsk::Grant, Ok(Some(session))) => {
                self.session = Some(session);
                self.fence_due = None;
                self.renewed_at = sent_at;
                self.next_at = sent_at + self.period;
                self.backoff = 50_000;
                self.set(LeaseState::Live(session))
            }
            (KeeperAsk::KeepAlive(session), Ok(_)) => {
                self.renewed_at = sent_at;
                self.next_at = sent_at + self.period;
                self.backoff = 50_000;
                self.set(LeaseState::Live(session))
            }
            (KeeperAsk::KeepAlive(session), Err(StoreError::SessionExpired(_))) => {
                if matches!(self.state, LeaseState::Live(_)) {
                    self.fence_due = Some((self.renewed_at + self.fence_after, session));
                }
                self.session = None;
                self.next_at = now;
                self.set(LeaseState::Pending)
            }
            (_, _) => {
                self.next_at = now + self.backoff;
                self.backoff = (self.backoff * 2).min(self.period);
                None
            }
        }
    }

    fn set(&mut self, state: LeaseState) -> Option<LeaseState> {
        (self.state != state).then(|| {
            self.state = state;
            state
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    #[test]
    fn grants_keeps_alive_fences_and_lifts_the_fence() {
        let mut keeper = Keeper::new(TTL, 0);
        let (_, Some((t, KeeperAsk::Grant))) = keeper.wake(0, true) else { panic!("no grant asked") };
        assert_eq!(keeper.answered(5, t, Ok(Some(SessionId(1)))), Some(LeaseState::Live(SessionId(1))));
        assert_eq!(keeper.next_wake(), 1_000_000, "a third of the TTL after the grant was sent");
        let (_, Some((t, KeeperAsk::KeepAlive(_)))) = keeper.wake(1_000_000, true) else {
            panic!("no keep-alive")
        };
        // The answer is lost: at ¾ TTL after the last renewal (sent at 0) it fences.
        assert_eq!(keeper.next_wake(), 2_250_000);
        let (fenced, Some((t2, _))) = keeper.wake(2_250_000, true) else { panic!("no retry") };
        assert_eq!(fenced, Some(LeaseState::Fenced(SessionId(1))));
        assert_ne!(t, t2);
        assert_eq!(keeper.wake(2_250_001, true), (None, None), "one request at a time");
        assert_eq!(keeper.answered(2_300_000, t2, Ok(None)), Some(LeaseState::Live(SessionId(1))));
    }

    #[test]
    fn a_session_the_store_expired_is_replaced_and_fenced_if_late() {
        let mut keeper = Keeper::new(TTL, 0);
        let (_, Some((t, _))) = keeper.wake(0, true) else { panic!() };
        keeper.answered(0, t, Ok(Some(SessionId(1))));
        let (_, Some((t, _))) = keeper.wake(1_000_000, true) else { panic!() };
        let expired = Err(StoreError::SessionExpired(SessionId(1)));
        assert_eq!(keeper.answered(1_000_100, t, expired), Some(LeaseState::Pending));
        let (_, Some((_, KeeperAsk::Grant))) = keeper.wake(1_000_100, true) else { panic!("no new grant") };
        // No new session by the old fence time: fenced.
        assert_eq!(keeper.wake(2_250_000, true).0, Some(LeaseState::Fenced(SessionId(1))));
    }

    #[test]
    fn an_instance_that_cannot_follow_lets_its_session_lapse_and_takes_no_new_one() {
        let mut keeper = Keeper::new(TTL, 0);
        let (_, Some((t, _))) = keeper.wake(0, true) else { panic!() };
        keeper.answered(0, t, Ok(Some(SessionId(1))));
        assert_eq!(keeper.wake(1_000_000, false), (None, None), "no keep-alive");
        assert_eq!(keeper.wake(2_250_000, false).0, Some(LeaseState::Fenced(SessionId(1))));
        assert_eq!(keeper.wake(3_000_000, false), (Some(LeaseState::Pending), None), "gone at its TTL");
        assert_eq!(keeper.wake(4_000_000, false), (None, None), "no new grant");
        let (_, Some((_, KeeperAsk::Grant))) = keeper.wake(5_000_000, true) else {
            panic!("a grant once it follows")
        };
    }
}
