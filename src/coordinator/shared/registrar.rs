//! [`Registrar`]: what a store-backed backend plugs into the shared registration — pure
//! answers about its records and its relay; the store is read and written by
//! `registration.rs` (which also settles a registration whose stream is gone) and the relay
//! applied by `streams.rs`.
//! [`Caller`] tells a registration's write whether anyone still waits for it.

use std::sync::{
    Arc,
    atomic::{AtomicU8, Ordering},
};

use tokio_util::sync::CancellationToken;

use super::Core;
use super::batch::KeyWrite;
use super::mirror::MirrorCache;
use super::relay::{RelayStep, StreamSeen};
use super::streams::{StreamKey, Told};
use crate::handoff::Millis;
use crate::store::{KeyValue, Revision, SessionId};

/// Whether the caller of a `Register` still waits for its answer (the registration itself
/// runs to the end in the instance's loop, `enrolment.rs`).
///
/// A registration whose caller went away must never replace another one (docs/design.md
/// §6): a client that gave up on a call has already sent its next attempt, whose stream is
/// the live one. So a registration is decided (on the cache, `enrolment.rs`, or on the
/// store's state, [`super::registration::write`]) only while the caller waits: once it is
/// gone, a write already sent lands only where the record is still the one that write was
/// decided from, and a write that lost its compare is not retried.
#[derive(Clone, Debug)]
pub struct Caller(Arc<CallerState>);

#[derive(Debug)]
struct CallerState {
    /// [`WAITING`], [`GONE`] or [`ANSWERED`].
    state: AtomicU8,
    /// Register calls whose caller went away while they still run.
    abandoned: prometheus_client::metrics::gauge::Gauge,
}

const WAITING: u8 = 0;
const GONE: u8 = 1;
const ANSWERED: u8 = 2;

/// Held by the `Register` call while it waits: dropping it before the registration was
/// answered ([`Caller::answered`]) marks the caller gone.
#[derive(Debug)]
pub struct CallerGuard(Caller);

impl Caller {
    /// A caller that waits, and the guard whose drop marks it gone; `abandoned` counts the
    /// registrations still running whose caller went away.
    pub fn waiting(abandoned: prometheus_client::metrics::gauge::Gauge) -> (Self, CallerGuard) {
        let caller = Caller(Arc::new(CallerState { state: AtomicU8::new(WAITING), abandoned }));
        (caller.clone(), CallerGuard(caller))
    }

    /// Whether the caller went away before the registration was answered.
    pub fn is_gone(&self) -> bool {
        self.0.state.load(Ordering::Acquire) == GONE
    }

    /// The registration's work is over (answered, refused or given up): a caller that goes
    /// away from now on changes nothing.
    pub fn answered(&self) {
        if self.0.state.swap(ANSWERED, Ordering::AcqRel) == GONE {
            self.0.abandoned.dec();
        }
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        let state = &self.0.0;
        if state.state.compare_exchange(WAITING, GONE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            state.abandoned.inc();
        }
    }
}

/// How long a registration whose stream is gone is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// It is not this stream's any more (replaced or gone): nothing to do.
    NotOurs,
    /// For the consumer TTL after the stream ended.
    ForTtl,
    /// Until this wall-clock time (a `SHUTDOWN_NOW` hold for the consumer's restart).
    Until(Millis),
}

