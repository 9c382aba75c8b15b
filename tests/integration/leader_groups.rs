//! Leader groups on a real etcd (`--leader-groups`, docs/design.md §4): the topics' planning
//! is spread over the instances, an instance that dies hands over only its groups (the
//! other topics keep being planned, and nobody else hears a thing), a joining instance
//! takes its share by hand-over (no TTL waited), a deposed group leader's write is fenced,
//! and instances configured with another group count do not campaign beside them.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_assigner::coordinator::leader_groups::group_of;
use kafka_assigner::store::{Compare, KeyValue, Op, Txn};

use crate::support::assigner::{Backend, PROMPT, TestCluster, TestConsumer};

/// Groups the tests split the topics into: two per instance of three.
const GROUPS: u32 = 6;
/// Partitions of each test topic.
const PARTITIONS: u32 = 4;

/// One topic name per group, `topics[g]` planned by group `g`.
fn one_topic_per_group() -> Vec<String> {
    (0..GROUPS)
        .map(|group| {
            (0..)
                .map(|i| format!("lg-{i}"))
                .find(|topic| group_of(topic, GROUPS) == group)
                .unwrap_or_else(|| unreachable!("an unbounded search finds every group"))
        })
        .collect()
}

/// The group leader keys in the store: group → (instance id, the key).
async fn group_leaders(cluster: &TestCluster) -> BTreeMap<u32, (String, KeyValue)> {
    let prefix = format!("{}leaders/{GROUPS}/", cluster.config.prefix);
    let stored = cluster.store.get_prefix(&prefix).await.unwrap_or_else(|e| panic!("read {prefix}: {e}"));
    stored
        .kvs
        .into_iter()
        .map(|kv| {
            let group = kv.key[prefix.len()..].parse().unwrap_or_else(|e| panic!("key {}: {e}", kv.key));
            (group, (String::from_utf8_lossy(&kv.value).into_owned(), kv))
        })
        .collect()
}

/// How many groups each instance leads.
fn led_by(leaders: &BTreeMap<u32, (String, KeyValue)>) -> BTreeMap<String, usize> {
    let mut led = BTreeMap::new();
    for (instance, _) in leaders.values() {
        *led.entry(instance.clone()).or_default() += 1;
    }
    led
}

