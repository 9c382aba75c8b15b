//! `/ui` in a real browser (Debian's headless `chromium`, driven over the DevTools
//! protocol: support/browser.rs) against a running assigner:
//! * the page shows three consumers and their partitions;
//! * a consumer leaves (drained): the page shows its handoffs in flight (held: the new
//!   owners do not answer `PartitionReady` until the page has shown them), then the new
//!   owners, in the same document: a value planted in the page's `window` before the
//!   handoff is still there after it, `performance.timeOrigin` is unchanged, and the page
//!   redrew in between;
//! * at each of those three moments the page, `kafka-assigner status` (the real binary) and
//!   `/status` say the same: the same consumer rows (topic, name, instance, status, owned,
//!   ranges), the same handoffs and the same owner for every partition;
//! * with mTLS on the gRPC port, the admin port serves the page as it serves `/status`
//!   (plain HTTP, reads only), and the page reads nothing but `/status`;
//! * screenshots are saved under `target/` (`kafka-assigner-ui-handoff.png`,
//!   `kafka-assigner-ui.png`).

use std::{path::PathBuf, time::Duration};

use kafka_assigner::config::DrainPolicy;
use kafka_assigner::proto::v1::DeregisterAction;
use serde_json::Value;

use kafka_assigner::server::{ServerOptions, identity::IdentityRule, tls::TlsSettings};

use crate::support::{
    assigner::{Backend, TestCluster, TestConsumer, settle},
    browser::Browser,
    certs::{Leaf, TestCa},
    http10::{get, get_with_headers},
    secure::Secured,
};

const TOPIC: &str = "events";
/// The page polls `/status` every second; a change must show within a few polls even on a
/// busy machine.
const SHOWN: Duration = Duration::from_secs(30);

/// What the page shows, read from its DOM (not from its data).
const READ_PAGE: &str = r#"(() => {
  // Read as soon as the navigation commits: the document may not be parsed yet.
  const text = (n) => (n ? n.textContent.trim() : '');
  return {
    renders: window.kaRenders || 0,
    planted: window.kaPlanted || null,
    origin: performance.timeOrigin,
    leader: text(document.getElementById('leader')),
    ready: text(document.getElementById('ready')),
    consumers: [...document.querySelectorAll('section[data-topic] tr[data-consumer]')]
      .map((tr) => [tr.closest('section').dataset.topic, ...[...tr.cells].map(text)]),
    owners: [...document.querySelectorAll('section[data-topic] [data-partition]')]
      .map((e) => [e.closest('section').dataset.topic, Number(e.dataset.partition), e.dataset.owner]),
    handoffs: [...document.querySelectorAll('section[data-topic] tr[data-handoff]')]
      .map((tr) => [tr.closest('section').dataset.topic, ...[...tr.cells].map(text)]),
  };
})()"#;

/// The target directory (`target/`, or `$CARGO_TARGET_DIR`): the test binary is
/// `<target>/debug/deps/integration-<hash>`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors().nth(3).expect("target dir above debug/deps").to_path_buf()
}

/// One view, three ways: (consumer rows, handoff rows without their age, owners) as the
/// page shows them, as `kafka-assigner status` prints them, and from `/status`.
#[derive(Debug, PartialEq)]
struct View {
    consumers: Vec<String>,
    handoffs: Vec<String>,
    owners: Vec<(String, u64, String)>,
    leader: String,
}

fn page_view(page: &Value) -> View {
    let strings = |row: &Value| -> Vec<String> {
        row.as_array()
            .into_iter()
            .flatten()
            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string))
            .collect()
    };
    let rows = |key: &str, take: usize| -> Vec<String> {
        page[key].as_array().into_iter().flatten().map(|r| strings(r)[..take].join(" ")).collect()
    };
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let owners = page["owners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| (text(&o[0]), o[1].as_u64().unwrap_or(u64::MAX), text(&o[2])))
        .collect();
    View {
        // topic, consumer, instance, status, owned, ranges (zone, capacity, load, share are
        // the page's own columns).
        consumers: rows("consumers", 6),
        // topic, partition, from, to, phase (the age moves on).
        handoffs: rows("handoffs", 5),
        owners,
        leader: page["leader"].as_str().unwrap_or("").trim_start_matches("leader: ").to_string(),
    }
}

