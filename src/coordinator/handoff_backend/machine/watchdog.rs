//! What keeps the instance from waiting forever: a deadline for every store request (a
//! lost answer fails the request `Unavailable`), and the silence rule of production's
//! follower (a watch that says nothing at all, not even a progress mark, for
//! [`silence_bound`] makes the instance stale as of when it was last heard from).

use std::time::Duration;

use super::Instance;
use crate::coordinator::machine::io::{Micros, RequestId};
use crate::coordinator::shared::lease::fence_after;
use crate::coordinator::shared::mirror::silence_bound;
use crate::store::{StoreError, Unreachable};

/// How long a store request may go unanswered: the etcd client's per-call budget, retries
/// included, so a request the driver still works on is not given up before the client
/// gives up itself.
pub const STORE_ANSWER_WITHIN: Duration = crate::store::DEFAULT_REQUEST_TIMEOUT;

impl Instance {
    /// Fails the requests whose deadline has passed, as the store failing them: the answer
    /// was lost, whether or not the request took effect. A later answer finds nothing
    /// waiting and is ignored.
    pub(super) fn expire_requests(&mut self) {
        let now = self.now;
        let expired: Vec<RequestId> =
            self.deadlines.iter().filter(|(_, at)| now >= **at).map(|(request, _)| *request).collect();
        for request in expired {
            let error = StoreError::Unavailable(Unreachable::NoAnswer { within: STORE_ANSWER_WITHIN });
            self.answered(request, Err(error));
        }
    }

    /// How long the open watch may say nothing (`None`: the store sends no progress marks).
    fn silence(&self) -> Option<Micros> {
        let every = self.progress_every?;
        Some(silence_bound(fence_after(self.config.lease_ttl), every).as_micros() as Micros)
    }

    /// A watch that has said nothing for its bound went silent: the mirror does not follow
    /// as of when it was last heard from (so the stale fence, due that long after, falls at
    /// once), and it reads and watches again, following again only once the new watch
    /// speaks.
    pub(super) fn check_silence(&mut self) {
        let (Some(watch), Some(bound)) = (self.watch, self.silence()) else { return };
        if self.now < self.heard + bound {
            return;
        }
        let heard = self.heard;
        self.waiting.remove(&watch);
        self.deadlines.remove(&watch);
        self.watch = None;
        self.unproven = true;
        self.interruptions += 1;
        if self.stale_since.is_none_or(|since| since > heard) {
            self.stale_since = Some(heard);
        }
        let _ = self.sweeper.health(false, self.instant(heard));
        self.poke_leaders();
        self.reread();
    }

    /// The watch in use said something (a batch or a progress mark): it is alive, and after
    /// a silence it proves the new watch.
    pub(super) fn heard_from_watch(&mut self) {
        self.heard = self.now;
        if std::mem::take(&mut self.unproven) && self.cache.is_some() {
            self.follow_again();
        }
    }

    /// The mirror follows the store again.
    pub(super) fn follow_again(&mut self) {
        let _ = self.sweeper.health(true, self.instant(self.now));
        self.stale_since = None;
        if std::mem::take(&mut self.stale_fenced) {
            // Its keeper renews again, at once.
            self.out.push(crate::coordinator::machine::io::Effect::KeepLeaseAliveNow);
        }
    }

    /// When the watchdog has something to do next: the first deadline, or the silence
    /// bound of the watch in use.
    pub(super) fn watchdog_wake(&self) -> Option<Micros> {
        let deadline = self.deadlines.values().min().copied();
        let silent = self.watch.zip(self.silence()).map(|(_, bound)| self.heard + bound);
        deadline.into_iter().chain(silent).min()
    }
}
