//! The pure Kubernetes decision: from a pod and (for a StatefulSet pod) its StatefulSet,
//! will the departing consumer come back under the same name? No I/O here.
//!
//! * StatefulSet pod, ordinal below the desired replicas → it is recreated with the same
//!   name (rollout, restart, eviction): `SHUTDOWN_NOW`, partitions held.
//! * StatefulSet pod at or above the desired replicas (scale-down), or its StatefulSet is
//!   being deleted → `WAIT_FOR_DRAIN`.
//! * ReplicaSet (Deployment) pod, or any other controller: a replacement gets a new
//!   generated name, so nobody comes back under this one → `WAIT_FOR_DRAIN`.
//! * No controller: being deleted → nothing recreates it → `WAIT_FOR_DRAIN`; not being
//!   deleted → its container restarts in place, same name → `SHUTDOWN_NOW`.

use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};

use super::{DrainDecision, Reason};

/// The controller of a pod (its `ownerReferences` entry with `controller: true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Controller {
    /// A StatefulSet, by name.
    StatefulSet(String),
    /// A ReplicaSet, by name.
    ReplicaSet(String),
    /// Another kind (DaemonSet, Job, ...).
    Other(String),
    /// No controller.
    None,
}

/// The pod's controller.
pub fn controller(pod: &Pod) -> Controller {
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    match owner {
        Some(o) if o.kind == "StatefulSet" => Controller::StatefulSet(o.name.clone()),
        Some(o) if o.kind == "ReplicaSet" => Controller::ReplicaSet(o.name.clone()),
        Some(o) => Controller::Other(o.kind.clone()),
        None => Controller::None,
    }
}

/// The ordinal of StatefulSet `set`'s pod `pod_name` (`consumer-2` of `consumer` is 2).
pub fn ordinal(set: &str, pod_name: &str) -> Option<u32> {
    let rest = pod_name.strip_prefix(set)?.strip_prefix('-')?;
    // `u32::from_str` accepts a leading '+'; a StatefulSet never writes one.
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// The decision for `pod`; `statefulset` is its controller when that is a StatefulSet
/// (`None`: not found).
pub fn decide(pod: &Pod, statefulset: Option<&StatefulSet>) -> DrainDecision {
    let deleting = pod.metadata.deletion_timestamp.is_some();
    match controller(pod) {
        Controller::StatefulSet(set) => {
            let Some(sts) = statefulset else {
                return DrainDecision::ShutdownNow(Reason::NotFound);
            };
            if sts.metadata.deletion_timestamp.is_some() {
                return DrainDecision::WaitForDrain(Reason::StatefulSetDeleted);
            }
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let Some(ordinal) = ordinal(&set, name) else {
                return DrainDecision::ShutdownNow(Reason::BadOrdinal);
            };
            // The API defaults `replicas` to 1 when unset.
            let desired = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as u32;
            if ordinal < desired {
                DrainDecision::ShutdownNow(Reason::StatefulSetRestart)
            } else {
                DrainDecision::WaitForDrain(Reason::StatefulSetScaleDown)
            }
        }
        Controller::ReplicaSet(_) => DrainDecision::WaitForDrain(Reason::ReplicaSetPod),
        Controller::Other(_) => DrainDecision::WaitForDrain(Reason::OtherController),
        Controller::None if deleting => DrainDecision::WaitForDrain(Reason::NoControllerDeleted),
        Controller::None => DrainDecision::ShutdownNow(Reason::NoControllerRestart),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
        let path = format!("{}/tests/fixtures/k8s/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn statefulset_pod_below_desired_replicas_comes_back() {
        let pod: Pod = fixture("pod-statefulset.json");
        let sts: StatefulSet = fixture("statefulset.json");
        assert_eq!(controller(&pod), Controller::StatefulSet("consumer".into()));
        assert_eq!(decide(&pod, Some(&sts)), DrainDecision::ShutdownNow(Reason::StatefulSetRestart));
    }

    #[test]
    fn statefulset_scale_down_drains() {
        let pod: Pod = fixture("pod-statefulset-scaled-down.json");
        let sts: StatefulSet = fixture("statefulset-scaled-down.json");
        assert_eq!(decide(&pod, Some(&sts)), DrainDecision::WaitForDrain(Reason::StatefulSetScaleDown));
        // The same pod while the set still wants three replicas is a restart.
        let three: StatefulSet = fixture("statefulset.json");
        assert_eq!(decide(&pod, Some(&three)), DrainDecision::ShutdownNow(Reason::StatefulSetRestart));
        // Scaled to zero: every pod drains.
        let mut zero = sts.clone();
        zero.spec.as_mut().unwrap().replicas = Some(0);
        let first: Pod = fixture("pod-statefulset.json");
        assert!(decide(&first, Some(&zero)).drains());
    }

    #[test]
    fn deleted_statefulset_drains_and_missing_one_is_unknown() {
        let pod: Pod = fixture("pod-statefulset.json");
        let mut sts: StatefulSet = fixture("statefulset.json");
        assert_eq!(decide(&pod, None), DrainDecision::ShutdownNow(Reason::NotFound));
        sts.metadata.deletion_timestamp = pod.metadata.deletion_timestamp.clone();
        assert_eq!(decide(&pod, Some(&sts)), DrainDecision::WaitForDrain(Reason::StatefulSetDeleted));
    }

    #[test]
    fn replicaset_pod_drains() {
        let pod: Pod = fixture("pod-replicaset.json");
        assert_eq!(controller(&pod), Controller::ReplicaSet("consumer-7d9f8b6c5".into()));
        assert_eq!(decide(&pod, None), DrainDecision::WaitForDrain(Reason::ReplicaSetPod));
    }

    #[test]
    fn bare_pod_drains_when_deleted_and_is_held_when_restarting_in_place() {
        let mut pod: Pod = fixture("pod-bare.json");
        assert_eq!(controller(&pod), Controller::None);
        assert_eq!(decide(&pod, None), DrainDecision::WaitForDrain(Reason::NoControllerDeleted));
        pod.metadata.deletion_timestamp = None;
        assert_eq!(decide(&pod, None), DrainDecision::ShutdownNow(Reason::NoControllerRestart));
    }

    #[test]
    fn other_controller_drains_and_a_non_controller_owner_is_ignored() {
        let mut pod: Pod = fixture("pod-replicaset.json");
        let owners = pod.metadata.owner_references.as_mut().unwrap();
        owners[0].kind = "DaemonSet".into();
        assert_eq!(decide(&pod, None), DrainDecision::WaitForDrain(Reason::OtherController));
        pod.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert_eq!(controller(&pod), Controller::None);
    }

    #[test]
    fn ordinals() {
        assert_eq!(ordinal("consumer", "consumer-0"), Some(0));
        assert_eq!(ordinal("consumer", "consumer-12"), Some(12));
        assert_eq!(ordinal("web-consumer", "web-consumer-3"), Some(3));
        for bad in ["consumer", "consumer-", "consumer-+1", "consumer-x", "other-1", "consumer1"] {
            assert_eq!(ordinal("consumer", bad), None, "{bad}");
        }
        // A pod whose name does not match its set is unknown, so held.
        let mut pod: Pod = fixture("pod-statefulset.json");
        pod.metadata.name = Some("renamed".into());
        let sts: StatefulSet = fixture("statefulset.json");
        assert_eq!(decide(&pod, Some(&sts)), DrainDecision::ShutdownNow(Reason::BadOrdinal));
    }
}
