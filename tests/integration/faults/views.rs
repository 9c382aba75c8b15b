//! What the fault scenarios check, from the consumers' side: who was told it owns what,
//! and when; a fleet of consumers that reconnect like real clients; readiness probes.
//!
//! A consumer believes it owns a partition from the command that assigned it (snapshot or
//! `AssignmentUpdate`) until it is told `ReleasePartition` (the release window may overlap
//! the new owner), `unassigned`, or its stream ends. Ending belief at the stream's end is
//! lenient (a real client may keep processing until its session timeout), so a reported
//! overlap is certainly one.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use kafka_assigner::proto::v1::assignment_command::Command;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::support::{
    POLL_INTERVAL,
    assigner::{TestCluster, TestConsumer, is_stable, owned_by, try_topic},
};

/// Skew allowed between the new owner hearing `assigned` and the old owner hearing
/// `ReleasePartition` / `unassigned` (docs/design.md §5: "in the same step"; the two may be on
/// different instances, each relaying from its own watch).
pub const SAME_STEP: Duration = Duration::from_millis(300);

/// Consumers of one topic, as real clients: a stream that ends is registered again under
/// the same name (on the next instance that is up); every stream ever opened is kept for
/// the ownership check.
pub struct Fleet {
    /// The topic.
    pub topic: String,
    /// The live stream per consumer name (it may have ended, until the next reconnect).
    pub live: BTreeMap<String, TestConsumer>,
    /// Streams that ended and were replaced.
    pub retired: Vec<TestConsumer>,
    /// Reconnects done.
    pub reconnects: usize,
    /// The k-th consumer (in name order) waits k times this after its stream ends before
    /// registering again, as clients with backoff and jitter come back one by one.
    pub stagger: Duration,
    /// No reconnect before this (the test holds clients back while the store is away, as
    /// their backoff would, so that they come back one by one once it returns).
    pub not_before: Option<Instant>,
    next_instance: usize,
}

impl Fleet {
    /// Registers `names` on the instances that are up, round robin.
    pub async fn join(cluster: &TestCluster, topic: &str, names: &[&str]) -> Fleet {
        let mut fleet = Fleet {
            topic: topic.into(),
            live: BTreeMap::new(),
            retired: Vec::new(),
            reconnects: 0,
            stagger: Duration::ZERO,
            not_before: None,
            next_instance: 0,
        };
        for name in names {
            let i = fleet.pick(cluster);
            let mut consumer = cluster.consumer_on(i, name, topic).await;
            consumer.expect_snapshot().await;
            fleet.live.insert(name.to_string(), consumer);
        }
        fleet
    }

    /// A fleet of consumers registered by the test (snapshots already taken).
    pub fn from_streams(topic: &str, consumers: Vec<TestConsumer>) -> Fleet {
        let live = consumers.into_iter().map(|c| (c.name.clone(), c)).collect();
        Fleet {
            topic: topic.into(),
            live,
            retired: Vec::new(),
            reconnects: 0,
            stagger: Duration::ZERO,
            not_before: None,
            next_instance: 0,
        }
    }

    /// The next instance that is up, round robin.
    fn pick(&mut self, cluster: &TestCluster) -> usize {
        let n = cluster.instances.len();
        for _ in 0..n {
            let i = self.next_instance % n;
            self.next_instance += 1;
            if cluster.instance(i).is_up() {
                return i;
            }
        }
        panic!("no instance is up")
    }

    /// Answers every warm and release, and registers again every consumer whose stream
    /// ended (one try each: a refused reconnect is tried on the next pass).
    pub async fn pass(&mut self, cluster: &TestCluster) {
        let names: Vec<String> = self.live.keys().cloned().collect();
        for (k, name) in names.into_iter().enumerate() {
            let Some(consumer) = self.live.get_mut(&name) else { continue };
            consumer.poll_now();
            if consumer.ended.is_none() {
                consumer.answer_all().await;
                continue;
            }
            let delay = self.stagger * u32::try_from(k).unwrap_or(u32::MAX);
            let ended = consumer.ended_at.unwrap_or_else(Instant::now);
            let from = self.not_before.map_or(ended, |not_before| not_before.max(ended));
            if Instant::now() < from + delay {
                continue;
            }
            let i = self.pick(cluster);
            let attempt =
                tokio::time::timeout(Duration::from_secs(6), cluster.try_consumer_on(i, &name, &self.topic));
            if let Ok(Ok(fresh)) = attempt.await
                && let Some(old) = self.live.insert(name, fresh)
            {
                self.retired.push(old);
                self.reconnects += 1;
            }
        }
    }

