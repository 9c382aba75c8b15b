//! A child process that cannot outlive the test: it runs in a process group of its own
//! under a shell watchdog that kills the whole group (`kill -9 -PGID`) when our end of its
//! stdin pipe closes, on [`Drop`] (a passing or a panicking test) or when the test binary
//! dies in any way (even SIGKILL: the kernel closes the pipe). The group matters for
//! Chromium, whose renderer and GPU processes would otherwise be left behind.

use std::{
    process::{Child, ChildStdin, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

/// Runs `$0 "$@"` as the leader of a new session (setsid: a background job of a shell with
/// no job control is not a group leader, so setsid execs in place and `$!` is the group);
/// a watcher kills the group when fd 3 (our pipe) reaches EOF.
const WATCHDOG: &str = r#"exec 3<&0
setsid "$0" "$@" </dev/null 3<&- &
pid=$!
( cat <&3 >/dev/null 2>&1; kill -9 -- "-$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null ) </dev/null &
watcher=$!
exec 3<&-
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
exit "$status""#;

/// How long dropping waits for the watchdog shell to exit.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// A process (and its process group) killed when this is dropped.
pub struct Guarded {
    child: Child,
    stdin: Option<ChildStdin>,
    what: String,
}

impl Guarded {
    /// Starts `program` with `args`; its stdout and stderr go to `log` (a file), so a
    /// failing test can show them.
    pub fn spawn(program: &str, args: &[String], log: &std::path::Path) -> Guarded {
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let err = out.try_clone().expect("log file handle");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let stdin = child.stdin.take();
        Guarded { child, stdin, what: program.to_string() }
    }

    /// Whether it is still running (`Some(status)` once it exited by itself).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let give_up = Instant::now() + STOP_DEADLINE;
        while Instant::now() < give_up {
            if let Ok(Some(_)) | Err(_) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(5));
        }
        eprintln!("{}: the watchdog did not finish within {STOP_DEADLINE:?}; killing the shell", self.what);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The live processes (not zombies: those have no command line) whose command line
/// mentions `needle`, as `pid: command line`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then(|| format!("{}: {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}
