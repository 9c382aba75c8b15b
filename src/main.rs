//! `kafka-assigner serve`: parse flags, start the backend, serve until SIGTERM / Ctrl-C.
//! `kafka-assigner status`: print a running assigner's state.
//! `kafka-assigner probe`: exit 0 when a running assigner is ready (the images' healthcheck).

#![forbid(unsafe_code)]

use std::sync::Arc;

use clap::Parser;
use kafka_assigner::{
    backend::coordinator_from_args,
    cli::{probe::ProbeArgs, status::StatusArgs},
    config::{Cli, Command, LogFormat},
    metrics::Metrics,
    server::AssignerServer,
};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Status(args) => return status(&args).await,
        Command::Probe(args) => return probe(&args).await,
    };
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
    kafka_assigner::signal::shutdown_signal().await;
    tracing::info!("shutting down: ending streams, resigning leadership");
    server.stop().await;
    std::process::ExitCode::SUCCESS
}

/// Logs to stdout, plain or JSON; both carry the same fields (time, level, target, the
/// event's fields and message, and the current span's fields).
fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Plain => {
            builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())).init();
        }
        LogFormat::Json => {
            builder.json().flatten_event(true).with_current_span(true).with_span_list(false).init()
        }
    }
}

/// `kafka-assigner status`: prints the table (or JSON); exits 1 with a message when the
/// admin server cannot be read.
async fn status(args: &StatusArgs) -> std::process::ExitCode {
    match kafka_assigner::cli::status::run(args).await {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("kafka-assigner status: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `kafka-assigner probe`: one line on stdout and exit 0 when ready; the reason on stderr
/// and exit 1 otherwise (Docker keeps both in the container's health log).
async fn probe(args: &ProbeArgs) -> std::process::ExitCode {
    match kafka_assigner::cli::probe::run(args).await {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("kafka-assigner probe: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
