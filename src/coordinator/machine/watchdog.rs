//! What keeps a state machine from waiting forever, the same for both backends: a deadline
//! for every store request (a lost answer fails the request `Unavailable`), and the silence
//! rule of production's follower (a watch that says nothing at all, not even a progress
//! mark, for [`silence_bound`] makes the instance stale as of when it was last heard from).
//! Pure: the instance says what happened and when; the watchdog says what is due.

use std::collections::BTreeMap;
use std::time::Duration;

use super::io::{Micros, RequestId};
use crate::coordinator::shared::lease::fence_after;
use crate::coordinator::shared::mirror::silence_bound;
use crate::store::{StoreError, Unreachable};

/// How long a store request may go unanswered: the etcd client's per-call budget, retries
/// included, so a request the driver still works on is not given up before the client
/// gives up itself.
pub const STORE_ANSWER_WITHIN: Duration = crate::store::DEFAULT_REQUEST_TIMEOUT;

/// What a request past its deadline failed with: its answer was lost.
pub fn no_answer() -> StoreError {
    StoreError::Unavailable(Unreachable::NoAnswer { within: STORE_ANSWER_WITHIN })
}

/// The deadlines of an instance's store requests and the silence of its watch.
#[derive(Debug)]
pub struct Watchdog {
    /// When each store request in flight counts as failed without an answer.
    deadlines: BTreeMap<RequestId, Micros>,
    /// When the watch in use was last heard from (opened, a batch, a progress mark).
    heard: Micros,
    /// A watch went silent: the mirror follows again only once a new watch speaks.
    unproven: bool,
    /// How long the watch in use may say nothing (`None`: the store sends no progress
    /// marks, and a silent watch cannot be told from a quiet store).
    silence: Option<Micros>,
}

impl Watchdog {
    /// A watchdog at `now` for an instance with session TTL `ttl` whose store's watches
    /// send a progress mark every `progress_every` when quiet.
    pub fn new(now: Micros, ttl: Duration, progress_every: Option<Duration>) -> Self {
        let silence =
            progress_every.map(|every| silence_bound(fence_after(ttl), every).as_micros() as Micros);
        Watchdog { deadlines: BTreeMap::new(), heard: now, unproven: false, silence }
    }

    /// The request `request` was sent at `now`.
    pub fn sent(&mut self, request: RequestId, now: Micros) {
        self.deadlines.insert(request, now + STORE_ANSWER_WITHIN.as_micros() as Micros);
    }

    /// The request `request` was answered, or is given up.
    pub fn settled(&mut self, request: RequestId) {
        self.deadlines.remove(&request);
    }

    /// The requests whose deadline has passed at `now`.
    pub fn expired(&self, now: Micros) -> Vec<RequestId> {
        self.deadlines.iter().filter(|(_, at)| now >= **at).map(|(request, _)| *request).collect()
    }

    /// The watch in use was opened, or said something, at `now`. True when that proves a
    /// new watch after a silence: the mirror follows again.
    pub fn heard(&mut self, now: Micros) -> bool {
        self.heard = now;
        std::mem::take(&mut self.unproven)
    }

    /// The watch in use was opened at `now`: its silence counts from then (until it is
    /// opened it cannot speak). Proves nothing.
    pub fn opened(&mut self, now: Micros) {
        self.heard = now;
    }

    /// Whether a watch went silent and no new one has spoken since.
    pub fn unproven(&self) -> bool {
        self.unproven
    }

    /// If the open watch has said nothing for its bound at `now`: it is given up (no new
    /// watch counts as following until one speaks), and the answer is when it was last
    /// heard from, as of which the instance is stale.
    pub fn silent(&mut self, now: Micros, watching: bool) -> Option<Micros> {
        let bound = self.silence.filter(|_| watching)?;
        if now < self.heard + bound {
            return None;
        }
        self.unproven = true;
        Some(self.heard)
    }

    /// When the watchdog has something to do next: the first deadline, or the silence
    /// bound of the watch in use.
    pub fn wake(&self, watching: bool) -> Option<Micros> {
        let deadline = self.deadlines.values().min().copied();
        let silent = self.silence.filter(|_| watching).map(|bound| self.heard + bound);
        deadline.into_iter().chain(silent).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_expires_at_its_deadline_and_not_once_settled() {
        let mut dog = Watchdog::new(0, Duration::from_secs(2), None);
        dog.sent(1, 10);
        dog.sent(2, 20);
        let within = STORE_ANSWER_WITHIN.as_micros() as Micros;
        assert!(dog.expired(10 + within - 1).is_empty());
        assert_eq!(dog.expired(10 + within), vec![1]);
        dog.settled(1);
        assert_eq!(dog.wake(false), Some(20 + within));
        assert_eq!(dog.expired(30 + within), vec![2]);
    }

    #[test]
    fn a_silent_watch_is_given_up_and_only_a_new_one_that_speaks_proves_it() {
        let ttl = Duration::from_secs(2);
        let mut dog = Watchdog::new(0, ttl, Some(ttl / 4));
        let bound = fence_after(ttl).as_micros() as Micros;
        assert_eq!(dog.wake(true), Some(bound));
        assert_eq!(dog.silent(bound - 1, true), None);
        assert_eq!(dog.silent(bound, false), None, "no watch open: nothing to be silent");
        assert_eq!(dog.silent(bound, true), Some(0), "stale as of when it was last heard");
        assert!(dog.unproven());
        dog.opened(bound + 5);
        assert!(dog.unproven(), "opening a watch proves nothing");
        assert!(dog.heard(bound + 9), "the new watch spoke");
        assert!(!dog.heard(bound + 10));
        let mut quiet = Watchdog::new(0, ttl, None);
        assert_eq!(quiet.silent(Micros::MAX / 2, true), None, "no progress marks: never silent");
    }
}
