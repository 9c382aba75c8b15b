//! `kafka-assigner serve`: parse flags, start the backend, serve until SIGTERM / Ctrl-C.

#![forbid(unsafe_code)]

use std::sync::Arc;

use clap::Parser;
use kafka_assigner::{
    backend::coordinator_from_args,
    config::{Cli, Command},
    metrics::Metrics,
    server::AssignerServer,
};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let metrics = Arc::new(Metrics::new());
    let server = async {
        // Security flags first: a bad one stops the start before anything connects.
        let options = args.security.options()?;
        let coordinator = coordinator_from_args(&args, metrics.clone()).await?;
        AssignerServer::start_with(coordinator, metrics, args.grpc_addr, args.admin_addr, options)
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
    };
    let server = match server.await {
        Ok(server) => server,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            eprintln!("kafka-assigner: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    shutdown_signal().await;
    tracing::info!("shutting down: ending streams, resigning leadership");
    server.stop().await;
    std::process::ExitCode::SUCCESS
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
