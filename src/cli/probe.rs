//! `kafka-assigner probe`: one HTTP GET of a running assigner's admin `/ready`, exit 0 when
//! it answers 200. The container images' `HEALTHCHECK`: they are `FROM scratch`, with no
//! shell and no curl, so the binary checks itself.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tokio::time::Instant;

use crate::cli::status::source_chain;

/// `kafka-assigner probe` flags.
#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    /// The assigner's admin address, as given to `serve` (the same variable): an
    /// unspecified host (`0.0.0.0`, `[::]`) is probed on loopback.
    #[arg(long, env = "KAFKA_ASSIGNER_ADMIN_ADDR", default_value = "127.0.0.1:9090")]
    pub admin_addr: SocketAddr,

    /// Probe this URL instead of `http://<admin-addr>/ready` (plain HTTP only).
    #[arg(long)]
    pub url: Option<String>,

    /// Give up on one attempt when no answer comes within this.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "2s")]
    pub timeout: Duration,

    /// Keep trying, every 100 ms, until ready or this long has passed (default: one try).
    /// For start scripts and tests that wait for an instance.
    #[arg(long, value_parser = crate::duration::parse_duration)]
    pub wait: Option<Duration>,
}

/// Why a probe failed (the message the healthcheck log shows).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `--url` is not a plain `http://` URL.
    #[error("--url '{0}' is not an http:// URL")]
    BadUrl(String),
    /// Nothing answered.
    #[error("{url}: cannot connect: {reason}")]
    Unreachable {
        /// What was asked.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// No answer in time.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// What was asked.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// An answer other than 200 (503: the instance cannot reach its store).
    #[error("{url}: HTTP {status}: {body}")]
    NotReady {
        /// What was asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
}

/// `http://127.0.0.1:9090/ready` from `0.0.0.0:9090`: where a process next to the server
/// reaches its admin listener.
pub fn ready_url(admin_addr: SocketAddr) -> String {
    let ip = match admin_addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/ready", SocketAddr::new(ip, admin_addr.port()))
}

/// The URL this probe asks.
pub fn url(args: &ProbeArgs) -> Result<hyper::Uri, ProbeError> {
    let text = args.url.clone().unwrap_or_else(|| ready_url(args.admin_addr));
    let uri: hyper::Uri = text.parse().map_err(|_| ProbeError::BadUrl(text.clone()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
        return Err(ProbeError::BadUrl(text));
    }
    Ok(uri)
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// One GET: `Ok` with the body on 200.
async fn once(client: &HttpClient, uri: &hyper::Uri, timeout: Duration) -> Result<String, ProbeError> {
    let url = uri.to_string();
    let request = async {
        let response = client
            .get(uri.clone())
            .await
            .map_err(|e| ProbeError::Unreachable { url: url.clone(), reason: source_chain(&e) })?;
        let status = response.status().as_u16();
        // The body is a word or two ("ready", "not ready"); a failed read leaves it empty.
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body = String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string();
        if status == 200 { Ok(body) } else { Err(ProbeError::NotReady { url: url.clone(), status, body }) }
    };
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| ProbeError::Timeout { url: url.clone(), timeout })?
}

/// Runs the probe: the line to print on success.
pub async fn run(args: &ProbeArgs) -> Result<String, ProbeError> {
    let uri = url(args)?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let deadline = Instant::now() + args.wait.unwrap_or_default();
    loop {
        match once(&client, &uri, args.timeout).await {
            Ok(body) => return Ok(format!("ready: {uri} answered 200 ({body})")),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(admin: &str, url: Option<&str>) -> ProbeArgs {
        ProbeArgs {
            admin_addr: admin.parse().expect("address"),
            url: url.map(str::to_string),
            timeout: Duration::from_secs(1),
            wait: None,
        }
    }

    #[test]
    fn urls() {
        assert_eq!(ready_url("0.0.0.0:9090".parse().unwrap()), "http://127.0.0.1:9090/ready");
        assert_eq!(ready_url("[::]:9091".parse().unwrap()), "http://[::1]:9091/ready");
        assert_eq!(ready_url("10.1.2.3:80".parse().unwrap()), "http://10.1.2.3:80/ready");
        let given = url(&args("0.0.0.0:1", Some("http://a:2/live"))).unwrap();
        assert_eq!(given.to_string(), "http://a:2/live");
        for bad in ["https://a:1/ready", "a b", "/ready"] {
            assert!(matches!(url(&args("0.0.0.0:1", Some(bad))), Err(ProbeError::BadUrl(_))), "{bad}");
        }
    }
}
