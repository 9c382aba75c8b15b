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

use std::{
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use etcd_client::{Client, ConnectOptions, GetOptions};
use kafka_assigner::store::{EtcdStore, EtcdStoreConfig};
use tempfile::TempDir;

/// How long one start attempt may take before it counts as failed.
const START_DEADLINE: Duration = Duration::from_secs(15);
/// Start attempts (new ports each time) before giving up.
const START_ATTEMPTS: u32 = 5;
/// How long stopping waits for the process to exit after closing its watchdog pipe.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Runs etcd (`$0`, arguments `$@`) in the background; a watcher kills it when our end of
/// the stdin pipe closes (our `stop`/`Drop`, or the test binary dying in any way). The
/// shell exits with etcd's status, so an etcd that dies by itself is noticed.
pub(super) const WATCHDOG: &str = r#"exec 3<&0
"$0" "$@" </dev/null 3<&- &
pid=$!
( cat <&3 >/dev/null 2>&1; kill -9 "$pid" 2>/dev/null ) </dev/null &
watcher=$!
exec 3<&-
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
exit "$status""#;

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

pub(super) struct Process {
    pub(super) child: Child,
    /// Closing this kills etcd (see [`WATCHDOG`]).
    pub(super) stdin: Option<ChildStdin>,
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
            .with_request_timeout(Duration::from_secs(5));
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

impl Process {
    /// Closes the watchdog pipe (which kills etcd) and waits for the shell to exit.
    pub(super) fn stop(mut self) {
        drop(self.stdin.take());
        let give_up = Instant::now() + STOP_DEADLINE;
        while Instant::now() < give_up {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        // The watchdog did not finish: kill the shell at least.
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Two distinct free loopback ports (released again: etcd binds them right after).
pub(super) fn free_ports() -> (u16, u16) {
    let bind =
        || TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
    let (a, b) = (bind(), bind());
    let port =
        |l: &TcpListener| l.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("local_addr: {e}"));
    (port(&a), port(&b))
}

/// Starts etcd under the watchdog and waits until it serves; kills it on failure.
async fn launch(
    binary: &Path,
    data_dir: &Path,
    log: &Path,
    client_port: u16,
    peer_port: u16,
) -> Result<Process, String> {
    let log_file =
        File::options().create(true).append(true).open(log).map_err(|e| format!("log file: {e}"))?;
    let log_start = log_file.metadata().map(|m| m.len()).unwrap_or(0);
    let log_err = log_file.try_clone().map_err(|e| format!("log file: {e}"))?;
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg(binary)
        .arg("--name=test")
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=test={peer_url}"))
        .arg("--initial-cluster-state=new")
        .arg("--initial-cluster-token=kafka-assigner-test")
        .args(["--logger=zap", "--log-level=error", "--log-outputs=stderr"])
        .args(["--heartbeat-interval=10", "--election-timeout=100"])
        .stdin(Stdio::piped())
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("cannot run sh to start {}: {e}", binary.display()))?;
    let stdin = child.stdin.take();
    let mut process = Process { child, stdin };
    let endpoints = vec![client_url];
    let ready = wait_healthy(&endpoints, START_DEADLINE, || match process.child.try_wait() {
        Ok(Some(status)) => Some(format!("etcd exited ({status})")),
        _ => None,
    })
    .await;
    match ready {
        Ok(()) => Ok(process),
        Err(error) => {
            process.stop();
            Err(format!("{error}; etcd log:\n{}", log_tail(log, log_start)))
        }
    }
}

/// Waits until a linearizable read succeeds (or `exited` reports the process died).
async fn wait_healthy(
    endpoints: &[String],
    deadline: Duration,
    mut exited: impl FnMut() -> Option<String>,
) -> Result<(), String> {
    let give_up = tokio::time::Instant::now() + deadline;
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));
    let mut client =
        Client::connect(endpoints, Some(options)).await.map_err(|e| format!("etcd client: {e}"))?;
    loop {
        if let Some(reason) = exited() {
            return Err(reason);
        }
        let probe = client.get("kat-health", Some(GetOptions::new().with_count_only()));
        let last_error = match tokio::time::timeout(Duration::from_millis(500), probe).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => error.to_string(),
            Err(_) => "probe timed out".to_string(),
        };
        if tokio::time::Instant::now() >= give_up {
            return Err(format!("not serving within {deadline:?} (last error: {last_error})"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The end of the log written since `from` (for failure messages).
pub(super) fn log_tail(log: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(log) {
        let _ = file.seek(SeekFrom::Start(from));
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
