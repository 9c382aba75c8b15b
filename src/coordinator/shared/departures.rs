//! Registrations whose streams are gone, as each machine settles them: each is kept
//! as long as the backend says ([`Held`]: one TTL after its stream ended, so a quick
//! reconnect keeps the partitions, or until a `SHUTDOWN_NOW` hold ends), then deleted if it
//! is still the same registration. A reconnect (here or elsewhere) replaces the record,
//! which ends the wait. Before the cache has seen the registration, it counts as held for
//! the TTL. The registration of a consumer that left ([`Departed::left`]) is due at once:
//! nothing is kept for a consumer that said goodbye.
//!
//! Pure: the machine hands it the time (monotonic and wall clock) and the cache, and
//! deletes what [`Departures::due_with`] returns.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

use super::mirror::MirrorCache;
use super::streams::StreamKey;
use crate::handoff::Millis;
use crate::store::Revision;

/// How long a registration whose stream is gone is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// It is not this stream's any more (replaced or gone): nothing to do.
    NotOurs,
    /// For the consumer TTL after the stream ended.
    ForTtl,
    /// Until this wall-clock time (a `SHUTDOWN_NOW` hold for the consumer's restart).
    Until(Millis),
}

/// A stream that ended without its consumer leaving: its registration waits here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departed {
    /// The stream's registration.
    pub key: StreamKey,
    /// The revision its registration was written at.
    pub registered_at: Revision,
    /// When its stream ended.
    pub at: Instant,
    /// Its consumer left (drained, or deregistered): the registration is deleted at once,
    /// whatever its hold, if it is still the same one.
    pub left: bool,
}

/// The registrations waiting to be settled, and when each is due.
#[derive(Debug)]
pub struct Departures {
    ttl: Duration,
    /// Ordered, so that what falls due at one look is settled in one order on every run
    /// (the whole-cluster simulation replays a seed exactly).
    waiting: BTreeMap<StreamKey, Waiting>,
}

#[derive(Debug)]
struct Waiting {
    registered_at: Revision,
    at: Instant,
    /// When it is due, as of the last look.
    due: Instant,
    /// Its consumer left: due at once.
    left: bool,
}

