//! `Register`s that wait for their topic's record: the record is made sure of once for
//! all those of a topic that arrive while it is being written (or its count asked of
//! Kafka), not once each (pure).
//!
//! Until the watch brings the topic's record back, the cache does not hold it, so every
//! `Register` of a new topic would otherwise write it again: a storm of ten thousand on a
//! new topic sent ten thousand topic writes at once, unbatched.

use std::collections::BTreeMap;

/// The topics whose record is being made sure of, and the registrations waiting for it.
#[derive(Debug)]
pub struct TopicWaits<E> {
    waiting: BTreeMap<String, Vec<E>>,
}

impl<E> Default for TopicWaits<E> {
    fn default() -> Self {
        Self { waiting: BTreeMap::new() }
    }
}

impl<E> TopicWaits<E> {
    /// `enrolling` needs `topic`'s record: it waits (`None`) if another registration is
    /// making sure of it already, or is handed back (`Some`) to do it, the others waiting.
    pub fn lead_or_wait(&mut self, topic: &str, enrolling: E) -> Option<E> {
        match self.waiting.get_mut(topic) {
            Some(waiters) => {
                waiters.push(enrolling);
                None
            }
            None => {
                self.waiting.insert(topic.to_owned(), Vec::new());
                Some(enrolling)
            }
        }
    }

    /// `topic`'s record was made sure of, or could not be: the registrations that waited.
    pub fn done(&mut self, topic: &str) -> Vec<E> {
        self.waiting.remove(topic).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::TopicWaits;

    #[test]
    fn the_first_leads_and_the_rest_wait_until_it_is_done() {
        let mut waits = TopicWaits::default();
        assert_eq!(waits.lead_or_wait("t", 1), Some(1));
        assert_eq!(waits.lead_or_wait("t", 2), None);
        assert_eq!(waits.lead_or_wait("u", 3), Some(3), "another topic leads on its own");
        assert_eq!(waits.lead_or_wait("t", 4), None);
        assert_eq!(waits.done("t"), vec![2, 4]);
        assert_eq!(waits.lead_or_wait("t", 5), Some(5), "done: the next leads again");
        assert!(waits.done("v").is_empty());
    }
}
