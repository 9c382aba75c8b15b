//! A real etcd server for one test.
//!
//! * `ETCD_ENDPOINTS=http://host:2379,...` set: every [`EtcdServer`] uses that cluster and
//!   starts nothing. Tests then share it, which is why they all work under
//!   [`EtcdServer::unique_prefix`]; [`EtcdServer::stop`] / [`EtcdServer::restart`] panic.
//! * Otherwise each [`EtcdServer::start`] runs its own `etcd` (from `ETCD_BIN`, `PATH`, or
//!   `/usr/bin/etcd`) on free loopback ports with a temporary data dir and fast raft timings
//!   (`--heartbeat-interval=10 --election-timeout=100`), and waits until it serves a
//!   linearizable read. Dropping the server kills the process and waits for it. The process
//!   also dies with the test binary, even on `SIGKILL`: it runs under a small `sh` watchdog
//!   that kills it when our end of its stdin pipe closes.
//! * Neither available: panic with how to install etcd. Tests never skip silently.
//! * Faults: [`EtcdServer::stop`] (a crash: SIGKILL, data kept), [`EtcdServer::restart`] (on
//!   the same ports and data dir), [`EtcdServer::freeze`] / [`EtcdServer::thaw`] (SIGSTOP /
//!   SIGCONT: the process hangs with its connections open, as a stalled disk or VM does).
//!   A 3-member cluster lives in `cluster.rs`, on the same launcher.

#[path = "etcd_process.rs"]
mod process;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

pub(super) use self::process::{MemberSpec, Process, exited, log_tail, spawn, wait_healthy};
use kafka_assigner::store::{EtcdStore, EtcdStoreConfig};
use tempfile::TempDir;

/// How long one start attempt may take before it counts as failed.
pub(super) const START_DEADLINE: Duration = Duration::from_secs(15);
/// Start attempts (new ports each time) before giving up.
const START_ATTEMPTS: u32 = 5;
static NEXT_PREFIX: AtomicU64 = AtomicU64::new(0);

/// One etcd for one test (see the module docs).
pub struct EtcdServer {
    mode: Mode,
}

enum Mode {
    External {
        endpoints: Vec<String>,
    },
    Local(Local),
    /// `KAT_ETCD_TLS=1`: TLS, client-certificate auth and users (see `etcd_tls`).
    Tls(Box<super::etcd_tls::TlsEtcd>),
}

struct Local {
    binary: PathBuf,
    /// Data dir and log; removed on drop, after the process is dead (fields drop in order,
    /// and `EtcdServer::drop` stops the process first).
    _root: TempDir,
    data_dir: PathBuf,
    log: PathBuf,
    client_port: u16,
    peer_port: u16,
    process: Option<Process>,
}

impl EtcdServer {
    /// Starts a fresh etcd (or attaches to `ETCD_ENDPOINTS`) and waits until it serves.
    ///
    /// # Panics
    /// When no etcd is available, or it does not come up.
    pub async fn start() -> EtcdServer {
        if super::etcd_tls::requested() {
            return EtcdServer { mode: Mode::Tls(Box::new(super::etcd_tls::TlsEtcd::start().await)) };
        }
        if let Some(endpoints) = external_endpoints() {
            if let Err(error) = wait_healthy(&endpoints, START_DEADLINE, || None).await {
                panic!("ETCD_ENDPOINTS={} is not serving: {error}", endpoints.join(","));
            }
            return EtcdServer { mode: Mode::External { endpoints } };
        }
        let binary = find_etcd();
        let root = tempfile::Builder::new()
            .prefix("kafka-assigner-etcd-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for etcd: {e}"));
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            // A port can be taken between our probe and etcd's bind: then try new ones.
            let (client_port, peer_port) = free_ports();
            let data_dir = root.path().join(format!("data-{attempt}"));
            let log = root.path().join(format!("etcd-{attempt}.log"));
            match launch(&binary, &data_dir, &log, client_port, peer_port).await {
                Ok(process) => {
                    let local = Local {
                        binary,
                        _root: root,
                        data_dir,
                        log,
                        client_port,
                        peer_port,
                        process: Some(process),
                    };
                    return EtcdServer { mode: Mode::Local(local) };
                }
                Err(error) => {
                    failures.push(format!("attempt {attempt} (ports {client_port}/{peer_port}): {error}"))
                }
            }
        }
        panic!(
            "etcd ({}) did not start after {START_ATTEMPTS} attempts:\n{}",
            binary.display(),
            failures.join("\n")
        );
    }

    /// The client URLs (`http://127.0.0.1:port`).
    pub fn endpoints(&self) -> Vec<String> {
        match &self.mode {
            Mode::External { endpoints } => endpoints.clone(),
            Mode::Local(local) => vec![local.client_url()],
            Mode::Tls(tls) => tls.endpoints(),
        }
    }

    /// Whether this is a shared cluster from `ETCD_ENDPOINTS` (other tests write to it too).
    pub fn is_shared(&self) -> bool {
        matches!(self.mode, Mode::External { .. })
    }

    /// A key prefix no other test (in this run or any other) uses: `/kat/{name}-{unique}/`.
    pub fn unique_prefix(&self, name: &str) -> String {
        unique_prefix(name)
    }

    /// A store config for this server with test-friendly timeouts (2 s connect, 5 s request).
    pub fn store_config(&self) -> EtcdStoreConfig {
        let mut config = EtcdStoreConfig::new(self.endpoints())
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(5))
            // As the service sets it: a quarter of the session TTL (the tests' is 1 s,
            // `assigner::TTL`; the benchmarks share this file without that module).
            .with_watch_progress_every(Duration::from_millis(250));
        if let Mode::Tls(tls) = &self.mode {
            config.security = tls.security();
        }
        config
    }

    /// An [`EtcdStore`] connected to this server with [`store_config`](Self::store_config).
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(self.store_config())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to etcd at {:?}: {e}", self.endpoints()))
    }

    /// Kills the server (like a crash; data is kept). Idempotent.
    ///
    /// # Panics
    /// On a shared `ETCD_ENDPOINTS` cluster.
    pub fn stop(&mut self) {
        match &mut self.mode {
            Mode::External { .. } => panic!("cannot stop a shared ETCD_ENDPOINTS cluster"),
            Mode::Local(local) => {
                if let Some(process) = local.process.take() {
                    process.stop();
                }
            }
            Mode::Tls(tls) => tls.stop(),
        }
    }

    /// Freezes the server (SIGSTOP): it keeps its ports and connections but answers nothing,
    /// until [`thaw`](Self::thaw). Idempotent.
    ///
    /// # Panics
    /// On a shared cluster, or a stopped server.
    pub fn freeze(&mut self) {
        self.running("freeze").signal("STOP");
    }

    /// Lets a frozen server run again (SIGCONT). Idempotent.
    ///
    /// # Panics
    /// On a shared cluster, or a stopped server.
    pub fn thaw(&mut self) {
        self.running("thaw").signal("CONT");
    }

    fn running(&mut self, what: &str) -> &mut Process {
        match &mut self.mode {
            Mode::External { .. } => panic!("cannot {what} a shared ETCD_ENDPOINTS cluster"),
            Mode::Local(local) => {
                local.process.as_mut().unwrap_or_else(|| panic!("cannot {what} a stopped etcd"))
            }
            Mode::Tls(tls) => tls.process_mut().unwrap_or_else(|| panic!("cannot {what} a stopped etcd")),
        }
    }

    /// Starts a stopped server again on the same ports and data, and waits until it serves.
    /// Does nothing if it is running.
    ///
    /// # Panics
    /// On a shared `ETCD_ENDPOINTS` cluster, or if etcd does not come back.
    pub async fn restart(&mut self) {
        let local = match &mut self.mode {
            Mode::Local(local) => local,
            Mode::Tls(tls) => return tls.restart().await,
            Mode::External { .. } => panic!("cannot restart a shared ETCD_ENDPOINTS cluster"),
        };
        if local.process.is_some() {
            return;
        }
        match launch(&local.binary, &local.data_dir, &local.log, local.client_port, local.peer_port).await {
            Ok(process) => local.process = Some(process),
            Err(error) => panic!("etcd did not restart on port {}: {error}", local.client_port),
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Mode::Local(local) = &mut self.mode
            && let Some(process) = local.process.take()
        {
            process.stop();
        }
    }
}

