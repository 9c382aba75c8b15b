//! [`FaultyStore`]: a [`LeaseStore`] wrapper that injects the faults a real store shows, for
//! simulations and fault tests. **A test tool**: the service never builds one.
//!
//! It wraps any store (usually one [`MemoryStore`](super::MemoryStore) shared by several
//! coordinator instances, each behind its own wrapper) and, as the test tells it at runtime:
//!
//! * **loses answers** ([`lose_next_answers`](FaultyStore::lose_next_answers),
//!   [`lose_next_txn_answers`](FaultyStore::lose_next_txn_answers),
//!   [`lose_answers`](FaultyStore::lose_answers)): a write (`txn`, `put`, `delete`, session
//!   grant / keep-alive / revoke) is applied by the wrapped store, then reported as
//!   [`StoreError::Unavailable`], as when etcd commits and the connection drops before the
//!   answer arrives;
//! * **delays** answers and watch batches ([`delay`](FaultyStore::delay)) by a random time in
//!   a range: half before the call reaches the store, half on the way back; watch batches
//!   keep their order (a batch is never delivered before an earlier one), and can lag the
//!   answers by more ([`lag_watch`](FaultyStore::lag_watch));
//! * **cuts the instance off** ([`cut_off`](FaultyStore::cut_off),
//!   [`cut_off_for`](FaultyStore::cut_off_for), [`restore`](FaultyStore::restore)): every
//!   call fails `Unavailable` without reaching the store, a call in flight loses its answer,
//!   and every open watch ends with an `Unavailable` item;
//! * **stalls** the connection ([`stall`](FaultyStore::stall), or from the next
//!   transaction a test picks, [`stall_at_txn`](FaultyStore::stall_at_txn)), as a hung
//!   TCP connection or a paused network path does: requests wait at the door and answers
//!   and watch batches on the way back until it ends. Then the held requests reach the
//!   store *late* (a write sent before a session expired lands after), and their answers
//!   either arrive late ([`AfterStall::Deliver`]) or are lost after the wait, with every
//!   open watch broken ([`AfterStall::Lose`]: the connection reset);
//! * **hushes watches** ([`hush_watches`](FaultyStore::hush_watches)): open and new watches
//!   deliver nothing (no event, no progress mark, no error) while every other call works,
//!   as a watch whose connection hangs does; what arrived meanwhile follows, in order, once
//!   [`unhush_watches`](FaultyStore::unhush_watches) ends it;
//! * **refuses new sessions** ([`refuse_grants`](FaultyStore::refuse_grants));
//! * **expires sessions** on demand ([`expire_session`](FaultyStore::expire_session),
//!   [`expire_all_sessions`](FaultyStore::expire_all_sessions)), as a store does when it
//!   has not heard from the session's holder for its TTL (even while cut off).
//!
//! **Determinism.** Random choices come from one seeded generator, and every wait runs on
//! tokio time, so under `tokio::time::pause()` on a current-thread runtime the same seed and
//! the same calls give the same faults at the same instants.
//!
//! Clones share the wrapped store and the fault settings: keep one to steer the faults while
//! the code under test uses another.
//!
//! **Who wrote what.** With [`record_writes`](FaultyStore::record_writes) on, it logs every
//! transaction the wrapped store applied through it (answer lost or not): the revision and
//! the keys written ([`take_writes`](FaultyStore::take_writes)). A simulation with one
//! wrapper per instance can then tell which instance wrote a revision.

use std::{
    collections::BTreeSet,
    fmt,
    future::Future,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

use super::{
    InjectedFault, KeyValue, LeaseStore, Op, PrefixSnapshot, Revision, SessionId, StoreError, Txn,
    TxnOutcome, WatchStream,
};

/// A [`LeaseStore`] that injects faults into calls to the store it wraps (see the module docs).
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    shared: Arc<Shared>,
}

/// What a [`FaultyStore`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Calls applied by the wrapped store whose answer was reported lost.
    pub lost_answers: u64,
    /// Calls refused because the instance was cut off (they never reached the store).
    pub refused_calls: u64,
    /// Watches ended by a cut-off.
    pub broken_watches: u64,
    /// Sessions expired on demand.
    pub expired_sessions: u64,
    /// Calls (and watch batches) a stall held.
    pub stalled_calls: u64,
}

