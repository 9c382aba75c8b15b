//! What keeps a state machine from waiting forever, the same for both backends: a deadline
//! for every store request (a lost answer fails the request `Unavailable`), and the silence
//! rule of production's follower (a watch that says nothing at all, not even a progress
//! mark, for [`silence_bound`] makes the instance stale as of when it was last heard from).
//! Pure: the instance says what happened and when; the watchdog says what is due.
//!
//! **Noticed late, a bound says nothing about the store.** The instance asks to be woken by
//! every deadline and by the silence bound ([`Watchdog::wake`]), so a step that finds one
//! of them passed by more than [`Watchdog::late_after`] (one progress period) runs late:
//! the instance was slow, not the store (busy, or its runtime frozen, with the watch's
//! batches and the store's answers queued behind it; the watch even asks for progress only
//! while it runs). A busy instance must not fence itself for being busy: such a bound is
//! not taken as the store's silence or a lost answer, and starts afresh from the step that
//! noticed it: a whole bound (the running follower, `shared/mirror/follower.rs::
//! silence_holds`, gives the watch two progress periods more). The step reads no clock for
//! this: it compares its `now` with the times it computed itself.

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
    /// When the watch in use was last heard from (opened, a batch, a progress mark), or
    /// when its silence was noticed late: its silence counts from then.
    heard: Micros,
    /// A watch went silent: the mirror follows again only once a new watch speaks.
    unproven: bool,
    /// How long the watch in use may say nothing (`None`: the store sends no progress
    /// marks, and a silent watch cannot be told from a quiet store).
    silence: Option<Micros>,
    /// How long after its time a deadline or the silence bound may be noticed and still be
    /// the store's doing ([`late_after`](Self::late_after)).
    late_after: Micros,
}

impl Watchdog {
    /// A watchdog at `now` for an instance with session TTL `ttl` whose store's watches
    /// send a progress mark every `progress_every` when quiet.
    pub fn new(now: Micros, ttl: Duration, progress_every: Option<Duration>) -> Self {
        let silence =
            progress_every.map(|every| silence_bound(fence_after(ttl), every).as_micros() as Micros);
        let late_after = progress_every.unwrap_or(ttl / 4).as_micros() as Micros;
        Watchdog { deadlines: BTreeMap::new(), heard: now, unproven: false, silence, late_after }
    }

    /// How long after its time a deadline or the silence bound may be noticed and still be
    /// taken as the store's doing (module docs): one progress period of the watch, as the
    /// running follower allows (the service sets a quarter of the TTL); a quarter of the
    /// TTL for a store that sends no progress marks.
    pub fn late_after(&self) -> Micros {
        self.late_after
    }

    /// The request `request` was sent at `now`.
    pub fn sent(&mut self, request: RequestId, now: Micros) {
        self.deadlines.insert(request, now + STORE_ANSWER_WITHIN.as_micros() as Micros);
    }

    /// The request `request` was answered, or is given up.
    pub fn settled(&mut self, request: RequestId) {
        self.deadlines.remove(&request);
    }

    /// The requests whose deadline has passed at `now`. A deadline noticed late (module
    /// docs) is not a lost answer: the request gets a fresh deadline from `now`.
    pub fn expired(&mut self, now: Micros) -> Vec<RequestId> {
        let late_after = self.late_after;
        let mut expired = Vec::new();
        for (request, at) in &mut self.deadlines {
            if now < *at {
                continue;
            }
            if now - *at > late_after {
                *at = now + STORE_ANSWER_WITHIN.as_micros() as Micros;
            } else {
                expired.push(*request);
            }
        }
        expired
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
    /// heard from, as of which the instance is stale. A silence noticed late (module docs)
    /// is the instance's, not the watch's: a fresh bound starts at `now`.
    pub fn silent(&mut self, now: Micros, watching: bool) -> Option<Micros> {
        let bound = self.silence.filter(|_| watching)?;
        let due = self.heard + bound;
        if now < due {
            return None;
        }
        if now - due > self.late_after {
            self.heard = now;
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

    #[test]
    fn a_bound_noticed_late_starts_afresh_and_one_noticed_on_time_holds() {
        let ttl = Duration::from_secs(2);
        let every = ttl / 4;
        let mut dog = Watchdog::new(0, ttl, Some(every));
        let (bound, late) = (fence_after(ttl).as_micros() as Micros, dog.late_after());
        assert_eq!(late, every.as_micros() as Micros, "one progress period");
        // The silence: noticed within a progress period of its bound, it holds.
        let mut on_time = Watchdog::new(0, ttl, Some(every));
        assert_eq!(on_time.silent(bound + late, true), Some(0));
        // Noticed later: the instance was slow; a fresh bound from when it was noticed.
        let noticed = bound + late + 1;
        assert_eq!(dog.silent(noticed, true), None);
        assert!(!dog.unproven(), "the watch is not given up");
        assert_eq!(dog.wake(true), Some(noticed + bound));
        assert_eq!(dog.silent(noticed + bound - 1, true), None);
        assert_eq!(dog.silent(noticed + bound, true), Some(noticed), "silent a bound since the late step");
        // A deadline: the same.
        let within = STORE_ANSWER_WITHIN.as_micros() as Micros;
        let mut dog = Watchdog::new(0, ttl, None);
        assert_eq!(dog.late_after(), (ttl / 4).as_micros() as Micros, "no marks: a quarter of the TTL");
        dog.sent(1, 0);
        dog.sent(2, late);
        let noticed = within + late + 1;
        assert_eq!(dog.expired(noticed), vec![2], "2 is on time; 1 is noticed late");
        dog.settled(2);
        assert_eq!(dog.wake(false), Some(noticed + within), "1 has a fresh deadline");
        assert!(dog.expired(noticed + within - 1).is_empty());
        assert_eq!(dog.expired(noticed + within), vec![1]);
    }
}
