//! `--log-format plain|json`: the real binary's start-up line carries the same fields in
//! both formats (time, level, target, message, and the event's fields).

use std::{process::Stdio, time::Duration};

use tokio::io::{AsyncBufReadExt, BufReader};

/// Starts `kafka-assigner serve` on free ports with `format`, and returns the log line that
/// says it is serving.
async fn serving_line(format: &str) -> String {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
        .args(["serve", "--backend", "memory", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(["--instance-id", "log-test", "--log-format", format])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kafka-assigner serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("read log") {
            if line.contains("serving") {
                return line;
            }
        }
        panic!("the server exited without logging 'serving'")
    })
    .await
    .unwrap_or_else(|_| panic!("no 'serving' line within 30 s with --log-format {format}"));
    let _ = child.kill().await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_json_logs_carry_the_same_fields() {
    let json = serving_line("json").await;
    let doc: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    assert_eq!(doc["level"], "INFO", "{json}");
    assert_eq!(doc["message"], "serving", "{json}");
    assert_eq!(doc["target"], "kafka_assigner::server", "{json}");
    assert!(doc["timestamp"].as_str().is_some_and(|t| t.contains('T')), "{json}");
    let grpc = doc["grpc_addr"].as_str().unwrap_or_else(|| panic!("grpc_addr is a top-level field: {json}"));
    let admin =
        doc["admin_addr"].as_str().unwrap_or_else(|| panic!("admin_addr is a top-level field: {json}"));
    assert!(grpc.starts_with("127.0.0.1:") && admin.starts_with("127.0.0.1:"), "{json}");

    let plain = serving_line("plain").await;
    for part in ["INFO", "kafka_assigner::server", "serving", "grpc_addr=127.0.0.1:", "admin_addr=127.0.0.1:"]
    {
        assert!(plain.contains(part), "'{part}' missing from the plain line: {plain}");
    }
    assert!(serde_json::from_str::<serde_json::Value>(&plain).is_err(), "plain is not JSON: {plain}");
}