/// A transaction the wrapped store applied through this wrapper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenTxn {
    /// The revision it committed at.
    pub revision: Revision,
    /// The keys it wrote (put or deleted).
    pub keys: Vec<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Counts cut-offs: a watch opened at an older count is broken.
    cuts: watch::Sender<u64>,
    /// While `true`, transaction answers are held back ([`FaultyStore::hold_txn_answers`]).
    holding: watch::Sender<bool>,
    /// Moves whenever a stall starts or ends early: calls held by one look again.
    stalls: watch::Sender<u64>,
    /// While `true`, watches deliver nothing ([`FaultyStore::hush_watches`]).
    hushed: watch::Sender<bool>,
}

struct State {
    rng: SplitMix64,
    /// Chance that a write's answer is lost.
    lose_probability: f64,
    /// Writes whose answer is lost regardless of the chance.
    lose_next: u32,
    /// Transactions whose answer is lost regardless of the chance.
    lose_next_txns: u32,
    /// Range of the injected delay per call and per watch batch.
    delay: (Duration, Duration),
    /// Added to the delay of watch batches only: the watch lags the answers.
    watch_lag: Duration,
    /// Cut off: `Some(None)` until restored, `Some(Some(t))` until `t`.
    cut: Option<Option<Instant>>,
    /// Reads and watches fail while sessions and transactions still work.
    reads_cut: bool,
    /// New sessions are refused while everything else works.
    grants_refused: bool,
    /// Sessions granted through this wrapper and not revoked or expired through it.
    sessions: BTreeSet<SessionId>,
    stats: FaultStats,
    /// The latest stall (in force while `now < until`).
    stall: Option<Stall>,
    /// A stall that starts with the next transaction it picks.
    armed: Option<Armed>,
    /// Applied transactions, while recording.
    written: Option<Vec<WrittenTxn>>,
}

impl State {
    fn is_cut_off(&mut self) -> bool {
        if let Some(Some(until)) = self.cut
            && Instant::now() >= until
        {
            self.cut = None;
        }
        self.cut.is_some()
    }

    fn draw_delay(&mut self) -> Duration {
        let (low, high) = self.delay;
        if high <= low {
            return low;
        }
        low + (high - low).mul_f64(self.rng.unit())
    }

    fn draw_loss(&mut self, kind: Kind) -> bool {
        if self.lose_next > 0 {
            self.lose_next -= 1;
            return true;
        }
        if kind == Kind::Txn && self.lose_next_txns > 0 {
            self.lose_next_txns -= 1;
            return true;
        }
        self.lose_probability > 0.0 && self.rng.unit() < self.lose_probability
    }
}

/// A small, fast, seedable generator (Steele, Lea and Flood's SplitMix64): enough for
/// test schedules, and no dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether a call changes the store (so that losing its answer means something).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    /// A write other than a transaction (sessions, compaction).
    Write,
    /// A transaction (`txn`, `put`, `delete`).
    Txn,
}

impl FaultyStore {
    /// Wraps `inner`, with no fault active and random choices seeded by `seed`.
    pub fn new(inner: Arc<dyn LeaseStore>, seed: u64) -> Self {
        let state = State {
            rng: SplitMix64(seed),
            lose_probability: 0.0,
            lose_next: 0,
            lose_next_txns: 0,
            delay: (Duration::ZERO, Duration::ZERO),
            watch_lag: Duration::ZERO,
            cut: None,
            reads_cut: false,
            grants_refused: false,
            sessions: BTreeSet::new(),
            stats: FaultStats::default(),
            stall: None,
            armed: None,
            written: None,
        };
        let (cuts, _) = watch::channel(0);
        let (holding, _) = watch::channel(false);
        let (stalls, _) = watch::channel(0);
        let (hushed, _) = watch::channel(false);
        let shared = Shared { state: Mutex::new(state), cuts, holding, stalls, hushed };
        FaultyStore { inner, shared: Arc::new(shared) }
    }

