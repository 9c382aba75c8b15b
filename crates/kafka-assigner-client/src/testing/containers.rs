//! The assigner as a container for a consumer's integration tests (cargo feature
//! `testcontainers` of this crate, the `testcontainers` crate, re-exported here so its
//! version always matches). **Needs a Docker engine** and the images (`scripts/images`
//! builds both from a checkout of the repository, no registry needed; or
//! `docker build -t kafka-assigner:local .`). Containers, and the networks they were
//! started on, are removed when their handles drop, a failing test's included.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! use kafka_assigner_client::testing::containers::{
//!     AssignerImage, client_config, testcontainers::runners::AsyncRunner,
//! };
//!
//! let assigner = AssignerImage::default().with_topics(&[("payments", 4)]).start().await?;
//! let config = client_config(&[&assigner], "worker-a", "payments").await?;
//! // ... AssignerClient::start(config, handler, None) ...
//! # Ok(()) }
//! ```
//!
//! * [`AssignerImage`]: `kafka-assigner:local` on the memory backend, configured through
//!   `KAFKA_ASSIGNER_*` variables; ready once `kafka-assigner probe` (run in the container)
//!   finds its admin `/ready` answering 200.
//! * [`EtcdImage`]: `kafka-assigner-etcd:local`, one etcd member.
//! * [`EtcdNetwork`]: etcd on a network of its own, and assigners started on it
//!   ([`start_with_etcd`]: one of each).
//! * [`grpc_url`], [`admin_url`], [`client_config`], [`status`]: the test's side.
//! * [`kill`], [`engine_available`], [`images_available`], [`log_to_stderr`]: Docker itself.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use testcontainers::{
    ContainerAsync, Image, ImageExt, TestcontainersError,
    core::{
        CmdWaitFor, ContainerPort, ContainerState, ExecCommand, WaitFor, client::docker_client_instance,
        logs::LogFrame,
    },
    runners::AsyncRunner,
};

use crate::ClientConfig;
use crate::status::{Status, StatusError};

/// The `testcontainers` crate this module is built on (`runners::AsyncRunner` starts an
/// image, `ImageExt` names it or puts it on a network).
pub use testcontainers;

/// The gRPC port inside the assigner container.
pub const GRPC_PORT: ContainerPort = ContainerPort::Tcp(50051);
/// The admin HTTP port inside the assigner container.
pub const ADMIN_PORT: ContainerPort = ContainerPort::Tcp(9090);
/// etcd's client port inside its container.
pub const ETCD_PORT: ContainerPort = ContainerPort::Tcp(2379);
/// The assigner image [`AssignerImage::default`] runs.
pub const ASSIGNER_IMAGE: (&str, &str) = ("kafka-assigner", "local");
/// The etcd image [`EtcdImage::default`] runs.
pub const ETCD_IMAGE: (&str, &str) = ("kafka-assigner-etcd", "local");
/// How long a container may take to become ready (first starts on a busy machine included).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The session TTL [`AssignerImage`] sets unless told otherwise: short, for tests.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(2);

/// Errors starting or driving containers.
#[derive(Debug, thiserror::Error)]
pub enum ContainersError {
    /// Docker refused, or a container never became ready.
    #[error("testcontainers: {0}")]
    Testcontainers(#[from] TestcontainersError),
    /// No Docker engine answered.
    #[error("no Docker engine: {0}")]
    NoEngine(String),
    /// An image is not in the engine (nothing is pulled for these).
    #[error(
        "image {0} not found: build it with scripts/images (or `docker build -t kafka-assigner:local .`)"
    )]
    MissingImage(String),
    /// A Docker API call failed.
    #[error("docker: {0}")]
    Docker(String),
    /// The assigner's admin server did not answer with its status.
    #[error("status: {0}")]
    Status(#[from] StatusError),
}

/// A name no other container or network on this engine has: `kafka-assigner-{what}-...`
/// (the process id, a counter and the time). The prefix lets a CI check find leftovers.
pub fn unique_name(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() % 1_000_000);
    format!("kafka-assigner-{what}-{}-{n}-{millis}", std::process::id())
}

/// A fresh network name; testcontainers creates the network with the first container
/// started on it and removes it when the last one is dropped.
pub fn network_name() -> String {
    unique_name("net")
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
        Self::new(ASSIGNER_IMAGE.0, ASSIGNER_IMAGE.1)
    }
}