/// Waits until every group has a leader and `want` holds of who leads how many.
async fn wait_groups(
    cluster: &TestCluster,
    deadline: Duration,
    what: &str,
    want: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> BTreeMap<u32, (String, KeyValue)> {
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        let leaders = group_leaders(cluster).await;
        if leaders.len() == GROUPS as usize && want(&led_by(&leaders)) {
            return leaders;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: not within {deadline:?}; leaders {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every one of `instances` leads exactly `each` groups.
fn balanced(
    cluster: &TestCluster,
    instances: &[usize],
    each: usize,
) -> impl Fn(&BTreeMap<String, usize>) -> bool {
    let ids: Vec<String> = instances.iter().map(|i| cluster.instance(*i).id.clone()).collect();
    move |led| led.len() == ids.len() && ids.iter().all(|id| led.get(id) == Some(&each))
}

/// A cluster of `instances` whose config splits the topics in [`GROUPS`] and knows the
/// topics of [`one_topic_per_group`].
async fn cluster(instances: usize, ttl: Duration) -> TestCluster {
    TestCluster::start(Backend::Etcd, instances, |c| {
        c.leader_groups = GROUPS;
        c.lease_ttl = ttl;
        for topic in one_topic_per_group() {
            c.topic_partitions.insert(topic, PARTITIONS);
        }
    })
    .await
}

/// Three instances lead two groups each. One crashes: while its groups' keys still stand, a
/// join to a topic of a surviving group is planned at once (those topics keep running);
/// after the TTL the survivors take over the crashed instance's groups, three each. The
/// consumers of every topic, all on survivors, hear nothing throughout, and a write fenced
/// by the crashed instance's election of a group is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instance_hands_over_only_its_groups_and_the_other_topics_keep_running() {
    let ttl = Duration::from_secs(5);
    let mut cluster = cluster(3, ttl).await;
    let topics = one_topic_per_group();
    let leaders = wait_groups(&cluster, PROMPT, "two groups each", balanced(&cluster, &[0, 1, 2], 2)).await;

    // The victim is whoever leads group 0; every consumer lives on a survivor.
    let victim_id = leaders[&0].0.clone();
    let victim = cluster.instances.iter().position(|i| i.id == victim_id).expect("the leader is an instance");
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let mut owners: Vec<TestConsumer> = Vec::new();
    for (n, topic) in topics.iter().enumerate() {
        owners.push(cluster.sole_owner(survivors[n % 2], &format!("owner-{n}"), topic).await);
    }
    let seen: Vec<usize> = owners
        .iter_mut()
        .map(|c| {
            c.poll_now();
            c.seen()
        })
        .collect();

    let theirs: Vec<u32> = leaders.iter().filter(|(_, (id, _))| *id == victim_id).map(|(g, _)| *g).collect();
    let ours = (0..GROUPS).find(|g| !theirs.contains(g)).expect("survivors lead four groups");
    cluster.crash(victim).await;

    // A topic of a surviving group is planned while the victim's keys still stand.
    let mut joiner = cluster.consumer_on(survivors[0], "joiner", &topics[ours as usize]).await;
    joiner.expect_snapshot().await;
    joiner.wait_warms(PARTITIONS as usize / 2, PROMPT).await;
    let standing = group_leaders(&cluster).await;
    for group in &theirs {
        let still =
            standing.get(group).is_some_and(|(_, kv)| kv.create_revision == leaders[group].1.create_revision);
        assert!(
            still,
            "group {group}'s key expired before the join to group {ours} was planned: {standing:?}"
        );
    }

    // The survivors take the victim's groups over once its lease ends.
    let after =
        wait_groups(&cluster, ttl + PROMPT, "the survivors take over", balanced(&cluster, &survivors, 3))
            .await;
    for group in 0..GROUPS {
        let moved = after[&group].1.create_revision != leaders[&group].1.create_revision;
        assert_eq!(
            moved,
            theirs.contains(&group),
            "group {group}: before {:?}, after {:?}",
            leaders[&group],
            after[&group]
        );
    }

    // Nobody else heard a thing (the joiner's topic's owner was asked to hand over two).
    for (n, owner) in owners.iter_mut().enumerate() {
        owner.poll_now();
        if n != ours as usize {
            assert_eq!(owner.since(seen[n]).len(), 0, "{}: {:?}", owner.name, owner.since(seen[n]));
        }
    }

    // The victim's election of a group it led fences its writes.
    let group = theirs[0];
    let key = format!("{}leaders/{GROUPS}/{group}", cluster.config.prefix);
    let probe = format!("{}probe", cluster.config.prefix);
    let fenced = |revision| {
        Txn::new().when(Compare::CreateRevision(key.clone(), revision)).then(Op::put(&probe, b"x".to_vec()))
    };
    let stale =
        cluster.store.txn(fenced(leaders[&group].1.create_revision)).await.expect("the store answers");
    assert!(
        !stale.succeeded,
        "a write fenced by the crashed leader's election of group {group} went through"
    );
    let current =
        cluster.store.txn(fenced(after[&group].1.create_revision)).await.expect("the store answers");
    assert!(current.succeeded, "the same write fenced by the current election of group {group} is refused");
}

/// Two instances lead three groups each; a third joins and gets its two by hand-over, with
/// a TTL far longer than the test: no key is left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_instance_takes_its_share_by_hand_over() {
    let mut cluster = cluster(2, Duration::from_secs(60)).await;
    wait_groups(&cluster, PROMPT, "three groups each", balanced(&cluster, &[0, 1], 3)).await;
    let third = cluster.add_instance().await;
    wait_groups(&cluster, PROMPT, "two groups each", balanced(&cluster, &[0, 1, third], 2)).await;
    let gauges: Vec<bool> = (0..3).map(|i| cluster.instance(i).coordinator.is_leader()).collect();
    assert_eq!(gauges, [true, true, true], "every instance leads a group");
}

/// An instance configured with one group, started beside instances with six, does not
/// campaign while their keys stand (it would plan their topics under another key); once
/// they stop (resigning), it leads alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_with_another_group_count_does_not_campaign_beside_them() {
    let ttl = Duration::from_secs(1);
    let mut cluster = cluster(2, ttl).await;
    wait_groups(&cluster, PROMPT, "three groups each", balanced(&cluster, &[0, 1], 3)).await;
    cluster.config.leader_groups = 1;
    let single = cluster.add_instance().await;
    let key = format!("{}leader", cluster.config.prefix);
    // Past the vacancy grace (one TTL) and many looks: still no single leader key.
    let until = tokio::time::Instant::now() + ttl * 3;
    while tokio::time::Instant::now() < until {
        let found = cluster.store.get(&key).await.expect("read the leader key");
        assert!(found.is_none(), "the one-group instance campaigned beside six groups: {found:?}");
        assert!(!cluster.instance(single).coordinator.is_leader());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop(0).await;
    cluster.stop(1).await;
    let leader = cluster.wait_leader(PROMPT).await;
    assert_eq!(leader, single);
}
