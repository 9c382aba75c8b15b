//! The instance's upkeep, which its loop runs beside its other inputs: decided here on the
//! mirror's health, the time and the cache, carried out by the loop. It writes the
//! registrations of the `Register`s handed over and admits their streams
//! ([`Enrolments`]), settles the registrations whose streams ended ([`Departures`]), has
//! the registrations the store lost written again when the relay finds some ([`rebind`],
//! one pass at a time), keeps readiness ("not stopping, the lease is live and the mirror
//! follows the store") and the instance record (`instance_record.rs`) up with the
//! instance lease, and:
//!
//! **An instance that cannot relay fences its streams**, as when it loses its lease. The
//! instance lease is kept on a connection of its own (`lease.rs`), so the lease can stay
//! alive while the watch, or the re-read that closes its gap, fails. The consumers of this
//! instance would then hear nothing of what the others decide: a `PartitionReady`
//! elsewhere flips an owner, and the old owner here is never told `ReleasePartition`. So
//! when the mirror has not followed the store for [`fence_after`] (three quarters of the
//! TTL, the lease's own fencing margin), every stream is fenced (told `unassigned` for
//! everything, ended `UNAVAILABLE`) and no stream is admitted until it follows again.
//!
//! **A safety net ends registrations of this instance that no stream holds.** Every path
//! that writes a registration also settles it (`enrolment.rs`: a stream that ends, a write
//! whose answer was lost, a stream refused after a fence). Should one path still miss a
//! record, it would keep its partitions, and draw warms, until the instance died. So every
//! half TTL the sweep looks for registration records naming this instance whose
//! registration no local stream holds; one still found a TTL and a half later is deleted
//! (compare-and-swap on its registration id) and counted in
//! `kafka_assigner_registrations_swept_total`. A restart hold (`SHUTDOWN_NOW`) is left to
//! its own timer, and nothing is swept while the cache does not follow the store.

use std::{collections::BTreeMap, sync::Arc, sync::atomic::Ordering, time::Duration};

use futures::future::BoxFuture;
use tokio::sync::{mpsc::UnboundedReceiver, watch};
use tokio::time::Instant;

use super::Core;
use super::departures::{Departed, Departures};
use super::enrolment::{self, Enrolment, Enrolments};
use super::instance_record::write_instance_record;
use super::lease::{LeaseState, fence_after};
use super::mirror::{MirrorCache, MirrorHealth};
use super::registrar::{Held, Registrar};
use super::registration::unregister_retrying;
use super::streams::{EndReason, StreamKey, Told};
use crate::store::SessionId;

/// What the loop does for the upkeep.
#[derive(Debug, PartialEq, Eq)]
pub enum Chore {
    /// The mirror has not followed the store for the fencing margin: fence every stream
    /// ([`fence`]).
    Fence,
    /// It follows again: admit streams again ([`unfence`]).
    Unfence,
    /// Delete this registration no stream held for a TTL and a half ([`sweep`]).
    Sweep(StreamKey),
    /// Delete this registration whose stream ended and whose consumer did not come back,
    /// or left ([`Departures`]).
    Unregister(StreamKey),
}

/// A store call of the upkeep's, which the loop runs beside its other inputs and hands back
/// to [`Upkeep::worked`] when it ends.
pub type Work = BoxFuture<'static, Worked>;

/// What a [`Work`] was.
#[derive(Debug)]
pub enum Worked {
    /// A delete: a sweep, or an ended stream's registration.
    Deleted,
    /// A pass writing lost registrations again (`rebind.rs`).
    Rebound,
    /// A write of the instance record bound to this lease, if it was written.
    Recorded(Option<SessionId>),
    /// A store call of the `Register`s' (`enrolment.rs`).
    Enrolled(enrolment::Done),
}

/// The upkeep's state (see the module docs). Pure: the loop hands it the time.
#[derive(Debug)]
pub struct Upkeep {
    ttl: Duration,
    /// Since when the mirror has not followed the store; `None` while it follows.
    stale_since: Option<Instant>,
    /// The streams were fenced for it; they are admitted again once it follows.
    fenced: bool,
    /// When the sweep looks next.
    next_sweep: Instant,
    /// Registrations no stream held at the last looks, since when.
    /// Ordered, so that a sweep finds them in one order on every run (the simulation
    /// replays a seed exactly).
    orphans: BTreeMap<StreamKey, Instant>,
    /// Registrations whose streams ended, kept for their consumers' return.
    departures: Departures,
    /// A pass writing lost registrations again is under way.
    rebinding: bool,
    /// The instance lease the instance record was last written for.
    recorded: Option<SessionId>,
    /// A write of the instance record is under way.
    recording: bool,
    /// The `Register`s the loop writes and admits.
    enrolments: Enrolments,
}

