//! A single-member etcd that can be snapshotted and restored for real, with Debian's
//! `etcdctl` (3.4): `etcdctl snapshot save` while it serves, then, once it is stopped,
//! `etcdctl snapshot restore` into a new data dir and a new etcd on that dir, on the same
//! ports (so the assigners and consumers find it where they left it). The restored store's
//! revision is the snapshot's: everything written after the snapshot is gone. This is what
//! docs/operating.md ("Restoring etcd from a snapshot") tells an operator to run.
//!
//! Every process runs under the watchdog of `etcd_process.rs` (it dies with the test
//! binary); dropping the server stops it; the data dirs live in a temp dir removed on drop.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tempfile::TempDir;

use super::etcd::{
    MemberSpec, Process, START_DEADLINE, exited, find_etcd, free_ports, log_tail, spawn, wait_healthy,
};

/// The member name and cluster token the restore must repeat (etcd derives its member and
/// cluster ids from them).
const NAME: &str = "restore";
const TOKEN: &str = "kafka-assigner-test";

/// A local etcd that can be stopped, restored from a snapshot and started again.
pub struct RestorableEtcd {
    binary: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// The data dir in use (a new one after each restore).
    data_dir: PathBuf,
    /// Restores done so far (names the next data dir).
    restores: u32,
    log: PathBuf,
    process: Option<Process>,
    /// Declared last: removed after the process is dead (`Drop` stops it first).
    root: TempDir,
}

impl RestorableEtcd {
    /// Starts a fresh etcd on free loopback ports and waits until it serves.
    ///
    /// # Panics
    /// When no etcd is installed or it does not come up.
    pub async fn start() -> RestorableEtcd {
        let root = tempfile::Builder::new()
            .prefix("kafka-assigner-restore-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for etcd: {e}"));
        let (client_port, peer_port) = free_ports();
        let mut etcd = RestorableEtcd {
            binary: find_etcd(),
            client_port,
            peer_port,
            data_dir: root.path().join("data-0"),
            restores: 0,
            log: root.path().join("etcd.log"),
            process: None,
            root,
        };
        etcd.launch().await;
        etcd
    }

    /// The client URL, `http://127.0.0.1:port` (the same across restores).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A path in the server's temp dir (for a snapshot file).
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// Runs `etcdctl --endpoints=<this server> args...` (API v3) and returns its stdout.
    ///
    /// # Panics
    /// When etcdctl cannot run or fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let endpoints = format!("--endpoints={}", self.endpoint());
        let mut all = vec![endpoints.as_str()];
        all.extend_from_slice(args);
        etcdctl(&all)
    }

    /// `etcdctl snapshot save path`: a real snapshot of the running server.
    pub fn snapshot_save(&self, path: &Path) {
        let target = path.display().to_string();
        self.etcdctl(&["snapshot", "save", &target]);
    }

    /// Stops the server (its data dir stays). Idempotent.
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.stop();
        }
    }

    /// `etcdctl snapshot restore snapshot` into a new data dir (same name, peer URL and
    /// cluster token), then starts etcd on it and waits until it serves.
    ///
    /// # Panics
    /// When the server still runs, the restore fails or the restored etcd does not come up.
    pub async fn restore(&mut self, snapshot: &Path) {
        assert!(self.process.is_none(), "stop etcd before restoring a snapshot");
        self.restores += 1;
        let data_dir = self.root.path().join(format!("data-{}", self.restores));
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        etcdctl(&[
            "snapshot",
            "restore",
            &snapshot.display().to_string(),
            &format!("--data-dir={}", data_dir.display()),
            &format!("--name={NAME}"),
            &format!("--initial-cluster={NAME}={peer}"),
            &format!("--initial-advertise-peer-urls={peer}"),
            &format!("--initial-cluster-token={TOKEN}"),
        ]);
        self.data_dir = data_dir;
        self.launch().await;
    }

    async fn launch(&mut self) {
        let initial_cluster = format!("{NAME}=http://127.0.0.1:{}", self.peer_port);
        let spec = MemberSpec {
            binary: &self.binary,
            name: NAME,
            data_dir: &self.data_dir,
            log: &self.log,
            client_port: self.client_port,
            peer_port: self.peer_port,
            initial_cluster: &initial_cluster,
            client_scheme: "http",
            extra_args: &[],
        };
        let (mut process, log_start) = spawn(&spec).unwrap_or_else(|e| panic!("etcd does not start: {e}"));
        let endpoints = vec![self.endpoint()];
        if let Err(error) = wait_healthy(&endpoints, START_DEADLINE, || exited(&mut process)).await {
            process.stop();
            panic!(
                "etcd on {} does not serve: {error}; log:\n{}",
                self.data_dir.display(),
                log_tail(&self.log, log_start)
            );
        }
        self.process = Some(process);
    }
}

impl Drop for RestorableEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs Debian's `etcdctl` (`ETCDCTL_BIN`, else `PATH`) with API v3; returns its stdout.
///
/// # Panics
/// When it cannot run or exits with an error.
pub fn etcdctl(args: &[&str]) -> String {
    let binary = std::env::var_os("ETCDCTL_BIN").map_or_else(|| PathBuf::from("etcdctl"), PathBuf::from);
    let output = Command::new(&binary)
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (apt-get install etcd-client): {e}", binary.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "etcdctl {args:?} failed ({}): {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A free loopback port below the ephemeral range (see `etcd::free_ports`): an instance
/// restarted on it finds it still free, so its consumers reconnect where they left it.
pub fn loopback_port() -> u16 {
    free_ports().0
}
