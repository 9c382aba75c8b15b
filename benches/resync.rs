//! The whole-prefix read an instance makes on resync (issue 42, item 3), at 100,000 keys.
//!
//! Every instance mirrors the whole prefix, so a resync (start-up, a compacted watch, a
//! lost connection) reads everything with one `get_prefix`. This bench fills a store with
//! 100,000 generated assignment records (`{prefix}assignments/topic-NNN/P`, the layout's
//! key and a JSON value like `{"v":1,"owner":"consumer-00042","epoch":…}`; 100 topics of
//! 1,000 partitions) and times `LeaseStore::get_prefix` on:
//!
//! * the memory store (`MemoryStore`);
//! * a real etcd started by the bench (`EtcdStore`, the service's client), with, in the same
//!   run, the raw `etcd_client` range read of the same prefix as the baseline: the ratio is
//!   what decoding into `KeyValue`s adds to etcd's own read and its transport.
//!
//! Median and min–max of the runs. Prints the table, writes it to `bench-resync.md` under
//! the target directory, and with `-- --write-docs` (or `BENCH_DOCS=1`) to
//! `docs/benchmarks/resync.md`. Run: `cargo bench --bench resync` (needs the `etcd` binary).
#![forbid(unsafe_code)]

#[path = "support/docs.rs"]
mod docs;

#[allow(dead_code)]
#[path = "../tests/integration/support/etcd.rs"]
mod etcd;
// etcd.rs starts a TLS etcd instead when KAT_ETCD_TLS is set.
#[allow(dead_code)]
#[path = "../tests/integration/support/certs.rs"]
mod certs;
#[allow(dead_code)]
#[path = "../tests/integration/support/etcd_tls.rs"]
mod etcd_tls;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use kafka_assigner::store::{LeaseStore, MemoryStore, Op, Txn};

type BoxError = Box<dyn std::error::Error>;

const KEYS: usize = 100_000;
const TOPICS: usize = 100;
/// etcd refuses a transaction of more than 128 operations by default (`--max-txn-ops`).
const PER_TXN: usize = 128;
const RUNS: usize = 11;
const PREFIX: &str = "/bench/resync/";

/// The generated records, in the layout's shape (see the module docs).
fn records() -> Vec<(String, String)> {
    let per_topic = KEYS / TOPICS;
    (0..KEYS)
        .map(|i| {
            let (topic, partition) = (i / per_topic, i % per_topic);
            let key = format!("{PREFIX}assignments/topic-{topic:03}/{partition}");
            let epoch = 1_765_000_000_000_000u64 + i as u64;
            let value = format!(r#"{{"v":1,"owner":"consumer-{:05}","epoch":{epoch}}}"#, i % 10_000);
            (key, value)
        })
        .collect()
}

async fn fill(store: &dyn LeaseStore, records: &[(String, String)]) -> Result<(), BoxError> {
    for chunk in records.chunks(PER_TXN) {
        let ops = chunk.iter().map(|(k, v)| Op::put(k.clone(), v.clone().into_bytes())).collect();
        store.txn(Txn { compares: Vec::new(), ops }).await?;
    }
    Ok(())
}

/// Median and min–max, in ms.
fn spread(mut samples: Vec<Duration>) -> (String, Duration) {
    samples.sort_unstable();
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
    let median = samples[samples.len() / 2];
    (format!("{} ({}–{})", ms(median), ms(samples[0]), ms(samples[samples.len() - 1])), median)
}

/// `RUNS` timings of `read`, which returns the number of keys it read (checked).
async fn time<F, Fut>(mut read: F) -> Result<(String, Duration), BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize, BoxError>>,
{
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        let read = read().await?;
        samples.push(start.elapsed());
        if read != KEYS {
            return Err(format!("read {read} keys, expected {KEYS}").into());
        }
    }
    Ok(spread(samples))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let records = records();
    let bytes: usize = records.iter().map(|(k, v)| k.len() + v.len()).sum();

    let memory = MemoryStore::new();
    fill(&memory, &records).await?;
    let memory = &memory;
    let (memory_read, memory_median) =
        time(|| async move { Ok(memory.get_prefix(PREFIX).await?.kvs.len()) }).await?;

    let server = etcd::EtcdServer::start().await;
    let store = server.store().await;
    let fill_start = Instant::now();
    fill(&store, &records).await?;
    let fill_time = fill_start.elapsed();
    let raw = etcd_client::Client::connect(server.endpoints(), None).await?;
    // Interleaved run by run would be fairer to noise, but each read is tens of ms against
    // a shared machine's millisecond noise; one after the other keeps the code plain.
    let (raw_read, raw_median) = time(|| {
        // The reply is about 11 MB, over tonic's 4 MiB default; the service raises it alike.
        let mut kv = raw.kv_client().max_decoding_message_size(256 * 1024 * 1024);
        async move {
            let response = kv.get(PREFIX, Some(GetOptions::new().with_prefix())).await?;
            Ok(response.kvs().len())
        }
    })
    .await?;
    let etcd_store = &store;
    let (store_read, store_median) =
        time(|| async move { Ok(etcd_store.get_prefix(PREFIX).await?.kvs.len()) }).await?;
    drop(store);
    drop(server);

    let ratio = |a: Duration, b: Duration| format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64().max(1e-9));
    let mut md = String::new();
    let _ = writeln!(md, "| read of {KEYS} keys | ms, median (min–max) of {RUNS} | against raw etcd |");
    let _ = writeln!(md, "| --- | --- | --- |");
    let _ = writeln!(md, "| raw `etcd_client` range (baseline) | {raw_read} | 1.00x |");
    let _ = writeln!(md, "| `EtcdStore::get_prefix` | {store_read} | {} |", ratio(store_median, raw_median));
    let _ =
        writeln!(md, "| `MemoryStore::get_prefix` | {memory_read} | {} |", ratio(memory_median, raw_median));
    let _ = writeln!(
        md,
        "\n{KEYS} generated assignment records under one prefix ({TOPICS} topics of {} partitions, \
         {:.1} MiB of keys and values), written in transactions of {PER_TXN} (on etcd in {:.1} s). \
         etcd {} on loopback, started by the bench with the tests' launcher; the raw read and \
         `get_prefix` read the same prefix, one after the other.",
        KEYS / TOPICS,
        bytes as f64 / (1024.0 * 1024.0),
        fill_time.as_secs_f64(),
        etcd_version(),
    );
    println!("{md}");

    match docs::write_target("resync", &md) {
        Ok(path) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("{e}: {}", e.source),
    }
    if docs::wanted() {
        let command = docs::command("resync", &["KAT_ETCD_TLS"]);
        let path = docs::write("resync", "Resync: whole-prefix reads at 100,000 keys", &command, &md)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The etcd binary's version line, for the table's caption.
fn etcd_version() -> String {
    let out = std::process::Command::new("etcd").arg("--version").output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().next().map(|l| l.replace("etcd Version: ", ""))
        })
        .unwrap_or_else(|| "(version unknown)".into())
}
