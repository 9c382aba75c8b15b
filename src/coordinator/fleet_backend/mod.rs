//! The `fleet` backend: per-partition leases claimed without a leader and without warm
//! handoffs (the Kinesis Client Library model), over any [`LeaseStore`].
//!
//! * Every partition has at most one lease record (`{prefix}fleet/leases/{topic}/{p}`),
//!   created with compare-and-swap on its absence and bound to the owning consumer's
//!   session: two live leases on one partition cannot exist, and a crashed consumer's
//!   leases vanish with its session, one TTL after its stream dropped.
//! * The instance that holds a consumer's stream claims and renews on its behalf: its
//!   registration is kept alive while the stream is open.
//! * Every instance is one state machine (`machine/`), run by the production driver
//!   (`coordinator/machine/driver/`). It follows the prefix (its cache, `state.rs`); after
//!   each change its relay (`relay.rs`) tells the local consumers the difference between
//!   the leases they hold and what they were told, as `AssignmentUpdate{assigned,
//!   unassigned}` (the first message is the snapshot). Then, and on a timer, it runs each
//!   local consumer's claim step (`machine/claim.rs`, decided by `claim_decide.rs` and
//!   [`share`]): claim free leases up to the consumer's fair share, give back the excess
//!   when membership grew.
//! * A partition given back is first `unassigned` on the giver's stream, then its lease is
//!   deleted once the stream's transport took that `unassigned`, which may wait behind
//!   older unread commands: a consumer that is alive has always been told to stop before
//!   anyone else can claim the partition. A giver that does not take it within one TTL has
//!   its stream ended and keeps its leases until its registration ends, one TTL later
//!   (`coordinator/machine/driver/told.rs`). Without warm handoffs the new owner starts cold.
//! * `PartitionReady` / `PartitionReleased` are `FAILED_PRECONDITION` (no handoffs).
//!   `Deregister` marks the member as leaving: the holding instance tells the consumer
//!   `unassigned` for all its partitions, ends the stream cleanly and revokes the session,
//!   so its leases are free at once (not one TTL later); the answer is `SHUTDOWN_NOW`.
//! * Re-registering a name (within the TTL, on any instance) moves the member record and
//!   all its leases to the new session in one transaction: no partition moves, and the old
//!   stream ends with `ABORTED` (or, if it had dropped, is simply forgotten).

mod calls;

mod claim_decide;
pub mod machine;
pub mod records;
mod register;

mod relay;
pub mod share;
pub mod state;
mod status;

pub use records::{FleetKeys, LeaseRecord, MemberRecord};

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::PartitionCounts;

/// Settings of a fleet instance.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// This instance's id (in member records and the status view).
    pub instance_id: String,
    /// The store's name, for the status view (`fleet-memory`, `fleet-etcd`).
    pub backend: String,
    /// Key prefix; the fleet stores everything under `{prefix}fleet/`.
    pub prefix: String,
    /// TTL of consumer sessions: a crashed consumer's leases are free after this.
    pub lease_ttl: Duration,
    /// Partition counts known without Kafka (`--topic-partitions`); they override Kafka.
    pub topic_partitions: BTreeMap<String, u32>,
    /// Where the partition counts of other topics come from (`--kafka-brokers`); `None`:
    /// only `topic_partitions`.
    pub kafka: Option<Arc<dyn PartitionCounts>>,
    /// How often each instance asks Kafka for the counts of stored topics (growth).
    pub topic_refresh_interval: Duration,
    /// How often each local consumer's claim step runs without a change (safety net).
    pub claim_interval: Duration,
    /// How often the watcher re-reads the whole prefix as a safety net.
    pub resync_interval: Duration,
    /// The Kubernetes view (`--drain-policy k8s`): what it knows of a consumer when it
    /// registers (zone, capacity, generation) goes into its member record.
    pub view: Option<Arc<dyn crate::drain::RolloutView>>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            instance_id: "kafka-assigner".into(),
            backend: "fleet".into(),
            prefix: "/kafka-assigner/".into(),
            lease_ttl: Duration::from_secs(10),
            topic_partitions: BTreeMap::new(),
            kafka: None,
            topic_refresh_interval: Duration::from_secs(60),
            claim_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(300),
            view: None,
        }
    }
}