    /// The wrapped store (calls on it bypass every fault).
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics under this lock; a poisoned one still holds whole settings.
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Loses the answers of the next `n` writes (they are applied all the same).
    pub fn lose_next_answers(&self, n: u32) {
        self.state().lose_next = n;
    }

    /// Loses the answers of the next `n` transactions (`txn`, `put`, `delete`; session calls
    /// are not counted), to hit one precise write: an election, a CAS.
    pub fn lose_next_txn_answers(&self, n: u32) {
        self.state().lose_next_txns = n;
    }

    /// Loses each write's answer with this probability (`0.0` stops it).
    pub fn lose_answers(&self, probability: f64) {
        self.state().lose_probability = probability.clamp(0.0, 1.0);
    }

    /// Delays every answer and every watch batch by a random time in `low..=high`
    /// (`Duration::ZERO` twice stops it).
    pub fn delay(&self, low: Duration, high: Duration) {
        self.state().delay = (low, high.max(low));
    }

    /// Delays watch batches by `lag` more than answers (`Duration::ZERO` stops it): the
    /// watch stream lags the store, as a busy etcd's does, so a writer learns of a commit
    /// from its answer well before its cache does (or, the answer lost, only from the watch).
    pub fn lag_watch(&self, lag: Duration) {
        self.state().watch_lag = lag;
    }

    /// Cuts the instance off until [`restore`](Self::restore): calls fail `Unavailable`,
    /// open watches break.
    pub fn cut_off(&self) {
        self.start_cut(None);
    }

    /// Cuts the instance off for `period` (of tokio time), then lets calls through again.
    pub fn cut_off_for(&self, period: Duration) {
        self.start_cut(Some(Instant::now() + period));
    }

    fn start_cut(&self, until: Option<Instant>) {
        self.state().cut = Some(until);
        self.shared.cuts.send_modify(|count| *count += 1);
    }

    /// Cuts reads and watches only, until [`restore_reads`](Self::restore_reads): `get`,
    /// `get_prefix` and `watch_prefix` fail `Unavailable` and open watches break, while
    /// sessions (grant, keep-alive) and transactions still work — a relay that cannot
    /// follow the store under a lease that stays alive.
    pub fn cut_reads(&self) {
        self.state().reads_cut = true;
        self.shared.cuts.send_modify(|count| *count += 1);
    }

    /// Ends a [`cut_reads`](Self::cut_reads) now.
    pub fn restore_reads(&self) {
        self.state().reads_cut = false;
    }

    /// Hushes every watch, open or opened later, until
    /// [`unhush_watches`](Self::unhush_watches): it delivers nothing, not even a progress
    /// mark, and does not break, while every other call works (a hung watch connection).
    pub fn hush_watches(&self) {
        self.shared.hushed.send_replace(true);
    }

    /// Ends [`hush_watches`](Self::hush_watches): what the watches held comes, in order.
    pub fn unhush_watches(&self) {
        self.shared.hushed.send_replace(false);
    }

    /// Refuses new sessions (`grant_session` fails `Unavailable`) while `on`; every other
    /// call works: an instance whose lease the store expired early cannot get another one
    /// yet, so its lost registrations stay lost (`shared/rebind.rs`).
    pub fn refuse_grants(&self, on: bool) {
        self.state().grants_refused = on;
    }

    /// Holds back the answers of transactions (`txn`, `put`, `delete`) until
    /// [`release_held_answers`](Self::release_held_answers): each is applied by the store,
    /// and its answer is delivered only then, as it was, whatever else happened meanwhile
    /// (a slow answer, a busy runtime). Session calls are not held.
    pub fn hold_txn_answers(&self) {
        self.shared.holding.send_replace(true);
    }

    /// Delivers the answers [`hold_txn_answers`](Self::hold_txn_answers) held back, and
    /// holds no more.
    pub fn release_held_answers(&self) {
        self.shared.holding.send_replace(false);
    }

    /// Ends a cut-off now.
    pub fn restore(&self) {
        self.state().cut = None;
    }

    /// Whether calls are refused right now.
    pub fn is_cut_off(&self) -> bool {
        self.state().is_cut_off()
    }

