//! Cluster benchmark (issue 42): K = 1, 3, 5 instances of the release server on one real
//! etcd, at least 100 topics, and a rolling restart of every consumer in waves of 10 %
//! (see `benches/cluster/mod.rs`). Prints a table (one column per K), writes it to
//! `bench-cluster.md` under the target directory, and with `-- --write-docs` (or
//! `BENCH_DOCS=1`) to `docs/benchmarks/cluster.md`.
//!
//! Run: `cargo bench --bench cluster` (starts etcd itself, needs the `etcd` binary).
//! `CLUSTER_INSTANCES=1,3,5`, `CLUSTER_TOPICS`, `CLUSTER_PARTITIONS`, `CLUSTER_CONSUMERS`
//! (per topic), `CLUSTER_WAVES`, `CLUSTER_DEADLINE_S`, `CLUSTER_SERVER_ARGS`.

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

#[allow(dead_code)]
#[path = "support/bench_error.rs"]
mod error;
#[allow(dead_code)]
#[path = "support/server_process.rs"]
mod server;

#[path = "cluster/mod.rs"]
mod cluster;

#[path = "support/docs.rs"]
mod docs;

use std::path::PathBuf;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Cargo builds the binary with the bench profile (release) for benches.
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_kafka-assigner"));
    let config = cluster::Config::from_env(binary)?;
    // Thousands of streams share a few connections, but K servers, etcd clients and their
    // sockets need more than the usual 1,024 descriptors.
    rlimit::increase_nofile_limit(65_536)?;
    let mut rows = Vec::new();
    for k in config.instances.clone() {
        eprintln!("cluster: K = {k}");
        let row = cluster::run(&config, k).await?;
        eprintln!("  {}", row.summary());
        rows.push(row);
    }
    let markdown = cluster::report::markdown(&rows);
    println!("{markdown}");
    let out = docs::write_target("cluster", &markdown)?;
    println!("wrote {}", out.display());
    if docs::wanted() {
        let command = docs::command("cluster", &["CLUSTER_", "KAT_ETCD_TLS"]);
        let path = docs::write("cluster", "A rolling restart on K instances", &command, &markdown)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
