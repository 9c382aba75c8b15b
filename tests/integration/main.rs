//! Integration tests: real etcd (started by the harness), real gRPC over loopback.

mod every_backend;
mod fleet_backend;
mod fuzz;
mod grpc_bad_input;
mod grpc_scenarios;
mod kafka_metadata;
mod multi_instance;
mod security;
mod security_kafka;
mod security_limits;
mod static_backend;
mod store_conformance;
mod support;
mod tls_etcd;