    /// Drives the fleet until every consumer streams and the topic is stable with every
    /// consumer's view equal to the store's; returns how long that took.
    pub async fn settle(&mut self, cluster: &TestCluster, deadline: Duration) -> Duration {
        let started = Instant::now();
        loop {
            self.pass(cluster).await;
            if self.is_settled(cluster).await {
                return started.elapsed();
            }
            if started.elapsed() >= deadline {
                let status = crate::support::assigner::json(&cluster.status().await);
                panic!(
                    "the fleet did not settle within {deadline:?}; status {status}; fleet {:#?}",
                    self.live
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn is_settled(&self, cluster: &TestCluster) -> bool {
        let status = cluster.status().await;
        let Some(topic) = try_topic(&status, &self.topic) else { return false };
        is_stable(topic)
            && self.live.values().all(|c| {
                c.ended.is_none()
                    && c.warms.is_empty()
                    && c.releases.is_empty()
                    && owned_by(topic, &c.name) == c.owned
            })
            && topic.consumers.len() == self.live.len()
    }

    /// What each consumer believes it owns now.
    pub fn owned(&self) -> BTreeMap<String, BTreeSet<u32>> {
        self.live.iter().map(|(name, c)| (name.clone(), c.owned.clone())).collect()
    }

    /// Every stream ever opened.
    pub fn streams(&self) -> impl Iterator<Item = &TestConsumer> {
        self.retired.iter().chain(self.live.values())
    }

    /// Double ownership seen by the consumers (see [`double_ownership`]).
    pub fn double_ownership(&self) -> Vec<String> {
        double_ownership(self.streams())
    }
}

/// One consumer's belief that it owns a partition, from when it was told so until it was
/// told to release it (the release window is allowed to overlap) or to drop it, or its
/// stream ended.
#[derive(Debug)]
struct Belief {
    consumer: String,
    partition: u32,
    from: Instant,
    until: Instant,
}

fn beliefs(consumer: &TestConsumer, now: Instant) -> Vec<Belief> {
    let mut open: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut done = Vec::new();
    let mut close = |open: &mut BTreeMap<u32, Instant>, p: u32, at: Instant| {
        if let Some(from) = open.remove(&p) {
            done.push(Belief { consumer: consumer.name.clone(), partition: p, from, until: at });
        }
    };
    for (at, command) in &consumer.history {
        match &command.command {
            Some(Command::Assignment(update)) => {
                for tp in &update.unassigned {
                    close(&mut open, tp.partition, *at);
                }
                for tp in &update.assigned {
                    open.entry(tp.partition).or_insert(*at);
                }
            }
            Some(Command::Release(release)) => {
                if let Some(tp) = &release.partition {
                    close(&mut open, tp.partition, *at);
                }
            }
            _ => {}
        }
    }
    let end = consumer.ended_at.unwrap_or(now);
    for p in open.keys().copied().collect::<Vec<_>>() {
        close(&mut open, p, end);
    }
    done
}

/// Pairs of consumers that both believed they owned a partition for longer than
/// [`SAME_STEP`] at once, outside a release window.
pub fn double_ownership<'a>(streams: impl Iterator<Item = &'a TestConsumer>) -> Vec<String> {
    let now = Instant::now();
    let all: Vec<Belief> = streams.flat_map(|c| beliefs(c, now)).collect();
    let mut found = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.partition != b.partition || a.consumer == b.consumer {
                continue;
            }
            let (from, until) = (a.from.max(b.from), a.until.min(b.until));
            if until > from && until - from > SAME_STEP {
                found.push(format!(
                    "partition {} owned by {} and {} at once for {:?}",
                    a.partition,
                    a.consumer,
                    b.consumer,
                    until - from
                ));
            }
        }
    }
    found
}

/// `/ready` of instance `i`'s admin server: true on 200.
pub async fn http_ready(cluster: &TestCluster, i: usize) -> bool {
    let addr = cluster.instance(i).admin_addr;
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        conn.write_all(b"GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut response = String::new();
        conn.read_to_string(&mut response).await.ok()?;
        Some(response.starts_with("HTTP/1.1 200"))
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(true)))
}

/// gRPC health of the assigner service on instance `i`: true when `SERVING`.
pub async fn grpc_serving(cluster: &TestCluster, i: usize) -> bool {
    let url = cluster.instance(i).grpc_url.clone();
    let probe = async {
        let channel = tonic::transport::Endpoint::from_shared(url).ok()?.connect().await.ok()?;
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest { service: "kafka_assigner.v1.KafkaAssigner".into() };
        let response = client.check(request).await.ok()?;
        Some(response.into_inner().status == ServingStatus::Serving as i32)
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(true)))
}

/// Partitions whose owner differs between two views.
pub fn moved(before: &BTreeMap<String, BTreeSet<u32>>, after: &BTreeMap<String, BTreeSet<u32>>) -> usize {
    let owner = |view: &BTreeMap<String, BTreeSet<u32>>| -> BTreeMap<u32, String> {
        view.iter().flat_map(|(name, ps)| ps.iter().map(move |p| (*p, name.clone()))).collect()
    };
    let (a, b) = (owner(before), owner(after));
    a.iter().filter(|(p, name)| b.get(p) != Some(name)).count()
}
