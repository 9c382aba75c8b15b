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

pub mod batch;
pub mod cas;
pub mod departures;
pub mod enrolment;
pub mod instance;
pub mod instance_record;
pub mod lease;
pub mod mirror;
pub mod outgoing;
pub mod rebind;
pub mod records;
pub mod register;
pub mod registrar;
pub mod registration;
pub mod relay;
pub mod streams;
#[cfg(test)]
mod test_backend;
pub mod topics;
pub mod transport;
pub mod upkeep;
pub mod validate;

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::LeaseStore;

use lease::{LeaseHolder, LeaseState};
use mirror::{Mirror, MirrorCache, Source};
use streams::{LocalStream, Streams};
use topics::Topics;

/// Wall-clock milliseconds: stored deadlines (holds, handoff ages) must survive a failover.
pub fn now_ms() -> crate::handoff::Millis {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as crate::handoff::Millis)
}

/// How often a session is kept alive: three times per TTL, so two lost keep-alives in a
/// row still leave it alive; never more often than every 100 ms (etcd TTLs are seconds).
pub fn keep_alive_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// How many registrations of one instance are under way at once: enough to fill every
/// batch transaction in flight ([`batch`]); the rest queue here, not in front of the store.
pub const REGISTRATIONS_IN_FLIGHT: usize = batch::BATCH * batch::BATCHES_IN_FLIGHT;

/// A channel into the instance's loop: any task sends, and the loop takes the receiving
/// end, once.
#[derive(Debug)]
pub struct Inbox<M> {
    sender: tokio::sync::mpsc::UnboundedSender<M>,
    receiver: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<M>>>,
}

impl<M> Default for Inbox<M> {
    fn default() -> Self {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        Self { sender, receiver: std::sync::Mutex::new(Some(receiver)) }
    }
}

impl<M> Inbox<M> {
    /// Sends `message` to the loop; handed back once the loop has stopped.
    pub fn send(&self, message: M) -> Result<(), M> {
        self.sender.send(message).map_err(|refused| refused.0)
    }

