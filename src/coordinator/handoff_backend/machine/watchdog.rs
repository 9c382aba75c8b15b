//! The instance's use of the shared [`Watchdog`]: requests past their deadline fail as lost
//! answers, and a watch that went silent makes the instance stale as of when it was last
//! heard from.

use super::Instance;
use crate::coordinator::machine::io::Micros;
use crate::coordinator::machine::watchdog::no_answer;

impl Instance {
    /// Fails the requests whose deadline has passed, as the store failing them: the answer
    /// was lost, whether or not the request took effect. A later answer finds nothing
    /// waiting and is ignored.
    pub(super) fn expire_requests(&mut self) {
        for request in self.watchdog.expired(self.now) {
            self.answered(request, Err(no_answer()));
        }
    }

    /// A watch that has said nothing for its bound went silent: the mirror does not follow
    /// as of when it was last heard from (so the stale fence, due that long after, falls at
    /// once), and it reads and watches again, following again only once the new watch
    /// speaks.
    pub(super) fn check_silence(&mut self) {
        let Some(watch) = self.watch else { return };
        let Some(heard) = self.watchdog.silent(self.now, true) else { return };
        self.waiting.remove(&watch);
        self.watchdog.settled(watch);
        self.watch = None;
        self.interruptions += 1;
        if self.stale_since.is_none_or(|since| since > heard) {
            self.stale_since = Some(heard);
        }
        self.sweeper.health(false, self.instant(heard));
        self.poke_leaders();
        self.reread();
    }

    /// The watch in use said something (a batch or a progress mark): it is alive, and after
    /// a silence it proves the new watch.
    pub(super) fn heard_from_watch(&mut self) {
        if self.watchdog.heard(self.now) && self.cache.is_some() {
            self.follow_again();
        }
    }

    /// The mirror follows the store again.
    pub(super) fn follow_again(&mut self) {
        self.sweeper.health(true, self.instant(self.now));
        self.stale_since = None;
        if std::mem::take(&mut self.stale_fenced) {
            // Its keeper renews again, at once.
            self.out.push(crate::coordinator::machine::io::Effect::KeepLeaseAliveNow);
        }
    }

    /// When the watchdog has something to do next.
    pub(super) fn watchdog_wake(&self) -> Option<Micros> {
        self.watchdog.wake(self.watch.is_some())
    }
}
