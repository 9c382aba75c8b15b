//! `docker-compose.yml` started for real, with `docker-compose.local.yml` (local images,
//! partition counts from flags, consumers with `--log-only`, since no Kafka image exists
//! here): etcd, two assigners and two example consumers, each started by compose. Checks
//! that both assigners become ready, that the consumers share the partitions with `/status`
//! agreeing on both instances, that `stop consumer-1` hands its partitions to consumer-0 by
//! warm handoff (consumer-0 warms each before it is assigned it; consumer-1 drains), and
//! that `down -v` leaves nothing behind.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use crate::container_faults::SERIAL;
use crate::support::docker::{ETCD_IMAGE, assigner_image, available, docker, owners, ready, status, suffix};

const FILES: [&str; 2] = ["docker-compose.yml", "docker-compose.local.yml"];
const BOUND: Duration = Duration::from_secs(60);
/// Host ports `docker-compose.yml` takes from the environment; 0 here: any free port (the
/// defaults are fixed ones a developer's machine may be using).
const PORTS: [&str; 5] = [
    "ETCD_PORT",
    "ASSIGNER_0_GRPC_PORT",
    "ASSIGNER_0_ADMIN_PORT",
    "ASSIGNER_1_GRPC_PORT",
    "ASSIGNER_1_ADMIN_PORT",
];

/// `docker compose` when the plugin is there, else `docker-compose` (v1).
fn compose_program() -> Vec<String> {
    let plugin =
        Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
    if plugin { vec!["docker".into(), "compose".into()] } else { vec!["docker-compose".into()] }
}

/// A compose project; `down -v` on drop, so a failing test leaves nothing behind.
struct Project {
    name: String,
    program: Vec<String>,
}

impl Project {
    fn argv(&self, args: &[&str]) -> Vec<String> {
        let mut argv: Vec<String> = self.program[1..].to_vec();
        argv.extend(["-p".to_string(), self.name.clone()]);
        for file in FILES {
            argv.extend(["-f".to_string(), format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))]);
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    async fn run(&self, args: &[&str]) -> String {
        let argv = self.argv(args);
        let output = tokio::process::Command::new(&self.program[0])
            .args(&argv)
            .envs(PORTS.map(|var| (var, "0")))
            .kill_on_drop(true)
            .output()
            .await;
        match output {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            Ok(o) => panic!("{} {}: {}", self.program[0], argv.join(" "), String::from_utf8_lossy(&o.stderr)),
            Err(e) => panic!("{}: {e}", self.program[0]),
        }
    }

    /// The host address compose published `port` of `service` on.
    async fn port(&self, service: &str, port: u16) -> SocketAddr {
        let out = self.run(&["port", service, &port.to_string()]).await;
        let port = out.lines().next().and_then(|l| l.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok());
        SocketAddr::from((
            [127, 0, 0, 1],
            port.unwrap_or_else(|| panic!("{service}: no published port in '{out}'")),
        ))
    }

    /// A service's logs, colour codes removed.
    async fn logs(&self, service: &str) -> String {
        let raw = self.run(&["logs", "--no-color", service]).await;
        let mut clean = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().find(|c| c.is_ascii_alphabetic());
            } else {
                clean.push(c);
            }
        }
        clean
    }

    /// Containers, networks and volumes of this project still there.
    fn leftovers(&self) -> String {
        let label = format!("label=com.docker.compose.project={}", self.name);
        ["ps -a -q", "network ls -q", "volume ls -q"]
            .iter()
            .map(|what| {
                let mut args: Vec<&str> = what.split(' ').collect();
                args.extend(["--filter", &label]);
                Command::new("docker")
                    .args(&args)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            })
            .filter_map(Result::ok)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = Command::new(&self.program[0])
            .args(self.argv(&["down", "-v", "--timeout", "5"]))
            .envs(PORTS.map(|var| (var, "0")))
            .output();
    }
}