impl Upkeep {
    /// The upkeep of an instance with consumer TTL `ttl`, started at `now` with a mirror
    /// that follows its store.
    pub fn new(ttl: Duration, now: Instant) -> Self {
        Self {
            ttl,
            stale_since: None,
            fenced: false,
            next_sweep: now + ttl / 2,
            orphans: BTreeMap::new(),
            departures: Departures::new(ttl),
            rebinding: false,
            recorded: None,
            recording: false,
            enrolments: Enrolments::default(),
        }
    }

    /// A [`Work`] of the upkeep's ended.
    pub fn worked(&mut self, worked: Worked) {
        match worked {
            Worked::Deleted => {}
            Worked::Rebound => self.rebinding = false,
            Worked::Recorded(written) => {
                self.recording = false;
                self.recorded = written.or(self.recorded);
            }
            Worked::Enrolled(done) => self.enrolments.done(done),
        }
    }

    /// Whether the mirror follows the store, as last reported.
    fn following(&self) -> bool {
        self.stale_since.is_none()
    }

    /// The instance record must be written for the live lease `live`: it is not yet, and
    /// no write is under way.
    fn record_due(&mut self, live: Option<SessionId>) -> Option<SessionId> {
        let session = live.filter(|s| self.recorded != Some(*s) && !self.recording)?;
        self.recording = true;
        Some(session)
    }

    /// The mirror's health is now `following`.
    pub fn health(&mut self, following: bool, now: Instant) -> Option<Chore> {
        if following {
            self.stale_since = None;
            return std::mem::take(&mut self.fenced).then_some(Chore::Unfence);
        }
        self.stale_since.get_or_insert(now);
        None
    }

    /// When the sweep looks next.
    pub fn next_sweep(&self) -> Instant {
        self.next_sweep
    }

    /// When the upkeep has something to do next.
    pub fn wake_at(&self) -> Instant {
        let departure = self.departures.wake_at().unwrap_or(self.next_sweep);
        self.own_wake_at().min(departure)
    }

    /// When [`due`](Self::due) has something to do next.
    fn own_wake_at(&self) -> Instant {
        match self.stale_since {
            Some(since) if !self.fenced => self.next_sweep.min(since + fence_after(self.ttl)),
            _ => self.next_sweep,
        }
    }

    /// What is due at `now`. The sweep reads `cache` (`backend`'s) for the registrations of
    /// this instance no local stream holds.
    pub fn due<R: Registrar>(&mut self, backend: &R, cache: &R::Cache, now: Instant) -> Vec<Chore> {
        let core = backend.core();
        let found = || {
            backend
                .registrations_of(cache, &core.instance_id)
                .into_iter()
                .filter(|key| !core.streams.holds(key) && backend.held(cache, key) == Held::ForTtl)
                .collect()
        };
        let mut chores: Vec<Chore> = self.fence_due(now).into_iter().collect();
        chores.extend(self.sweep_due(now, found));
        chores
    }

    /// [`Chore::Fence`] once the mirror has not followed for the margin, once.
    fn fence_due(&mut self, now: Instant) -> Option<Chore> {
        if self.fenced || !stale_fence_due(self.stale_since?, now, self.ttl) {
            return None;
        }
        self.fenced = true;
        Some(Chore::Fence)
    }

    /// The sweep, if it is due: `found` lists the registrations no local stream holds.
    pub fn sweep_due(&mut self, now: Instant, found: impl FnOnce() -> Vec<StreamKey>) -> Vec<Chore> {
        if now < self.next_sweep {
            return Vec::new();
        }
        self.next_sweep = now + self.ttl / 2;
        if self.stale_since.is_some() {
            return Vec::new();
        }
        let seen = std::mem::take(&mut self.orphans);
        let mut chores = Vec::new();
        for key in found() {
            let since = seen.get(&key).copied().unwrap_or(now);
            // Past the TTL and a half: the after-disconnect path, due at one TTL, goes
            // first. One whose delete failed is still found, and tried again next time.
            if now.duration_since(since) >= self.ttl * 3 / 2 {
                chores.push(Chore::Sweep(key.clone()));
            }
            self.orphans.insert(key, since);
        }
        chores
    }
}

