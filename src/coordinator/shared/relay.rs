//! The relay: after every revision, each local stream it concerns is told what changed.
//!
//! A backend's relay model looks at its cache and at what one stream has told its consumer
//! ([`StreamSeen`]) and answers a [`RelayStep`] (pure: no I/O, no stream touched). The
//! machine applies each step to the stream's [`Book`] ([`Book::apply`]), which says what
//! to send now (gains), what once every stream of the step heard its gains (losses), and
//! whether the stream ends.

use super::streams::{Book, Told, replaced_error};
pub use super::streams::{EndReason, Ending};
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// What the relay model sees of one stream (read-only).
pub struct StreamSeen<'a, T> {
    /// The session its registration is bound to.
    pub session: SessionId,
    /// Store revision of the registration write.
    pub registered_at: Revision,
    /// Whether the snapshot has been sent.
    pub activated: bool,
    /// What the consumer has been told so far.
    pub told: &'a T,
    /// Whether `told` followed every relay step since the snapshot (then a step may
    /// compare only what a revision changed).
    pub told_complete: bool,
}

/// Where a stream's registration stands in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// The record is this stream's.
    Ours,
    /// The cache has not reached the registration's write yet: nothing to relay.
    NotYet,
    /// Another registration of the name took the record.
    Replaced,
    /// The record is gone (the store lost it with the instance lease): the stream stays
    /// open and relayed while the machine writes it again.
    Lost,
}

impl<T> StreamSeen<'_, T> {
    /// Where this stream's registration stands, given the session of the name's record in
    /// a cache at `revision` (`None`: no record).
    pub fn registration(&self, record_session: Option<i64>, revision: Revision) -> Registration {
        match record_session {
            Some(session) if session == self.session.0 => Registration::Ours,
            _ if revision < self.registered_at => Registration::NotYet,
            Some(_) => Registration::Replaced,
            None => Registration::Lost,
        }
    }
}

/// The relay model's decision for one stream.
#[derive(Debug)]
pub enum RelayStep<T> {
    /// Nothing to tell (the cache has not reached the registration yet).
    Wait,
    /// A newer registration took the name: the consumer is told it owns nothing and the
    /// stream ends `ABORTED`.
    Replaced,
    /// The consumer left: it is told it owns nothing and the stream ends cleanly.
    Farewell,
    /// Tell the consumer something (possibly nothing new).
    Tell(Tell<T>),
}

/// Commands for one stream and what the consumer knows after them.
#[derive(Debug)]
pub struct Tell<T> {
    /// Sent now, the snapshot first when the stream is new: what the consumer gains.
    pub gains: Vec<AssignmentCommand>,
    /// Sent once every stream of the relay pass heard its gains: what it loses.
    pub losses: Vec<AssignmentCommand>,
    /// What the consumer has been told once these are sent: all of it, or with `within`
    /// its part in those partitions alone (the rest is unchanged).
    pub told: T,
    /// The partitions `told` is about, when it is a part ([`Told::patch`]).
    ///
    /// [`Told::patch`]: super::streams::Told::patch
    pub within: Option<std::collections::BTreeSet<u32>>,
    /// The store lost the registration: the stream is marked lost (and stays open).
    pub lost: bool,
    /// Why the stream ends after these commands, if it does.
    pub end: Option<Ending>,
}

impl<T> RelayStep<T> {
    /// The step for a stream whose registration is not [`Registration::Ours`] and not
    /// [`Registration::Lost`] (those relay on).
    pub fn not_relayed(registration: Registration) -> Option<Self> {
        match registration {
            Registration::NotYet => Some(Self::Wait),
            Registration::Replaced => Some(Self::Replaced),
            Registration::Ours | Registration::Lost => None,
        }
    }
}

/// What a relay step says to send one stream, once applied to its [`Book`].
#[derive(Debug, Default)]
pub struct Said {
    /// Sent at once, in order: gains (and a farewell).
    pub now: Vec<AssignmentCommand>,
    /// Sent once every stream of the relay pass heard its gains: losses.
    pub later: Vec<AssignmentCommand>,
    /// The step says the store lost the registration.
    pub lost: bool,
    /// Why the stream ends after these, if it does.
    pub end: Option<Ending>,
}

impl<T: Told> Book<T> {
    /// Applies the relay model's `step` for `consumer` on `topic` (pure): what to send,
    /// and why the stream must end, if it must.
    pub fn apply(&mut self, topic: &str, consumer: &str, step: RelayStep<T>) -> Said {
        match step {
            RelayStep::Wait => {
                self.told_complete = false;
                Said::default()
            }
            RelayStep::Replaced => Said {
                now: self.farewell(topic),
                end: Some((EndReason::Replaced, Some(replaced_error(topic, consumer)))),
                ..Said::default()
            },
            RelayStep::Farewell => {
                Said { now: self.farewell(topic), end: Some((EndReason::Left, None)), ..Said::default() }
            }
            RelayStep::Tell(tell) => {
                self.activated = true;
                match tell.within {
                    Some(partitions) => self.told.patch(&partitions, tell.told),
                    None => {
                        self.told = tell.told;
                        self.told_complete = true;
                    }
                }
                Said { now: tell.gains, later: tell.losses, lost: tell.lost, end: tell.end }
            }
        }
    }
}
