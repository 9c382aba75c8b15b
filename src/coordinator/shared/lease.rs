//! This instance's lease: one store session for every registration the instance holds,
//! so keep-alive traffic grows with instances, not consumers (docs/design.md §6).
//!
//! [`keep_lease`] grants the session, keeps it alive every third of the TTL, and retries a
//! failed keep-alive at once with backoff. **Self-fencing:** when the session has not been
//! renewed for [`fence_after`] (three quarters of the TTL), the instance stops acting on
//! it *before* the store can expire it: the keeper reports the fenced state and rings the
//! streams' bell (`transport.rs`), and each stream's transport then tells its consumer
//! `unassigned` for everything it was sent and ends with `UNAVAILABLE`; the instance is not
//! ready, and the leader steps down (it watches the same value). The keeper writes nothing
//! else: the machine forgets the fenced streams as they close. The quarter of the TTL left is the safety margin: it
//! covers the keep-alive's own round trip (renewal is timed from when it was *sent*), clock
//! rate differences between this host and the store, and the delivery of the last commands.
//! A keep-alive that succeeds again before the session expired lifts the fence; a session
//! the store reports expired is replaced by a new one. While the instance cannot follow its
//! store ([`LeaseHolder::renews`]) nothing is renewed or granted: the session lapses rather
//! than keep registrations and leadership the instance cannot act on.
//!
//! **A session the store expired early** (the store reports it gone while it is still
//! live here: revoked by an operator, the store's clock ahead of ours) does not end the
//! streams: a new session is granted at once and the lost registrations are written again
//! bound to it (the machine's rebind). Only if no new session is granted by the time the old one
//! would have been fenced is the instance fenced after all.
//!
//! **Its own thread.** A busy instance must deliver late, never fence itself because it was
//! busy: a burst of thousands of calls makes thousands of runnable tasks, and a keep-alive
//! timer that fires behind them on the same runtime runs after all of them. So
//! [`spawn_keeper`] keeps the lease on a thread of its own, with a single-thread runtime
//! and a store connection of its own ([`LeaseStore::connect_again`]: an etcd connection is
//! driven by tasks of the runtime that made it). The instance's runtime then affects only
//! how fast commands go out; the lease, and with it the leadership, depends only on the
//! store answering. A runtime stuck for good is found by the liveness probe (`/live` is
//! served by it), not by the lease.

use std::{sync::Arc, time::Duration};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::store::{LeaseStore, SessionId, StoreError};

/// The state of the instance lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Not granted yet (start, or the store expired the last one).
    Pending,
    /// Renewed recently enough to act on.
    Live(SessionId),
    /// Not renewed for [`fence_after`]: the instance acts on nothing until it is again.
    Fenced(SessionId),
}

impl LeaseState {
    /// The session, while it may be acted on.
    pub fn live(self) -> Option<SessionId> {
        match self {
            LeaseState::Live(session) => Some(session),
            _ => None,
        }
    }
}

/// How long after its last renewal a session may still be acted on: three quarters of the
/// TTL (see the module docs for the margin).
pub fn fence_after(ttl: Duration) -> Duration {
    ttl * 3 / 4
}

/// Whether a fenced lease ends the instance's streams (self-fencing, see the module docs):
/// always, but for the [`Mutation::SelfFenceSkipped`] test switch. Asked by the core's
/// reaction to a fence and by the instance's state machine alike.
///
/// [`Mutation::SelfFenceSkipped`]: crate::mutation::Mutation::SelfFenceSkipped
pub fn fences_streams() -> bool {
    !crate::mutation::is_active(crate::mutation::Mutation::SelfFenceSkipped)
}

/// What [`keep_lease`] needs from the core, and tells it.
pub trait LeaseHolder: Send + Sync {
    /// The instance's store (the keeper connects to it again on its own thread).
    fn store(&self) -> &dyn LeaseStore;
    /// The session TTL.
    fn ttl(&self) -> Duration;
    /// The lease's state channel.
    fn lease(&self) -> &watch::Sender<LeaseState>;
    /// Called when the lease becomes fenced: rings the bell every stream's transport reads
    /// (`transport.rs`), which ends them; it writes no stream.
    fn fence(&self);
    /// Whether the session may be kept alive (or a new one granted) now: not while the
    /// instance cannot follow its store. Its streams are fenced then, and its session must
    /// lapse rather than keep, for as long as the store stays out of its reach, the
    /// registrations of consumers that are gone and a leadership it cannot act on.
    fn renews(&self) -> bool;
    /// Notified when the lease should be kept alive at once, not at the next period.
    fn check_now(&self) -> &tokio::sync::Notify;
    /// Cancelled when the instance stops.
    fn stop_token(&self) -> &tokio_util::sync::CancellationToken;
}

