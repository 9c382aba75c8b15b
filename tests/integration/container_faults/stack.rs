//! The containers of a fault scenario: etcd (one member or three) on a `back` network, and
//! assigner containers on `back` (to reach etcd) and `front` (where the test process reaches
//! them, at fixed addresses: a replacement container takes its predecessor's address, so the
//! consumers' endpoints stay valid). Cutting an assigner from etcd is `docker network
//! disconnect` from `back`; its consumers still reach it on `front`.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::support::docker::{
    self, Container, ETCD_IMAGE, Network, assigner_image, leader, ready, status, suffix,
};

/// The topic the consumers read, and its partition count (from `--topic-partitions`).
pub const TOPIC: &str = "events";
/// Partitions of [`TOPIC`].
pub const PARTITIONS: u32 = 12;
/// Bound for a container to start and become ready, or for a fleet to settle.
pub const START: Duration = Duration::from_secs(30);

/// etcd members and assigner instances of one scenario; all removed on drop.
pub struct Stack {
    /// Unique part of every name.
    pub id: String,
    /// The assigners' session TTL (`--lease-ttl`).
    pub ttl: Duration,
    /// Networks last: dropped after the containers on them.
    pub etcd: Vec<Container>,
    assigners: Vec<Option<Container>>,
    generation: usize,
    pub front: Network,
    pub back: Network,
}

fn etcd_ip(back: &Network, member: usize) -> String {
    back.ip(2 + member as u8)
}

impl Stack {
    /// `members` etcd containers (a cluster when more than one), ready; no assigner yet.
    pub async fn start(members: usize, ttl: Duration) -> Stack {
        let id = suffix();
        let front = Network::create(&format!("kat-front-{id}")).await;
        let back = Network::create(&format!("kat-back-{id}")).await;
        let cluster: Vec<String> =
            (0..members).map(|m| format!("e{m}=http://{}:2380", etcd_ip(&back, m))).collect();
        let mut etcd = Vec::new();
        for m in 0..members {
            let ip = etcd_ip(&back, m);
            let args = vec![
                format!("--network={}", back.name),
                format!("--ip={ip}"),
                ETCD_IMAGE.to_string(),
                format!("--name=e{m}"),
                "--listen-client-urls=http://0.0.0.0:2379".into(),
                format!("--advertise-client-urls=http://{ip}:2379"),
                "--listen-peer-urls=http://0.0.0.0:2380".into(),
                format!("--initial-advertise-peer-urls=http://{ip}:2380"),
                format!("--initial-cluster={}", cluster.join(",")),
                format!("--initial-cluster-token=kat-{id}"),
                "--initial-cluster-state=new".into(),
            ];
            etcd.push(Container::start(&format!("kat-etcd{m}-{id}"), &args, &[]).await);
        }
        let stack = Stack { id, ttl, etcd, assigners: Vec::new(), generation: 0, front, back };
        for m in 0..members {
            stack.wait_etcd_healthy(m).await;
        }
        stack
    }

    async fn wait_etcd_healthy(&self, member: usize) {
        let name = &self.etcd[member].name;
        let give_up = Instant::now() + START;
        loop {
            let args =
                ["exec", name, "etcdctl", "--command-timeout=2s", "endpoint", "health"].map(String::from);
            if docker::try_run("docker", &args).await.is_ok() {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "etcd {name} not healthy within {START:?}:\n{}",
                self.etcd[member].logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every etcd member's client URL.
    fn etcd_endpoints(&self) -> String {
        (0..self.etcd.len())
            .map(|m| format!("http://{}:2379", etcd_ip(&self.back, m)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts assigner `i` (`a<i>`) in a new container and waits until it is ready.
    pub async fn start_assigner(&mut self, i: usize) {
        self.generation += 1;
        let name = format!("kat-a{i}-{}-{}", self.generation, self.id);
        let args = vec![
            format!("--network={}", self.front.name),
            format!("--ip={}", self.front_ip(i)),
            assigner_image(),
            "serve".into(),
            "--backend=etcd".into(),
            format!("--etcd-endpoints={}", self.etcd_endpoints()),
            format!("--topic-partitions={TOPIC}={PARTITIONS}"),
            format!("--instance-id=a{i}"),
            format!("--lease-ttl={}s", self.ttl.as_secs()),
        ];
        let container = Container::start(&name, &args, &[(&self.back, self.back_ip(i))]).await;
        if self.assigners.len() <= i {
            self.assigners.resize_with(i + 1, || None);
        }
        self.assigners[i] = Some(container);
        let give_up = Instant::now() + START;
        while !ready(self.admin(i)).await {
            assert!(
                Instant::now() < give_up,
                "assigner a{i} not ready within {START:?}:\n{}",
                self.assigner(i).logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn front_ip(&self, i: usize) -> String {
        self.front.ip(10 + i as u8)
    }

    /// Assigner `i`'s address on `back` (where it reaches etcd).
    pub fn back_ip(&self, i: usize) -> String {
        self.back.ip(10 + i as u8)
    }

    /// Assigner `i`'s container.
    pub fn assigner(&self, i: usize) -> &Container {
        self.assigners.get(i).and_then(Option::as_ref).unwrap_or_else(|| panic!("no assigner a{i}"))
    }

    /// Removes assigner `i`'s container (after a stop or a kill).
    pub fn remove_assigner(&mut self, i: usize) {
        self.assigners[i] = None;
    }

    /// Assigner `i`'s gRPC URL (on `front`).
    pub fn grpc_url(&self, i: usize) -> String {
        format!("http://{}:50051", self.front_ip(i))
    }

    /// Assigner `i`'s admin address (on `front`).
    pub fn admin(&self, i: usize) -> SocketAddr {
        format!("{}:9090", self.front_ip(i)).parse().unwrap_or_else(|e| panic!("admin address: {e}"))
    }

    /// The instance id every reachable assigner names as leader, once they agree.
    pub async fn wait_leader(&self, among: &[usize], deadline: Duration) -> String {
        let give_up = Instant::now() + deadline;
        loop {
            let mut seen = Vec::new();
            for &i in among {
                seen.push(status(self.admin(i)).await.as_ref().and_then(leader));
            }
            if let Some(Some(first)) = seen.first()
                && seen.iter().all(|l| l.as_ref() == Some(first))
            {
                return first.clone();
            }
            assert!(Instant::now() < give_up, "no agreed leader within {deadline:?}: {seen:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The etcd member that leads the raft group (by `etcdctl endpoint status`), asking the
    /// members that answer; `None` while none does.
    pub async fn etcd_leader(&self) -> Option<usize> {
        for (m, member) in self.etcd.iter().enumerate() {
            let args =
                ["exec", &member.name, "etcdctl", "--command-timeout=1s", "endpoint", "status", "-w", "json"]
                    .map(String::from);
            let Ok(json) = docker::try_run("docker", &args).await else { continue };
            let Ok(parsed) = serde_json::from_str::<serde_json::Value>(&json) else { continue };
            let s = &parsed[0]["Status"];
            if s["leader"].as_u64().is_some_and(|l| l != 0)
                && s["leader"].as_u64() == s["header"]["member_id"].as_u64()
            {
                return Some(m);
            }
        }
        None
    }
}
