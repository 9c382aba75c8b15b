//! A 3-member (or N-member) etcd cluster on loopback, for faults a single etcd cannot show:
//! the raft leader dying, a call landing on a dead member of a multi-endpoint client.
//!
//! Members run under the same watchdog as [`EtcdServer`](super::EtcdServer) (they die with
//! the test binary), with fast raft timings (10 ms heartbeat, 100 ms election timeout), so
//! a new leader is elected within a few hundred milliseconds of the old one dying.
//! It always runs local processes (it kills its own members), so it needs a local etcd
//! binary even when `ETCD_ENDPOINTS` points the other tests at a shared cluster.

use std::{path::PathBuf, time::Duration};

use etcd_client::{Client, ConnectOptions};
use kafka_assigner::store::{EtcdStore, EtcdStoreConfig};
use tempfile::TempDir;

use super::etcd::{
    MemberSpec, Process, START_DEADLINE, exited, find_etcd, free_ports, log_tail, spawn, unique_prefix,
    wait_healthy,
};

/// Whole-cluster start attempts (new ports each time) before giving up.
const START_ATTEMPTS: u32 = 3;

/// An etcd cluster of local processes (see the module docs).
pub struct EtcdCluster {
    binary: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    /// Removed on drop, after the members (fields drop in order; `Drop` kills them first).
    _root: TempDir,
}

struct Member {
    name: String,
    data_dir: PathBuf,
    log: PathBuf,
    client_port: u16,
    peer_port: u16,
    process: Option<Process>,
}