/// Starts keeping the lease of the instance `owner` holds (`holder` finds it), until the
/// instance stops: on a thread of its own (see the module docs). On a current-thread
/// runtime it runs as a task of that runtime instead: such a runtime is a test's on paused
/// time, whose clock another thread would not share.
pub fn spawn_keeper<O, H>(owner: Arc<O>, holder: fn(&O) -> &H)
where
    O: Send + Sync + 'static,
    H: LeaseHolder + 'static,
{
    let runtime = Handle::current();
    if runtime.runtime_flavor() == RuntimeFlavor::CurrentThread {
        return keep_on(&runtime, owner, holder);
    }
    let on_thread = owner.clone();
    let main = runtime.clone();
    let started = std::thread::Builder::new().name("instance-lease".into()).spawn(move || {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(own) => own.block_on(keep_on_own_connection(holder(&on_thread))),
            Err(error) => {
                tracing::warn!(%error, "cannot build the instance lease's runtime; keeping it on the main one");
                keep_on(&main, on_thread, holder);
            }
        }
    });
    if let Err(error) = started {
        tracing::warn!(%error, "cannot start the instance lease's thread; keeping it on the main runtime");
        keep_on(&runtime, owner, holder);
    }
}

/// Keeps the lease as a task of `runtime`, over the instance's own store handle.
fn keep_on<O, H>(runtime: &Handle, owner: Arc<O>, holder: fn(&O) -> &H)
where
    O: Send + Sync + 'static,
    H: LeaseHolder + 'static,
{
    runtime.spawn(async move {
        let holder = holder(&owner);
        keep_lease(holder, holder.store()).await
    });
}

/// Keeps the lease over a store connection made on this runtime (retried until the store
/// answers or the instance stops).
async fn keep_on_own_connection(holder: &impl LeaseHolder) {
    let mut backoff = Backoff::new(super::keep_alive_period(holder.ttl()));
    let store = loop {
        let connected = tokio::select! {
            _ = holder.stop_token().cancelled() => return,
            connected = holder.store().connect_again() => connected,
        };
        match connected {
            Ok(store) => break store,
            Err(error) => {
                tracing::warn!(%error, "cannot connect the instance lease's keeper to the store; retrying");
                if sleep_or_stop(holder, backoff.next()).await {
                    return;
                }
            }
        }
    };
    match store {
        Some(own) => keep_lease(holder, &*own).await,
        None => keep_lease(holder, holder.store()).await,
    }
}

