//! One etcd process under a watchdog: spawned, signalled (freeze, thaw, kill), stopped,
//! and probed until it serves. Used by [`EtcdServer`](super::EtcdServer) and
//! [`EtcdCluster`](super::super::cluster::EtcdCluster).

use std::{
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use etcd_client::{Client, ConnectOptions, GetOptions};

/// How long stopping waits for the process to exit after closing its watchdog pipe.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Runs etcd (`$0`, arguments `$@`) in the background; a watcher kills it when our end of
/// the stdin pipe closes (our `stop`/`Drop`, or the test binary dying in any way). The
/// shell exits with etcd's status, so an etcd that dies by itself is noticed.
/// etcd's own pid is written to `$KAT_ETCD_PIDFILE` (to signal etcd, not the shell).
const WATCHDOG: &str = r#"exec 3<&0
"$0" "$@" </dev/null 3<&- &
pid=$!
echo "$pid" > "$KAT_ETCD_PIDFILE"
( cat <&3 >/dev/null 2>&1; kill -9 "$pid" 2>/dev/null ) </dev/null &
watcher=$!
exec 3<&-
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
exit "$status""#;

/// A running etcd (under its watchdog).
pub struct Process {
    child: Child,
    /// Closing this kills etcd (see [`WATCHDOG`]).
    stdin: Option<ChildStdin>,
    /// Where the watchdog wrote etcd's pid.
    pid_file: PathBuf,
}

impl Process {
    /// etcd's pid (the watchdog writes it before etcd can serve).
    pub fn pid(&self) -> u32 {
        let text = fs::read_to_string(&self.pid_file)
            .unwrap_or_else(|e| panic!("etcd pid file {}: {e}", self.pid_file.display()));
        text.trim().parse().unwrap_or_else(|e| panic!("etcd pid file holds {text:?}: {e}"))
    }

    /// Sends `SIGSTOP` / `SIGCONT` / `SIGKILL` (by name) to etcd itself.
    pub fn signal(&mut self, signal: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.clone()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill -{signal} {pid}: {e}"));
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
        if signal == "STOP" {
            // `kill` returns once the signal is queued; a thread of etcd's that is running on
            // the other core may still answer a request before it stops. Frozen means every
            // thread of it shows the stopped state.
            let deadline = Instant::now() + STOP_DEADLINE;
            while !all_threads_stopped(&pid) {
                assert!(
                    Instant::now() < deadline,
                    "etcd {pid} did not stop within {STOP_DEADLINE:?} of SIGSTOP"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Kills etcd at once (SIGKILL, like a crash), then reaps the watchdog.
    pub fn kill(mut self) {
        self.signal("KILL");
        self.stop();
    }

    /// Closes the watchdog pipe (which kills etcd) and waits for the shell to exit.
    pub fn stop(mut self) {
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

/// One etcd member's command line.
pub struct MemberSpec<'a> {
    /// The etcd binary.
    pub binary: &'a Path,
    /// The member name (`--name`).
    pub name: &'a str,
    /// Its data dir (kept across restarts).
    pub data_dir: &'a Path,
    /// Its log file; the pid file sits next to it.
    pub log: &'a Path,
    /// Loopback client port.
    pub client_port: u16,
    /// Loopback peer port.
    pub peer_port: u16,
    /// `name=http://127.0.0.1:peer,...` of every member.
    pub initial_cluster: &'a str,
    /// `http` or `https` (TLS etcd: the caller adds the certificate flags).
    pub client_scheme: &'a str,
    /// More flags, after the common ones.
    pub extra_args: &'a [String],
}

/// Spawns one etcd member under the watchdog (without waiting for it to serve). Returns
/// the process and the log length before it started (for [`log_tail`]).
pub fn spawn(spec: &MemberSpec<'_>) -> Result<(Process, u64), String> {
    let log_file =
        File::options().create(true).append(true).open(spec.log).map_err(|e| format!("log file: {e}"))?;
    let log_start = log_file.metadata().map(|m| m.len()).unwrap_or(0);
    let log_err = log_file.try_clone().map_err(|e| format!("log file: {e}"))?;
    let client_url = format!("{}://127.0.0.1:{}", spec.client_scheme, spec.client_port);
    let peer_url = format!("http://127.0.0.1:{}", spec.peer_port);
    let pid_file = spec.log.with_extension("pid");
    let _ = fs::remove_file(&pid_file);
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg(spec.binary)
        .arg(format!("--name={}", spec.name))
        .arg(format!("--data-dir={}", spec.data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster={}", spec.initial_cluster))
        .arg("--initial-cluster-state=new")
        .arg("--initial-cluster-token=kafka-assigner-test")
        .args(["--logger=zap", "--log-level=error", "--log-outputs=stderr"])
        .args(["--heartbeat-interval=10", "--election-timeout=100"])
        .args(spec.extra_args)
        .env("KAT_ETCD_PIDFILE", &pid_file)
        .stdin(Stdio::piped())
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("cannot run sh to start {}: {e}", spec.binary.display()))?;
    let stdin = child.stdin.take();
    Ok((Process { child, stdin, pid_file }, log_start))
}

/// Whether the process has exited (and how), for [`wait_healthy`].
pub fn exited(process: &mut Process) -> Option<String> {
    match process.child.try_wait() {
        Ok(Some(status)) => Some(format!("etcd exited ({status})")),
        _ => None,
    }
}

/// Waits until a linearizable read succeeds (or `exited` reports the process died).
pub async fn wait_healthy(
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
pub fn log_tail(log: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(log) {
        let _ = file.seek(SeekFrom::Start(from));
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
fn all_threads_stopped(pid: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            // The state follows the command name, which is in parentheses.
            .is_ok_and(|stat| {
                stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
            })
    })
}