/// What a store-backed backend plugs into the shared registration.
pub trait Registrar: Send + Sync + Sized + 'static {
    /// The backend's cache of the store.
    type Cache: MirrorCache + Send + Sync + 'static;
    /// What each of its streams remembers having told its consumer.
    type Told: Told;

    /// The shared core.
    fn core(&self) -> &Core<Self::Cache, Self::Told>;

    /// Where `consumer`'s registration on `topic` is stored.
    fn registration_key(&self, topic: &str, consumer: &str) -> String;

    /// The record of `consumer`'s active registration with id `registration` on this
    /// instance, sent by the client process `incarnation` (0: unknown), encoded.
    fn registration_record(&self, consumer: &str, registration: SessionId, incarnation: u64) -> Vec<u8>;

    /// The registration id the stored record `value` at `key` names (`None`: it does not
    /// parse).
    fn registration_in(&self, key: &str, value: &[u8]) -> Option<SessionId>;

    /// The client process the stored record `value` at `key` was registered by (0: unknown).
    fn incarnation_in(&self, _key: &str, _value: &[u8]) -> u64 {
        0
    }

    /// The client process `consumer`'s registration on `topic` in `cache` was registered by
    /// (0: unknown, or no registration).
    fn cached_incarnation(&self, _cache: &Self::Cache, _topic: &str, _consumer: &str) -> u64 {
        0
    }

    /// Where the records bound to a registration of `topic` besides its own are (the
    /// fleet's leases): they move to a new registration of the same name and are deleted
    /// with it. `None`: there are none.
    fn bound_prefix(&self, _topic: &str) -> Option<String> {
        None
    }

    /// Whether the record `kv` under [`bound_prefix`](Self::bound_prefix) is bound to
    /// `consumer`'s registration.
    fn is_bound_to(&self, _consumer: &str, _kv: &KeyValue) -> bool {
        false
    }

    /// The mod revision of `consumer`'s registration record on `topic` in `cache` (0: none),
    /// when a registration may be decided from the cache and share a transaction with
    /// others (`enrolment.rs`); `None` to decide every one from the store
    /// ([`super::registration::write`]).
    fn cached_registration(&self, _cache: &Self::Cache, _topic: &str, _consumer: &str) -> Option<Revision> {
        None
    }

    /// Where the records that carry `topic`'s epochs are: read, when a registration is
    /// decided on the store's state, for [`raise_epochs`](Self::raise_epochs). Empty: the
    /// backend raises none.
    fn epoch_prefixes(&self, _topic: &str) -> Vec<String> {
        Vec::new()
    }

    /// A new incarnation of `consumer` on `topic` (docs/design.md §10): the writes that
    /// raise, above `now_micros`, the epoch of every partition the name owns or is warming
    /// in `cache`, moving nothing, each compared with the records it replaces; a record
    /// bound to the registration is written bound to `lease`. They join the registration's
    /// transaction. Empty when the name holds nothing.
    fn raise_epochs(
        &self,
        _cache: &Self::Cache,
        _topic: &str,
        _consumer: &str,
        _lease: SessionId,
        _now_micros: u64,
    ) -> Vec<KeyWrite> {
        Vec::new()
    }

    /// The relay model: what the stream `seen` of `consumer` on `topic` must be told, given
    /// `cache` ([`super::relay`]). Pure.
    fn relay_step(
        &self,
        cache: &Self::Cache,
        topic: &str,
        consumer: &str,
        seen: StreamSeen<'_, Self::Told>,
    ) -> RelayStep<Self::Told>;

    /// How long the registration `key` is kept after its stream ended.
    fn held(&self, cache: &Self::Cache, key: &StreamKey) -> Held;

    /// Every registration in `cache` that names `instance` as the one holding its stream.
    fn registrations_of(&self, cache: &Self::Cache, instance: &str) -> Vec<StreamKey>;

    /// Work that runs beside a stream until `done` is cancelled (the fleet's claim step).
    fn spawn_companion(
        self: &Arc<Self>,
        _key: StreamKey,
        _registered_at: Revision,
        _done: CancellationToken,
    ) {
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;

    use super::Caller;

    #[test]
    fn a_caller_is_gone_only_if_it_left_before_the_answer_and_is_counted_while_the_work_runs() {
        let abandoned = Gauge::default();
        let (caller, guard) = Caller::waiting(abandoned.clone());
        assert!(!caller.is_gone());
        drop(guard);
        assert!(caller.is_gone());
        assert_eq!(abandoned.get(), 1, "counted while its registration still runs");
        caller.answered();
        assert_eq!(abandoned.get(), 0, "no longer once it is over");

        let (answered, guard) = Caller::waiting(abandoned.clone());
        answered.answered();
        drop(guard);
        assert!(!answered.is_gone(), "leaving after the answer changes nothing");
        assert_eq!(abandoned.get(), 0);
    }
}
