//! Each local consumer's claim step in the fleet machine: decided on the cache by `claim_decide::decide` once the cache holds the
//! step's last write, then, in order, the kept partitions shown again once the store
//! confirms their leases, the excess given back (the consumer is sent `unassigned` before
//! the delete's request, and the partitions stay hidden from it meanwhile), and free
//! leases claimed (compare on absence, on the epoch floor and on the member record). A
//! transaction that loses a compare is tried one partition at a time. One step per
//! consumer at a time; a change while it runs makes it step again once it ended.

use super::{Instance, Waiting, txn_outcome};
use crate::coordinator::fleet_backend::claim_decide::{
    AtRevision, Claim, ClaimDecision, LeaseAt, claim_txn, decide, give_back_txn,
};
use crate::coordinator::machine::io::{Effect, Micros, StoreReply, StoreRequest};
use crate::coordinator::machine::observe::Observation;
use crate::coordinator::shared::outgoing::update;
use crate::store::{Revision, SessionId, StoreError};

/// What the instance keeps of one stream's claim step.
#[derive(Debug)]
pub(super) struct Claimer {
    /// The revision of its last write: a step waits for the cache to reach it.
    seen: Revision,
    /// A step of its is under way.
    running: bool,
    /// Something changed since its last step began: it steps (again).
    due: bool,
}

impl Claimer {
    /// The claim step of a stream registered at `registered_at`, due at once.
    pub fn new(registered_at: Revision) -> Self {
        Claimer { seen: registered_at, running: false, due: true }
    }

    /// Its registration was written again at `revision`: it steps once the cache holds it
    /// (a step under way goes on: one step at a time).
    pub fn rebound(&mut self, revision: Revision) {
        self.seen = self.seen.max(revision);
        self.due = true;
    }
}

/// A claim step between its store calls.
#[derive(Debug)]
pub(in crate::coordinator::fleet_backend) struct ClaimWait {
    /// (topic, consumer) of the stream.
    name: (String, String),
    /// Its registration id.
    registration: SessionId,
    /// What the step decided, and on which revision of the cache.
    decision: ClaimDecision,
    decided_at: Revision,
    /// The revision of the step's last write so far.
    seen: Revision,
    stage: Stage,
}

/// Where a [`ClaimWait`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The topic's leases read, to confirm the kept ones.
    Show,
    /// Giving back: all at once (`None`), or one at a time from this index.
    GiveBack(Option<usize>),
    /// Claiming: all at once (`None`), or one at a time from this index.
    Claim(Option<usize>),
}

impl Instance {
    /// Every stream's claim step is due (the cache changed, the lease came back, the
    /// periodic tick).
    pub(super) fn all_claims_due(&mut self) {
        for stream in self.streams.values_mut() {
            stream.claimer.due = true;
        }
    }

