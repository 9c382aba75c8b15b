//! An assigner's `/status` (cargo feature `status`): the JSON its admin port serves, read
//! over plain HTTP/1. Who is registered, who owns each partition, the handoffs in flight
//! and the leader. The server's `kafka-assigner status` and
//! `testing::containers::status` (feature `testcontainers`) both read it through here.
//!
//! ```no_run
//! # async fn t() -> Result<(), kafka_assigner_client::status::StatusError> {
//! use std::time::Duration;
//! let (_raw, status) = kafka_assigner_client::status::fetch("127.0.0.1:9090", Duration::from_secs(5)).await?;
//! println!("{} owners of {:?}", status.instance, status.topics.first().map(|t| &t.owners));
//! # Ok(()) }
//! ```
//!
//! The types mirror what the server writes field for field (a test against the real
//! server checks that reading and writing back gives the server's document unchanged);
//! unknown fields are ignored, so a newer server stays readable.

use std::{fmt::Write as _, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::{Deserialize, Serialize};

/// Errors reading `/status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The address is not a usable URL.
    #[error("--admin-addr '{0}' is not host:port or http://host:port")]
    BadAddress(String),
    /// Nothing answered at the address.
    #[error("cannot reach the assigner's admin server at {url}: {reason}")]
    Unreachable {
        /// What was asked.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// The server answered, but not with 200.
    #[error("{url} answered HTTP {status}")]
    Http {
        /// What was asked.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The answer is not the status JSON.
    #[error("{url} did not answer with the assigner's status JSON: {reason}")]
    BadAnswer {
        /// What was asked.
        url: String,
        /// Why it could not be read.
        reason: String,
    },
}

/// The `/status` document.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Status {
    /// The instance that answered.
    pub instance: String,
    /// Its backend.
    pub backend: String,
    /// The leading instance, if known.
    pub leader: Option<String>,
    /// Whether the answering instance is ready.
    pub ready: bool,
    /// Per-topic state.
    pub topics: Vec<Topic>,
    /// How each topic is placed, from a handoff backend (docs/design.md §11); absent from
    /// the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<Placement>,
}

/// How one topic is placed: the consumers' loads and, under `--placement shadow`, what
/// placement by load would do.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Placement {
    /// Topic name.
    pub topic: String,
    /// `count`, `load` or `shadow`.
    pub mode: String,
    /// The total weight of the partitions.
    pub total_weight: u64,
    /// The highest consumer load over its share (max/mean).
    pub imbalance: f64,
    /// Each registered consumer's load.
    pub consumers: Vec<ConsumerLoad>,
    /// Under `shadow`: what placement by load would do now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_plan: Option<LoadPlan>,
}

/// One consumer's load in a [`Placement`].
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ConsumerLoad {
    /// Consumer name.
    pub name: String,
    /// Partitions it owns.
    pub partitions: usize,
    /// The total weight of those partitions.
    pub load: u64,
    /// The weight it would carry in a perfect split.
    pub share: f64,
    /// `load / share`.
    pub normalized: f64,
}

/// What placement by load would do ([`Placement::load_plan`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct LoadPlan {
    /// How many partitions it would move.
    pub moves: usize,
    /// The imbalance it would reach.
    pub imbalance_after: f64,
    /// The moves: partition, from, to.
    pub would_move: Vec<PlannedMove>,
}

/// One move of a [`LoadPlan`].
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct PlannedMove {
    /// Partition.
    pub partition: u32,
    /// Its owner now.
    pub from: String,
    /// The consumer it would move to.
    pub to: String,
}

/// One topic of [`Status`].
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Topic {
    /// Topic name.
    pub topic: String,
    /// Partition count.
    pub partition_count: u32,
    /// Registered consumers.
    pub consumers: Vec<Consumer>,
    /// Owner by partition (`null`: unowned).
    pub owners: Vec<Option<String>>,
    /// Handoffs in flight.
    pub handoffs: Vec<Handoff>,
}

/// A consumer of a [`Topic`].
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Consumer {
    /// Name.
    pub name: String,
    /// `Active` or `Draining`.
    pub status: String,
    /// Instance holding its stream.
    pub instance: String,
    /// How many partitions it owns.
    pub partitions: usize,
    /// Its zone as recorded at registration, if known.
    pub zone: Option<String>,
    /// Its capacity as recorded at registration (1 when the server does not say: servers
    /// from before capacities).
    #[serde(default = "one")]
    pub capacity: u32,
}

fn one() -> u32 {
    1
}

/// A handoff of a [`Topic`].
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Handoff {
    /// Partition.
    pub partition: u32,
    /// Old owner.
    pub from: String,
    /// New owner.
    pub to: String,
    /// `Warming` or `Releasing`.
    pub phase: String,
    /// Unix ms when the phase began.
    pub since: u64,
}

/// `http://host:port/status` from an admin address (`host:port` or `http://host:port`).
pub fn status_url(admin_addr: &str) -> Result<hyper::Uri, StatusError> {
    let bad = || StatusError::BadAddress(admin_addr.to_string());
    let trimmed = admin_addr.trim();
    let (scheme, rest) = trimmed.split_once("://").unwrap_or(("http", trimmed));
    let authority = rest.trim_end_matches('/');
    if scheme != "http" || authority.is_empty() || authority.contains('/') {
        return Err(bad());
    }
    let uri: hyper::Uri = format!("http://{authority}/status").parse().map_err(|_| bad())?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(uri)
}

/// Fetches the status document from `admin_addr` (see [`status_url`]), giving up after
/// `timeout`: as the server sent it, and as read here.
pub async fn fetch(admin_addr: &str, timeout: Duration) -> Result<(serde_json::Value, Status), StatusError> {
    let uri = status_url(admin_addr)?;
    let url = uri.to_string();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let unreachable = |reason: String| StatusError::Unreachable { url: url.clone(), reason };
    let request = async {
        let response = client.get(uri.clone()).await.map_err(|e| unreachable(source_chain(&e)))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(StatusError::Http { url: url.clone(), status });
        }
        let body = response.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?;
        Ok(body.to_bytes())
    };
    let body = tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| unreachable(format!("no answer within {timeout:?}")))??;
    let bad = |e: serde_json::Error| StatusError::BadAnswer { url: url.clone(), reason: e.to_string() };
    let raw: serde_json::Value = serde_json::from_slice(&body).map_err(bad)?;
    let status = Status::deserialize(&raw).map_err(bad)?;
    Ok((raw, status))
}

/// An error and its causes, joined: hyper's top-level message alone says little
/// ("client error (Connect)").
pub fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests;
