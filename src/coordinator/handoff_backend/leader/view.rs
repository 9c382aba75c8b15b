//! What the leader takes from the Kubernetes view ([`crate::drain::RolloutView`]) when it
//! plans a topic, from memory (never waits on the API): the rollout among the topic's
//! consumers, and each consumer's current info where the view has its pod, which wins over
//! the info stored at registration (a pod whose node's zone was not known yet when it
//! registered gets it now). Neither is written to the store.

use std::collections::BTreeSet;

use super::super::HandoffConfig;
use crate::assignment::{ConsumerInfo, Rollout};
use crate::handoff::TopicState;

/// Puts the view's info into `state`, and returns the rollout among its consumers.
pub(super) fn from_view(config: &HandoffConfig, state: &mut TopicState) -> Option<Rollout> {
    let view = config.rollout.as_ref()?;
    with_current_info(state, |consumer| view.info(consumer));
    let live: BTreeSet<String> = state.consumers.keys().cloned().collect();
    let active: BTreeSet<String> = live.iter().filter(|c| state.is_active(c)).cloned().collect();
    view.rollout(&live, &active)
}

/// Replaces the stored info of each live consumer that `current` knows with what it says
/// (`state.info` keeps holding only consumers with more than the defaults).
fn with_current_info(state: &mut TopicState, current: impl Fn(&str) -> Option<ConsumerInfo>) {
    for name in state.consumers.keys() {
        match current(name) {
            Some(info) if info.is_default() => {
                state.info.remove(name);
            }
            Some(info) => {
                state.info.insert(name.clone(), info);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::ConsumerStatus;

    fn zoned(zone: &str, capacity: u32) -> ConsumerInfo {
        ConsumerInfo { zone: Some(zone.into()), capacity, generation: None }
    }

    #[test]
    fn the_views_info_wins_where_it_knows_the_pod() {
        let mut state = TopicState::default();
        for name in ["late", "moved", "plain", "gone-pod"] {
            state.consumers.insert(name.into(), ConsumerStatus::Active);
        }
        // Stored at registration: "moved" and "gone-pod" had info, the others none.
        state.info.insert("moved".into(), zoned("eu-1a", 2));
        state.info.insert("gone-pod".into(), zoned("eu-1c", 3));
        // A stale entry of a consumer that is no longer live is not the view's business.
        state.info.insert("left".into(), zoned("eu-1a", 1));
        with_current_info(&mut state, |name| match name {
            "late" => Some(zoned("eu-1b", 1)),
            "moved" | "plain" => Some(ConsumerInfo::default()),
            _ => None,
        });
        assert_eq!(state.info.get("late"), Some(&zoned("eu-1b", 1)), "zone known only now");
        assert_eq!(state.info.get("moved"), None, "the view's defaults win: stored as nothing");
        assert_eq!(state.info.get("plain"), None);
        assert_eq!(state.info.get("gone-pod"), Some(&zoned("eu-1c", 3)), "unknown to the view: as stored");
        assert_eq!(state.info.get("left"), Some(&zoned("eu-1a", 1)));
    }
}
