//! Integration tests: real etcd (started by the harness), real gRPC over loopback.

mod busy_instance;
mod client;
#[cfg(feature = "testcontainers")]
mod client_containers;
mod client_epochs;
mod client_in_process;
mod client_session;
mod compose;
mod compose_up;
mod container_faults;
mod epochs;
mod epochs_incarnation;
mod every_backend;
mod example_consumer;
mod faults;
mod fencing;
mod fleet_backend;
mod fuzz;
mod grpc_bad_input;
mod grpc_scenarios;
mod harness;
mod http2_multiplexing;
mod k8s_api;
mod k8s_drain;
mod k8s_info;
mod k8s_rollout;
mod kafka_load;
mod kafka_metadata;
mod log_format;
mod manifests;
mod metrics;
mod multi_instance;
mod placement;
mod placement_kafka;
mod probe_cli;
#[cfg(feature = "testcontainers")]
mod readme_container;
mod reflection;
mod security;
mod security_kafka;
mod security_limits;
mod static_backend;
mod status_cli;
mod store_conformance;
mod support;
mod tls_etcd;
