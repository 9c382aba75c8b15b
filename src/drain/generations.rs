//! The pure part of the rollout view: from the pods and ReplicaSets of the namespace, which
//! Deployments are rolling out, and for a topic's consumers (pod names) the [`Rollout`] the
//! leader plans with. No I/O; time is an input.
//!
//! * A pod belongs to the ReplicaSet that controls it; a ReplicaSet to the Deployment that
//!   controls it, with its generation in the `deployment.kubernetes.io/revision`
//!   annotation. The highest revision of a Deployment's ReplicaSets is the new generation.
//! * A Deployment **rolls out** while one of its pods that is still alive (listed, running
//!   or terminating, not `Succeeded` / `Failed`) belongs to an older revision. A pod that
//!   is terminating still counts: while the last old pod drains, the new pods are still
//!   capped, so the one still to come gets its share.
//! * Its desired replicas come from the new ReplicaSet's
//!   `deployment.kubernetes.io/desired-replicas` annotation (which the Deployment
//!   controller keeps equal to the Deployment's `replicas`): no `get` on Deployments needed.
//!   Without it the Deployment is not treated as rolling out.
//! * Pods that vanished from the list are remembered for a while, so the registration of a
//!   crashed old pod, which outlives its pod by up to a TTL, still counts as old.
//! * A consumer name that is no listed pod but reads `{replicaset}-{suffix}` (a ReplicaSet
//!   pod's generated name, `suffix` without `-`) of a listed ReplicaSet belongs to it: a new
//!   pod that registers before the next list still counts as new.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};

use super::policy::{self, Controller};
use crate::assignment::Rollout;

/// The annotation with a ReplicaSet's revision among its Deployment's.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The annotation with the Deployment's desired replicas, on each of its ReplicaSets.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";

/// A consumer pod's generation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    /// Its Deployment.
    deployment: String,
    /// The revision of its ReplicaSet.
    revision: u64,
    /// When it was last listed.
    seen: Instant,
}

/// A Deployment rolling out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rolling {
    /// The new generation's revision.
    pub newest: u64,
    /// The Deployment's desired replicas.
    pub desired: u32,
}

/// What the view knows at one refresh (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generations {
    /// Pods of Deployments, listed or remembered, by name.
    members: BTreeMap<String, Member>,
    /// Deployments rolling out, by name.
    rolling: BTreeMap<String, Rolling>,
    /// ReplicaSets of Deployments: name → (Deployment, revision).
    sets: BTreeMap<String, (String, u64)>,
}

/// A ReplicaSet's Deployment (its controller), revision and desired-replicas annotation.
fn replicaset_facts(rs: &ReplicaSet) -> Option<(String, Option<u64>, Option<u32>)> {
    let owner = rs.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true))?;
    if owner.kind != "Deployment" {
        return None;
    }
    let annotation = |key: &str| rs.metadata.annotations.as_ref().and_then(|a| a.get(key));
    let revision = annotation(REVISION).and_then(|v| v.trim().parse().ok());
    let desired = annotation(DESIRED_REPLICAS).and_then(|v| v.trim().parse().ok());
    Some((owner.name.clone(), revision, desired))
}

/// Whether a listed pod is alive (running or terminating): `Succeeded` and `Failed` pods
/// (an evicted pod stays listed as `Failed`) are not.
fn alive(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

impl Generations {
    /// The view after listing `pods` and `replicasets` at `now`; pods of `previous` that
    /// are no longer listed are remembered until `retain` after they were last seen.
    pub fn observe(
        pods: &[Pod],
        replicasets: &[ReplicaSet],
        previous: &Generations,
        now: Instant,
        retain: Duration,
    ) -> Generations {
        // ReplicaSet name → (Deployment, revision); per Deployment its newest revision
        // and that ReplicaSet's desired replicas.
        let mut sets: BTreeMap<String, (String, u64)> = BTreeMap::new();
        let mut newest: BTreeMap<String, (u64, Option<u32>)> = BTreeMap::new();
        for rs in replicasets {
            let (Some(name), Some((deployment, Some(revision), desired))) =
                (rs.metadata.name.as_deref(), replicaset_facts(rs))
            else {
                continue;
            };
            let entry = newest.entry(deployment.clone()).or_insert((revision, desired));
            if revision > entry.0 {
                *entry = (revision, desired);
            }
            sets.insert(name.to_string(), (deployment, revision));
        }
        let mut members = BTreeMap::new();
        let mut old_alive: BTreeSet<String> = BTreeSet::new();
        for pod in pods.iter().filter(|p| alive(p)) {
            let (Some(name), Controller::ReplicaSet(set)) =
                (pod.metadata.name.as_ref(), policy::controller(pod))
            else {
                continue;
            };
            let Some((deployment, revision)) = sets.get(set.as_str()) else { continue };
            if newest.get(deployment).is_some_and(|(top, _)| revision < top) {
                old_alive.insert(deployment.clone());
            }
            let member = Member { deployment: deployment.clone(), revision: *revision, seen: now };
            members.insert(name.clone(), member);
        }
        for (name, member) in &previous.members {
            if !members.contains_key(name) && now.saturating_duration_since(member.seen) < retain {
                members.insert(name.clone(), member.clone());
            }
        }
        let rolling = old_alive
            .into_iter()
            .filter_map(|deployment| {
                let (newest, desired) = *newest.get(&deployment)?;
                Some((deployment, Rolling { newest, desired: desired? }))
            })
            .collect();
        Generations { members, rolling, sets }
    }

    /// The Deployments rolling out.
    pub fn rolling(&self) -> &BTreeMap<String, Rolling> {
        &self.rolling
    }

    /// Whether `name` is a known pod of a Deployment (listed or remembered).
    pub fn knows(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }

    /// The Deployment and revision of consumer `name`: a known pod's, else those of the
    /// listed ReplicaSet its name was generated from.
    fn generation(&self, name: &str) -> Option<(&str, u64)> {
        if let Some(m) = self.members.get(name) {
            return Some((m.deployment.as_str(), m.revision));
        }
        let (set, suffix) = name.rsplit_once('-')?;
        if suffix.is_empty() {
            return None;
        }
        self.sets.get(set).map(|(deployment, revision)| (deployment.as_str(), *revision))
    }

    /// The rollout among one topic's consumers: `live` are the registered ones, `active`
    /// those not draining. `None` when no Deployment that one of them belongs to rolls out.
    ///
    /// Outgoing: the live consumers of an older revision of a rolling Deployment. Final
    /// members: the desired replicas of each rolling Deployment involved, plus the active
    /// consumers outside them.
    pub fn rollout(&self, live: &BTreeSet<String>, active: &BTreeSet<String>) -> Option<Rollout> {
        let rolling_of = |name: &String| {
            let (deployment, revision) = self.generation(name)?;
            let (deployment, rolling) = self.rolling.get_key_value(deployment)?;
            Some((deployment.as_str(), revision, rolling))
        };
        let involved: BTreeMap<&str, &Rolling> =
            live.iter().filter_map(rolling_of).map(|(d, _, r)| (d, r)).collect();
        if involved.is_empty() {
            return None;
        }
        let outgoing = live
            .iter()
            .filter(|name| rolling_of(name).is_some_and(|(_, revision, r)| revision < r.newest))
            .cloned()
            .collect();
        let outside = active.iter().filter(|name| rolling_of(name).is_none()).count();
        let desired: usize = involved.values().map(|r| r.desired as usize).sum();
        Some(Rollout { outgoing, final_members: desired + outside })
    }
}

#[cfg(test)]
#[path = "generations_tests.rs"]
mod tests;
