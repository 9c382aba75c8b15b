//! The pure part of the consumers' attributes ([`ConsumerInfo`]) under the Kubernetes
//! integration: from the namespace's pods and the zones of the cluster's nodes, each
//! consumer pod's zone, capacity and rollout generation. No I/O.
//!
//! * **zone**: the zone of the pod's node (`spec.nodeName`): the Node label
//!   [`ZONE_LABEL`], else the older [`LEGACY_ZONE_LABEL`]; `None` while the pod is not
//!   scheduled, its node is not known (nodes cannot be listed) or has neither label.
//! * **capacity**: the pod annotation [`CAPACITY_ANNOTATION`], a positive integer in
//!   decimal digits; absent, 1; anything else, 1 and the bad value is reported (the caller
//!   warns, naming the pod). An annotation, not a label: a label value is meant for
//!   selecting, and a number that an operator tunes has no selector to serve.
//! * **generation**: the pod's `pod-template-hash` label (a Deployment's pods carry the
//!   hash of their ReplicaSet's template), the generation the rollout rule tells old pods
//!   from new ones by; `None` for other pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::assignment::ConsumerInfo;

/// The Node label with its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zone label older clusters set (deprecated since Kubernetes 1.17).
pub const LEGACY_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
/// The pod annotation with the consumer's capacity.
pub const CAPACITY_ANNOTATION: &str = "kafka-assigner.io/capacity";
/// The label with a Deployment pod's template hash.
pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// Node name → its zone (`None`: the node has no zone label).
pub type NodeZones = BTreeMap<String, Option<String>>;

/// The zone of a node, from its metadata.
pub fn node_zone(node: &ObjectMeta) -> Option<String> {
    let labels = node.labels.as_ref()?;
    [ZONE_LABEL, LEGACY_ZONE_LABEL]
        .iter()
        .filter_map(|key| labels.get(*key))
        .find(|zone| !zone.is_empty())
        .cloned()
}

/// The zones of `nodes` (their metadata), by node name.
pub fn node_zones<'a>(nodes: impl IntoIterator<Item = &'a ObjectMeta>) -> NodeZones {
    nodes.into_iter().filter_map(|meta| Some((meta.name.clone()?, node_zone(meta)))).collect()
}

/// A pod's capacity: `Ok(1)` without the annotation, `Err(value)` when it is there but is
/// no positive integer.
pub fn capacity(pod: &Pod) -> Result<u32, String> {
    let Some(value) = pod.metadata.annotations.as_ref().and_then(|a| a.get(CAPACITY_ANNOTATION)) else {
        return Ok(1);
    };
    // `u32::from_str` accepts a leading '+'; only plain digits are a capacity.
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<u32>() {
        Ok(n) if digits && n > 0 => Ok(n),
        _ => Err(value.clone()),
    }
}

/// The node a pod runs on, if it is scheduled.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// What the view knows of the consumers at one refresh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// By pod name: the info of each listed pod.
    pub info: BTreeMap<String, ConsumerInfo>,
    /// Pods whose capacity annotation is not a positive integer, with its value.
    pub bad_capacity: BTreeMap<String, String>,
}

impl Attributes {
    /// The attributes of the listed `pods`, their zones read from `zones`.
    pub fn observe(pods: &[Pod], zones: &NodeZones) -> Attributes {
        let mut found = Attributes::default();
        for pod in pods {
            let Some(name) = pod.metadata.name.clone() else { continue };
            let capacity = capacity(pod).unwrap_or_else(|bad| {
                found.bad_capacity.insert(name.clone(), bad);
                1
            });
            let zone = node_of(pod).and_then(|node| zones.get(node).cloned().flatten());
            let generation = pod.metadata.labels.as_ref().and_then(|l| l.get(TEMPLATE_HASH_LABEL)).cloned();
            found.info.insert(name, ConsumerInfo { zone, capacity, generation });
        }
        found
    }
}

/// Whether a listed pod runs on a node `zones` does not know (a node added since nodes
/// were last listed).
pub fn unknown_node(pods: &[Pod], zones: &NodeZones) -> bool {
    pods.iter().filter_map(node_of).any(|node| !zones.contains_key(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, capacity: Option<&str>, hash: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        if let Some(value) = capacity {
            pod.metadata.annotations = Some([(CAPACITY_ANNOTATION.to_string(), value.to_string())].into());
        }
        if let Some(hash) = hash {
            pod.metadata.labels = Some([(TEMPLATE_HASH_LABEL.to_string(), hash.to_string())].into());
        }
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: node.map(String::from),
            ..Default::default()
        });
        pod
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn zone_label_then_the_legacy_one() {
        let both = node("n1", &[(ZONE_LABEL, "eu-1a"), (LEGACY_ZONE_LABEL, "old")]);
        assert_eq!(node_zone(&both).as_deref(), Some("eu-1a"));
        assert_eq!(node_zone(&node("n2", &[(LEGACY_ZONE_LABEL, "eu-1b")])).as_deref(), Some("eu-1b"));
        assert_eq!(
            node_zone(&node("n3", &[(ZONE_LABEL, ""), (LEGACY_ZONE_LABEL, "eu-1c")])).as_deref(),
            Some("eu-1c")
        );
        assert_eq!(node_zone(&node("n4", &[("kubernetes.io/hostname", "n4")])), None);
        assert_eq!(node_zone(&ObjectMeta::default()), None);
    }

    #[test]
    fn capacities() {
        for (value, want) in [(None, Ok(1)), (Some("1"), Ok(1)), (Some("4"), Ok(4)), (Some("007"), Ok(7))] {
            assert_eq!(capacity(&pod("p", None, value, None)), want, "{value:?}");
        }
        for bad in ["0", "-1", "+2", " 2", "2.5", "two", "", "4294967296"] {
            assert_eq!(capacity(&pod("p", None, Some(bad), None)), Err(bad.to_string()), "{bad:?}");
        }
    }

    #[test]
    fn attributes_of_listed_pods() {
        let zones = node_zones(&[node("n1", &[(ZONE_LABEL, "eu-1a")]), node("n2", &[])]);
        let pods = [
            pod("a", Some("n1"), Some("3"), Some("7d9f8b6c5")),
            pod("b", Some("n2"), Some("lots"), None),
            pod("c", None, None, None),
            pod("d", Some("n9"), None, None),
        ];
        let found = Attributes::observe(&pods, &zones);
        let info = |zone: Option<&str>, capacity, generation: Option<&str>| ConsumerInfo {
            zone: zone.map(String::from),
            capacity,
            generation: generation.map(String::from),
        };
        assert_eq!(found.info["a"], info(Some("eu-1a"), 3, Some("7d9f8b6c5")));
        assert_eq!(found.info["b"], info(None, 1, None), "no zone label; a bad capacity is 1");
        assert!(found.info["c"].is_default() && found.info["d"].is_default(), "unscheduled; unknown node");
        assert_eq!(found.bad_capacity, [("b".to_string(), "lots".to_string())].into());
        assert!(unknown_node(&pods, &zones), "n9 is not listed");
        assert!(!unknown_node(&pods[..3], &zones));
    }
}
