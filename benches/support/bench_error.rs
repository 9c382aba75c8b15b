//! The benchmark's one error type.

/// Why a benchmark step failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server process could not be started or did not become ready.
    #[error("server: {0}")]
    Server(String),
    /// A gRPC connection could not be opened.
    #[error("client: {0}")]
    Client(String),
    /// An HTTP request to an admin or metrics port failed.
    #[error("http {url}: {reason}")]
    Http {
        /// What was requested.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// An etcd call failed (the raw etcd reference).
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// Files (logs, outputs, /proc).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Output encoding.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A bad `SCALE_*` environment variable.
    #[error("config: {0}")]
    Config(String),
}