    /// Starts the claim steps that are due and not running; the periodic tick makes every
    /// one due.
    pub(super) fn run_claims(&mut self) {
        if self.now >= self.claim_tick {
            self.all_claims_due();
            self.claim_tick = self.now + Self::micros(self.config.claim_interval);
        }
        let due: Vec<(String, String)> = self
            .streams
            .iter()
            .filter(|(_, s)| s.claimer.due && !s.claimer.running)
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            if let Some(stream) = self.streams.get_mut(&name) {
                stream.claimer.due = false;
            }
            self.start_claim(name);
        }
    }

    /// When the periodic tick comes, if any stream is open.
    pub(super) fn claim_wake(&self) -> Option<Micros> {
        (!self.streams.is_empty()).then_some(self.claim_tick)
    }

    /// Decides the claim step of the stream `name` on the cache and starts it.
    fn start_claim(&mut self, name: (String, String)) {
        let Some(_) = self.lease.live() else { return };
        let (Some(cache), Some(stream)) = (self.cache.as_ref(), self.streams.get(&name)) else { return };
        if cache.revision < stream.claimer.seen {
            return; // its last write is not in the cache yet: the watch brings it
        }
        let Some(entry) = cache.topics.get(&name.0) else { return };
        // Not registered yet, leaving, or replaced: the relay handles those.
        let Some(decision) = decide(entry, &name.1, stream.registration, &stream.book.told.releasing) else {
            return;
        };
        let wait = ClaimWait {
            registration: stream.registration,
            seen: stream.claimer.seen,
            decided_at: cache.revision,
            decision,
            stage: Stage::Show,
            name,
        };
        self.set_running(&wait, true);
        self.next_stage(wait);
    }

    /// Marks the step of `wait`'s stream running or not (and notes its last write).
    fn set_running(&mut self, wait: &ClaimWait, running: bool) {
        if let Some(stream) = self.streams.get_mut(&wait.name).filter(|s| s.registration == wait.registration)
        {
            stream.claimer.running = running;
            stream.claimer.seen = stream.claimer.seen.max(wait.seen);
        }
    }

    /// Whether the stream of `wait` is still open as that registration.
    fn still_open(&self, wait: &ClaimWait) -> bool {
        self.streams.get(&wait.name).is_some_and(|s| s.registration == wait.registration)
    }

    /// Goes on with `wait` from its stage: what is left to show, give back and claim. A
    /// step whose stream ended (or was replaced) ends: in particular nothing is given back
    /// that its consumer was not told to stop first.
    fn next_stage(&mut self, mut wait: ClaimWait) {
        if !self.still_open(&wait) {
            return;
        }
        loop {
            let (show, give_back, claim) =
                (wait.decision.show.len(), wait.decision.give_back.len(), wait.decision.claim.len());
            match wait.stage {
                Stage::Show if show > 0 => {
                    let leases = self.keys.leases(&wait.name.0);
                    return self.claim_request(StoreRequest::GetPrefix(leases), wait);
                }
                Stage::Show => wait.stage = Stage::GiveBack(None),
                Stage::GiveBack(None) if give_back > 0 => return self.give_back(wait),
                Stage::GiveBack(_) => wait.stage = Stage::Claim(None),
                Stage::Claim(None) if claim > 0 => {
                    let txn = self.claim_txn_of(&wait, &wait.decision.claim);
                    return self.claim_request(StoreRequest::Txn(txn), wait);
                }
                Stage::Claim(Some(i)) if i < claim => {
                    let txn = self.claim_txn_of(&wait, &wait.decision.claim[i..=i]);
                    return self.claim_request(StoreRequest::Txn(txn), wait);
                }
                Stage::Claim(_) => return self.set_running(&wait, false),
            }
        }
    }

    /// Sends `unassigned` for the partitions `wait` gives back, hides them from the
    /// consumer's view until their leases are gone, then deletes the leases.
    fn give_back(&mut self, wait: ClaimWait) {
        let topic = wait.name.0.clone();
        let partitions: Vec<u32> = wait.decision.give_back.iter().map(|(p, _)| *p).collect();
        if let Some(stream) = self.streams.get_mut(&wait.name) {
            stream.book.told.releasing.extend(partitions.iter().copied());
            let told: Vec<u32> =
                partitions.iter().copied().filter(|p| stream.book.told.owned.remove(p)).collect();
            // Never told it owns them: there is nothing to hear first.
            if stream.book.activated && !told.is_empty() {
                let command = update(&topic, [], told);
                self.out.push(Effect::Command { stream: stream.id, command });
            }
        }
        let txn = give_back_txn(&self.keys, &topic, &wait.decision.give_back);
        self.claim_request(StoreRequest::Txn(txn), wait);
    }

    /// The claim transaction of `partitions` for `wait`'s consumer.
    fn claim_txn_of(&self, wait: &ClaimWait, partitions: &[LeaseAt]) -> crate::store::Txn {
        let claim = Claim {
            topic: &wait.name.0,
            consumer: &wait.name.1,
            member: &wait.decision.member,
            instance_lease: self.lease.live().unwrap_or(SessionId(0)),
            decided_at: wait.decided_at,
            now_micros: self.now,
        };
        claim_txn(&self.keys, claim, partitions)
    }

    /// Sends `op` for the claim step `wait`.
    fn claim_request(&mut self, op: StoreRequest, wait: ClaimWait) {
        self.request(op, Waiting::Claim(Box::new(wait)));
    }

    /// What the store answered a claim step. A failure ends the step (a lost answer
    /// leaves the given-back partitions hidden: the next step's compare finds out).
    pub(super) fn claim_answered(&mut self, mut wait: ClaimWait, answer: Result<StoreReply, StoreError>) {
        match wait.stage {
            Stage::Show => {
                let Ok(StoreReply::Prefix(stored)) = answer else { return self.set_running(&wait, false) };
                let lease = |p: u32| self.keys.lease(&wait.name.0, p);
                let confirmed: Vec<u32> = wait
                    .decision
                    .show
                    .iter()
                    .filter(|(p, at): &&AtRevision| {
                        stored.kvs.iter().any(|kv| kv.key == lease(*p) && kv.mod_revision == *at)
                    })
                    .map(|(p, _)| *p)
                    .collect();
                if confirmed.len() < wait.decision.show.len() {
                    wait.seen = wait.seen.max(stored.revision);
                }
                if !confirmed.is_empty() && self.still_open(&wait) {
                    if let Some(stream) = self.streams.get_mut(&wait.name) {
                        stream.book.told.releasing.retain(|p| !confirmed.contains(p));
                    }
                    let (topic, consumer) = wait.name.clone();
                    self.relay_whole(&topic, &consumer);
                }
                wait.stage = Stage::GiveBack(None);
                self.next_stage(wait)
            }
            Stage::GiveBack(at) => {
                let Ok(outcome) = txn_outcome(answer) else { return self.set_running(&wait, false) };
                wait.seen = wait.seen.max(outcome.revision);
                let next = match at {
                    None if outcome.succeeded => None,
                    None => Some(0),
                    Some(i) => Some(i + 1),
                };
                match next {
                    Some(i) if i < wait.decision.give_back.len() => {
                        wait.stage = Stage::GiveBack(Some(i));
                        let one = wait.decision.give_back[i];
                        let txn = give_back_txn(&self.keys, &wait.name.0, &[one]);
                        self.claim_request(StoreRequest::Txn(txn), wait)
                    }
                    _ => {
                        let (topic, consumer) = wait.name.clone();
                        let partitions = wait.decision.give_back.iter().map(|(p, _)| *p).collect();
                        let quota = wait.decision.quota;
                        let gave = Observation::GaveBack { topic, consumer, partitions, quota };
                        self.out.push(Effect::Observe(gave));
                        wait.stage = Stage::Claim(None);
                        self.next_stage(wait)
                    }
                }
            }
            Stage::Claim(at) => {
                let Ok(outcome) = txn_outcome(answer) else { return self.set_running(&wait, false) };
                if outcome.succeeded {
                    wait.seen = wait.seen.max(outcome.revision);
                    let claim = &wait.decision.claim;
                    let claimed = match at {
                        None => claim.iter().map(|free| free.partition).collect(),
                        Some(i) => claim.get(i).map(|free| free.partition).into_iter().collect(),
                    };
                    let (topic, consumer) = wait.name.clone();
                    let quota = wait.decision.quota;
                    let claimed = Observation::Claimed { topic, consumer, partitions: claimed, quota };
                    self.out.push(Effect::Observe(claimed));
                }
                wait.stage = match at {
                    None if outcome.succeeded => return self.set_running(&wait, false),
                    // Someone else claimed one of them first: the others one by one.
                    None => Stage::Claim(Some(0)),
                    Some(i) => Stage::Claim(Some(i + 1)),
                };
                self.next_stage(wait)
            }
        }
    }
}
