//! Process signals, for the binary and the example consumer: both stop on SIGTERM (what
//! Kubernetes sends) or Ctrl-C.

/// Resolves on SIGTERM or Ctrl-C. If SIGTERM cannot be listened for, only Ctrl-C counts.
pub async fn shutdown_signal() {
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
