use super::*;
use crate::handoff::{Handoff, Phase};
use crate::store::{Op, SessionId};

#[test]
fn joins_of_an_empty_group_or_in_a_burst_wait_a_single_join_does_not() {
    let delay = std::time::Duration::from_millis(300);
    let t0 = tokio::time::Instant::now();
    let ms = |n| t0 + std::time::Duration::from_millis(n);
    let names = |list: &'static [&'static str]| list.iter().copied();
    let mut arrivals = Arrivals::default();
    // The first consumers of an empty group: wait until joins are quiet.
    assert_eq!(arrivals.wait_until(names(&["a"]), ms(0), delay), Some(ms(300)));
    assert_eq!(arrivals.wait_until(names(&["a", "b"]), ms(100), delay), Some(ms(400)));
    assert_eq!(arrivals.wait_until(names(&["a", "b"]), ms(400), delay), None, "quiet: plan once");
    // Established: a single join is planned at once...
    assert_eq!(arrivals.wait_until(names(&["a", "b", "c"]), ms(5_000), delay), None);
    // ...and one that follows it closely makes it a burst.
    assert_eq!(arrivals.wait_until(names(&["a", "b", "c", "d"]), ms(5_100), delay), Some(ms(5_400)));
    // Someone leaving is not a join.
    assert_eq!(arrivals.wait_until(names(&["a"]), ms(9_000), delay), None);
}

#[test]
fn rebalance_writes_are_batched_fenced_and_keep_a_partition_together() {
    // 300 partitions, each with an owner change and a handoff change: 600 writes.
    let mut writes = Vec::new();
    for partition in 0..300 {
        writes.push(Write::SetOwner { partition, owner: "b".into(), epoch: 0 });
        let handoff =
            Handoff { from: "a".into(), to: "b".into(), phase: Phase::Releasing, since: 0, epoch: 0 };
        writes.push(Write::PutHandoff { partition, handoff });
    }
    let fence = Fence { session: SessionId(1), revision: 42 };
    let guard =
        |p: u32| vec![Compare::ModRevision(format!("k/{p}"), 7), Compare::ModRevision("gone".into(), 0)];
    let ops = |ws: &[Write]| ws.iter().map(|w| Op::delete(format!("k/{}", w.partition()))).collect();
    let txns = fenced_batches("leader", fence, &writes, guard, ops);
    assert_eq!(
        txns.len(),
        300usize.div_ceil(PARTITIONS_PER_TXN),
        "one txn per {PARTITIONS_PER_TXN} partitions"
    );
    let mut seen = 0;
    for txn in &txns {
        assert_eq!(txn.compares[0], Compare::CreateRevision("leader".into(), 42), "every txn is fenced");
        assert!(txn.compares.len() <= 128 && txn.ops.len() <= 128, "within etcd's default max-txn-ops");
        seen += txn.ops.len();
    }
    assert_eq!(seen, 600);
    // No partition is split across two transactions.
    for pair in txns.windows(2) {
        let last = pair[0].ops.last().cloned();
        let first = pair[1].ops.first().cloned();
        assert_ne!(last, first);
    }
}

#[test]
fn a_plan_is_fenced_by_the_leader_key_of_its_topics_group() {
    use crate::coordinator::handoff_backend::register::active_record;
    use crate::coordinator::shared::mirror::Versioned;
    use crate::coordinator::shared::records::TopicRecord;

    let keys = Keys::new("/p");
    let fence = Fence { session: SessionId(1), revision: 42 };
    for groups in [1, 4, 16] {
        let config = HandoffConfig { leader_groups: groups, ..HandoffConfig::default() };
        for topic in ["orders", "payments", "clicks"] {
            // A topic of two partitions and its one consumer: the plan assigns both.
            let mut entry = TopicEntry::default();
            entry.config = Some(Versioned { value: TopicRecord::new(2), mod_revision: 1 });
            let record = active_record(&config, "a", SessionId(7), 0);
            entry.consumers.insert("a".into(), Versioned { value: record, mod_revision: 2 });
            let clock = PlanClock { revision: 50, now: 1_000, now_micros: 1_000_000 };
            let (mut cooldowns, mut memory) = Default::default();
            let plan = plan_topic(&config, &keys, fence, (topic, &entry), clock, &mut cooldowns, &mut memory);
            assert!(!plan.batches.is_empty(), "{topic}: nothing planned");
            let group = config.leader_group_of(topic);
            assert!(group.plans(topic) && group.groups == groups);
            let key = if groups == 1 {
                "/p/leader".to_string()
            } else {
                format!("/p/leaders/{groups}/{}", group.group)
            };
            assert_eq!(keys.leader(group), key);
            for (txn, _) in &plan.batches {
                assert_eq!(txn.compares[0], Compare::CreateRevision(key.clone(), 42), "{topic} in {group:?}");
            }
        }
    }
}
