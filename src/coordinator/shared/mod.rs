//! What the store-backed backends' state machines (`memory`, `etcd` and `fleet`), their
//! driver and, for its streams, the static backend share:
//! * the [`mirror`]'s cache contract and what a revision changed, and the own-write rules;
//! * the [`relay`] step per stream, applied to its [`streams`] book, and the [`outgoing`]
//!   channels the driver puts commands into (where a release waits until the new owner's
//!   `assigned` left), read by each stream's [`transport`];
//! * [`lease`]: the instance's one store session, kept on a thread of its own, and
//!   self-fencing;
//! * [`instance_record`]: this instance's own record, bound to its lease, whose deletion
//!   tells the leader that an instance's lease ended (its consumers may be coming back);
//! * [`departures`]: registrations whose streams ended, kept for their consumers' return,
//!   then deleted;
//! * [`upkeep`]: the sweep, a safety net ending registrations of this instance nobody
//!   streams for, and when a cache that cannot follow the store fences the streams;
//! * [`topics`]: the stored topic record and Kafka partition counts;
//! * readiness, and whether a stream may be admitted.
//!
//! [`batch`] cuts the writes that arrive together into shared transactions; [`cas`],
//! [`records`], [`registration`] and [`validate`] are small helpers both machines use.

pub mod batch;
pub mod cas;
pub mod departures;
pub mod instance;
pub mod instance_record;
pub mod lease;
pub mod mirror;
pub mod outgoing;
pub mod records;
pub mod registration;
pub mod relay;
pub mod streams;
#[cfg(test)]
mod test_cache;
pub mod topics;
pub mod transport;
pub mod upkeep;
pub mod validate;

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use lease::LeaseState;

/// How often a session is kept alive: three times per TTL, so two lost keep-alives in a
/// row still leave it alive; never more often than every 100 ms (etcd TTLs are seconds).
pub fn keep_alive_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// Whether this instance is ready to serve: an explicit value that shutdown clears, read
/// by `/ready`, gRPC health and the status view.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<watch::Sender<bool>>);

impl Readiness {
    /// A readiness value, initially `ready`.
    pub fn new(ready: bool) -> Self {
        Self(Arc::new(watch::Sender::new(ready)))
    }

    /// Sets the value (a no-op if it is unchanged).
    pub fn set(&self, ready: bool) {
        self.0.send_if_modified(|current| std::mem::replace(current, ready) != ready);
    }

    /// The current value.
    pub fn get(&self) -> bool {
        *self.0.borrow()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// Whether a stream registered on the instance lease `on` may be admitted (pure): the
/// instance is not stopping, `on` is still the live lease, and the relay is not fenced for
/// a mirror that cannot follow the store.
pub fn admits(stopping: bool, lease: LeaseState, on: crate::store::SessionId, relay_fenced: bool) -> bool {
    !stopping && lease.live() == Some(on) && !relay_fenced
}