/// Whether an instance whose mirror has not followed the store since `since` fences its
/// streams at `now` (pure): once that lasted the lease's fencing margin, [`fence_after`].
pub fn stale_fence_due<At: Copy + Ord + std::ops::Add<Duration, Output = At>>(
    since: At,
    now: At,
    ttl: Duration,
) -> bool {
    if crate::mutation::is_active(crate::mutation::Mutation::StaleRelayNotFenced) {
        return false;
    }
    now >= since + fence_after(ttl)
}

/// Does what is due at `now` for `backend`'s loop: keeps readiness and the instance
/// record up with the lease and the mirror's health, fences, sweeps, settles the
/// registrations of ended streams. Returns the store calls, for the loop to run beside its
/// other inputs. The loop calls it every turn, and wakes on lease and health changes.
pub fn run_due<R: Registrar>(upkeep: &mut Upkeep, backend: &Arc<R>, now: Instant) -> Vec<Work> {
    let core = backend.core();
    let live = core.lease.borrow().live();
    // Ready: not stopping, the lease is live and the mirror follows the store.
    core.readiness.set(!core.shutdown.is_cancelled() && live.is_some() && upkeep.following());
    let mut works: Vec<Work> = Vec::new();
    if let Some(session) = upkeep.record_due(live) {
        let backend = backend.clone();
        works.push(Box::pin(async move {
            let written = write_instance_record(backend.core(), session).await;
            Worked::Recorded(written.then_some(session))
        }));
    }
    let mut chores = Vec::new();
    {
        let cache = core.mirror.read();
        if upkeep.departures.must_look(cache.revision(), now) {
            let due = upkeep.departures.due(&**backend, &cache, now, super::now_ms());
            chores.extend(due.into_iter().map(Chore::Unregister));
        }
        if now >= upkeep.own_wake_at() {
            chores.extend(upkeep.due(&**backend, &cache, now));
        }
    }
    works.extend(chores.into_iter().filter_map(|chore| carry_out(backend, chore)));
    for call in upkeep.enrolments.due(backend) {
        works.push(Box::pin(async move { Worked::Enrolled(call.await) }));
    }
    works
}

/// What the upkeep waits on beside a loop's other inputs: the mirror's health, the
/// instance lease, the streams that end (`Core::departures`), the `Register`s handed over
/// (`Core::enrolments`), the relay's finds of lost registrations, and its own timer. One
/// per loop ([`Inputs::new`] takes the departures and the `Register`s).
pub struct Inputs {
    health: watch::Receiver<MirrorHealth>,
    lease: watch::Receiver<LeaseState>,
    bell: watch::Receiver<super::transport::Ends>,
    departures: Option<UnboundedReceiver<Departed>>,
    enrolments: Option<UnboundedReceiver<Enrolment>>,
}

/// What woke the upkeep ([`Inputs::next`]); a loop that acts on the lease or the mirror's
/// health itself does so on these.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// The instance lease changed.
    Lease,
    /// The mirror's health changed.
    Health,
    /// Anything else: a stream ended, lost registrations were found, the timer.
    Other,
}

impl Inputs {
    /// The inputs of `backend`'s loop.
    pub fn new<R: Registrar>(backend: &R) -> Self {
        let core = backend.core();
        Self {
            health: core.mirror.health(),
            lease: core.lease.subscribe(),
            bell: core.streams.bell(),
            departures: core.departures(),
            enrolments: core.enrolments(),
        }
    }

