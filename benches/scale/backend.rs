//! Which store the benchmarked server runs on.

use super::error::BenchError;

/// Which store the server runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `--backend memory`.
    Memory,
    /// `--backend etcd` on an etcd the benchmark starts.
    Etcd,
}

impl Backend {
    /// Parses `memory` / `etcd`.
    pub fn parse(text: &str) -> Result<Self, BenchError> {
        match text {
            "memory" => Ok(Self::Memory),
            "etcd" => Ok(Self::Etcd),
            other => Err(BenchError::Config(format!("backend {other}: use memory or etcd"))),
        }
    }

    /// The name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Etcd => "etcd",
        }
    }
}
