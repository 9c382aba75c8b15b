//! The cluster bench's smallest size, so it never rots: the same code as `cargo bench
//! --bench cluster`, against the debug server binary as child processes on one real etcd,
//! at K = 1 and 3. Asserts that the rolling restart completes with each partition moved
//! twice, no lost stream or refused call, and every change delivered once per instance.

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

#[allow(dead_code)]
#[path = "../benches/support/bench_error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../benches/support/server_process.rs"]
mod server;

// The bench reads its sizes from the environment; this test sets them itself.
#[allow(dead_code)]
#[path = "../benches/cluster/mod.rs"]
mod cluster;

use std::{path::PathBuf, time::Duration};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_on_one_and_three_instances_moves_each_partition_twice() {
    let config = cluster::Config {
        instances: vec![1, 3],
        topics: 10,
        partitions: 8,
        consumers: 2,
        waves: 10,
        deadline: Duration::from_secs(60),
        binary: PathBuf::from(env!("CARGO_BIN_EXE_kafka-assigner")),
        // Three groups per instance at K = 3: the planning is spread (checked below).
        leader_groups: 9,
        extra_args: Vec::new(),
    };
    for k in config.instances.clone() {
        let row = cluster::run(&config, k).await.unwrap_or_else(|e| panic!("K = {k}: {e}"));
        let table = cluster::report::markdown(std::slice::from_ref(&row));
        assert!(row.restart_s.is_some(), "K = {k}: the restart did not complete:\n{table}");
        // Each consumer's partitions move away when it drains and as many come back to its
        // successor: twice the partitions, and no more.
        assert_eq!(row.stats.moves, u64::from(2 * config.topics * config.partitions), "K = {k}:\n{table}");
        assert_eq!(
            (row.stats.errors.stream_errors, row.stats.errors.rpc_errors),
            (0, 0),
            "K = {k}:\n{table}"
        );
        let per_change = row.etcd.events / row.etcd.changes;
        assert!((per_change - k as f64).abs() < 0.05, "K = {k}: {per_change} events per change:\n{table}");
        let planning: f64 = row.instances.iter().map(|i| i.plan_s).sum();
        assert!(planning > 0.0, "K = {k}: no planning counted:\n{table}");
        // Every instance leads its share of the groups, and writes plans.
        let led: Vec<u32> = row.instances.iter().map(|i| i.groups_led).collect();
        assert_eq!(led.iter().sum::<u32>(), config.leader_groups, "K = {k}: groups led {led:?}:\n{table}");
        let share = config.leader_groups.div_ceil(k as u32);
        assert!(led.iter().all(|n| *n <= share), "K = {k}: groups led {led:?}:\n{table}");
        // The ten topics fall in more groups than one instance leads, so with three
        // instances at least two write plans.
        let writers = row.instances.iter().filter(|i| i.moves > 0.0).count();
        assert!(writers >= k.min(2), "K = {k}: {writers} instances wrote plans:\n{table}");
    }
}
