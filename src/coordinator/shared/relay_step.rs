//! The relay as a pure decision: a backend's model looks at its cache and at what one stream
//! has told its consumer ([`StreamSeen`]) and answers a [`RelayStep`]; the stream registry
//! applies it (`LocalStream::apply`, `streams.rs`). The model does no I/O and touches no stream, so the
//! registry can call it while it holds a stream without calling out of the relay.

use crate::coordinator::CoordinatorError;
use crate::proto::v1::AssignmentCommand;
use crate::store::{Revision, SessionId};

/// Why the server ended a stream; tells the stream's session task what to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The consumer left (drained, or deregistered on the fleet): revoke the session.
    Left,
    /// A newer registration of the same name replaced this one: revoke the old session.
    Replaced,
    /// The consumer's registration is gone and could not be written again within a TTL
    /// ([`super::rebind`]): nothing left to do.
    Expired,
    /// This instance is shutting down: keep nothing alive, and let the TTL give the
    /// consumer time to reconnect elsewhere.
    Shutdown,
    /// The client went away, or this instance fenced itself, or the consumer stopped
    /// reading: the registration is kept for the TTL so the consumer can come back.
    Disconnected,
}

/// Why a stream must end, and the last item to send it, if any.
pub type Ending = (EndReason, Option<CoordinatorError>);

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
    /// open and relayed while `rebind.rs` writes it again.
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
