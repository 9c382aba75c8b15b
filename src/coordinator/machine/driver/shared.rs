//! What the driver, the front and the lease keeper share: flags and channels, none of
//! the machine's state. The keeper (`shared/lease.rs`) reads `renews` and flips the lease
//! state and the bell; the driver alone writes the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coordinator::shared::Readiness;
use crate::coordinator::shared::lease::{LeaseHolder, LeaseState};
use crate::coordinator::shared::transport::Ends;
use crate::metrics::Metrics;
use crate::store::LeaseStore;

/// What the driver, the front and the lease keeper share: flags and channels, no state of
/// the machine's.
pub(crate) struct Shared {
    pub(crate) instance_id: String,
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) ttl: Duration,
    /// The lease's state as the keeper reports it (the driver hands it to the machine).
    pub(crate) lease: watch::Sender<LeaseState>,
    /// The bell every stream's transport reads (fences, stop).
    pub(crate) bell: watch::Sender<Ends>,
    /// The machine's [`Machine::renews`], as of its last step (the keeper reads it).
    pub(crate) renews: AtomicBool,
    pub(crate) check_now: tokio::sync::Notify,
    /// Cancelled when the instance stops (the keeper ends; the driver ends on a crash).
    pub(crate) stop: CancellationToken,
    pub(crate) readiness: Readiness,
    /// Whether the machine leads some leader group, as of its last step.
    pub(crate) leading: AtomicBool,
    pub(crate) metrics: Arc<Metrics>,
}

impl LeaseHolder for Shared {
    fn store(&self) -> &dyn LeaseStore {
        &*self.store
    }
    fn ttl(&self) -> Duration {
        self.ttl
    }
    fn lease(&self) -> &watch::Sender<LeaseState> {
        &self.lease
    }
    fn fence(&self) {
        if !crate::coordinator::shared::lease::fences_streams() {
            return;
        }
        let why = crate::coordinator::causes::Fence::SessionLost { instance: self.instance_id.clone() };
        self.bell.send_modify(|ends| {
            ends.fences += 1;
            ends.fence = Some(why);
        });
    }
    fn renews(&self) -> bool {
        self.renews.load(Ordering::Relaxed)
    }
    fn check_now(&self) -> &tokio::sync::Notify {
        &self.check_now
    }
    fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }
}
