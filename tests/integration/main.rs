//! Integration tests: real etcd (started by the harness), real gRPC over loopback.

mod client;
#[cfg(feature = "testcontainers")]
mod client_containers;
mod client_in_process;
mod compose;
mod every_backend;
mod example_consumer;
mod fleet_backend;
mod grpc_bad_input;
mod grpc_scenarios;
mod kafka_metadata;
mod multi_instance;
mod static_backend;
mod store_conformance;
mod support;
