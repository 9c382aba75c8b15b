//! Logs fit a log pipeline: the real `kafka-assigner serve` and the example consumer
//! (`examples/consumer.rs`, the binary the images ship), with their output piped as
//! `docker logs` or a log file has it, write plain lines with no ANSI colour codes
//! (`--log-format json` is checked by log_format.rs).

use std::{path::PathBuf, process::Stdio, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

const PROMPT: Duration = Duration::from_secs(60);
const ESC: char = '\u{1b}';

/// `<target>/debug/examples/consumer`. `cargo test` builds the examples of a whole run
/// (`./scripts/test`, and the images are made from that same file), but not for a run of
/// one test target: then build it first. It is not built from here: a cargo started by a
/// test inherits the test's environment and rebuilds half the tree for it.
fn example_consumer() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe.ancestors().nth(3).expect("target dir").to_path_buf();
    let path = target.join("debug/examples/consumer");
    assert!(
        path.exists(),
        "{} is missing: run the whole suite (./scripts/test), or `cargo build --example consumer` \
         with this run's --features first",
        path.display()
    );
    path
}

/// Reads `child`'s stdout until a line contains `until`; returns every line so far.
async fn lines_until(child: &mut Child, until: &str) -> Vec<String> {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut reader = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(PROMPT, async {
        while let Ok(Some(line)) = reader.next_line().await {
            let done = line.contains(until);
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(found, Ok(true)), "no line with '{until}' within {PROMPT:?}: {seen:#?}");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_the_example_consumer_write_no_colour_codes_to_a_pipe() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
        .args(["serve", "--backend", "memory", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(["--topic-partitions", "events=2", "--instance-id", "logs-test"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kafka-assigner serve starts");
    let server_lines = lines_until(&mut server, "serving").await;
    let serving = server_lines.last().expect("the serving line");
    let grpc = serving
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc_addr="))
        .unwrap_or_else(|| panic!("no grpc_addr in {serving}"))
        .to_string();

    let mut consumer = Command::new(example_consumer())
        .args(["--endpoints", &format!("http://{grpc}"), "--consumer-name", "c-0", "--topic", "events"])
        .arg("--log-only")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the example consumer starts");
    // Its first partition assigned: the log has levels, targets and fields by then.
    let consumer_lines = lines_until(&mut consumer, "assigned: processing").await;

    for (who, lines) in [("kafka-assigner serve", &server_lines), ("the example consumer", &consumer_lines)] {
        assert!(lines.iter().any(|l| l.contains(" INFO ")), "{who}: {lines:#?}");
        let coloured: Vec<&String> = lines.iter().filter(|l| l.contains(ESC)).collect();
        assert!(coloured.is_empty(), "{who} wrote colour codes to a pipe: {coloured:?}");
    }
    let _ = consumer.kill().await;
    let _ = server.kill().await;
}
