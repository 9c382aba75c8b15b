//! Docker through its CLI, for the container suites (`compose_up`, `container_faults`):
//! networks with a subnet of their own (so a container has a fixed address the test process
//! reaches directly, and a replacement container can take the same one), containers, and
//! compose projects. Each is removed when its guard drops, so a failing test leaves no
//! container, network or volume behind. Names carry a random suffix per test run.

use std::{
    net::SocketAddr,
    process::{Command, Output},
    time::Duration,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The image `scripts/images` builds from the release binary.
pub const ASSIGNER_IMAGE: &str = "kafka-assigner:local";
/// Debian's etcd, built by `scripts/images`.
pub const ETCD_IMAGE: &str = "kafka-assigner-etcd:local";
/// Label on everything these suites create (`docker ps -a --filter label=...`).
pub const LABEL: &str = "org.kafka-assigner.test=containers";

/// The assigner image under test: `KAFKA_ASSIGNER_IMAGE` or [`ASSIGNER_IMAGE`].
pub fn assigner_image() -> String {
    std::env::var("KAFKA_ASSIGNER_IMAGE").unwrap_or_else(|_| ASSIGNER_IMAGE.to_string())
}

/// Whether the engine and `images` are there. Without them the test is skipped with a
/// message, unless `CI` is set: then it fails.
pub fn available(test: &str, images: &[&str]) -> bool {
    let engine = Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]).output();
    let missing = if !engine.is_ok_and(|o| o.status.success()) {
        Some("no Docker engine".to_string())
    } else {
        images
            .iter()
            .find(|image| {
                !Command::new("docker")
                    .args(["image", "inspect", image])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .map(|image| format!("no image {image} (build it with scripts/images)"))
    };
    match missing {
        None => true,
        Some(why) if std::env::var_os("CI").is_some() => panic!("{test}: {why}, and CI is set"),
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

/// A short random suffix for names.
pub fn suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

fn outcome(args: &[String], output: std::io::Result<Output>) -> Result<String, String> {
    match output {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => Err(format!("docker {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("docker {}: {e}", args.join(" "))),
    }
}

/// Runs `program args`, returning its stdout or why it failed.
pub async fn try_run(program: &str, args: &[String]) -> Result<String, String> {
    outcome(args, tokio::process::Command::new(program).args(args).kill_on_drop(true).output().await)
}

/// Runs `docker args`; panics with its stderr if it fails.
pub async fn docker(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    try_run("docker", &args).await.unwrap_or_else(|e| panic!("{e}"))
}

/// `docker args`, synchronously and ignoring failure: for guards' `Drop`.
fn docker_quietly(args: &[&str]) {
    let _ = Command::new("docker").args(args).output();
}

/// A user-defined bridge network with its own /24, removed on drop.
pub struct Network {
    /// Its name.
    pub name: String,
    /// The first three octets of its subnet.
    prefix: String,
}

impl Network {
    /// Creates `name` on a free 10.x.y.0/24 (tries others when one overlaps).
    pub async fn create(name: &str) -> Network {
        let mut last = String::new();
        for _ in 0..20 {
            let prefix = format!("10.{}.{}", 200 + rand::random::<u8>() % 50, rand::random::<u8>());
            let subnet = format!("--subnet={prefix}.0/24");
            let args = ["network", "create", "--label", LABEL, &subnet, name].map(String::from);
            match try_run("docker", &args).await {
                Ok(_) => return Network { name: name.to_string(), prefix },
                Err(e) => last = e,
            }
        }
        panic!("no free subnet for network {name}: {last}");
    }

    /// The address `host` (2..=254) of this network.
    pub fn ip(&self, host: u8) -> String {
        format!("{}.{host}", self.prefix)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        docker_quietly(&["network", "rm", &self.name]);
    }
}

/// A container, removed (with its anonymous volumes) on drop.
pub struct Container {
    /// Its name.
    pub name: String,
}

impl Container {
    /// `docker create` with `args` (options, image, command), then connects it to `more`
    /// networks (name, address) and starts it.
    pub async fn start(name: &str, args: &[String], more: &[(&Network, String)]) -> Container {
        let mut create =
            vec!["create".to_string(), "--name".into(), name.into(), "--label".into(), LABEL.into()];
        create.extend(args.iter().cloned());
        // The guard exists from here on: a failure below still removes the container.
        let container = Container { name: name.to_string() };
        try_run("docker", &create).await.unwrap_or_else(|e| panic!("{e}"));
        for (network, ip) in more {
            docker(&["network", "connect", "--ip", ip, &network.name, name]).await;
        }
        docker(&["start", name]).await;
        container
    }

    /// `docker <verb> <name>`: kill, stop, pause, unpause, start.
    pub async fn act(&self, verb: &str) {
        docker(&[verb, &self.name]).await;
    }

    /// `docker network disconnect`: cuts the container from `network`.
    pub async fn disconnect(&self, network: &Network) {
        docker(&["network", "disconnect", &network.name, &self.name]).await;
    }

    /// Connects the container to `network` at `ip`.
    pub async fn connect(&self, network: &Network, ip: &str) {
        docker(&["network", "connect", "--ip", ip, &network.name, &self.name]).await;
    }

    /// Its logs so far (stdout and stderr), for failure messages.
    pub fn logs(&self) -> String {
        Command::new("docker")
            .args(["logs", "--tail", "40", &self.name])
            .output()
            .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
            .unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        docker_quietly(&["rm", "--force", "--volumes", &self.name]);
    }
}

/// `GET path` over HTTP/1.1: status code and body, or `None` if nothing answered in 2 s.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let get = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        conn.read_to_string(&mut response).await.ok()?;
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(2), get).await.ok().flatten()
}

/// `/ready` answers 200.
pub async fn ready(admin: SocketAddr) -> bool {
    http_get(admin, "/ready").await.is_some_and(|(code, _)| code == 200)
}

/// `/status` as JSON, if it answers.
pub async fn status(admin: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) = http_get(admin, "/status").await?;
    if code != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

/// The owners of `topic` in a `/status` document (`None`: unowned), if the topic is there.
pub fn owners(status: &serde_json::Value, topic: &str) -> Option<Vec<Option<String>>> {
    let topics = status.get("topics")?.as_array()?;
    let topic = topics.iter().find(|t| t.get("topic").and_then(|n| n.as_str()) == Some(topic))?;
    let owners = topic.get("owners")?.as_array()?;
    Some(owners.iter().map(|o| o.as_str().map(String::from)).collect())
}

/// The `leader` field of a `/status` document.
pub fn leader(status: &serde_json::Value) -> Option<String> {
    status.get("leader").and_then(|l| l.as_str()).map(String::from)
}

/// Handoffs in progress on `topic` in a `/status` document.
pub fn handoffs(status: &serde_json::Value, topic: &str) -> usize {
    let topics = status.get("topics").and_then(|t| t.as_array());
    topics
        .and_then(|ts| ts.iter().find(|t| t.get("topic").and_then(|n| n.as_str()) == Some(topic)))
        .and_then(|t| t.get("handoffs")?.as_array().map(Vec::len))
        .unwrap_or(0)
}
