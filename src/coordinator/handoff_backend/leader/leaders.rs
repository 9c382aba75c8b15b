//! The leaders of an instance, one per leader group ([`Leaders`]): the loop's calls spread
//! over them, and the instance's one planning budget ([`PLAN_PACE`](super::PLAN_PACE)) shared in turn.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{Answer, Job, Leader, Why};
use crate::coordinator::handoff_backend::Handoff;
use crate::coordinator::handoff_backend::leader_groups::LeaderGroup;

/// The leaders of every group, as the instance's loop keeps them: each one a [`Leader`]
/// of its own, the loop's calls spread over them.
pub(in crate::coordinator::handoff_backend) struct Leaders {
    groups: Vec<Leader>,
    /// No group plans before this: the instance's planning budget ([`PLAN_PACE`](super::PLAN_PACE)), set
    /// when a group plans.
    pace: Option<Instant>,
    /// The group asked first for its next call (rotated, so that no group's plan always
    /// takes the budget first).
    turn: usize,
}

/// Which of the [`Leaders`] a call belongs to.
pub(in crate::coordinator::handoff_backend) type GroupIndex = usize;

impl Leaders {
    /// One leader per group of `groups`, each looking at once.
    pub(in crate::coordinator::handoff_backend) fn new(groups: u32, now: Instant) -> Self {
        let groups = LeaderGroup::all(groups).map(|group| Leader::new(group, now)).collect();
        Leaders { groups, pace: None, turn: 0 }
    }

    /// See [`Leader::poke`].
    pub(in crate::coordinator::handoff_backend) fn poke(&mut self) {
        self.groups.iter_mut().for_each(Leader::poke);
    }

    /// The earliest of the leaders' timers (see [`Leader::wake_at`]).
    pub(in crate::coordinator::handoff_backend) fn wake_at(&self) -> Option<Instant> {
        self.groups.iter().filter_map(Leader::wake_at).min()
    }

    /// Whether some leader may plan at its next call (see [`Leader::may_plan`]).
    pub(in crate::coordinator::handoff_backend) fn may_plan(&self, inner: &Handoff, now: Instant) -> bool {
        self.pace.is_none_or(|at| now >= at) && self.groups.iter().any(|leader| leader.may_plan(inner, now))
    }

    /// Every leader's next store call that is ready now, with its group, starting from
    /// the group whose turn it is.
    pub(in crate::coordinator::handoff_backend) fn next_jobs(
        &mut self,
        inner: &Arc<Handoff>,
        now: Instant,
    ) -> Vec<(GroupIndex, Job)> {
        let count = self.groups.len();
        let first = self.turn % count.max(1);
        self.turn = first + 1;
        let mut jobs = Vec::new();
        for index in (first..count).chain(0..first) {
            if let Some(job) = self.groups[index].next_job(inner, now, &mut self.pace) {
                jobs.push((index, job));
            }
        }
        jobs
    }

    /// Every topic refresh due now (see [`Leader::refresh`]), with its group.
    pub(in crate::coordinator::handoff_backend) fn refreshes(
        &mut self,
        inner: &Arc<Handoff>,
    ) -> Vec<(GroupIndex, u64, BoxFuture<'static, ()>)> {
        let due = self.groups.iter_mut().enumerate();
        due.filter_map(|(index, leader)| leader.refresh(inner).map(|(number, run)| (index, number, run)))
            .collect()
    }

    /// See [`Leader::stop`].
    pub(in crate::coordinator::handoff_backend) fn stop(&mut self) {
        self.groups.iter_mut().for_each(Leader::stop);
    }

    /// The topic refresh `number` of group `index` ended.
    pub(in crate::coordinator::handoff_backend) fn refreshed(&mut self, index: GroupIndex, number: u64) {
        if let Some(leader) = self.groups.get_mut(index) {
            leader.refreshed(number);
        }
    }

    /// What the store answered group `index`'s call.
    pub(in crate::coordinator::handoff_backend) fn answered(
        &mut self,
        inner: &Handoff,
        index: GroupIndex,
        why: Why,
        answer: Answer,
    ) {
        if let Some(leader) = self.groups.get_mut(index) {
            leader.answered(inner, why, answer);
        }
    }
}
