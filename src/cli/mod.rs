//! Client subcommands of the `kafka-assigner` binary (they talk to a running assigner).

pub mod probe;
pub mod status;
