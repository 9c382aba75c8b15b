//! The leader: [`election`], [`reconcile`] and the topic refresh.
//!
//! Leadership is one `watch` value, `Some(Fence)` while this instance leads: `is_leader`,
//! the leader gauge and this loop read it, and only the election writes it. The leader key
//! is created (compare: absent) bound to this instance's session; its create revision is
//! the **fence**. Every write the leader makes also compares the leader key's create
//! revision with the fence: a deposed leader's write fails and changes nothing.
//!
//! With Kafka configured, the leader also refreshes the partition counts of the stored
//! topics every `topic_refresh_interval` (in a task of its own: Kafka may be slow) and
//! grows a topic's record when Kafka's count grew; the next reconcile assigns the new
//! partitions like any orphan.

mod election;
mod reconcile;

pub(super) use election::resign;

use std::{collections::BTreeMap, sync::Arc};

use tokio::task::JoinHandle;

use super::Handoff;
use crate::handoff::Cooldowns;
use crate::store::{Compare, Revision, SessionId};

/// Proof of leadership: the create revision of our leader key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The session the leader key is bound to.
    pub session: SessionId,
    /// The leader key's create revision.
    pub revision: Revision,
}

/// The leader loop's own state.
#[derive(Default)]
struct Leadership {
    /// This instance's session (the leader key is bound to it).
    session: Option<SessionId>,
    /// Per-topic cooldowns of the planner; lost with leadership.
    cooldowns: BTreeMap<String, Cooldowns>,
    /// Revision our last write produced; reconcile again only once the cache has it.
    written: Revision,
    /// The running topic refresh, if any.
    refresh: Option<JoinHandle<()>>,
    /// When the next topic refresh is due.
    next_refresh: Option<tokio::time::Instant>,
}

impl Handoff {
    /// Our fence, while we lead.
    fn fence(&self) -> Option<Fence> {
        *self.leadership.borrow()
    }

    /// The compare that holds only while `fence` is the current election.
    fn fenced(&self, fence: Fence) -> Compare {
        Compare::CreateRevision(self.core.keys.leader(), fence.revision)
    }
}

/// Campaigns, keeps the instance session alive, and reconciles while leading.
pub(super) async fn leader_loop(inner: Arc<Handoff>) {
    let mut changed = inner.core.mirror.subscribe();
    let mut me = Leadership::default();
    let keep_alive_every = inner.core.keep_alive_period();
    let mut next_keep_alive = tokio::time::Instant::now();
    loop {
        if inner.core.shutdown.is_cancelled() {
            return;
        }
        if let Err(error) = election::keep_session(&inner, &mut me, &mut next_keep_alive).await {
            tracing::warn!(%error, "instance session unavailable");
        }
        election::check_leadership(&inner, &mut me);
        if inner.fence().is_none() {
            election::campaign(&inner, &mut me).await;
        }
        if let Some(fence) = inner.fence()
            && inner.core.mirror.read().revision >= me.written
        {
            reconcile::reconcile_all(&inner, &mut me, fence).await;
        }
        if let Some(fence) = inner.fence() {
            start_topic_refresh(&inner, &mut me, fence);
        }
        let wait = inner.config.reconcile_interval.min(keep_alive_every);
        tokio::select! {
            _ = inner.core.shutdown.cancelled() => return,
            _ = changed.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Keeps the leader gauge equal to the leadership value.
pub(super) async fn publish_gauge(inner: Arc<Handoff>) {
    let mut leadership = inner.leadership.subscribe();
    loop {
        let leading = leadership.borrow_and_update().is_some();
        inner.core.metrics.is_leader.set(i64::from(leading));
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Starts a topic refresh when one is due and none is running.
fn start_topic_refresh(inner: &Arc<Handoff>, me: &mut Leadership, fence: Fence) {
    if inner.core.topics.source.is_none() || me.refresh.as_ref().is_some_and(|task| !task.is_finished()) {
        return;
    }
    let now = tokio::time::Instant::now();
    if me.next_refresh.is_some_and(|due| now < due) {
        return;
    }
    me.next_refresh = Some(now + inner.config.topic_refresh_interval);
    let inner = inner.clone();
    me.refresh = Some(tokio::spawn(async move {
        let go_on = || !inner.core.shutdown.is_cancelled() && inner.fence() == Some(fence);
        inner.core.grow_topics(Some(inner.fenced(fence)), go_on).await;
    }));
}