impl Local {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// A prefix unique across tests, processes and runs.
pub fn unique_prefix(name: &str) -> String {
    let n = NEXT_PREFIX.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("/kat/{name}-{}-{nanos:x}-{n}/", std::process::id())
}

fn external_endpoints() -> Option<Vec<String>> {
    let raw = std::env::var("ETCD_ENDPOINTS").ok()?;
    let endpoints: Vec<String> =
        raw.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_string).collect();
    (!endpoints.is_empty()).then_some(endpoints)
}

pub(super) fn find_etcd() -> PathBuf {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "ETCD_BIN={} does not exist", bin.display());
        return bin;
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join("etcd")).collect::<Vec<_>>())
        .unwrap_or_default();
    let fallbacks = [PathBuf::from("/usr/bin/etcd"), PathBuf::from("/usr/local/bin/etcd")];
    on_path.into_iter().chain(fallbacks).find(|candidate| candidate.is_file()).unwrap_or_else(|| {
        panic!(
            "these tests need a real etcd, and none was found (not on PATH, not /usr/bin/etcd).\n\
             Install it (Debian/Ubuntu: `apt-get install etcd-server etcd-client`),\n\
             or point ETCD_BIN at an etcd binary,\n\
             or set ETCD_ENDPOINTS=http://host:2379[,...] to use a running cluster."
        )
    })
}

/// Two free loopback ports for an etcd, taken **below the kernel's ephemeral range**
/// (32768–60999 by default). A stopped etcd keeps its ports for its restart; a port from the
/// ephemeral range could meanwhile become the source port of some client connection, or be
/// handed to another `:0` listener, and the restart would fail. Ports here are handed out
/// in turn from a per-process starting point, so this process never hands one out twice.
pub(super) fn free_ports() -> (u16, u16) {
    (free_port(), free_port())
}

fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = u16::try_from(FIRST + offset).unwrap_or_else(|_| panic!("port {offset} out of range"));
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

/// Starts a single-member etcd under the watchdog and waits until it serves; kills it on
/// failure.
async fn launch(
    binary: &Path,
    data_dir: &Path,
    log: &Path,
    client_port: u16,
    peer_port: u16,
) -> Result<Process, String> {
    let initial_cluster = format!("test=http://127.0.0.1:{peer_port}");
    let spec = MemberSpec {
        binary,
        name: "test",
        data_dir,
        log,
        client_port,
        peer_port,
        initial_cluster: &initial_cluster,
        client_scheme: "http",
        extra_args: &[],
    };
    let (mut process, log_start) = spawn(&spec)?;
    let endpoints = vec![format!("http://127.0.0.1:{client_port}")];
    let ready = wait_healthy(&endpoints, START_DEADLINE, || exited(&mut process)).await;
    match ready {
        Ok(()) => Ok(process),
        Err(error) => {
            process.stop();
            Err(format!("{error}; etcd log:\n{}", log_tail(log, log_start)))
        }
    }
}
