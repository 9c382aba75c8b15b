//! The fleet backend's instance as one state with one step (issue 40, stage 3):
//! [`Instance::step`]`(now, input) -> effects`, over the inputs and effects of
//! [`crate::coordinator::machine::io`]. (Being written: this is its interface.)

use crate::coordinator::fleet_backend::FleetConfig;
use crate::coordinator::fleet_backend::state::FleetCache;
use crate::coordinator::machine::Start;
use crate::coordinator::machine::io::{Effect, Input, Micros};

/// One instance of the fleet backend (see the module docs).
pub struct Instance {
    cache: Option<FleetCache>,
}

impl Instance {
    /// A new instance of `config` at `now` (wall-clock µs), in the life `start`, and its
    /// first effects (the read of the prefix).
    pub fn new(config: FleetConfig, start: Start, now: Micros) -> (Self, Vec<Effect>) {
        let _ = (config, start, now);
        (Instance { cache: None }, Vec::new())
    }

    /// Takes `input` in at `now` and returns what to do, in order.
    pub fn step(&mut self, now: Micros, input: Input) -> Vec<Effect> {
        let _ = (now, input);
        Vec::new()
    }

    /// Whether its lease may be kept alive now (not while it cannot follow its store).
    pub fn renews(&self) -> bool {
        true
    }

    /// The cache, once the first read answered (for a simulation's checks).
    pub fn cache(&self) -> Option<&FleetCache> {
        self.cache.as_ref()
    }

    /// The (topic, consumer) of every command stream open here.
    pub fn stream_names(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
