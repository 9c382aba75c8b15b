//! Integration tests: real etcd (started by the harness), real gRPC over loopback.

mod support;
mod grpc_smoke;
mod store_conformance;