impl AssignerImage {
    /// The image `name:tag`, memory backend, a 2 s session TTL.
    pub fn new(name: &str, tag: &str) -> Self {
        let image = Self { name: name.into(), tag: tag.into(), env: BTreeMap::new() };
        image.with_flag("BACKEND", "memory").with_lease_ttl(DEFAULT_LEASE_TTL)
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

    /// The session TTL (`--lease-ttl`); [`client_config`] matches clients to it.
    pub fn with_lease_ttl(self, ttl: Duration) -> Self {
        self.with_flag("LEASE_TTL", &format!("{}ms", ttl.as_millis()))
    }

    /// The instance id (`--instance-id`, shown in `/status`).
    pub fn with_instance_id(self, id: &str) -> Self {
        self.with_flag("INSTANCE_ID", id)
    }

    /// The etcd backend on `endpoints` (comma-separated URLs, as the container sees them).
    pub fn with_etcd(self, endpoints: &str) -> Self {
        self.with_flag("BACKEND", "etcd").with_flag("ETCD_ENDPOINTS", endpoints)
    }

    /// The session TTL it is configured with.
    pub fn lease_ttl(&self) -> Duration {
        self.env
            .get("KAFKA_ASSIGNER_LEASE_TTL")
            .and_then(|ttl| humantime::parse_duration(ttl.trim()).ok())
            .unwrap_or(Duration::from_secs(10))
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
        // Readiness is the probe in `exec_before_ready`; this line comes before it.
        vec![WaitFor::message_on_stdout("serving")]
    }

    /// The image's own healthcheck, run at once and retried until ready: Docker's first
    /// healthcheck only comes an interval after the start.
    fn exec_before_ready(&self, _: ContainerState) -> testcontainers::core::error::Result<Vec<ExecCommand>> {
        let wait = format!("{}s", STARTUP_TIMEOUT.as_secs());
        let probe = ExecCommand::new(["kafka-assigner", "probe", "--wait", wait.as_str()])
            .with_cmd_ready_condition(CmdWaitFor::message_on_stdout("ready: "));
        Ok(vec![probe])
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

/// One etcd member, from `kafka-assigner-etcd:local` (Debian's etcd; see the module docs).
#[derive(Clone, Debug)]
pub struct EtcdImage {
    name: String,
    tag: String,
    member: String,
    args: Vec<String>,
}

impl Default for EtcdImage {
    /// `kafka-assigner-etcd:local`, member `etcd`.
    fn default() -> Self {
        Self { name: ETCD_IMAGE.0.into(), tag: ETCD_IMAGE.1.into(), member: "etcd".into(), args: Vec::new() }
    }
}

impl EtcdImage {
    /// The member's name, which is also the host name it advertises: start it with the
    /// same container name on a network (`ImageExt::with_container_name`).
    pub fn with_member(mut self, name: &str) -> Self {
        self.member = name.into();
        self
    }

    /// More `etcd` flags (peer URLs and `--initial-cluster` for a cluster, ...).
    pub fn with_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// `http://{member}:2379`: how containers on its network reach it.
    pub fn client_url(&self) -> String {
        format!("http://{}:2379", self.member)
    }
}

impl Image for EtcdImage {
    fn name(&self) -> &str {
        &self.name
    }

    fn tag(&self) -> &str {
        &self.tag
    }

    fn ready_conditions(&self) -> Vec<WaitFor> {
        vec![WaitFor::message_on_stderr("ready to serve client requests")]
    }

    fn cmd(&self) -> impl IntoIterator<Item = impl Into<Cow<'_, str>>> {
        let mut cmd = vec![
            format!("--name={}", self.member),
            "--listen-client-urls=http://0.0.0.0:2379".to_string(),
            format!("--advertise-client-urls={}", self.client_url()),
        ];
        cmd.extend(self.args.iter().cloned());
        cmd
    }

    fn expose_ports(&self) -> &[ContainerPort] {
        &[ETCD_PORT]
    }
}

/// etcd alone on a fresh network, for assigners to be started next to it.
pub struct EtcdNetwork {
    /// The etcd container.
    pub etcd: ContainerAsync<EtcdImage>,
    /// The network's name.
    pub network: String,
    /// etcd's URL as containers on the network see it.
    pub etcd_url: String,
}

impl EtcdNetwork {
    /// Starts etcd on a new network, under a unique name (so several can run at once);
    /// its output goes to stderr, prefixed with that name.
    pub async fn start() -> Result<Self, ContainersError> {
        let network = network_name();
        let member = unique_name("etcd");
        let image = EtcdImage::default().with_member(&member);
        let etcd_url = image.client_url();
        let etcd = image
            .with_network(network.clone())
            .with_container_name(member.clone())
            .with_log_consumer(log_to_stderr(&member))
            .with_startup_timeout(STARTUP_TIMEOUT)
            .start()
            .await?;
        Ok(Self { etcd, network, etcd_url })
    }

    /// `image` on the etcd backend, on this network, reachable by `name` from it; its
    /// output goes to stderr, each line prefixed with `name` (see [`log_to_stderr`]).
    pub async fn start_assigner(
        &self,
        image: AssignerImage,
        name: &str,
    ) -> Result<ContainerAsync<AssignerImage>, ContainersError> {
        let container = image
            .with_etcd(&self.etcd_url)
            .with_network(self.network.clone())
            .with_container_name(name)
            .with_log_consumer(log_to_stderr(name))
            .with_startup_timeout(STARTUP_TIMEOUT)
            .start()
            .await?;
        Ok(container)
    }
}

/// etcd and one assigner on it, sharing a network; all removed when dropped.
pub struct EtcdAssigner {
    /// The assigner (dropped first).
    pub assigner: ContainerAsync<AssignerImage>,
    /// etcd and the network.
    pub etcd: EtcdNetwork,
}

/// Starts etcd, then `image` on the etcd backend, on a fresh network.
pub async fn start_with_etcd(image: AssignerImage) -> Result<EtcdAssigner, ContainersError> {
    let etcd = EtcdNetwork::start().await?;
    let assigner = etcd.start_assigner(image, &unique_name("assigner")).await?;
    Ok(EtcdAssigner { assigner, etcd })
}

/// `http://host:port` of an assigner container's gRPC API, from the test's side.
pub async fn grpc_url(container: &ContainerAsync<AssignerImage>) -> Result<String, ContainersError> {
    let host = container.get_host().await?;
    let port = container.get_host_port_ipv4(GRPC_PORT).await?;
    Ok(format!("http://{host}:{port}"))
}

/// `http://host:port` of an assigner container's admin server (`/ready`, `/status`,
/// `/metrics`), from the test's side.
pub async fn admin_url(container: &ContainerAsync<AssignerImage>) -> Result<String, ContainersError> {
    let host = container.get_host().await?;
    let port = container.get_host_port_ipv4(ADMIN_PORT).await?;
    Ok(format!("http://{host}:{port}"))
}

/// A client configuration for `consumer` on `topic`, with these containers as its
/// endpoints (in order) and its session timeout matched to the first one's TTL.
pub async fn client_config(
    containers: &[&ContainerAsync<AssignerImage>],
    consumer: &str,
    topic: &str,
) -> Result<ClientConfig, ContainersError> {
    let mut urls = Vec::with_capacity(containers.len());
    for container in containers {
        urls.push(grpc_url(container).await?);
    }
    let ttl = containers.first().map_or(DEFAULT_LEASE_TTL, |c| c.image().lease_ttl());
    Ok(ClientConfig::new(urls, consumer, topic).with_server_lease_ttl(ttl))
}

/// The assigner's `/status` (consumers, owners, handoffs, leader), read from its admin port.
pub async fn status(container: &ContainerAsync<AssignerImage>) -> Result<Status, ContainersError> {
    Ok(crate::status::fetch(&admin_url(container).await?, Duration::from_secs(5)).await?.1)
}

/// A log consumer (`ImageExt::with_log_consumer`) that copies a container's output to
/// stderr, each line prefixed with `name`: the test harness shows it when a test fails.
pub fn log_to_stderr(name: &str) -> impl Fn(&LogFrame) + Send + Sync + 'static {
    let name = name.to_string();
    move |frame: &LogFrame| {
        let bytes = match frame {
            LogFrame::StdOut(b) | LogFrame::StdErr(b) => b,
        };
        for line in String::from_utf8_lossy(bytes).lines() {
            eprintln!("[{name}] {line}");
        }
    }
}

/// `docker kill`: SIGKILL, no graceful stop (the container stays until its handle drops).
pub async fn kill<I: Image>(container: &ContainerAsync<I>) -> Result<(), ContainersError> {
    let docker = docker_client_instance().await.map_err(|e| ContainersError::Docker(e.to_string()))?;
    docker.kill_container(container.id(), None).await.map_err(|e| ContainersError::Docker(e.to_string()))
}

/// Whether a Docker engine answers (`DOCKER_HOST`, or the default socket).
pub async fn engine_available() -> Result<(), ContainersError> {
    let docker = docker_client_instance().await.map_err(|e| ContainersError::NoEngine(e.to_string()))?;
    docker.ping().await.map(drop).map_err(|e| ContainersError::NoEngine(e.to_string()))
}

/// Whether both images are in the engine (they are never pulled).
pub async fn images_available() -> Result<(), ContainersError> {
    let docker = docker_client_instance().await.map_err(|e| ContainersError::NoEngine(e.to_string()))?;
    for (name, tag) in [ASSIGNER_IMAGE, ETCD_IMAGE] {
        let image = format!("{name}:{tag}");
        if docker.inspect_image(&image).await.is_err() {
            return Err(ContainersError::MissingImage(image));
        }
    }
    Ok(())
}