impl Departures {
    /// No registration waits; each that comes is kept for `ttl` (or its hold).
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, waiting: BTreeMap::new() }
    }

    /// `departed`'s registration waits from now on.
    pub fn add(&mut self, departed: Departed) {
        let Departed { key, registered_at, at, left } = departed;
        let due = if left { at } else { at + self.ttl };
        self.waiting.insert(key, Waiting { registered_at, at, due, left });
    }

    /// Whether the registration `key` waits here.
    pub fn contains(&self, key: &StreamKey) -> bool {
        self.waiting.contains_key(key)
    }

    /// Whether the registration `key` waits here as one whose consumer left (due at once).
    pub fn is_left(&self, key: &StreamKey) -> bool {
        self.waiting.get(key).is_some_and(|waiting| waiting.left)
    }

    /// The earliest a waiting registration is due (`None` when none waits).
    pub fn wake_at(&self) -> Option<Instant> {
        self.waiting.values().map(|w| w.due).min()
    }

    /// Looks at every waiting registration on `cache` at `now` (`now_ms` on the wall clock,
    /// for holds), `held` the backend's hold rule (pure): forgets those that are not theirs
    /// any more, and returns those whose time is up, to be deleted if they are still theirs.
    pub fn due_with<C: MirrorCache>(
        &mut self,
        held: impl Fn(&C, &StreamKey) -> Held,
        cache: &C,
        now: Instant,
        now_ms: Millis,
    ) -> Vec<StreamKey> {
        let mut due = Vec::new();
        self.waiting.retain(|key, waiting| {
            let held =
                if cache.revision() < waiting.registered_at { Held::ForTtl } else { held(cache, key) };
            waiting.due = match held {
                Held::NotOurs => return false,
                _ if waiting.left => waiting.at,
                Held::ForTtl => waiting.at + self.ttl,
                Held::Until(until) => now + Duration::from_millis(until.saturating_sub(now_ms)),
            };
            if now < waiting.due {
                return true;
            }
            if !waiting.left {
                tracing::info!(topic = %key.0, consumer = %key.1, ?held, "consumer did not come back; its registration ends");
            }
            due.push(key.clone());
            false
        });
        due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Departed, Departures, Held};
    use crate::coordinator::shared::test_cache::{Records, registration};
    use crate::handoff::Millis;
    use crate::store::{KeyValue, SessionId};

    const TTL: Duration = Duration::from_secs(3);

    /// The test cache's hold rule: a registration is held for the TTL while its record
    /// holds its id.
    fn held(cache: &Records, key: &(String, String, SessionId)) -> Held {
        match cache.kvs.get(&registration(&key.0, &key.1)) {
            Some(kv) if kv.value == key.2.0.to_string().into_bytes() => Held::ForTtl,
            _ => Held::NotOurs,
        }
    }

    /// What of `departures` is due on `cache` at `now` (`now_ms` on the wall clock).
    fn due(
        departures: &mut Departures,
        cache: &Records,
        now: Instant,
        now_ms: Millis,
    ) -> Vec<(String, String, SessionId)> {
        departures.due_with(held, cache, now, now_ms)
    }

    /// A cache at `revision` holding `consumer`'s registration `id` on topic `t`, if any.
    fn cache(revision: i64, record: Option<(&str, i64)>) -> Records {
        let mut records = Records { revision, ..Records::default() };
        if let Some((consumer, id)) = record {
            let key = registration("t", consumer);
            let kv = KeyValue {
                key: key.clone(),
                value: id.to_string().into_bytes(),
                mod_revision: 5,
                create_revision: 5,
                session: None,
            };
            records.kvs.insert(key, kv);
        }
        records
    }

    #[test]
    fn a_registration_is_due_one_ttl_after_its_stream_ended_and_not_before() {
        let mut departures = Departures::new(TTL);
        let at = Instant::now();
        let key = ("t".to_string(), "c".to_string(), SessionId(7));
        departures.add(Departed { key: key.clone(), registered_at: 5, at, left: false });
        let seen = cache(6, Some(("c", 7)));
        assert!(due(&mut departures, &seen, at, 0).is_empty());
        assert_eq!(departures.wake_at(), Some(at + TTL));
        assert!(due(&mut departures, &seen, at + TTL - Duration::from_millis(1), 0).is_empty());
        assert_eq!(due(&mut departures, &seen, at + TTL, 0), vec![key]);
        assert_eq!(departures.wake_at(), None, "settled once");
    }

    #[test]
    fn a_registration_replaced_by_a_reconnect_is_forgotten() {
        let mut departures = Departures::new(TTL);
        let at = Instant::now();
        departures.add(Departed {
            key: ("t".into(), "c".into(), SessionId(7)),
            registered_at: 5,
            at,
            left: false,
        });
        assert!(due(&mut departures, &cache(8, Some(("c", 8))), at, 0).is_empty());
        assert_eq!(departures.wake_at(), None, "the new registration is not this one's to end");
        departures.add(Departed {
            key: ("t".into(), "d".into(), SessionId(9)),
            registered_at: 5,
            at,
            left: false,
        });
        assert!(due(&mut departures, &cache(8, None), at + TTL, 0).is_empty(), "gone already");
        assert_eq!(departures.wake_at(), None);
    }

    #[test]
    fn before_the_cache_saw_the_registration_it_is_held_for_the_ttl() {
        let mut departures = Departures::new(TTL);
        let at = Instant::now();
        let key = ("t".to_string(), "c".to_string(), SessionId(7));
        departures.add(Departed { key: key.clone(), registered_at: 9, at, left: false });
        // The cache (revision 8) has not seen the write at 9: no record, yet it waits.
        assert!(due(&mut departures, &cache(8, None), at, 0).is_empty());
        assert_eq!(due(&mut departures, &cache(8, None), at + TTL, 0), vec![key]);
    }

    #[test]
    fn the_registration_of_a_consumer_that_left_is_due_at_once_if_it_is_still_its_own() {
        let mut departures = Departures::new(TTL);
        let at = Instant::now();
        let key = ("t".to_string(), "c".to_string(), SessionId(7));
        departures.add(Departed { key: key.clone(), registered_at: 5, at, left: true });
        assert_eq!(departures.wake_at(), Some(at), "no TTL to wait for");
        assert_eq!(due(&mut departures, &cache(6, Some(("c", 7))), at, 0), vec![key.clone()]);
        departures.add(Departed { key, registered_at: 5, at, left: true });
        assert!(due(&mut departures, &cache(8, Some(("c", 8))), at, 0).is_empty(), "replaced: not its own");
        assert_eq!(departures.wake_at(), None);
    }
}