/// Grants and keeps the instance lease on `store` until the instance stops (see the module
/// docs).
pub async fn keep_lease(holder: &impl LeaseHolder, store: &dyn LeaseStore) {
    let ttl = holder.ttl();
    let period = super::keep_alive_period(ttl);
    let mut backoff = Backoff::new(period);
    // While a session the store expired early is replaced, the streams stay open: they are
    // fenced if no new session is granted by the time the old one would have been fenced.
    let mut fence_due: Option<Instant> = None;
    'grant: loop {
        while !holder.renews() {
            // Asked again when the instance follows its store again (`check_now`).
            tokio::select! {
                _ = holder.stop_token().cancelled() => return,
                _ = holder.check_now().notified() => {}
                _ = tokio::time::sleep(period) => {}
            }
        }
        let asked_at = Instant::now();
        let session = tokio::select! {
            _ = holder.stop_token().cancelled() => return,
            _ = sleep_until_due(fence_due) => {
                fence_due = None;
                tracing::error!("no new instance session in time: fencing this instance (its consumers are told to stop)");
                holder.fence();
                continue 'grant;
            }
            granted = store.grant_session(ttl) => granted,
        };
        let session = match session {
            Ok(session) => session,
            Err(error) => {
                tracing::warn!(%error, "cannot start the instance session; retrying");
                if sleep_or_stop(holder, backoff.next()).await {
                    return;
                }
                continue 'grant;
            }
        };
        fence_due = None;
        backoff.reset();
        set(holder, LeaseState::Live(session));
        tracing::info!(%session, "instance session started");
        let mut renewed_at = asked_at;
        let mut next_at = asked_at + period;
        loop {
            let live = holder.lease().borrow().live().is_some();
            let fence_at = renewed_at + fence_after(ttl);
            // Wake for the next keep-alive, or to fence on time while keep-alives fail.
            let wake = if live { next_at.min(fence_at) } else { next_at };
            tokio::select! {
                _ = holder.stop_token().cancelled() => return,
                _ = tokio::time::sleep_until(wake) => {}
                _ = holder.check_now().notified() => next_at = Instant::now(),
            }
            if live && Instant::now() >= fence_at {
                fence(holder, session, renewed_at);
                continue;
            }
            if Instant::now() < next_at {
                continue;
            }
            if !holder.renews() {
                // Not renewed: fenced at ¾ TTL as any session, then gone at its TTL.
                next_at = (Instant::now() + period).min(renewed_at + ttl);
                if Instant::now() >= renewed_at + ttl {
                    tracing::warn!(%session, "instance session let lapse while this instance cannot follow its store");
                    set(holder, LeaseState::Pending);
                    continue 'grant;
                }
                continue;
            }
            // A keep-alive may hang: it is bounded by the moment the session must be
            // fenced (while live) or is surely expired (once fenced).
            let deadline = if live { fence_at } else { renewed_at + ttl };
            let asked_at = Instant::now();
            let answer = tokio::select! {
                _ = holder.stop_token().cancelled() => return,
                answer = tokio::time::timeout_at(deadline, store.keep_alive(session)) => answer,
            };
            match answer {
                Ok(Ok(())) => {
                    renewed_at = asked_at;
                    next_at = asked_at + period;
                    backoff.reset();
                    if !live {
                        tracing::info!(%session, "instance session renewed again: fence lifted");
                        set(holder, LeaseState::Live(session));
                    }
                }
                Ok(Err(StoreError::SessionExpired(_))) => {
                    set(holder, LeaseState::Pending);
                    if live {
                        tracing::warn!(
                            %session,
                            "the store expired the instance session before this instance fenced itself; \
                             starting a new one, its consumers are registered again on it"
                        );
                        fence_due = Some(renewed_at + fence_after(ttl));
                    } else {
                        tracing::warn!(%session, "the store expired the fenced instance session; starting a new one");
                    }
                    continue 'grant;
                }
                Err(_) if !live => {
                    tracing::warn!(%session, "instance session not renewed within its TTL; starting a new one");
                    set(holder, LeaseState::Pending);
                    continue 'grant;
                }
                // Timed out at the fence deadline: the next turn fences.
                Err(_) => next_at = Instant::now(),
                Ok(Err(error)) => {
                    tracing::warn!(%error, %session, "instance keep-alive failed; retrying");
                    next_at = Instant::now() + backoff.next();
                    if !live && next_at >= renewed_at + ttl {
                        tracing::warn!(%session, "instance session not renewed within its TTL; starting a new one");
                        set(holder, LeaseState::Pending);
                        continue 'grant;
                    }
                }
            }
        }
    }
}

/// Fences the instance (if its lease is live): see the module docs.
fn fence(holder: &impl LeaseHolder, session: SessionId, renewed_at: Instant) {
    if holder.lease().borrow().live().is_none() {
        return;
    }
    tracing::error!(
        %session,
        unrenewed_for = ?(Instant::now() - renewed_at),
        "instance session not renewed in time: fencing this instance (its consumers are told to stop)"
    );
    set(holder, LeaseState::Fenced(session));
    holder.fence();
}

fn set(holder: &impl LeaseHolder, state: LeaseState) {
    holder.lease().send_replace(state);
}

/// Sleeps until `due`, or forever without one.
async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Sleeps `wait`; returns whether the instance stopped meanwhile.
async fn sleep_or_stop(holder: &impl LeaseHolder, wait: Duration) -> bool {
    tokio::select! {
        _ = holder.stop_token().cancelled() => true,
        _ = tokio::time::sleep(wait) => false,
    }
}

/// Exponential backoff from 50 ms, doubling, capped at `cap`.
struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);

    fn new(cap: Duration) -> Self {
        Self { next: Self::FIRST, cap }
    }

    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.cap);
        wait
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}