    /// Waits for the upkeep's next input, takes it in (unfencing at once when the mirror
    /// follows again), and returns what woke it with the store call it starts, if any.
    /// Cancel-safe, for a loop's `select!`.
    pub async fn next<R: Registrar>(
        &mut self,
        upkeep: &mut Upkeep,
        backend: &Arc<R>,
    ) -> (Woke, Option<Work>) {
        let core = backend.core();
        let departed = async {
            match &mut self.departures {
                Some(receiver) => receiver.recv().await,
                None => None,
            }
        };
        let enrolled = async {
            match &mut self.enrolments {
                Some(receiver) => receiver.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The senders live in the core the loop holds: these cannot fail.
            Ok(()) = self.health.changed() => {
                let health = *self.health.borrow_and_update();
                // A silent watch stopped following when it was last heard from.
                let since = health.silent_since.unwrap_or_else(Instant::now);
                if let Some(chore) = upkeep.health(health.following, since) {
                    carry_out(backend, chore);
                }
                (Woke::Health, None)
            }
            Ok(()) = self.lease.changed() => (Woke::Lease, None),
            // A fence rang (on the lease keeper's thread, or in this loop): the fenced
            // streams' transports end them; the registry lets them go here.
            Ok(()) = self.bell.changed() => {
                core.streams.reap_fenced();
                (Woke::Other, None)
            }
            Some(departed) = departed => {
                // A consumer that went away: its stream ends here, in the loop, which
                // keeps it held (`Streams::holds`) until its departure waits in its place.
                if !departed.left {
                    core.streams.end(&departed.key, EndReason::Disconnected, None);
                }
                upkeep.departures.add(departed);
                (Woke::Other, None)
            }
            Some(enrolment) = enrolled => {
                // Those that arrived together are decided on one read of the cache, and
                // join one batch.
                let cache = core.mirror.read();
                upkeep.enrolments.arrive(&**backend, &cache, enrolment);
                while let Some(enrolment) = self.enrolments.as_mut().and_then(|r| r.try_recv().ok()) {
                    upkeep.enrolments.arrive(&**backend, &cache, enrolment);
                }
                (Woke::Other, None)
            }
            () = core.streams.lost_found(), if !upkeep.rebinding => (Woke::Other, Some(rebind(upkeep, backend))),
            () = tokio::time::sleep_until(upkeep.wake_at()) => (Woke::Other, None),
        }
    }
}

/// The relay found streams whose registrations the store lost: a pass writing them again
/// (`rebind.rs`), for `backend`'s loop to run.
fn rebind<R: Registrar>(upkeep: &mut Upkeep, backend: &Arc<R>) -> Work {
    upkeep.rebinding = true;
    let backend = backend.clone();
    Box::pin(async move {
        super::rebind::rewrite_all(&backend).await;
        Worked::Rebound
    })
}

/// Carries `chore` out: a fence at once, a sweep as the future returned.
fn carry_out<R: Registrar>(backend: &Arc<R>, chore: Chore) -> Option<Work> {
    match chore {
        Chore::Fence => fence(backend.core()),
        Chore::Unfence => unfence(backend.core()),
        Chore::Sweep(key) => {
            let backend = backend.clone();
            return Some(Box::pin(async move {
                sweep(backend, key).await;
                Worked::Deleted
            }));
        }
        Chore::Unregister(key) => {
            let backend = backend.clone();
            return Some(Box::pin(async move {
                unregister_retrying(&*backend, &key).await;
                // Settled: nothing is departing under this registration any more.
                backend.core().streams.set_departing(&key, false);
                Worked::Deleted
            }));
        }
    }
    None
}

/// Fences every stream of `core`: its relay cannot follow the store (module docs).
fn fence<C: MirrorCache, T: Told>(core: &Core<C, T>) {
    tracing::error!(
        margin = ?fence_after(core.lease_ttl),
        "this instance cannot follow its store: fencing its consumers (they are told to stop)"
    );
    core.relay_fenced.store(true, Ordering::SeqCst);
    core.streams
        .fence(crate::coordinator::causes::Fence::CannotFollow { instance: core.instance_id.to_string() });
    core.streams.reap_fenced();
}

/// Admits streams again: the relay follows the store again.
fn unfence<C: MirrorCache, T: Told>(core: &Core<C, T>) {
    core.relay_fenced.store(false, Ordering::SeqCst);
    // The lease keeper renews again, at once (`LeaseHolder::renews`).
    core.lease_check.notify_one();
    tracing::info!("this instance follows its store again: it admits streams again");
}

/// Deletes the orphaned registration `key` if it is still the same one, and counts it.
async fn sweep<R: Registrar>(backend: Arc<R>, key: StreamKey) {
    match super::registration::delete(&*backend, &key).await {
        Ok(true) => {
            tracing::warn!(topic = %key.0, consumer = %key.1, "swept a registration no stream held");
            backend.core().metrics.registrations_swept.inc();
        }
        // Its own path ended it meanwhile.
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(%error, topic = %key.0, consumer = %key.1, "cannot sweep a registration; later")
        }
    }
}

#[cfg(test)]
#[path = "upkeep_tests.rs"]
mod tests;