impl Member {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn spec<'a>(&'a self, binary: &'a std::path::Path, initial_cluster: &'a str) -> MemberSpec<'a> {
        MemberSpec {
            binary,
            name: &self.name,
            data_dir: &self.data_dir,
            log: &self.log,
            client_port: self.client_port,
            peer_port: self.peer_port,
            initial_cluster,
            client_scheme: "http",
            extra_args: &[],
        }
    }
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one serves a linearizable read.
    ///
    /// # Panics
    /// When etcd is not installed, or the cluster does not form.
    pub async fn start(size: usize) -> EtcdCluster {
        let binary = find_etcd();
        let root = tempfile::Builder::new()
            .prefix("kafka-assigner-etcd-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for etcd: {e}"));
        let mut cluster =
            EtcdCluster { binary, members: Vec::new(), initial_cluster: String::new(), _root: root };
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            // Ports can be taken between our probe and etcd's bind: new ones each attempt.
            let dir = cluster._root.path().to_path_buf();
            cluster.members = (0..size)
                .map(|i| {
                    let (client_port, peer_port) = free_ports();
                    Member {
                        name: format!("m{i}"),
                        data_dir: dir.join(format!("data-{attempt}-m{i}")),
                        log: dir.join(format!("etcd-{attempt}-m{i}.log")),
                        client_port,
                        peer_port,
                        process: None,
                    }
                })
                .collect();
            cluster.initial_cluster = cluster
                .members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
                .collect::<Vec<_>>()
                .join(",");
            match cluster.launch_all().await {
                Ok(()) => return cluster,
                Err(error) => {
                    failures.push(format!("attempt {attempt}: {error}"));
                    cluster.kill_all();
                }
            }
        }
        panic!(
            "an etcd cluster of {size} did not form after {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    async fn launch_all(&mut self) -> Result<(), String> {
        let mut starts = Vec::new();
        for member in &mut self.members {
            let (process, log_start) = spawn(&member.spec(&self.binary, &self.initial_cluster))?;
            member.process = Some(process);
            starts.push(log_start);
        }
        for (member, log_start) in self.members.iter_mut().zip(starts) {
            let endpoints = vec![member.url()];
            let process = member.process.as_mut().unwrap_or_else(|| unreachable!("just spawned"));
            if let Err(error) = wait_healthy(&endpoints, START_DEADLINE, || exited(process)).await {
                return Err(format!("{}: {error}; log:\n{}", member.name, log_tail(&member.log, log_start)));
            }
        }
        Ok(())
    }

    fn kill_all(&mut self) {
        for member in &mut self.members {
            if let Some(process) = member.process.take() {
                process.stop();
            }
        }
    }

    /// Client URLs of every member, running or not (as an operator would configure them).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::url).collect()
    }

    /// A key prefix unique to this test.
    pub fn unique_prefix(&self, name: &str) -> String {
        unique_prefix(name)
    }

    /// A store config over every member, with test timeouts (2 s connect, 5 s per request,
    /// 1 s per attempt).
    pub fn store_config(&self) -> EtcdStoreConfig {
        EtcdStoreConfig::new(self.endpoints())
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(5))
            .with_attempt_timeout(Duration::from_secs(1))
    }

    /// An [`EtcdStore`] over every member.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(self.store_config())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the etcd cluster {:?}: {e}", self.endpoints()))
    }

    /// Whether member `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process.is_some()
    }

    /// The index of the member that is raft leader, as the running members report it;
    /// waits up to `deadline` for them to agree on one.
    pub async fn leader(&self, deadline: Duration) -> usize {
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            let last = match self.find_leader().await {
                Ok(i) => return i,
                Err(error) => error,
            };
            if tokio::time::Instant::now() >= give_up {
                panic!("no etcd leader within {deadline:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn find_leader(&self) -> Result<usize, String> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for member in &self.members {
            if member.process.is_none() {
                ids.push(None);
                continue;
            }
            let options = ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(300))
                .with_timeout(Duration::from_millis(500));
            let mut client = Client::connect([member.url()], Some(options))
                .await
                .map_err(|e| format!("{}: {e}", member.name))?;
            let status = client.status().await.map_err(|e| format!("{}: status: {e}", member.name))?;
            ids.push(status.header().map(|h| h.member_id()));
            leaders.push(status.leader());
        }
        let leader = leaders.first().copied().filter(|l| *l != 0 && leaders.iter().all(|x| x == l));
        let leader = leader.ok_or_else(|| format!("members disagree on the leader: {leaders:x?}"))?;
        ids.iter()
            .position(|id| *id == Some(leader))
            .ok_or_else(|| format!("leader {leader:x} is not a running member"))
    }

    /// SIGKILLs member `i` (data kept).
    pub fn kill(&mut self, i: usize) {
        if let Some(process) = self.members[i].process.take() {
            process.kill();
        }
    }

    /// Freezes member `i` (SIGSTOP): its connections stay open and it answers nothing.
    pub fn freeze(&mut self, i: usize) {
        self.running(i).signal("STOP");
    }

    /// Thaws member `i` (SIGCONT).
    pub fn thaw(&mut self, i: usize) {
        self.running(i).signal("CONT");
    }

    fn running(&mut self, i: usize) -> &mut Process {
        let member = &mut self.members[i];
        member.process.as_mut().unwrap_or_else(|| panic!("{} is not running", member.name))
    }

    /// SIGKILLs the current raft leader; returns its index.
    pub async fn kill_leader(&mut self) -> usize {
        let leader = self.leader(Duration::from_secs(10)).await;
        self.kill(leader);
        leader
    }

    /// Starts a killed member again on its ports and data, and waits until it serves.
    pub async fn restart(&mut self, i: usize) {
        if self.members[i].process.is_some() {
            return;
        }
        let member = &self.members[i];
        let (mut process, log_start) = spawn(&member.spec(&self.binary, &self.initial_cluster))
            .unwrap_or_else(|e| panic!("cannot restart {}: {e}", member.name));
        let endpoints = vec![member.url()];
        if let Err(error) = wait_healthy(&endpoints, START_DEADLINE, || exited(&mut process)).await {
            panic!("{} did not come back: {error}; log:\n{}", member.name, log_tail(&member.log, log_start));
        }
        self.members[i].process = Some(process);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}
