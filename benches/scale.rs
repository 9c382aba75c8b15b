//! Scale benchmark: scale-out, fan-out and a `Register` storm against the release
//! server binary as a child process, on the memory and etcd backends, with the raw etcd
//! reference measured in the same run. Writes `target/bench-scale.md` and `.json`, and with
//! `-- --write-docs` (or `BENCH_DOCS=1`) the Markdown to `docs/benchmarks/scale.md`.
//!
//! Run: `cargo bench --bench scale` (full sizes; starts etcd itself, needs the `etcd`
//! binary). `SCALE_SIZES=smoke|full`, `SCALE_SCENARIOS=scaleout,fanout-1000,...`,
//! `SCALE_BACKENDS=memory,etcd`, `SCALE_MAX_WARMING`, `SCALE_SERVER_ARGS`, `SCALE_DEADLINE_S`,
//! `SCALE_IDLE_S`, `SCALE_OUT` (see `benches/scale/mod.rs`).

#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../tests/integration/support/etcd.rs"]
mod etcd;
// etcd.rs starts a TLS etcd instead when KAT_ETCD_TLS is set.
#[allow(dead_code)]
#[path = "../tests/integration/support/certs.rs"]
mod certs;
#[allow(dead_code)]
#[path = "../tests/integration/support/etcd_tls.rs"]
mod etcd_tls;

#[path = "scale/mod.rs"]
mod scale;

// This bench writes its own `.md` and `.json` (`SCALE_OUT`), not `bench-scale.md`.
#[allow(dead_code)]
#[path = "support/docs.rs"]
mod docs;

use std::path::PathBuf;

// One thread: its consumers' tasks run in the order their messages arrived (a multi-thread
// runtime runs the task woken last first, and two at once), so the views' timestamps keep
// the order the server sent in: an `assigned` the server sent before a release is seen first.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Cargo builds the binary with the bench profile (release) for benches.
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_kafka-assigner"));
    let config = scale::Config::from_env("full", binary, root.join("target/bench-scale"))?;
    let report = scale::run(&config).await?;
    let markdown = report.markdown();
    println!("{markdown}");
    println!("wrote {}.{{md,json}}", config.out.display());
    if docs::wanted() {
        let command = docs::command("scale", &["SCALE_", "KAT_ETCD_TLS"]);
        let path = docs::write("scale", "Performance at scale", &command, &markdown)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
