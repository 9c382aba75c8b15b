//! What the test mains share: the environment knobs (one prefix per simulation), the seeds
//! a test runs, one schedule on its own paused runtime under a wall-clock watchdog, the
//! loop over the seeds (or a survey of them), and the head of a failure report.

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The environment variables of one simulation, all named `{prefix}{NAME}`.
pub struct Knobs(pub &'static str);

impl Knobs {
    /// The number in `{prefix}{name}`, if set; panics if it is not a number.
    pub fn u64(&self, name: &str) -> Option<u64> {
        let name = format!("{}{name}", self.0);
        let value = std::env::var(&name).ok()?;
        Some(value.parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
    }

    /// Whether `{prefix}{name}` is set to a number other than 0.
    pub fn on(&self, name: &str) -> bool {
        self.u64(name).is_some_and(|v| v != 0)
    }

    /// The seeds of the `index`-th of `kinds` kinds that share seeds: its share of `total`
    /// from `{prefix}BASE` (rounded down to a multiple of `kinds`), or `{prefix}SEED` alone
    /// if it is one of its seeds.
    pub fn seeds(&self, index: u64, kinds: u64, total: u64) -> Vec<u64> {
        if let Some(seed) = self.u64("SEED") {
            return if seed % kinds == index { vec![seed] } else { Vec::new() };
        }
        let base = self.u64("BASE").unwrap_or(0) / kinds * kinds;
        (0..total.div_ceil(kinds)).map(|k| base + k * kinds + index).collect()
    }
}

/// Ends the test binary with `message` if the schedule it guards has not finished within
/// `budget` of wall time. A schedule that spins without letting paused time advance (a
/// loop that never awaits a timer) cannot be interrupted from outside, so the watchdog, on
/// a thread of its own, exits the process: the test fails instead of hanging CI.
pub struct Watchdog(Option<mpsc::Sender<()>>);

impl Watchdog {
    /// Starts watching; dropping the watchdog stops it.
    pub fn start(budget: Duration, message: String) -> Self {
        let (done, finished) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(budget) {
                // Straight to the process's stderr: the test harness captures `eprintln!`
                // (this thread inherits the capture) and drops it when the process exits.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{message}");
                std::process::exit(101);
            }
        });
        Self(Some(done))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            let _ = done.send(());
        }
    }
}

/// Runs `schedule` to its end on a paused current-thread runtime of its own, under
/// `watchdog`.
pub fn run_paused<T>(
    watchdog: Watchdog,
    schedule: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let _watchdog = watchdog;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(schedule)
}

/// Runs `seeds` one after the other through `run`, handing each success to `tally`.
/// In a `survey` every seed runs and the failures are listed as they come and asserted at
/// the end; otherwise the first failure panics with its whole report. `label` names the
/// test in the messages.
pub fn run_seeds<O>(
    label: &str,
    seeds: &[u64],
    survey: bool,
    mut run: impl FnMut(u64) -> Result<O, String>,
    mut tally: impl FnMut(u64, O),
) {
    let started = Instant::now();
    let mut failed = Vec::new();
    for seed in seeds {
        match run(*seed) {
            Ok(outcome) => tally(*seed, outcome),
            Err(report) if survey => {
                // The report's second line says what broke.
                let why = report.lines().nth(1).unwrap_or_default().trim().to_string();
                eprintln!("{label}: seed {seed} failed after {:?}: {why}", started.elapsed());
                failed.push(*seed);
            }
            Err(report) => panic!("{report}"),
        }
    }
    assert!(
        failed.is_empty(),
        "{label}: {} of {} schedules failed: seeds {failed:?}",
        failed.len(),
        seeds.len()
    );
}

/// The head of a failure report: `title` (which names the seed and how to replay it), what
/// broke, the shape of the run, and the last steps of its log.
pub fn report<'a>(title: &str, why: &str, shape: &str, log: impl IntoIterator<Item = &'a String>) -> String {
    let mut report = format!("{title}\n  {why}\n  shape: {shape}\n  last steps:\n");
    for line in log {
        report.push_str(&format!("    {line}\n"));
    }
    report
}
