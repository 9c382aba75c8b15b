//! The zones of the cluster's nodes, for the consumers' [`ConsumerInfo`]: the view's
//! refresh task lists the nodes' metadata (cluster-scoped: `list` on `nodes` through a
//! ClusterRole) now and then, not at every refresh, since zones rarely change.
//!
//! [`ConsumerInfo`]: crate::assignment::ConsumerInfo

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::ListParams};

use super::info::{NodeZones, node_zones, unknown_node};

/// Nodes are listed again after this long.
const EVERY: Duration = Duration::from_secs(60);
/// A pod on a node the last list did not have (a node just added) lists them again, no
/// sooner than this after the last list.
const SOONEST: Duration = Duration::from_secs(5);

/// The last known zones and when they were asked for.
#[derive(Debug, Default)]
pub(super) struct Zones {
    /// The last list's zones (kept while listing fails).
    pub known: NodeZones,
    /// When nodes were last asked for.
    tried: Option<Instant>,
    /// Whether the last list failed (warned once until it succeeds again).
    failing: bool,
}

impl Zones {
    /// Whether to list the nodes now, given the pods just listed.
    fn due(&self, pods: &[Pod], now: Instant) -> bool {
        let Some(tried) = self.tried else { return true };
        let since = now.saturating_duration_since(tried);
        since >= EVERY || (!self.failing && since >= SOONEST && unknown_node(pods, &self.known))
    }

    /// Lists the nodes when due (each call bounded by `timeout`). A failure keeps the last
    /// zones (none before the first list: every zone unknown) and logs one warning until a
    /// list succeeds again.
    pub async fn refresh(&mut self, client: &Client, pods: &[Pod], timeout: Duration) {
        let now = Instant::now();
        if !self.due(pods, now) {
            return;
        }
        self.tried = Some(now);
        let nodes = Api::<Node>::all(client.clone());
        let listed = match tokio::time::timeout(timeout, nodes.list_metadata(&ListParams::default())).await {
            Ok(Ok(list)) => Ok(node_zones(list.items.iter().map(|n| &n.metadata))),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        };
        match listed {
            Ok(zones) => {
                if self.failing {
                    tracing::info!("consumer zones: nodes can be listed again");
                }
                self.failing = false;
                self.known = zones;
            }
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(
                    %error,
                    "consumer zones: cannot list nodes (needs list on nodes, a ClusterRole); zones of consumers on nodes not known before stay unknown"
                );
            }
            Err(_) => {}
        }
    }
}
