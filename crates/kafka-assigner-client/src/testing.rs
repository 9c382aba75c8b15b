//! For a consumer's integration tests: the assigner (and etcd) in Docker containers
//! ([`containers`], cargo feature `testcontainers`). A suite that uses it depends on this
//! crate only; the server is never compiled.

pub mod containers;
