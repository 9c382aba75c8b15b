//! The assigner as a container for users' integration tests (cargo feature
//! `testcontainers`, the `testcontainers` crate). **Needs a Docker engine**: where there is
//! none, starting a container fails, and this crate's own container tests skip themselves
//! (the one kind of test allowed to).
//!
//! * [`AssignerImage`]: the image built from this repository's `Dockerfile`
//!   (`docker build -t kafka-assigner:local .`): exposed ports gRPC 50051 and admin 9090,
//!   ready once it logs `serving` (both listeners bound) and its healthcheck (admin
//!   `/ready`) passes; configured through `KAFKA_ASSIGNER_*` environment variables.
//! * [`start_with_etcd`]: etcd plus the assigner on the etcd backend, on a network of
//!   their own.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use testcontainers::{
    ContainerAsync, GenericImage, Image, ImageExt, TestcontainersError,
    core::{ContainerPort, WaitFor},
    runners::AsyncRunner,
};

/// The gRPC port inside the container.
pub const GRPC_PORT: ContainerPort = ContainerPort::Tcp(50051);
/// The admin HTTP port inside the container.
pub const ADMIN_PORT: ContainerPort = ContainerPort::Tcp(9090);
/// The etcd image [`start_with_etcd`] runs.
pub const ETCD_IMAGE: (&str, &str) = ("quay.io/coreos/etcd", "v3.5.17");

/// Errors starting containers.
#[derive(Debug, thiserror::Error)]
pub enum ContainersError {
    /// Docker refused, or a container never became ready.
    #[error("testcontainers: {0}")]
    Testcontainers(#[from] TestcontainersError),
}

/// The kafka-assigner image (see the module docs).
#[derive(Clone, Debug)]
pub struct AssignerImage {
    name: String,
    tag: String,
    env: BTreeMap<String, String>,
}

impl Default for AssignerImage {
    /// `kafka-assigner:local`, memory backend, a 2 s session TTL.
    fn default() -> Self {
        Self::new("kafka-assigner", "local")
    }
}

impl AssignerImage {
    /// The image `name:tag`, memory backend, a 2 s session TTL.
    pub fn new(name: &str, tag: &str) -> Self {
        let mut env = BTreeMap::new();
        env.insert("KAFKA_ASSIGNER_BACKEND".to_string(), "memory".to_string());
        env.insert("KAFKA_ASSIGNER_LEASE_TTL".to_string(), "2s".to_string());
        Self { name: name.into(), tag: tag.into(), env }
    }

    /// Sets `KAFKA_ASSIGNER_<FLAG>` (any `serve` flag, e.g. `("DRAIN_POLICY", "drain")`).
    pub fn with_flag(mut self, flag: &str, value: &str) -> Self {
        self.env.insert(format!("KAFKA_ASSIGNER_{}", flag.to_uppercase().replace('-', "_")), value.into());
        self
    }

    /// Known partition counts (`--topic-partitions`).
    pub fn with_topics(self, topics: &[(&str, u32)]) -> Self {
        let list: Vec<String> = topics.iter().map(|(t, n)| format!("{t}={n}")).collect();
        self.with_flag("TOPIC_PARTITIONS", &list.join(","))
    }

    /// The etcd backend on `endpoints` (comma-separated URLs).
    pub fn with_etcd(self, endpoints: &str) -> Self {
        self.with_flag("BACKEND", "etcd").with_flag("ETCD_ENDPOINTS", endpoints)
    }
}

impl Image for AssignerImage {
    fn name(&self) -> &str {
        &self.name
    }

    fn tag(&self) -> &str {
        &self.tag
    }

    fn ready_conditions(&self) -> Vec<WaitFor> {
        // `serving` is logged once both listeners are bound; the image's HEALTHCHECK then
        // says the store is reachable (admin /ready).
        vec![WaitFor::message_on_stdout("serving"), WaitFor::healthcheck()]
    }

    fn env_vars(&self) -> impl IntoIterator<Item = (impl Into<Cow<'_, str>>, impl Into<Cow<'_, str>>)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn cmd(&self) -> impl IntoIterator<Item = impl Into<Cow<'_, str>>> {
        ["serve"]
    }

    fn expose_ports(&self) -> &[ContainerPort] {
        &[GRPC_PORT, ADMIN_PORT]
    }
}

/// `http://host:port` of a running assigner container's gRPC API, from the test's side.
pub async fn grpc_url(container: &ContainerAsync<AssignerImage>) -> Result<String, ContainersError> {
    let host = container.get_host().await?;
    let port = container.get_host_port_ipv4(GRPC_PORT).await?;
    Ok(format!("http://{host}:{port}"))
}

/// etcd and an assigner on it, sharing a network; both stop when dropped.
pub struct EtcdAssigner {
    /// The assigner.
    pub assigner: ContainerAsync<AssignerImage>,
    /// etcd (reachable from the assigner as `http://{etcd_host}:2379`).
    pub etcd: ContainerAsync<GenericImage>,
    /// The network they share.
    pub network: String,
}

/// Starts etcd, then `image` on the etcd backend, on a fresh network.
pub async fn start_with_etcd(image: AssignerImage) -> Result<EtcdAssigner, ContainersError> {
    let unique = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let network = format!("kafka-assigner-{}-{unique}", std::process::id());
    let etcd_host = format!("etcd-{unique}");
    let etcd = GenericImage::new(ETCD_IMAGE.0, ETCD_IMAGE.1)
        .with_exposed_port(ContainerPort::Tcp(2379))
        .with_wait_for(WaitFor::message_on_stderr("ready to serve client requests"))
        .with_cmd([
            "etcd".to_string(),
            "--listen-client-urls=http://0.0.0.0:2379".to_string(),
            format!("--advertise-client-urls=http://{etcd_host}:2379"),
        ])
        .with_network(network.clone())
        .with_container_name(etcd_host.clone())
        .start()
        .await?;
    let assigner =
        image.with_etcd(&format!("http://{etcd_host}:2379")).with_network(network.clone()).start().await?;
    Ok(EtcdAssigner { assigner, etcd, network })
}
