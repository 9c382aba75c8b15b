//! The Kubernetes part of `--drain-policy k8s`: reads the departing consumer's pod (and
//! its StatefulSet) through kube-rs, and decides with the pure [`super::policy`].

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
use kube::{Api, Client, Config};

use super::{DrainDecider, DrainDecision, Reason, policy};

/// Errors building the Kubernetes client.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// Neither an in-cluster service account nor a kubeconfig was found.
    #[error("--drain-policy k8s: no Kubernetes configuration (not in a pod, and no usable kubeconfig): {0}")]
    Config(String),
    /// The client could not be built from the configuration.
    #[error("--drain-policy k8s: cannot build the Kubernetes client: {0}")]
    Client(String),
}

/// Settings of [`K8sDrainDecider`].
#[derive(Clone, Debug)]
pub struct K8sSettings {
    /// Namespace of the consumers' pods (`None`: the assigner's own namespace).
    pub namespace: Option<String>,
    /// A lookup not answered within this is unknown (`SHUTDOWN_NOW`).
    pub timeout: Duration,
}

/// Decides from the Kubernetes API (see the module docs of [`crate::drain`]).
#[derive(Clone)]
pub struct K8sDrainDecider {
    client: Client,
    namespace: String,
    timeout: Duration,
}

impl std::fmt::Debug for K8sDrainDecider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sDrainDecider")
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl K8sDrainDecider {
    /// In-cluster configuration (service account), else the kubeconfig.
    pub async fn from_environment(settings: &K8sSettings) -> Result<Self, DrainError> {
        let config = Config::infer().await.map_err(|e| DrainError::Config(e.to_string()))?;
        Self::from_config(config, settings)
    }

    /// A decider over an explicit configuration (e.g. `Config::new(url)` for a proxy).
    pub fn from_config(mut config: Config, settings: &K8sSettings) -> Result<Self, DrainError> {
        config.connect_timeout = Some(settings.timeout);
        config.read_timeout = Some(settings.timeout);
        let namespace = settings.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| DrainError::Client(e.to_string()))?;
        Ok(Self { client, namespace, timeout: settings.timeout })
    }

    /// The namespace pods are looked up in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The rollout view over the same client and namespace, listing every `interval`
    /// (starts its refresh task: needs a Tokio runtime).
    pub fn rollout_view(&self, interval: std::time::Duration) -> super::K8sRolloutView {
        super::K8sRolloutView::start(self.client.clone(), &self.namespace, interval, self.timeout)
    }

    async fn lookup(&self, consumer: &str) -> Result<DrainDecision, kube::Error> {
        let pod = Api::<Pod>::namespaced(self.client.clone(), &self.namespace).get(consumer).await?;
        let statefulset = match policy::controller(&pod) {
            policy::Controller::StatefulSet(set) => {
                Api::<StatefulSet>::namespaced(self.client.clone(), &self.namespace).get_opt(&set).await?
            }
            _ => None,
        };
        Ok(policy::decide(&pod, statefulset.as_ref()))
    }
}

/// The reason for a failed lookup.
fn failure(error: &kube::Error) -> Reason {
    match error {
        kube::Error::Api(status) if status.code == 403 => Reason::Forbidden,
        kube::Error::Api(status) if status.code == 404 => Reason::NotFound,
        _ => Reason::ApiError,
    }
}

/// Logs an unknown answer: the pod may or may not come back, and `SHUTDOWN_NOW` is
/// what the proto says for no Kubernetes awareness.
fn warn_unknown(consumer: &str, namespace: &str, reason: Reason, error: &dyn std::fmt::Display) {
    tracing::warn!(
        consumer,
        namespace,
        reason = reason.as_str(),
        %error,
        "cannot tell from Kubernetes whether the consumer's pod comes back; answering SHUTDOWN_NOW"
    );
}

#[async_trait]
impl DrainDecider for K8sDrainDecider {
    async fn decide(&self, consumer: &str) -> DrainDecision {
        let namespace = self.namespace.as_str();
        let decision = match tokio::time::timeout(self.timeout, self.lookup(consumer)).await {
            Ok(Ok(decision)) => decision,
            Ok(Err(error)) => {
                let reason = failure(&error);
                warn_unknown(consumer, namespace, reason, &error);
                return DrainDecision::ShutdownNow(reason);
            }
            Err(_) => {
                let error = format!("no answer within {:?}", self.timeout);
                warn_unknown(consumer, namespace, Reason::Timeout, &error);
                return DrainDecision::ShutdownNow(Reason::Timeout);
            }
        };
        let reason = decision.reason();
        if reason.is_unknown() {
            warn_unknown(consumer, namespace, reason, &"the pod's owner does not tell");
        } else {
            tracing::info!(
                consumer,
                namespace,
                reason = reason.as_str(),
                drain = decision.drains(),
                "Deregister decided from the Kubernetes API"
            );
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_https_client_builds_with_the_bundled_tls_stack() {
        // In a cluster the API is https: building the client must not need anything the
        // build left out (a TLS crypto provider).
        let config = Config::new("https://10.96.0.1:443".parse().expect("url"));
        let settings = K8sSettings { namespace: None, timeout: Duration::from_secs(1) };
        let decider = K8sDrainDecider::from_config(config, &settings).expect("client builds");
        assert_eq!(decider.namespace(), "default", "Config::new's namespace when none is given");
    }
}