    /// The receiving end, for the loop: `None` once a loop took it.
    pub fn take(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<M>> {
        self.receiver.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
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

/// The settings every store-backed backend gives its core.
pub struct CoreSettings {
    /// This instance's id.
    pub instance_id: String,
    /// TTL of consumer sessions.
    pub lease_ttl: Duration,
    /// Where partition counts come from.
    pub topics: Topics,
    /// The leader group count this instance campaigns under, written in its instance
    /// record (1 unless the handoff backend splits the topics).
    pub leader_groups: u32,
}

impl CoreSettings {
    /// The settings of an instance `instance_id` with sessions of `lease_ttl`.
    pub fn new(instance_id: &str, lease_ttl: Duration, topics: Topics) -> Self {
        Self { instance_id: instance_id.to_string(), lease_ttl, topics, leader_groups: 1 }
    }
}

/// Whether a stream registered on the instance lease `on` may be admitted (pure): the
/// instance is not stopping, `on` is still the live lease, and the relay is not fenced for
/// a mirror that cannot follow the store.
pub fn admits(stopping: bool, lease: LeaseState, on: crate::store::SessionId, relay_fenced: bool) -> bool {
    !stopping && lease.live() == Some(on) && !relay_fenced
}

/// What every store-backed backend shares (see the module docs). `C` is the backend's
/// cache of the store, `T` what each of its streams remembers having told its consumer.
pub struct Core<C: MirrorCache, T> {
    /// The store.
    store: Arc<dyn LeaseStore>,
    /// The backend's key layout.
    keys: C::Keys,
    /// The instance's metrics.
    metrics: Arc<Metrics>,
    /// The store's state as last seen by the watcher.
    mirror: Mirror<C>,
    /// The consumer streams this instance holds.
    streams: Streams<LocalStream<T>>,
    /// This instance's id (records, logs, status).
    instance_id: String,
    /// The leader group count in its instance record ([`CoreSettings::leader_groups`]).
    leader_groups: u32,
    /// TTL of consumer sessions.
    lease_ttl: Duration,
    /// Cancelled when the instance shuts down or crashes: every task stops.
    shutdown: CancellationToken,
    /// Set by a crash before `shutdown` is cancelled: a loop that stops then does nothing
    /// a graceful stop would (the handoff leader does not resign).
    crashed: std::sync::atomic::AtomicBool,
    /// Whether the instance serves.
    readiness: Readiness,
    /// Where partition counts come from.
    topics: Topics,
    /// This instance's lease: every registration it holds is bound to it.
    lease: watch::Sender<LeaseState>,
    /// Asks the lease task to keep the lease alive now (something suggests the store lost
    /// it, `rebind.rs`).
    lease_check: tokio::sync::Notify,
    /// Bounds the registrations writing to the store at once, so a storm of `Register`s
    /// queues here instead of in front of the lease keep-alive.
    register_permits: tokio::sync::Semaphore,
    /// `Register`s on their way to the instance's loop, which writes their registrations
    /// and admits their streams ([`enrolment`]).
    enrolments: Inbox<enrolment::Enrolment>,
    /// Set while the relay has not followed the store for longer than the fencing margin
    /// ([`upkeep`]): every stream was fenced and none is admitted.
    relay_fenced: std::sync::atomic::AtomicBool,
    /// Registrations whose streams ended, on their way to the loop's upkeep, which settles
    /// them ([`departures`]).
    departures: Inbox<departures::Departed>,
    /// The consumers' `PartitionReady`, `PartitionReleased` and `Deregister`, on their
    /// way to the instance's loop, which decides and applies them.
    calls: Inbox<instance::Call>,
}

impl<C: MirrorCache, T: streams::Told> Core<C, T> {
    /// The store.
    pub fn store(&self) -> &dyn LeaseStore {
        &*self.store
    }

    /// The store, to hand to a task of its own.
    pub fn shared_store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    /// The backend's key layout.
    pub fn keys(&self) -> &C::Keys {
        &self.keys
    }

    /// The instance's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store's state as last seen by the watcher.
    pub fn mirror(&self) -> &Mirror<C> {
        &self.mirror
    }

    /// The consumer streams this instance holds.
    pub fn streams(&self) -> &Streams<LocalStream<T>> {
        &self.streams
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// TTL of consumer sessions.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// Cancelled when the instance shuts down or crashes.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Whether the instance serves.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Where partition counts come from.
    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    /// This instance's lease: every registration it holds is bound to it.
    pub fn lease(&self) -> &watch::Sender<LeaseState> {
        &self.lease
    }

    /// A core over `store` holding a fresh snapshot of the prefix; fails if the store
    /// cannot be read.
    pub async fn load(
        store: Arc<dyn LeaseStore>,
        keys: C::Keys,
        metrics: Arc<Metrics>,
        settings: CoreSettings,
        name: &'static str,
    ) -> Result<Self, crate::store::StoreError> {
        let CoreSettings { instance_id, lease_ttl, topics, leader_groups } = settings;
        let mirror = Mirror::load(&*store, &keys, name).await?;
        Ok(Self {
            streams: Streams::new(metrics.clone()),
            store,
            keys,
            metrics,
            mirror,
            instance_id,
            leader_groups,
            lease_ttl,
            shutdown: CancellationToken::new(),
            crashed: std::sync::atomic::AtomicBool::new(false),
            readiness: Readiness::new(false),
            topics,
            lease: watch::Sender::new(LeaseState::Pending),
            lease_check: tokio::sync::Notify::new(),
            register_permits: tokio::sync::Semaphore::new(REGISTRATIONS_IN_FLIGHT),
            enrolments: Inbox::default(),
            relay_fenced: std::sync::atomic::AtomicBool::new(false),
            departures: Inbox::default(),
            calls: Inbox::default(),
        })
    }

    /// The stream of registration `key`, written at `registered_at`, ended without its
    /// consumer leaving (or the write's answer was lost: `Revision::MAX` holds it for the
    /// TTL whatever the cache says): the loop keeps the registration for the consumer's
    /// return, then deletes it if it is still this one ([`departures`]).
    pub fn depart(&self, key: streams::StreamKey, registered_at: crate::store::Revision) {
        self.hand_over(key, registered_at, false);
    }

    /// The consumer of registration `key`, written at `registered_at`, left (drained, or
    /// deregistered) and heard its last commands: the loop deletes it at once if it is
    /// still this one. (Its stream ended as `Left`, which marked it departing
    /// ([`Streams::end`](streams::Streams::end)), so nothing else settles it meanwhile.)
    pub fn leave(&self, key: streams::StreamKey, registered_at: crate::store::Revision) {
        self.hand_over(key, registered_at, true);
    }

    fn hand_over(&self, key: streams::StreamKey, registered_at: crate::store::Revision, left: bool) {
        let departed = departures::Departed { key, registered_at, at: tokio::time::Instant::now(), left };
        // Only a loop that ended (the instance stopped) does not take it.
        let _ = self.departures.send(departed);
    }

    /// Hands a `Register` to the instance's loop; handed back if the loop has stopped.
    pub fn enrol(&self, enrolment: enrolment::Enrolment) -> Result<(), enrolment::Enrolment> {
        self.enrolments.send(enrolment)
    }

    /// The `Register`s handed over, for the instance's loop: `None` once a loop took them.
    pub fn enrolments(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<enrolment::Enrolment>> {
        self.enrolments.take()
    }

    /// Hands a consumer's call to the instance's loop; handed back if the loop has stopped.
    pub fn call(&self, call: instance::Call) -> Result<(), instance::Call> {
        self.calls.send(call)
    }

    /// The consumers' calls, for the instance's loop: `None` once a loop took them.
    pub fn calls(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<instance::Call>> {
        self.calls.take()
    }

    /// The streams that ended, for the instance's loop: `None` once a loop took them.
    pub fn departures(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<departures::Departed>> {
        self.departures.take()
    }

    /// The instance session, while it may be acted on (`UNAVAILABLE` otherwise).
    pub fn live_lease(&self) -> Result<crate::store::SessionId, crate::coordinator::CoordinatorError> {
        self.lease.borrow().live().ok_or_else(|| {
            crate::coordinator::CoordinatorError::NoSession(
                crate::coordinator::causes::SessionMissing::NotLive {
                    instance: self.instance_id.to_string(),
                },
            )
        })
    }

    /// Admits `stream`, registered on the instance lease `lease`, while that lease is still
    /// the live one and the relay follows the store; drops it otherwise (`None`). Checked under
    /// the lock the fence takes ([`Streams::admit`]): no stream is admitted after a fence.
    pub fn admit(
        &self,
        lease: crate::store::SessionId,
        topic: &str,
        consumer: &str,
        stream: LocalStream<T>,
    ) -> Option<transport::EndWatch> {
        use std::sync::atomic::Ordering;
        self.streams.admit(topic, consumer, stream, || {
            admits(
                self.shutdown.is_cancelled(),
                *self.lease.borrow(),
                lease,
                self.relay_fenced.load(Ordering::SeqCst),
            )
        })
    }

    /// Waits until the instance lease is live (the store grants sessions); `UNAVAILABLE`
    /// after one TTL without.
    pub async fn lease_granted(&self) -> Result<(), crate::coordinator::CoordinatorError> {
        let mut lease = self.lease.subscribe();
        match tokio::time::timeout(self.lease_ttl, lease.wait_for(|s| s.live().is_some())).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(crate::coordinator::CoordinatorError::NoSession(
                crate::coordinator::causes::SessionMissing::NotGranted,
            )),
        }
    }

    /// Whether `cache` holds `topic`'s record with a partition count as large as the
    /// configured one, if any: then [`ensure_topic`](Self::ensure_topic) has nothing to do.
    pub fn topic_stored(&self, cache: &C, topic: &str) -> bool {
        let configured = self.topics.configured.get(topic);
        cache.topic_count(topic).is_some_and(|(stored, _)| configured.is_none_or(|c| *c <= stored))
    }

    /// Makes sure `topic` has a stored partition count and returns it ([`Topics::ensure`]).
    pub async fn ensure_topic(&self, topic: &str) -> Result<u32, crate::coordinator::CoordinatorError> {
        let cached = self.mirror.read().topic_count(topic);
        self.topics.ensure(&*self.store, &C::topic_key(&self.keys, topic), topic, cached).await
    }

    /// Grows the stored counts of the topics `of_ours` that grew in Kafka
    /// ([`Topics::grow`]), each write also guarded by `guard`; stops early when `go_on`
    /// turns false.
    pub async fn grow_topics(
        &self,
        guard: Option<crate::store::Compare>,
        of_ours: impl Fn(&str) -> bool,
        go_on: impl Fn() -> bool,
    ) {
        let stored = self.mirror.read().stored_topics();
        let stored = stored
            .into_iter()
            .filter(|(topic, _)| of_ours(topic))
            .map(|(topic, count)| {
                let key = C::topic_key(&self.keys, &topic);
                (topic, key, count)
            })
            .collect();
        self.topics.grow(&*self.store, stored, guard, go_on).await;
    }

    /// Follows the store into the mirror ([`mirror::Follower`]), re-reading the whole
    /// prefix every `resync_interval` as a safety net, until shutdown.
    pub fn follower(&self, resync_interval: Duration) -> mirror::Follower<'_, C> {
        let stale_after = lease::fence_after(self.lease_ttl);
        let source = Source {
            store: &*self.store,
            keys: &self.keys,
            resync_interval,
            stale_after,
            shutdown: &self.shutdown,
        };
        self.mirror.follower(source)
    }

    /// Starts a graceful stop: not ready, every task stops, every stream ends with
    /// `UNAVAILABLE` (sessions are left to their TTL, so consumers can reconnect
    /// elsewhere). Returns `false` if the instance had already stopped or crashed, so a
    /// `shutdown` after a `crash` does nothing.
    pub fn begin_shutdown(&self) -> bool {
        if self.shutdown.is_cancelled() {
            return false;
        }
        self.readiness.set(false);
        self.shutdown.cancel();
        self.streams.stop(transport::Stop::Shutdown { instance: self.instance_id.to_string() });
        true
    }

    /// Whether the instance crashed ([`Self::crash`]) rather than stopped gracefully; once
    /// its shutdown token is cancelled, this is final.
    pub fn crashed(&self) -> bool {
        self.crashed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops every task abruptly, as if the process died: streams break with an error, no
    /// session is revoked and no leadership resigned. For failover tests.
    pub fn crash(&self) {
        self.crashed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.readiness.set(false);
        self.shutdown.cancel();
        self.streams.stop(transport::Stop::Crashed);
    }
}

impl<C: MirrorCache + Send + Sync, T: streams::Told> LeaseHolder for Core<C, T> {
    fn store(&self) -> &dyn LeaseStore {
        &*self.store
    }

    fn ttl(&self) -> Duration {
        self.lease_ttl
    }

    fn lease(&self) -> &watch::Sender<LeaseState> {
        &self.lease
    }

    fn fence(&self) {
        if !lease::fences_streams() {
            return;
        }
        self.streams
            .fence(crate::coordinator::causes::Fence::SessionLost { instance: self.instance_id.to_string() });
    }

    fn renews(&self) -> bool {
        !self.relay_fenced.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn check_now(&self) -> &tokio::sync::Notify {
        &self.lease_check
    }

    fn stop_token(&self) -> &CancellationToken {
        &self.shutdown
    }
}
