//! Consumers in the test process: one `AssignerClient` each, connected to assigner
//! containers, with a handler that records what it was told, when. The checks read those
//! timelines: who owned what at any moment, double owners, partitions that changed owner,
//! how long a consumer held less than before (its processing pause), and when its stream
//! was down.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use kafka_assigner::client::{AssignerClient, Backoff, ClientConfig, Handler, Partition, WarmError};

use super::stack::{PARTITIONS, TOPIC};

/// How long a new owner's `assigned` may precede the old owner's `release` (docs/design.md
/// §5: "in the same step", from two instances' own watches); the fault suite allows the same.
pub const SAME_STEP: Duration = Duration::from_millis(300);

/// A gain (`true`) or loss of a partition, as the handler was told.
type Event = (Instant, u32, bool);

/// Records `assigned` as a gain, `release` (when it returns) and `unassigned` as a loss.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    fn push(&self, p: Partition, gained: bool) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), p.partition, gained));
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn warm(&self, _: Partition) -> Result<(), WarmError> {
        Ok(())
    }

    async fn assigned(&self, p: Partition) {
        self.push(p, true);
    }

    async fn release(&self, p: Partition) {
        self.push(p, false);
    }

    async fn unassigned(&self, p: Partition) {
        self.push(p, false);
    }
}

/// One consumer: its client, what it was told, and when its stream was up.
struct Member {
    name: String,
    client: Option<AssignerClient>,
    recorder: Arc<Recorder>,
    connected: Arc<Mutex<Vec<(Instant, bool)>>>,
    watcher: tokio::task::JoinHandle<()>,
}

/// The consumers of a scenario.
pub struct Fleet {
    members: Vec<Member>,
    call_timeout: Duration,
}

impl Fleet {
    /// Starts one client per `(name, endpoints)`, for assigners with session TTL `ttl`.
    pub fn join(consumers: &[(&str, Vec<String>)], ttl: Duration) -> Fleet {
        Fleet::join_with(consumers, ttl, Duration::from_secs(2))
    }

    /// [`join`](Self::join), with each client's connect and call timeout.
    pub fn join_with(consumers: &[(&str, Vec<String>)], ttl: Duration, call_timeout: Duration) -> Fleet {
        let mut fleet = Fleet { members: Vec::new(), call_timeout };
        for (name, endpoints) in consumers {
            fleet.add(name, endpoints, ttl);
        }
        fleet
    }

