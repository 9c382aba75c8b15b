//! A real Prometheus (Debian's `prometheus`, or `$PROMETHEUS`) on a free loopback port,
//! scraping given targets every second and evaluating given rules every second; killed
//! (with its data dir removed) when dropped.

use std::{net::SocketAddr, time::Duration};

use super::{child::Guarded, http10::get};
use serde_json::Value;

/// How long Prometheus gets to start and to answer.
const PROMPT: Duration = Duration::from_secs(30);

/// A running Prometheus.
pub struct Prometheus {
    /// Its HTTP API.
    pub addr: SocketAddr,
    _process: Guarded,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `rules` (a rules file's text) scraping `targets` as job
    /// `kafka-assigner`; returns once it is ready.
    pub async fn start(rules: &str, targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().expect("prometheus dir");
        let rules_path = dir.path().join("rules.yml");
        std::fs::write(&rules_path, rules).expect("write rules");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        // 1 s scrapes and evaluations: the test waits seconds, not minutes.
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: kafka-assigner\n    static_configs:\n      - targets: [{}]\n",
            rules_path.display(),
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write config");
        let port = super::etcd::free_ports().0;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let binary = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let args = vec![
            format!("--config.file={}", config_path.display()),
            format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".into(),
        ];
        let process = Guarded::spawn(&binary, &args, &dir.path().join("prometheus.log"));
        let mut prometheus = Prometheus { addr, _process: process, dir };
        let log = prometheus.dir.path().join("prometheus.log");
        let give_up = tokio::time::Instant::now() + PROMPT;
        loop {
            if let Some(status) = prometheus._process.exited() {
                panic!("{binary} exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            if matches!(get(addr, "/-/ready").await, Ok((200, _))) {
                return prometheus;
            }
            assert!(tokio::time::Instant::now() < give_up, "{binary} not ready within {PROMPT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET path` of the HTTP API: its `data` (panics unless the answer is a success).
    pub async fn api(&self, path: &str) -> Value {
        let (code, body) = get(self.addr, path).await.unwrap_or_else(|e| panic!("prometheus {path}: {e}"));
        let doc: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path} ({code}): {e}: {body}"));
        assert!(code == 200 && doc["status"] == "success", "{path} answered {code}: {body}");
        doc["data"].clone()
    }

    /// The alerts Prometheus holds now (pending or firing), as `(alertname, state, labels)`.
    pub async fn alerts(&self) -> Vec<(String, String, Value)> {
        let data = self.api("/api/v1/alerts").await;
        let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
        alerts
            .into_iter()
            .map(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default().to_string();
                (name, a["state"].as_str().unwrap_or_default().to_string(), a["labels"].clone())
            })
            .collect()
    }

    /// Ends Prometheus (what dropping does) and checks that it is gone: its port refuses
    /// connections and no process runs with its config file.
    pub async fn close(self) {
        let (addr, config) = (self.addr, self.dir.path().join("prometheus.yml").display().to_string());
        let running = super::child::processes_mentioning(&config);
        assert!(!running.is_empty(), "Prometheus is found by its config file: {running:?}");
        drop(self);
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "Prometheus still answers on {addr}");
        let left = super::child::processes_mentioning(&config);
        assert!(left.is_empty(), "Prometheus left behind: {left:?}");
    }

    /// Its log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}
