//! An assigner started from command-line flags, as `kafka-assigner serve` starts one: the
//! flags parsed by the binary's own `Cli`, the coordinator built by `coordinator_from_args`,
//! served on free loopback ports.

use std::{net::SocketAddr, sync::Arc};

use clap::Parser;
use kafka_assigner::config::{Cli, Command};
use kafka_assigner::metrics::Metrics;
use kafka_assigner::{backend::coordinator_from_args, server::AssignerServer};

/// Serves what `flags` (the whole command line, program name first) ask for; panics naming
/// `what` when the flags do not parse or the backend does not start.
pub async fn serve_from_flags(flags: &[String], what: &str) -> AssignerServer {
    let Command::Serve(args) =
        Cli::try_parse_from(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}")).command
    else {
        unreachable!("serve was asked for")
    };
    let metrics = Arc::new(Metrics::new());
    let coordinator = coordinator_from_args(&args, metrics.clone())
        .await
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    AssignerServer::start(coordinator, metrics, any, any).await.expect("serve")
}