    /// Starts one more client.
    pub fn add(&mut self, name: &str, endpoints: &[String], ttl: Duration) {
        let member = [(name, endpoints.to_vec())]
            .iter()
            .map(|(name, endpoints)| {
                let mut config =
                    ClientConfig::new(endpoints.clone(), *name, TOPIC).with_server_lease_ttl(ttl);
                config.backoff =
                    Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
                config.call_timeout = self.call_timeout;
                let recorder = Arc::new(Recorder::default());
                let client = AssignerClient::start(config, recorder.clone(), None)
                    .unwrap_or_else(|e| panic!("client {name}: {e}"));
                let connected = Arc::new(Mutex::new(Vec::new()));
                let mut watch = client.connected();
                let log = connected.clone();
                let watcher = tokio::spawn(async move {
                    loop {
                        let up = *watch.borrow_and_update();
                        log.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), up));
                        if watch.changed().await.is_err() {
                            return;
                        }
                    }
                });
                Member { name: name.to_string(), client: Some(client), recorder, connected, watcher }
            })
            .next();
        self.members.extend(member);
    }

    fn events(&self, m: &Member) -> Vec<Event> {
        m.recorder.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What each consumer owned at `at` (by what it was told up to then).
    pub fn owned_at(&self, at: Instant) -> BTreeMap<String, BTreeSet<u32>> {
        self.members
            .iter()
            .map(|m| {
                let mut set = BTreeSet::new();
                for (_, p, gained) in self.events(m).into_iter().filter(|(t, ..)| *t <= at) {
                    if gained {
                        set.insert(p);
                    } else {
                        set.remove(&p);
                    }
                }
                (m.name.clone(), set)
            })
            .collect()
    }

    /// What each consumer owns now.
    pub fn owned(&self) -> BTreeMap<String, BTreeSet<u32>> {
        self.owned_at(Instant::now())
    }

    /// Partition → its owner now, when it has exactly one.
    pub fn owners(&self) -> BTreeMap<u32, String> {
        let mut owners = BTreeMap::new();
        for (name, set) in self.owned() {
            for p in set {
                owners.insert(p, name.clone());
            }
        }
        owners
    }

    /// Waits until every partition has one owner, the consumers `among` share them evenly,
    /// and it stays so for 300 ms; returns the owners.
    pub async fn settle(&self, among: &[&str], deadline: Duration) -> BTreeMap<u32, String> {
        let give_up = Instant::now() + deadline;
        let mut since: Option<(Instant, BTreeMap<String, BTreeSet<u32>>)> = None;
        loop {
            let owned = self.owned();
            let counts: Vec<usize> = among.iter().map(|n| owned.get(*n).map_or(0, BTreeSet::len)).collect();
            let total: usize = owned.values().map(BTreeSet::len).sum();
            let even = counts.iter().max().zip(counts.iter().min()).is_some_and(|(max, min)| max - min <= 1);
            let settled = total == PARTITIONS as usize
                && counts.iter().sum::<usize>() == total
                && self.owners().len() == total
                && even;
            since = match since {
                Some((t, before)) if settled && before == owned => {
                    if t.elapsed() >= Duration::from_millis(300) {
                        return self.owners();
                    }
                    Some((t, before))
                }
                _ if settled => Some((Instant::now(), owned.clone())),
                _ => None,
            };
            assert!(Instant::now() < give_up, "the consumers did not settle within {deadline:?}: {owned:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every partition two consumers owned at once for longer than [`SAME_STEP`], as
    /// messages, and the longest overlap seen (findings or not).
    pub fn double_owners(&self) -> (Vec<String>, Duration) {
        let mut all: Vec<(Instant, usize, u32, bool)> = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            all.extend(self.events(m).into_iter().map(|(t, p, g)| (t, i, p, g)));
        }
        all.sort_by_key(|(t, ..)| *t);
        let mut holders: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
        let mut overlapping: BTreeMap<u32, (Instant, Vec<String>)> = BTreeMap::new();
        let (mut found, mut longest) = (Vec::new(), Duration::ZERO);
        let mut close = |p: u32, since: Instant, names: Vec<String>, at: Instant| {
            longest = longest.max(at - since);
            if at - since > SAME_STEP {
                found.push(format!("partition {p} owned by {names:?} for {:?}", at - since));
            }
        };
        for (t, i, p, gained) in all {
            let set = holders.entry(p).or_default();
            if gained {
                set.insert(i);
            } else {
                set.remove(&i);
            }
            if set.len() > 1 && !overlapping.contains_key(&p) {
                let names = set.iter().map(|i| self.members[*i].name.clone()).collect();
                overlapping.insert(p, (t, names));
            } else if set.len() <= 1
                && let Some((since, names)) = overlapping.remove(&p)
            {
                close(p, since, names, t);
            }
        }
        for (p, (since, names)) in overlapping {
            close(p, since, names, Instant::now());
        }
        (found, longest)
    }

    /// Partitions a consumer other than their owner in `before` was given since `from`.
    pub fn moved_since(&self, from: Instant, before: &BTreeMap<u32, String>) -> Vec<String> {
        let mut moved = Vec::new();
        for m in &self.members {
            for (_, p, gained) in self.events(m).into_iter().filter(|(t, ..)| *t > from) {
                if gained && before.get(&p) != Some(&m.name) {
                    moved.push(format!("partition {p} went to {} (was {:?})", m.name, before.get(&p)));
                }
            }
        }
        moved
    }

    /// When, after `from`, consumer `name` first owned nothing.
    pub fn emptied_after(&self, name: &str, from: Instant) -> Option<Duration> {
        let m = self.member(name);
        let mut set = self.owned_at(from).remove(name).unwrap_or_default();
        for (t, p, gained) in self.events(m).into_iter().filter(|(t, ..)| *t > from) {
            if gained {
                set.insert(p);
            } else {
                set.remove(&p);
            }
            if set.is_empty() {
                return Some(t - from);
            }
        }
        None
    }

    /// When, after `from`, consumer `name`'s stream first went down.
    pub fn stream_down_after(&self, name: &str, from: Instant) -> Option<Duration> {
        let log = self.member(name).connected.lock().unwrap_or_else(|e| e.into_inner()).clone();
        log.into_iter().find(|(t, up)| *t > from && !*up).map(|(t, _)| t - from)
    }

    /// Longest stretch after `from` in which consumer `name` owned less than at `from`: its
    /// processing pause (zero when it never let go of anything).
    pub fn longest_pause(&self, name: &str, from: Instant) -> Duration {
        let m = self.member(name);
        let full = self.owned_at(from).remove(name).unwrap_or_default();
        let mut set = full.clone();
        let (mut short_since, mut longest) = (None::<Instant>, Duration::ZERO);
        for (t, p, gained) in self.events(m).into_iter().filter(|(t, ..)| *t > from) {
            if gained {
                set.insert(p);
            } else {
                set.remove(&p);
            }
            match (short_since, full.is_subset(&set)) {
                (None, false) => short_since = Some(t),
                (Some(s), true) => {
                    longest = longest.max(t - s);
                    short_since = None;
                }
                _ => {}
            }
        }
        if let Some(s) = short_since {
            longest = longest.max(s.elapsed());
        }
        longest
    }

    /// Longest stretch after `from` in which consumer `name`'s stream was down.
    pub fn longest_disconnect(&self, name: &str, from: Instant) -> Duration {
        let log = self.member(name).connected.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (mut down_since, mut longest) = (None::<Instant>, Duration::ZERO);
        for (t, up) in log.into_iter().filter(|(t, _)| *t > from) {
            match (down_since, up) {
                (None, false) => down_since = Some(t),
                (Some(s), true) => {
                    longest = longest.max(t - s);
                    down_since = None;
                }
                _ => {}
            }
        }
        if let Some(s) = down_since {
            longest = longest.max(s.elapsed());
        }
        longest
    }

    fn member(&self, name: &str) -> &Member {
        self.members.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no consumer {name}"))
    }

    /// How consumer `name`'s client ended, if it did (it only ends on a fatal error).
    pub async fn ended(&mut self, name: &str) -> Option<String> {
        let member = self.members.iter_mut().find(|m| m.name == name)?;
        let client = member.client.as_mut()?;
        let result = tokio::time::timeout(Duration::from_millis(10), client.join()).await.ok()?;
        Some(format!("{result:?}"))
    }

    /// Whether consumer `name`'s stream is up now.
    pub fn connected(&self, name: &str) -> bool {
        self.member(name).client.as_ref().is_some_and(|c| *c.connected().borrow())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for m in &mut self.members {
            m.watcher.abort();
            // Dropped, not shut down: the containers go away with the test anyway.
            m.client.take();
        }
    }
}
