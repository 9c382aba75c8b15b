//! This instance's own committed writes in its mirror (pure): the batch the watch will
//! deliver for one, and where it goes in the cache — in turn, ahead of revisions the
//! cache has not seen, or later — and how a watched revision steps over what an own write
//! already applied. The running mirror ([`super::Mirror`]) and the instance's state
//! machine apply own writes by these rules.

use super::{Changes, MirrorCache};
use crate::store::{Compare, KeyValue, Op, Revision, WatchBatch, WatchEvent, WatchEventKind};

/// What the watch will deliver for a transaction of `ops` that this instance committed at
/// `revision`: its changes under `prefix`, to [`Mirror::offer`]. `None` without a put: a
/// transaction of deletes alone may change nothing, and then `revision` is not its own.
///
/// A put's `create_revision` is unknown when the key existed before, so it is set to
/// `revision`: offer only records whose cache reads the mod revision alone.
pub fn own_batch(prefix: &str, revision: Revision, ops: &[Op]) -> Option<WatchBatch> {
    if !ops.iter().any(|op| matches!(op, Op::Put { .. })) {
        return None;
    }
    let events = ops
        .iter()
        .filter_map(|op| {
            let (key, kind) = match op {
                Op::Put { key, value, session } => {
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision: revision,
                        mod_revision: revision,
                        session: *session,
                    };
                    (key, WatchEventKind::Put(kv))
                }
                Op::Delete { key } => (key, WatchEventKind::Delete),
            };
            key.starts_with(prefix).then(|| WatchEvent { key: key.clone(), revision, kind })
        })
        .collect::<Vec<_>>();
    (!events.is_empty()).then_some(WatchBatch { revision, events })
}

/// Where an own write committed at `batch.revision` with `compares` goes in `cache` (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnFit {
    /// Next in turn: the cache is at the revision before it.
    InTurn,
    /// Ahead of revisions the cache has not seen: its compares held every key it writes at
    /// the mod revision the cache holds ([`apply_ahead`]).
    Ahead,
    /// Neither: it waits for its turn (the watch brings it).
    Later,
}

/// Where an own write goes (see [`OwnFit`]; [`Mirror::apply_own_now`]).
pub fn own_write_fits<C: MirrorCache>(
    cache: &C,
    keys: &C::Keys,
    batch: &WatchBatch,
    compares: &[Compare],
) -> OwnFit {
    if batch.revision == cache.revision() + 1 {
        OwnFit::InTurn
    } else if batch.revision > cache.revision() && writes_as_compared(cache, keys, batch, compares) {
        OwnFit::Ahead
    } else {
        OwnFit::Later
    }
}

/// Applies an own write ahead of revisions the cache has not seen ([`OwnFit::Ahead`]): the
/// cache's revision stays where the watch is.
pub fn apply_ahead<C: MirrorCache>(cache: &mut C, keys: &C::Keys, batch: WatchBatch, changes: &mut Changes) {
    let watched = cache.revision();
    for event in batch.events {
        cache.apply(keys, event, changes);
    }
    cache.set_revision(watched);
}

/// Applies the changes of one revision after the cache's, as the watch delivers them, and
/// moves the cache to it. A key an own write changed ahead of the watch (`ahead`: the
/// newest such write's revision) may hold this revision's record or a newer one already:
/// that change is skipped, so the cache never goes back.
pub fn apply_watched<C: MirrorCache>(
    cache: &mut C,
    keys: &C::Keys,
    revision: Revision,
    events: Vec<WatchEvent>,
    ahead: Revision,
    changes: &mut Changes,
) {
    let ahead = ahead >= revision;
    for event in events {
        if ahead && cache.mod_revision(keys, &event.key).is_some_and(|held| held >= revision) {
            continue;
        }
        cache.apply(keys, event, changes);
    }
    cache.set_revision(cache.revision().max(revision));
}

/// Whether `compares` hold every key `batch` writes at the mod revision `cache` holds for
/// it: then nothing changed those keys between the cache and the batch's revision.
fn writes_as_compared<C: MirrorCache>(
    cache: &C,
    keys: &C::Keys,
    batch: &WatchBatch,
    compares: &[Compare],
) -> bool {
    batch.events.iter().all(|event| {
        let Some(cached) = cache.mod_revision(keys, &event.key) else { return false };
        compares.iter().any(|c| matches!(c, Compare::ModRevision(k, r) if *k == event.key && *r == cached))
    })
}
