//! # kafka-assigner
//!
//! Decides which Kafka consumer owns which partition, and moves partitions between
//! consumers with **warm handoffs** so stateful consumers never start cold. Consumers speak
//! gRPC (`proto/kafka_assigner/v1/service.proto`); state lives in a [`store::LeaseStore`]
//! (etcd in production, in-process for one node).
//!
//! ## Layout
//!
//! * [`proto`] — the generated wire contract (from the `kafka-assigner-client` crate).
//! * [`assignment`] — pure: the sticky, balanced target assignment.
//! * [`handoff`] — pure: the warm / ready / release state machine (`state + event → state
//!   + writes`), and the commands each consumer is sent, derived from state.
//! * [`store`] — the `LeaseStore` trait with `MemoryStore` and `EtcdStore`.
//! * [`coordinator`] — the `ConsumerGroupCoordinator` trait the gRPC layer talks to, and
//!   one folder per backend: `coordinator/handoff_backend/` (memory and etcd: warm
//!   handoffs, leader election and reconcile) and `coordinator/fleet_backend/` (lease
//!   claiming), each a state machine (`machine/`) over pure decisions, run by one driver
//!   task (`coordinator/machine/driver/`); `coordinator/shared/` (what they share: the
//!   cache contract, the relay step, streams and their transport, the lease keeper,
//!   departures, topics) and `coordinator/static_backend/` (fixed partitions).
//! * [`backend`] — builds the coordinator and store that the `serve` flags ask for.
//! * [`sim`] — the deterministic whole-cluster simulation: instance states over a model
//!   of etcd, consumer models and faults, on a virtual clock, from a seed.
//! * [`server`] — the tonic service, health and reflection, the admin HTTP server.
//! * [`kafka`] — partition counts from Kafka's topic metadata (librdkafka).
//! * [`config`] — flags and environment of `kafka-assigner serve`.
//! * [`metrics`] — Prometheus metrics.
//! * [`mutation`] — deliberate bugs that only tests switch on, to prove the simulation
//!   sees them.
//! * [`signal`] — SIGTERM / Ctrl-C, for the binary and the example consumer (from the
//!   client crate).
//! * [`status`] — the read-only status view (`/status`, the fleet gauges).
//! * [`duration`] — durations on the command line (`500ms`, `10s`).
//! * [`drain`] — what `Deregister` answers (fixed, or from the Kubernetes API).
//! * [`epoch_floor`] — `--state-dir`: the epoch floor file of the memory and static
//!   backends, so their epochs never go back across restarts.
//! * [`cli`] — client subcommands (`kafka-assigner status`, `kafka-assigner probe`).
//! * [`client`] — the consumer side: a client that drives a handler (warm / assigned /
//!   release / unassigned), and the rdkafka example consumer. It is the
//!   `kafka-assigner-client` crate, re-exported here for the server's own tests: consumers
//!   depend on `kafka-assigner-client`, which builds none of the server.
//! * [`testing`] — the assigner in-process for users' integration tests.
//! * [`weights`] — where partition weights come from (Kafka, or the operator), for
//!   placement by load.
//! * [`kafka_load`] — partition weights learned from Kafka (produce rate, lag), and zones.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assignment;
pub mod backend;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod drain;
pub mod duration;
pub mod epoch_floor;
pub mod handoff;
pub mod kafka;
pub mod kafka_load;
pub mod metrics;
pub mod mutation;
pub mod server;
pub mod sim;
pub mod status;
pub mod store;
pub mod testing;
pub mod weights;

/// The consumer side (the `kafka-assigner-client` crate): a consumer's service depends on
/// that crate directly, not on this one.
pub use kafka_assigner_client as client;
/// The generated wire contract, `kafka_assigner.v1` (one copy, in the client crate).
pub use kafka_assigner_client::proto;
/// SIGTERM / Ctrl-C, for the binary (in the client crate: the example consumer uses it).
pub use kafka_assigner_client::signal;
