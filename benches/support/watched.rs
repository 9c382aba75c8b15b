//! State that several consumer tasks report into and a bench thread waits on: one value
//! behind a mutex (short critical sections), with every change waking the waiters. The
//! scale bench's `World` and the cluster bench's `Views` are both held this way.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// A shared handle on `T`; clones share the same value.
pub struct Watched<T> {
    state: Arc<Mutex<T>>,
    changed: Arc<Notify>,
}

// Derived `Clone` would ask `T: Clone`; a handle clones without cloning the state.
impl<T> Clone for Watched<T> {
    fn clone(&self) -> Self {
        Self { state: Arc::clone(&self.state), changed: Arc::clone(&self.changed) }
    }
}

/// State with a measured phase: changes count towards `Stats` only while measuring.
pub trait Phased {
    /// The figures one measured phase collects.
    type Stats: Default;
    /// Whether a measured phase is under way, and its figures so far.
    fn phase(&mut self) -> (&mut bool, &mut Self::Stats);
}

impl<T> Watched<T> {
    /// Shares `state`.
    pub fn new(state: T) -> Self {
        Self { state: Arc::new(Mutex::new(state)), changed: Arc::new(Notify::new()) }
    }

    /// Locks the state (a poisoned lock only means a consumer task panicked: keep going).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `change` on the state and wakes the waiters.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let result = change(&mut self.lock());
        self.changed.notify_waiters();
        result
    }

    /// Waits until `done` holds of the state, or the deadline passes; returns when it held.
    pub async fn wait_for(&self, deadline: Instant, done: impl Fn(&T) -> bool) -> Option<Instant> {
        loop {
            // Registered before the test, so a change between the test and the wait wakes it.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(&self.lock()) {
                return Some(Instant::now());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            // A timeout here is only the deadline; any change wakes us earlier.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(250)), notified).await;
        }
    }
}

impl<T: Phased> Watched<T> {
    /// Starts a measured phase: clears the figures; later changes count.
    pub fn start_phase(&self) {
        self.update(|state| {
            let (measuring, stats) = state.phase();
            *stats = T::Stats::default();
            *measuring = true;
        });
    }

    /// Ends the measured phase and returns its figures.
    pub fn end_phase(&self) -> T::Stats {
        self.update(|state| {
            let (measuring, stats) = state.phase();
            *measuring = false;
            std::mem::take(stats)
        })
    }
}
