//! Re-executing the current test binary to run one test body in a child process.

use std::io::{self, Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use super::{trapped_count, trapped_syscalls};

/// Environment variable that marks the child process (`DP_SECCOMP_CHILD=1`).
pub const CHILD_ENV: &str = "DP_SECCOMP_CHILD";

const RESULT_PREFIX: &str = "DP_SECCOMP_RESULT:";
const TRAPPED_PREFIX: &str = "DP_SECCOMP_TRAPPED:";

/// How long the parent waits for the child before killing it (a hang guard, not a timing
/// assertion).
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(180);

/// Whether this process is a child started by [`run_in_child`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some_and(|v| v == "1")
}

/// What the child reported.
#[derive(Debug, Clone)]
pub struct ChildReport {
    /// The child's exit status (0 iff the body returned `Ok`).
    pub status: ExitStatus,
    /// Whether the body returned `Ok`.
    pub ok: bool,
    /// The body's `Ok` or `Err` string (or the panic message).
    pub message: String,
    /// Total syscalls trapped in the child.
    pub trapped_count: usize,
    /// The first [`MAX_RECORDED`](super::MAX_RECORDED) trapped syscall numbers.
    pub trapped: Vec<i64>,
    /// The child's full stdout.
    pub stdout: String,
    /// The child's full stderr.
    pub stderr: String,
}

impl ChildReport {
    /// Panics with the child's output unless the body succeeded, the child exited 0 and no
    /// syscall was trapped; prints the trapped syscall numbers otherwise.
    pub fn assert_ok_without_syscalls(&self) {
        assert!(
            self.ok && self.status.success(),
            "child failed ({}): {}\ntrapped {} syscall(s): {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.message,
            self.trapped_count,
            self.trapped,
            self.stdout,
            self.stderr
        );
        assert!(
            self.trapped_count == 0,
            "the filtered thread made {} syscall(s); numbers: {:?} (see `ausyscall --dump` or \
             asm/unistd_64.h)\nchild said: {}",
            self.trapped_count,
            self.trapped,
            self.message
        );
    }
}

/// Why the child could not be run or understood.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// `current_exe` failed.
    #[error("cannot find the test binary to re-execute: {0}")]
    CurrentExe(#[source] io::Error),
    /// The child could not be started.
    #[error("cannot start the child test process: {0}")]
    Spawn(#[source] io::Error),
    /// The child did not finish in time and was killed.
    #[error(
        "child test `{test}` did not finish within {after:?} and was killed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )]
    Timeout {
        /// The test name.
        test: String,
        /// The limit.
        after: Duration,
        /// Its stdout so far.
        stdout: String,
        /// Its stderr so far.
        stderr: String,
    },
    /// The child exited without printing a result line (wrong test name, crash, ...).
    #[error(
        "child test `{test}` exited ({status}) without a result line; is the name passed to \
         run_in_child the test's full path?\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )]
    NoResult {
        /// The test name.
        test: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stdout.
        stdout: String,
        /// Its stderr.
        stderr: String,
    },
}

/// Runs `body` in a child process and returns what it reported.
///
/// In the parent (no `DP_SECCOMP_CHILD=1` in the environment), re-executes the current test
/// binary as `<exe> --exact <test_name> --nocapture --test-threads=1` with
/// `DP_SECCOMP_CHILD=1`, waits up to [`CHILD_TIMEOUT`], and parses the child's result lines.
/// `test_name` is the libtest name of the calling test: the function name for a top-level
/// test in `tests/*.rs`, `module::name` otherwise.
///
/// In the child, calls `body`, prints the result and the trapped syscalls, and exits the
/// process (code 0 if `body` returned `Ok`, 1 otherwise; a panic counts as `Err`). The exit is
/// `exit_group`, which also ends threads parked by [`park_forever`](super::park_forever). It
/// never returns in the child.
///
/// # Errors
///
/// [`ChildError`] if the child could not be started, timed out, or printed no result.
pub fn run_in_child<F>(test_name: &str, body: F) -> Result<ChildReport, ChildError>
where
    F: FnOnce() -> Result<String, String>,
{
    if is_child() {
        child_main(body);
    }
    let exe = std::env::current_exe().map_err(ChildError::CurrentExe)?;
    let mut child = Command::new(exe)
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ChildError::Spawn)?;
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let status = wait_with_deadline(&mut child, CHILD_TIMEOUT);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(ChildError::Timeout {
            test: test_name.to_owned(),
            after: CHILD_TIMEOUT,
            stdout,
            stderr,
        });
    };
    parse(test_name, status, stdout, stderr)
}

fn child_main<F: FnOnce() -> Result<String, String>>(body: F) -> ! {
    let result = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => Err(p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .map_or_else(|| "panicked".to_owned(), |m| format!("panicked: {m}"))),
    };
    let (ok, msg) = match &result {
        Ok(m) => (true, m),
        Err(m) => (false, m),
    };
    let msg = msg.replace('\n', " | ");
    let count = trapped_count();
    let numbers = trapped_syscalls();
    let mut stdout = io::stdout().lock();
    // libtest has printed "test <name> ... " without a newline; start a fresh line.
    let _ = writeln!(stdout);
    let _ = writeln!(
        stdout,
        "{RESULT_PREFIX} {} {msg}",
        if ok { "ok" } else { "err" }
    );
    let _ = writeln!(stdout, "{TRAPPED_PREFIX} {count} {numbers:?}");
    let _ = stdout.flush();
    drop(stdout);
    std::process::exit(if ok { 0 } else { 1 })
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let mut buf = Vec::new();
            let _ = p.read_to_end(&mut buf);
            s = String::from_utf8_lossy(&buf).into_owned();
        }
        s
    })
}

fn wait_with_deadline(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = StdInstant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn parse(
    test: &str,
    status: ExitStatus,
    stdout: String,
    stderr: String,
) -> Result<ChildReport, ChildError> {
    let after = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.find(prefix).map(|i| l[i + prefix.len()..].trim()))
    };
    let (result, trapped) = (after(RESULT_PREFIX), after(TRAPPED_PREFIX));
    let (Some(result), Some(trapped)) = (result, trapped) else {
        return Err(ChildError::NoResult {
            test: test.to_owned(),
            status,
            stdout,
            stderr,
        });
    };
    let (ok, message) = match result.split_once(' ') {
        Some((word, rest)) => (word == "ok", rest.to_owned()),
        None => (result == "ok", String::new()),
    };
    let (count, list) = trapped.split_once(' ').unwrap_or((trapped, "[]"));
    let trapped_count = count.parse().unwrap_or(usize::MAX);
    let numbers = list
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    Ok(ChildReport {
        status,
        ok,
        message,
        trapped_count,
        trapped: numbers,
        stdout,
        stderr,
    })
}
