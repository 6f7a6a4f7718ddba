//! Helpers the integration tests share: the example files, a private rendezvous
//! directory, the `dpctl` binary with it, pipelines run and collected (killed by their pid
//! if a test fails first), and the telemetry commands.
//!
//! Runs take [`heavy`] so that at most two hybrid-mode lcores poll at a time (2-CPU CI);
//! each test binary has its own lock. Time limits are hang guards only.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use apps::config::{Config, ConfigError};
use apps::summary::{StageSummary, Summary};

static HEAVY: Mutex<()> = Mutex::new(());

/// One pipeline run at a time in this test binary.
pub fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `apps/configs/NAME`.
pub fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("configs")
        .join(name)
}

/// A private rendezvous directory (shm provider and telemetry sockets), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMPDIR/dpctl-<group>-<pid>-<tag>`, empty.
    pub fn new(group: &str, tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("dpctl-{group}-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `dpctl` binary with `dir` as its rendezvous directory, output captured.
pub fn dpctl(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dpctl"));
    c.env("DP_SHM_DIR", dir)
        .env_remove("XDG_RUNTIME_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    c
}

/// A pipeline this test started: killed (by its pid) if the test fails before collecting it.
pub struct Proc(pub Option<Child>);

impl Proc {
    /// Its pid.
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Asks it to stop as Ctrl-C does.
    pub fn interrupt(&self) {
        let pid = i32::try_from(self.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of the child this test started and has not reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `dpctl run apps/configs/NAME --json --quiet ARGS`, started.
pub fn run_json(c: &mut Command, name: &str, args: &[&str]) -> Proc {
    Proc(Some(
        c.arg("run")
            .arg(example(name))
            .args(["--json", "--quiet"])
            .args(args)
            .spawn()
            .unwrap(),
    ))
}

/// Waits for the pipeline (killing it after `limit`); returns its summary.
pub fn summary(mut p: Proc, limit: Duration) -> Summary {
    let mut child = p.0.take().expect("collected once");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("hung; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// What a finished `dpctl` said.
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Starts `c` with its output captured.
pub fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    c.spawn().unwrap()
}

/// Waits for `child` (spawned with piped stdout and stderr) for at most `limit`, reading
/// its output meanwhile (so a long output cannot block it).
pub fn wait(mut child: Child, limit: Duration) -> Finished {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let ro = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let re = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "dpctl did not finish within {limit:?}; stderr:\n{}",
                re.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Finished {
        status,
        stdout: ro.join().unwrap(),
        stderr: re.join().unwrap(),
    }
}

/// Runs an example with `--json --quiet` and `args` to its end; returns its summary.
pub fn run_example(dir: &Path, name: &str, args: &[&str]) -> Summary {
    let mut c = dpctl(dir);
    c.arg("run")
        .arg(example(name))
        .args(["--json", "--quiet"])
        .args(args);
    let f = wait(spawn(c), Duration::from_secs(90));
    assert!(
        f.status.success(),
        "{name}: {}\nstdout:\n{}\nstderr:\n{}",
        f.status,
        f.stdout,
        f.stderr
    );
    serde_json::from_str(&f.stdout)
        .unwrap_or_else(|e| panic!("{name}: summary is not JSON ({e}):\n{}", f.stdout))
}

/// The summary of stage `name`.
pub fn stage<'a>(s: &'a Summary, name: &str) -> &'a StageSummary {
    s.stage(name)
        .unwrap_or_else(|| panic!("no stage {name} in {s:#?}"))
}

/// Waits until `pid`'s telemetry socket is up in `dir`.
pub fn wait_socket(dir: &Path, pid: u32) {
    let sock = dir.join(format!("dpctl-{pid}.sock"));
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no telemetry socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `dpctl CMD --pid PID ARGS` in `dir`: its exit status, stdout and stderr.
pub fn info(dir: &Path, cmd: &str, pid: u32, args: &[&str]) -> (bool, String, String) {
    let out = dpctl(dir)
        .arg(cmd)
        .args(["--pid", &pid.to_string()])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The error of a config body that must be refused.
pub fn err(body: &str) -> ConfigError {
    match Config::parse(body, "t.toml") {
        Ok(c) => panic!("accepted a bad config: {c:#?}"),
        Err(e) => e,
    }
}

/// The key a config error names.
pub fn key_of(e: &ConfigError) -> &str {
    match e {
        ConfigError::Invalid { key, .. }
        | ConfigError::BadValue { key, .. }
        | ConfigError::MissingKey { key, .. }
        | ConfigError::UnknownKey { key, .. } => key,
        other => panic!("no key in {other:?}"),
    }
}
