//! Fault scenarios on the memory backend, with [`FaultyStore`] in front of one instance:
//! faults a network cannot make on cue (one lost answer to one precise transaction), and the
//! cut-off scenario again, without etcd (quick to iterate on).

use std::sync::Arc;

use kafka_assigner::store::{FaultyStore, LeaseStore, MemoryStore};

use super::{Findings, cut_off_leader_instance};
use crate::support::{
    assigner::{Backend, PARTITIONS, PROMPT, TOPIC, TTL, TestCluster},
    wait_until,
};

/// A memory cluster whose instance 0 (the leader) reaches the store through a fault
/// wrapper (seed 1), and instance 1 directly.
async fn cluster_with_faulty_leader() -> (TestCluster, FaultyStore) {
    let memory = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(memory.clone()), 1);
    let mut cluster = TestCluster::with_store(Backend::Memory, Arc::new(memory.clone()), "/kat-faults/");
    cluster.add_instance_on(Arc::new(faulty.clone())).await;
    assert_eq!(cluster.wait_leader(PROMPT).await, 0, "the first instance leads");
    let direct: Arc<dyn LeaseStore> = Arc::new(memory);
    cluster.add_instance_on(direct).await;
    (cluster, faulty)
}

/// The answer to the leader election's transaction is lost (the key is written, bound to
/// the instance's session). The instance must still become leader (it reads the key back
/// and adopts it), so the fleet is not leaderless: a consumer gets every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_campaign_answer_still_elects_a_leader() {
    let memory = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(memory.clone()), 1);
    // The first two transactions of a fresh instance are its campaign and the write of its
    // instance record, in either order (both wait for the instance lease): both answers are
    // lost, the record's write is simply retried.
    faulty.lose_next_txn_answers(2);
    let mut cluster = TestCluster::with_store(Backend::Memory, Arc::new(memory.clone()), "/kat-faults/");
    cluster.add_instance_on(Arc::new(faulty.clone())).await;
    wait_until(PROMPT, "the campaign's answer is lost", || async { faulty.stats().lost_answers == 2 }).await;
    let leader_key = memory.get("/kat-faults/leader").await.expect("read the leader key");
    assert!(leader_key.is_some(), "the lost campaign was applied: the key holds our session");

    let mut findings = Findings::default();
    let give_up = tokio::time::Instant::now() + TTL * 3;
    while cluster.leader().is_none() && tokio::time::Instant::now() < give_up {
        tokio::time::sleep(crate::support::POLL_INTERVAL).await;
    }
    findings
        .check(cluster.leader().is_some(), format!("no leader {:?} after the lost campaign answer", TTL * 3));
    let mut a = cluster.consumer_on(0, "a", TOPIC).await;
    a.expect_snapshot().await;
    let give_up = tokio::time::Instant::now() + PROMPT;
    while a.owned.len() < PARTITIONS as usize && tokio::time::Instant::now() < give_up {
        a.poll_now();
        tokio::time::sleep(crate::support::POLL_INTERVAL).await;
    }
    findings.check(
        a.owned.len() == PARTITIONS as usize,
        format!("the only consumer was not given the partitions: {a:?}"),
    );
    findings.finish("lost campaign answer");
}

/// [`cut_off_leader_instance`] with the fault wrapper cutting instance 0 off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_cut_off_from_memory_store_fences_its_consumers() {
    let (cluster, faulty) = cluster_with_faulty_leader().await;
    cut_off_leader_instance(cluster, || faulty.cut_off(), "the memory store (fault wrapper)").await;
}