/// `kafka-assigner status` (the real binary) and `/status`, read one after the other.
async fn cli_and_status_view(admin: std::net::SocketAddr) -> View {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka-assigner"))
        .args(["status", "--admin-addr", &admin.to_string()])
        .output()
        .await
        .expect("kafka-assigner status runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    // The rows under the header line that starts with `header`, up to the blank line.
    let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    let section = |header: &str| -> Vec<String> {
        let lines = table.lines().skip_while(|l| !words(l).starts_with(header)).skip(1);
        lines.take_while(|l| !l.trim().is_empty()).map(words).collect()
    };
    let consumers = section("TOPIC CONSUMER");
    // The age (last word) moves on between two reads.
    let handoffs = section("TOPIC PARTITION")
        .into_iter()
        .map(|r| r.rsplit_once(' ').map_or(r.clone(), |(row, _age)| row.to_string()))
        .collect();
    let (_, body) = crate::metrics::http_get(admin, "/status").await;
    let status: Value = serde_json::from_str(&body).expect("/status JSON");
    let mut owners = Vec::new();
    for t in status["topics"].as_array().into_iter().flatten() {
        let topic = t["topic"].as_str().unwrap_or_default().to_string();
        for (p, o) in t["owners"].as_array().into_iter().flatten().enumerate() {
            owners.push((topic.clone(), p as u64, o.as_str().unwrap_or("").to_string()));
        }
    }
    let leader = status["leader"].as_str().unwrap_or("(none)").to_string();
    View { consumers, handoffs, owners, leader }
}

/// Waits until the page shows what `want` accepts and the page, the CLI and `/status`
/// agree on it; returns the page's raw reading.
async fn shown(
    browser: &mut Browser,
    admin: std::net::SocketAddr,
    what: &str,
    want: impl Fn(&View) -> bool,
) -> Value {
    let give_up = tokio::time::Instant::now() + SHOWN;
    loop {
        let page = browser.eval(READ_PAGE).await;
        let view = page_view(&page);
        // The CLI and /status are read only once the page shows the state asked for.
        let mut last = (None, None);
        if want(&view) {
            let other = cli_and_status_view(admin).await;
            if other == view {
                return page;
            }
            last.1 = Some(other);
        }
        last.0 = Some(view);
        assert!(
            tokio::time::Instant::now() < give_up,
            "the page did not show {what} within {SHOWN:?}: {last:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn owned(view: &View, consumer: &str) -> usize {
    view.owners.iter().filter(|(_, _, o)| o == consumer).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_a_handoff_without_a_reload_and_says_what_status_says() {
    let cluster = TestCluster::start(Backend::Memory, 1, |c| {
        c.topic_partitions.clear();
        c.topic_partitions.insert(TOPIC.into(), 6);
        c.drain_policy = DrainPolicy::Drain;
    })
    .await;
    let admin = cluster.instance(0).admin_addr;
    let mut consumers: Vec<TestConsumer> = Vec::new();
    for name in ["c-0", "c-1", "c-2"] {
        consumers.push(cluster.consumer_on(0, name, TOPIC).await);
    }
    {
        let mut all: Vec<&mut TestConsumer> = consumers.iter_mut().collect();
        settle(&cluster, TOPIC, &mut all, SHOWN).await;
    }

    let mut browser = Browser::launch().await;
    browser.navigate(&format!("http://{admin}/ui")).await;
    let before = shown(&mut browser, admin, "three consumers with two partitions each", |v| {
        v.consumers.len() == 3
            && ["c-0", "c-1", "c-2"].iter().all(|c| owned(v, c) == 2)
            && v.handoffs.is_empty()
    })
    .await;
    assert_eq!(page_view(&before).leader, "memory-instance-0");
    assert_eq!(before["ready"], "ready");
    // Planted now; only the same document still has it at the end.
    browser.eval("window.kaPlanted = 'before the handoff'").await;
    let renders_before = before["renders"].as_u64().expect("renders");

    // c-1 leaves; c-0 and c-2 are told to warm its partitions and hold them warming.
    let mut c1 = consumers.remove(1);
    let leaving: Vec<u64> =
        page_view(&before).owners.iter().filter(|(_, _, o)| o == "c-1").map(|(_, p, _)| *p).collect();
    assert_eq!(c1.deregister().await.expect("Deregister"), DeregisterAction::WaitForDrain);
    let during = shown(&mut browser, admin, "c-1's partitions warming elsewhere", |v| {
        let warming: Vec<&String> =
            v.handoffs.iter().filter(|h| h.contains(" c-1 ") && h.ends_with(" warming")).collect();
        warming.len() == leaving.len()
            && v.consumers.iter().any(|r| r.contains(" c-1 ") && r.contains(" draining "))
    })
    .await;
    browser.screenshot(&target_dir().join("kafka-assigner-ui-handoff.png")).await;
    assert_eq!(during["planted"], "before the handoff");

    // The new owners answer; c-1 releases and goes.
    let after = {
        let give_up = tokio::time::Instant::now() + SHOWN;
        loop {
            for c in consumers.iter_mut().chain(std::iter::once(&mut c1)) {
                c.answer_all().await;
            }
            let view = page_view(&browser.eval(READ_PAGE).await);
            if view.consumers.len() == 2
                && view.handoffs.is_empty()
                && owned(&view, "c-0") + owned(&view, "c-2") == 6
            {
                break shown(&mut browser, admin, "the new owners", |v| v == &view).await;
            }
            assert!(tokio::time::Instant::now() < give_up, "the page did not show the new owners: {view:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let view = page_view(&after);
    for p in &leaving {
        let owner = &view.owners.iter().find(|(_, q, _)| q == p).expect("partition shown").2;
        assert!(owner == "c-0" || owner == "c-2", "partition {p} went to {owner}");
    }
    // The same document all along: no reload, no navigation, and it redrew meanwhile.
    assert_eq!(after["planted"], "before the handoff", "the page was reloaded");
    assert_eq!(after["origin"], before["origin"], "the page was reloaded");
    // Redrawn at least twice since (the handoff, then the new owners), by its own polling.
    assert!(after["renders"].as_u64().expect("renders") >= renders_before + 2, "{after}");
    browser.screenshot(&target_dir().join("kafka-assigner-ui.png")).await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mtls_on_the_page_is_served_as_status_is_and_reads_only_status() {
    let ca = TestCa::new("ui-ca");
    let (cert, key) = ca.issue(Leaf::Server).write(ca.dir.path(), "server");
    let tls = TlsSettings { cert, key, client_ca: Some(ca.write_ca("client-ca")), reload_interval: SHOWN };
    let options = ServerOptions {
        tls: Some(tls),
        bind_identity: Some(IdentityRule::new(None).expect("rule")),
        ..ServerOptions::default()
    };
    let served = Secured::memory(options).await;
    let pod = ca.issue(Leaf::ClientDns("pod-a"));
    let client = served.tls(&ca.cert_pem(), Some(&pod)).await.expect("pod-a connects with its certificate");
    let mut a = TestConsumer::register(client, "pod-a", "events").await.expect("pod-a registers");
    a.wait_owned(4, SHOWN).await;

    let admin = served.server.admin_addr;
    let (code, headers, page) = get_with_headers(admin, "/ui").await.expect("GET /ui");
    assert_eq!(code, 200, "{page}");
    let html = headers.iter().any(|h| h.to_ascii_lowercase().starts_with("content-type: text/html"));
    assert!(html, "{headers:?}");
    let (code, status) = get(admin, "/status").await.expect("GET /status");
    assert_eq!(code, 200, "{status}");
    assert!(status.contains("\"pod-a\""), "{status}");
    // The page's one request is /status on its own origin: no other path, no other host.
    assert_eq!(page.matches("fetch(").count(), 1, "{page}");
    assert!(page.contains("fetch(\"/status\""), "{page}");
    assert!(!page.contains("http://") && !page.contains("https://"), "the page loads nothing from elsewhere");
    // An unknown path is still a 404, next to the page.
    assert_eq!(get(admin, "/ui/x").await.expect("GET /ui/x").0, 404);
    served.stop().await;
}