/// Waits until `f` holds, polling every 100 ms; panics with `what` after [`BOUND`].
async fn until<F: AsyncFnMut() -> bool>(what: &str, mut f: F) {
    let give_up = Instant::now() + BOUND;
    while !f().await {
        assert!(Instant::now() < give_up, "timed out after {BOUND:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `p=events/N` partitions a line-oriented log mentions after `marker`, in order.
fn partitions_after(log: &str, marker: &str) -> Vec<u32> {
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| l.split("p=events/").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_stack_shares_and_hands_over() {
    if !available("compose_stack_shares_and_hands_over", &[ETCD_IMAGE, &assigner_image()]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let image = assigner_image();
    let help =
        docker(&["run", "--rm", "--entrypoint", "kafka-assigner-example-consumer", &image, "--help"]).await;
    assert!(
        help.contains("--log-only"),
        "{image} predates the consumer's --log-only: rebuild it with scripts/images"
    );
    let project = Project { name: format!("kat{}", suffix()), program: compose_program() };
    let started = Instant::now();
    // No Kafka here: the services that can run are started by name, without their
    // dependencies, in the order their healthchecks would impose.
    project.run(&["up", "-d", "--no-deps", "etcd"]).await;
    project.run(&["up", "-d", "--no-deps", "assigner-0", "assigner-1"]).await;
    let admins = [project.port("assigner-0", 9090).await, project.port("assigner-1", 9090).await];
    until("both assigners are ready", async || ready(admins[0]).await && ready(admins[1]).await).await;
    let ready_after = started.elapsed();
    project.run(&["up", "-d", "--no-deps", "consumer-0", "consumer-1"]).await;

    let shared = |names: &[&str]| {
        let names: Vec<Option<String>> = names.iter().map(|n| Some(n.to_string())).collect();
        move |owners: &Vec<Option<String>>| {
            let mut count: BTreeMap<&Option<String>, usize> = BTreeMap::new();
            owners.iter().for_each(|o| *count.entry(o).or_default() += 1);
            owners.len() == 6
                && names.iter().all(|n| count.get(n) == Some(&(6 / names.len())))
                && count.len() == names.len()
        }
    };
    let both = shared(&["consumer-0", "consumer-1"]);
    let mut seen = Vec::new();
    until("the consumers share the partitions, on both instances' /status", async || {
        seen.clear();
        for admin in admins {
            seen.push(status(admin).await.as_ref().and_then(|s| owners(s, "events")));
        }
        seen.iter().all(|o| o.as_ref().is_some_and(&both)) && seen[0] == seen[1]
    })
    .await;
    let before = seen[0].clone().unwrap_or_default();
    let of_1: Vec<u32> = (0..6).filter(|p| before[*p as usize].as_deref() == Some("consumer-1")).collect();

    project.run(&["stop", "consumer-1"]).await;
    let alone = shared(&["consumer-0"]);
    until("consumer-0 owns every partition, on both instances' /status", async || {
        seen.clear();
        for admin in admins {
            seen.push(status(admin).await.as_ref().and_then(|s| owners(s, "events")));
        }
        seen.iter().all(|o| o.as_ref().is_some_and(&alone)) && seen[0] == seen[1]
    })
    .await;
    // Warm handoff, from what the consumers were told: consumer-1 released each of its
    // partitions and drained; consumer-0 warmed each before it was assigned it.
    let (log0, log1) = (project.logs("consumer-0").await, project.logs("consumer-1").await);
    let mut released = partitions_after(&log1, "release: stopped processing");
    released.sort_unstable();
    assert_eq!(released, of_1, "consumer-1 released its partitions:\n{log1}");
    assert!(log1.contains("outcome=Drained"), "consumer-1 drained:\n{log1}");
    let line = |marker: &str, p: u32| {
        log0.lines().position(|l| l.contains(marker) && partitions_after(l, marker) == [p])
    };
    for p in &of_1 {
        let (warm, assigned) = (line("warm: ready at once", *p), line("assigned: processing", *p));
        assert!(
            warm.is_some() && assigned.is_some() && warm < assigned,
            "consumer-0 was not warmed on partition {p} before it was assigned it:\n{log0}"
        );
    }
    eprintln!(
        "[compose] assigners ready after {ready_after:?}; consumer-1's {of_1:?} handed to consumer-0 by warm handoff"
    );

    project.run(&["down", "-v", "--timeout", "5"]).await;
    let left = project.leftovers();
    assert!(left.is_empty(), "docker compose down -v left: {left}");
}
