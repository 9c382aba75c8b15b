//! The shared core of the store-backed backends (`memory`, `etcd` and `fleet`).
//!
//! [`Core`] holds what every one of them needs, so each backend is a thin layer of its
//! own records, relay and calls over it:
//! * the store, the backend's keys and the metrics;
//! * the [`mirror`] (a cache kept equal to the store prefix by a watch, re-read on gaps);
//! * the [`streams`] registry of the consumer streams this instance holds, and their
//!   [`outgoing`] channels (where a release waits until the new owner's `assigned` left),
//!   and the [`relay`] passes that tell them each revision (the backend's pure step per
//!   stream, applied by a pass the backend drives);
//! * [`register`]: the registration of a consumer stream, which the calling task hands to
//!   the instance's loop ([`enrolment`]: written there, in batches, and its stream
//!   admitted);
//! * [`lease`]: the instance's one store session, kept on a thread of its own, and
//!   self-fencing;
//! * [`rebind`]: registrations the store lost while their streams are open are written again;
//! * [`instance_record`]: this instance's own record, bound to its lease, whose deletion
//!   tells the leader that an instance's lease ended (its consumers may be coming back);
//! * [`departures`]: registrations whose streams ended, kept for their consumers' return,
//!   then deleted (decided by each instance's loop, through its upkeep);
//! * [`upkeep`]: what each instance's loop keeps up beside its inputs: an instance whose
//!   relay cannot follow the store fences its streams, and a sweep, a safety net, ends
//!   registrations of this instance nobody streams for;
//! * [`topics`]: the stored topic record (`ensure_topic`) and Kafka partition counts;
//! * readiness, shutdown and crash.
//!
//! [`batch`] batches the writes that arrive together (registrations, and the handoff
//! backend's calls) into one transaction, which the instance's loop commits; [`cas`] and
//! [`validate`] are small helpers every backend uses; [`outgoing`] builds the commands
//! every backend sends, and carries them to the consumers.

// The machines' call and registration batching takes `Batches` and `take_batch`.
#[allow(dead_code)]
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