    /// Starts (`true`) or stops logging the transactions applied through this wrapper.
    pub fn record_writes(&self, on: bool) {
        self.state().written = on.then(Vec::new);
    }

    /// The transactions applied through this wrapper since the last call (while recording).
    pub fn take_writes(&self) -> Vec<WrittenTxn> {
        self.state().written.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Ends `session` in the wrapped store now (its records go), as an expiry would.
    pub async fn expire_session(&self, session: SessionId) -> Result<(), StoreError> {
        self.inner.revoke_session(session).await?;
        let mut state = self.state();
        state.sessions.remove(&session);
        state.stats.expired_sessions += 1;
        Ok(())
    }

    /// Expires every session granted through this wrapper and still alive as far as it
    /// knows; returns them.
    pub async fn expire_all_sessions(&self) -> Result<Vec<SessionId>, StoreError> {
        let sessions: Vec<SessionId> = self.state().sessions.iter().copied().collect();
        for session in &sessions {
            self.expire_session(*session).await?;
        }
        Ok(sessions)
    }

    /// Sessions granted through this wrapper and not revoked or expired through it.
    pub fn sessions(&self) -> Vec<SessionId> {
        self.state().sessions.iter().copied().collect()
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        self.state().stats
    }

    fn refused(&self, what: &'static str) -> StoreError {
        self.state().stats.refused_calls += 1;
        StoreError::Unavailable(InjectedFault::CutOff { what }.into())
    }

    /// Runs one call through the faults (see the module docs).
    async fn call<T>(
        &self,
        what: &'static str,
        kind: Kind,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let delay = self.state().draw_delay();
        let before = delay / 2;
        if !before.is_zero() {
            tokio::time::sleep(before).await;
        }
        let held_going = self.wait_out_stall().await;
        let refused = {
            let mut state = self.state();
            state.is_cut_off() || (kind == Kind::Read && state.reads_cut)
        };
        if refused {
            return Err(self.refused(what));
        }
        let held = kind == Kind::Txn && *self.shared.holding.borrow();
        let result = call.await;
        if held {
            let mut holding = self.shared.holding.subscribe();
            let _ = holding.wait_for(|holding| !holding).await;
            return result;
        }
        if !(delay - before).is_zero() {
            tokio::time::sleep(delay - before).await;
        }
        let stalled = self.wait_out_stall().await.or(held_going);
        let mut state = self.state();
        if stalled.is_some_and(|stall| stall.then == AfterStall::Lose) {
            state.stats.lost_answers += 1;
            return Err(StoreError::Unavailable(InjectedFault::ResetAfterStall { what }.into()));
        }
        let lost = if state.is_cut_off() { true } else { kind != Kind::Read && state.draw_loss(kind) };
        if lost {
            state.stats.lost_answers += 1;
            return Err(StoreError::Unavailable(InjectedFault::AnswerLost { what }.into()));
        }
        result
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("FaultyStore")
            .field("lose_probability", &state.lose_probability)
            .field("lose_next", &state.lose_next)
            .field("delay", &state.delay)
            .field("cut", &state.cut)
            .field("stall", &state.stall)
            .field("stats", &state.stats)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    async fn grant_session(&self, ttl: Duration) -> Result<SessionId, StoreError> {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        if self.state().grants_refused {
            return Err(self.refused("grant session"));
        }
        self.call("grant session", Kind::Write, async move {
            let session = inner.grant_session(ttl).await?;
            // Granted in the store, even if the answer is lost below.
            shared.state.lock().unwrap_or_else(PoisonError::into_inner).sessions.insert(session);
            Ok(session)
        })
        .await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<(), StoreError> {
        self.call("keep alive", Kind::Write, self.inner.keep_alive(session)).await
    }

    async fn revoke_session(&self, session: SessionId) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        self.call("revoke session", Kind::Write, async move {
            inner.revoke_session(session).await?;
            shared.state.lock().unwrap_or_else(PoisonError::into_inner).sessions.remove(&session);
            Ok(())
        })
        .await
    }

    /// The new connection shares this wrapper's faults: a cut or lost answers reach it too.
    async fn connect_again(&self) -> Result<Option<Arc<dyn LeaseStore>>, StoreError> {
        let again = self.inner.connect_again().await?;
        Ok(again
            .map(|inner| Arc::new(FaultyStore { inner, shared: self.shared.clone() }) as Arc<dyn LeaseStore>))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.call("get", Kind::Read, self.inner.get(key)).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<PrefixSnapshot, StoreError> {
        self.call("get prefix", Kind::Read, self.inner.get_prefix(prefix)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        self.trigger(&txn);
        let keys: Vec<String> = txn
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, .. } | Op::Delete { key } => key.clone(),
            })
            .collect();
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        self.call("txn", Kind::Txn, async move {
            let outcome = inner.txn(txn).await?;
            if outcome.succeeded {
                let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(log) = state.written.as_mut() {
                    log.push(WrittenTxn { revision: outcome.revision, keys });
                }
            }
            Ok(outcome)
        })
        .await
    }

    async fn watch_prefix(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream, StoreError> {
        // Subscribed before the call: a cut while it runs breaks the watch at once.
        let cuts = self.shared.cuts.subscribe();
        let stream = self.call("watch", Kind::Read, self.inner.watch_prefix(prefix, from_revision)).await?;
        Ok(faulty_watch(self.clone(), stream, cuts))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.call("compact", Kind::Write, self.inner.compact(revision)).await
    }

    fn watch_progress_every(&self) -> Option<Duration> {
        self.inner.watch_progress_every()
    }
}

/// Forwards `stream` with the injected delays (in order), and breaks it at the next cut-off.
fn faulty_watch(store: FaultyStore, mut stream: WatchStream, cuts: watch::Receiver<u64>) -> WatchStream {
    // Batches are stamped with their delivery time as they arrive, by a task of their own,
    // so a delay is measured from the arrival of each batch, not from the previous delivery.
    let (tx, rx) = mpsc::unbounded_channel();
    let stamper = store.clone();
    tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            let item = tokio::select! {
            biased;
                           () = tx.closed() => return,
                           item = stream.next() => item,
                       };
            let Some(item) = item else { return };
            let delay = {
                let mut state = stamper.state();
                state.draw_delay() + state.watch_lag
            };
            last = last.max(Instant::now() + delay);
            if tx.send((last, item)).is_err() {
                return;
            }
        }
    });
    futures::stream::unfold(Some((store, rx, cuts)), |state| async move {
        let (store, mut rx, mut cuts) = state?;
        let item = tokio::select! {
        biased;
                   // Only a cut-off moves the counter (the sender lives as long as `store`).
                   _ = cuts.changed() => None,
                   item = rx.recv() => match item {
                       Some((at, item)) => tokio::select! {
        biased;
                           _ = cuts.changed() => None,
                           () = tokio::time::sleep_until(at) => Some(item),
                       },
                       // The wrapped stream ended without an error item (a store dropped).
                       None => return None,
                   },
               };
        // A stall holds the batch; one that ended by resetting the connection broke the watch.
        let item = match item {
            Some(item) => tokio::select! {
                biased;
                _ = cuts.changed() => None,
                held = store.wait_out_stall() => {
                    held.is_none_or(|stall| stall.then == AfterStall::Deliver).then_some(item)
                }
            },
            None => None,
        };
        // A hushed watch holds the batch (and what follows it) until it is unhushed.
        let item = match item {
            Some(item) => {
                let mut hushed = store.shared.hushed.subscribe();
                tokio::select! {
                    biased;
                    _ = cuts.changed() => None,
                    _ = hushed.wait_for(|hushed| !hushed) => Some(item),
                }
            }
            None => None,
        };
        let Some(item) = item else {
            store.state().stats.broken_watches += 1;
            let error = StoreError::Unavailable(InjectedFault::WatchCut.into());
            return Some((Err(error), None));
        };
        let next = item.is_ok().then_some((store, rx, cuts));
        Some((item, next))
    })
    .boxed()
}

#[path = "faulty_stall.rs"]
mod stall;
use stall::Armed;
pub use stall::{AfterStall, Stall};

#[cfg(test)]
#[path = "faulty_tests.rs"]
mod tests;
