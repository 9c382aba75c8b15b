//! The scale benchmark's smallest size (`SCALE_SIZES=smoke`), so it never rots: the same
//! code as `cargo bench --bench scale`, against the debug server binary as a child process,
//! on memory and on a real etcd. Asserts that every phase settles with the minimum moves and
//! no lost stream or refused call.

#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "integration/support/etcd.rs"]
mod etcd;
// etcd.rs starts a TLS etcd instead when KAT_ETCD_TLS is set.
#[allow(dead_code)]
#[path = "integration/support/certs.rs"]
mod certs;
#[allow(dead_code)]
#[path = "integration/support/etcd_tls.rs"]
mod etcd_tls;

#[path = "../benches/scale/mod.rs"]
mod scale;

use std::path::PathBuf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_sizes_settle_with_minimum_moves() {
    let out = tempfile::tempdir().expect("temp dir for the smoke report");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_kafka-assigner"));
    // The bench's own SCALE_* variables apply (e.g. SCALE_BACKENDS=memory), smoke by default.
    let config = scale::Config::from_env("smoke", binary, out.path().join("bench-scale-smoke"))
        .unwrap_or_else(|e| panic!("{e}"));
    let report = scale::run(&config).await.unwrap_or_else(|e| panic!("smoke run failed: {e}"));
    let markdown = report.markdown();
    assert_eq!(report.rows.len(), config.scenarios.len() * config.backends.len(), "{markdown}");
    if config.backends.contains(&scale::Backend::Etcd) {
        assert!(report.raw_etcd.as_ref().is_some_and(|raw| raw.txn_per_s > 0.0), "{markdown}");
    }
    for row in &report.rows {
        let name = format!("{} {}", row.backend, row.scenario);
        assert!(row.stable && row.stable_after_idle, "{name} did not stay stable:\n{markdown}");
        assert_eq!((row.stream_errors, row.rpc_errors), (0, 0), "{name} had errors:\n{markdown}");
        assert!(row.server_alive && row.rss_mib > 0.0, "{name}: server gone or no RSS:\n{markdown}");
        if row.kind != "storm" {
            // A storm may retarget warms; a planned scale-out or join must not.
            assert_eq!(row.ready_refused, 0, "{name}: PartitionReady refused:\n{markdown}");
            assert_eq!(row.moves, row.moves_min, "{name} moved more than needed:\n{markdown}");
            assert!(row.moves > 0 && row.delivery_samples > 0, "{name} measured nothing:\n{markdown}");
        }
        if row.backend == "etcd" {
            // Idle traffic may be zero in a short window; the phase itself writes to etcd.
            assert!(row.etcd_idle.is_some(), "{name}: etcd metrics unread:\n{markdown}");
            let busy = row.etcd_busy.expect("etcd rates while busy");
            assert!(busy.writes_per_s > 0.0, "{name}: no etcd writes seen:\n{markdown}");
        }
    }
    assert!(out.path().join("bench-scale-smoke.json").is_file());
}
