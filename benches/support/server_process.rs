//! The server under test as a child process (`kafka-assigner serve`), black-box: gRPC for
//! the consumers, the admin port for readiness and metrics, and `/proc/<pid>/` for its
//! memory and CPU. Also a tiny HTTP/1.0 GET for admin and etcd `/metrics` (no client
//! library needed). Shared by the scale and cluster benches.

use std::{
    fs::File,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::error::BenchError;

/// How long a server may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// Which store the server runs on.
#[derive(Clone, Debug)]
pub enum Store {
    /// `--backend memory`.
    Memory,
    /// `--backend etcd` on these endpoints, under this key prefix.
    Etcd {
        /// Client URLs.
        endpoints: Vec<String>,
        /// `--etcd-prefix`.
        prefix: String,
    },
}

/// What to start.
pub struct ServerSpec<'a> {
    /// The `kafka-assigner` binary.
    pub binary: &'a Path,
    /// Backend and store.
    pub store: &'a Store,
    /// `--topic-partitions`, e.g. `bench=256` or `bench=110,idle=1`.
    pub topics: &'a str,
    /// `--max-warming`.
    pub max_warming: u32,
    /// More flags (`SCALE_SERVER_ARGS`), e.g. for settings a later server adds.
    pub extra_args: &'a [String],
    /// Where the server's log goes.
    pub log: PathBuf,
}

/// A running server; killed (and reaped) on drop.
pub struct ServerProcess {
    child: Child,
    grpc: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts the server on free loopback ports and waits until `/ready` answers 200.
    pub async fn start(spec: &ServerSpec<'_>) -> Result<Self, BenchError> {
        let (grpc, admin) = (free_port()?, free_port()?);
        let log = File::create(&spec.log)?;
        let mut command = Command::new(spec.binary);
        command
            .arg("serve")
            .arg(format!("--grpc-addr={grpc}"))
            .arg(format!("--admin-addr={admin}"))
            .arg(format!("--topic-partitions={}", spec.topics))
            .arg(format!("--max-warming={}", spec.max_warming.max(1)))
            // Every consumer of the bench connects from 127.0.0.1: lift the per-IP limit.
            .arg("--max-streams-per-ip=1000000")
            .args(spec.extra_args)
            .env("RUST_LOG", std::env::var("SCALE_SERVER_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        match spec.store {
            Store::Memory => command.arg("--backend=memory"),
            Store::Etcd { endpoints, prefix } => command
                .arg("--backend=etcd")
                .arg(format!("--etcd-endpoints={}", endpoints.join(",")))
                .arg(format!("--etcd-prefix={prefix}")),
        };
        let child = command
            .spawn()
            .map_err(|e| BenchError::Server(format!("cannot run {}: {e}", spec.binary.display())))?;
        let mut server = Self { child, grpc, admin, log: spec.log.clone() };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<(), BenchError> {
        let give_up = Instant::now() + READY_DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BenchError::Server(format!(
                    "exited at start ({status}); log: {}",
                    self.log_tail()
                )));
            }
            if let Ok((200, _)) = http_get(&self.admin.to_string(), "/ready").await {
                return Ok(());
            }
            if Instant::now() > give_up {
                return Err(BenchError::Server(format!(
                    "not ready in {READY_DEADLINE:?}; log: {}",
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `http://host:port` of the gRPC listener.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The process's resident set size in bytes (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_bytes(&self) -> Result<u64, BenchError> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| BenchError::Server("no VmRSS in /proc status".into()))
    }

    /// The process id (for `/proc/<pid>/stat`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port` of the admin listener (`/metrics`, `/ready`).
    pub fn admin_addr(&self) -> String {
        self.admin.to_string()
    }

    /// CPU seconds the process has used so far, user and system (`utime` + `stime` of
    /// `/proc/<pid>/stat`, in clock ticks of 1/100 s, Linux's `USER_HZ` on every
    /// architecture it ships).
    pub fn cpu_seconds(&self) -> Result<f64, BenchError> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // The command name (field 2) may hold spaces: count fields after its `)`.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        // After `)`: state is field 3, so utime (14) and stime (15) are at 11 and 12.
        let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        match (tick(11), tick(12)) {
            (Some(user), Some(system)) => Ok((user + system) as f64 / 100.0),
            _ => Err(BenchError::Server(format!("no utime/stime in /proc/{}/stat", self.child.id()))),
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Log lines at WARN and ERROR level so far.
    pub fn log_warnings(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let count = |level: &str| text.lines().filter(|l| l.contains(level)).count() as u64;
        (count(" WARN "), count(" ERROR "))
    }

    /// Copies the server's log so far to `to`.
    pub fn copy_log(&self, to: &Path) -> std::io::Result<()> {
        std::fs::copy(&self.log, to).map(drop)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // SIGKILL: the scenario is over, a clean drain would only cost time.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (released again: the server binds it right after).
fn free_port() -> Result<SocketAddr, BenchError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `GET path` over HTTP/1.0 (the server closes the connection after the body); returns the
/// status code and the body.
pub async fn http_get(host_port: &str, path: &str) -> Result<(u16, String), BenchError> {
    let url = format!("http://{host_port}{path}");
    let fail = |reason: String| BenchError::Http { url: url.clone(), reason };
    let exchange = async {
        let mut stream = TcpStream::connect(host_port).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host_port}\r\n\r\n").as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| fail("no answer in 10 s".into()))?
        .map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| fail("no header end".into()))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| fail(format!("bad status line: {}", head.lines().next().unwrap_or(""))))?;
    Ok((code, body.to_string()))
}

/// Sum of every sample of metric `name` (any labels) whose labels contain `label`.
pub fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) || !rest.contains(label) {
                return None;
            }
            rest.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .sum()
}
