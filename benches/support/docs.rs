//! A benchmark's Markdown into `docs/benchmarks/{name}.md`, so the docs show the tables the
//! benches write instead of pasted logs. Asked for with `--write-docs` after `--`
//! (`cargo bench --bench assignment -- --write-docs`) or `BENCH_DOCS=1`; without either,
//! the benches only write under `target/`, so a trial run does not rewrite the docs.
//!
//! Each file starts with where it came from: the command, the date, the commit and the
//! machine's CPU count, since the numbers mean nothing without them.

use std::{
    path::PathBuf,
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

/// Whether this run should write its results into `docs/benchmarks/`.
pub fn wanted() -> bool {
    std::env::args().any(|arg| arg == "--write-docs") || std::env::var("BENCH_DOCS").is_ok_and(|v| v == "1")
}

/// The command that reproduces this run: `cargo bench --bench {bench} -- --write-docs`,
/// preceded by the environment variables named by `env_prefixes` that are set (the scale
/// bench's `SCALE_*`, `KAT_ETCD_TLS`), so a reader can tell a smoke run from a full one.
pub fn command(bench: &str, env_prefixes: &[&str]) -> String {
    let mut vars: Vec<String> = std::env::vars()
        .filter(|(name, _)| env_prefixes.iter().any(|prefix| name.starts_with(prefix)))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    vars.sort();
    vars.push(format!("cargo bench --bench {bench} -- --write-docs"));
    vars.join(" ")
}

/// Writing a bench's table under the target directory failed.
#[derive(Debug, thiserror::Error)]
#[error("could not write {}", path.display())]
pub struct TargetWriteFailed {
    /// The file it was writing.
    pub path: PathBuf,
    /// Why the directory or the file could not be written.
    #[source]
    pub source: std::io::Error,
}

/// Writes `bench-{name}.md` under the target directory in use (`CARGO_TARGET_DIR` when
/// set, else `target/`), creating it if missing; every run writes it, docs or not.
/// Returns the path written.
pub fn write_target(name: &str, body: &str) -> Result<PathBuf, TargetWriteFailed> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let path = dir.join(format!("bench-{name}.md"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, body)) {
        Ok(()) => Ok(path),
        Err(source) => Err(TargetWriteFailed { path, source }),
    }
}

/// Writes `docs/benchmarks/{name}.md`: `title`, where the numbers came from, then `body`.
/// Returns the path written.
pub fn write(name: &str, title: &str, command: &str, body: &str) -> std::io::Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.md"));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    // `cargo bench` builds with the bench profile; a run built otherwise (`--profile dev`)
    // says so, since its times are not comparable.
    let build = if cfg!(debug_assertions) { ", a debug build (times not comparable)" } else { "" };
    let text = format!(
        "<!-- Written by `{command}`; run it again to update this file. -->\n\n\
         # {title}\n\n\
         Run on {date} (UTC), commit `{commit}`, {cpus} CPUs{build}, by `{command}`.\n\n\
         {body}",
        date = today(),
        commit = commit(),
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The commit checked out, with `+ local changes` when tracked files outside
/// `docs/benchmarks/` differ from it; `unknown` outside a git checkout.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else { return "unknown".into() };
    let changes =
        git(&["status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/benchmarks"]);
    match changes {
        Some(list) if !list.is_empty() => format!("{head} + local changes"),
        _ => head,
    }
}

/// Today's date, `YYYY-MM-DD` in UTC, from the system clock (days to civil date, after
/// Howard Hinnant's `civil_from_days`; no date crate needed for one line).
fn today() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
