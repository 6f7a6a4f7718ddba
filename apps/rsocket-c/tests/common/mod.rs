//! Shared by the integration tests: the built library, and running programs under it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The library under test: `$DP_RSOCKET_LIB`, else a release build in this test's target
/// directory (built once per test process; release, as `scripts/with-rsocket` builds it
/// and so that program runs measure what users get). Panics if the build fails.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("DP_RSOCKET_LIB") {
            return PathBuf::from(p);
        }
        // <target>/<profile>/deps/<test>: the target directory is three levels up.
        let exe = std::env::current_exe().expect("test executable path");
        let target = exe
            .ancestors()
            .nth(3)
            .expect("test executable inside a cargo target directory")
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "--release", "-p", "dp-rsocket-c"])
            .current_dir(repo())
            .env("CARGO_TARGET_DIR", &target);
        if cfg!(feature = "verbs") {
            cmd.args(["--features", "verbs"]);
        }
        let st = cmd.status().expect("running cargo build for the library");
        assert!(st.success(), "building dp-rsocket-c failed: {st}");
        let lib = target.join("release/librdmacm.so");
        assert!(lib.exists(), "{} missing after the build", lib.display());
        lib
    })
}

/// `libdp_rspreload.so` (apps/rsocket-preload), built in release into the same target
/// directory as [`library`]; `$DP_RSPRELOAD_LIB` instead if set. Panics if the build fails.
pub fn rspreload() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("DP_RSPRELOAD_LIB") {
            return PathBuf::from(p);
        }
        let target = library()
            .parent()
            .and_then(Path::parent)
            .expect("the library inside <target>/release")
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "--quiet", "--release", "-p", "dp-rspreload"])
            .current_dir(repo())
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("running cargo build for the preload");
        assert!(st.success(), "building dp-rspreload failed: {st}");
        let lib = target.join("release/libdp_rspreload.so");
        assert!(lib.exists(), "{} missing after the build", lib.display());
        lib
    })
}

/// One program pair at a time per test process: the machine may have two cores only.
pub fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A port no other test (of this process or a concurrent run) uses: derived from the pid.
pub fn port(offset: u16) -> u16 {
    20_000 + (std::process::id() % 2000) as u16 * 16 + offset
}

/// A child that is killed if the test fails before waiting for it.
pub struct Guarded {
    pub child: Option<Child>,
    pub what: String,
}

impl Guarded {
    pub fn new(child: Child, what: impl Into<String>) -> Self {
        Self {
            child: Some(child),
            what: what.into(),
        }
    }

    /// Waits up to `limit`; on timeout kills the child and returns `None`.
    pub fn wait_for(&mut self, limit: Duration) -> Option<(ExitStatus, String, String)> {
        let mut child = self.child.take().expect("waited once");
        let t0 = Instant::now();
        loop {
            match child.try_wait().expect("try_wait") {
                Some(_) => break,
                None if t0.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let out = child.wait_with_output().expect("collecting output");
        Some((
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// True while the child runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits up to `limit` for a child that must finish by itself (a client); panics,
    /// having killed it, if it does not.
    pub fn finish(&mut self, limit: Duration) -> (ExitStatus, String, String) {
        self.wait_for(limit)
            .unwrap_or_else(|| panic!("{} did not finish within {limit:?} (killed)", self.what))
    }

    /// Stops a child that would serve on (a server): kills it by its pid, then returns its
    /// status and output.
    pub fn stop(mut self) -> (ExitStatus, String, String) {
        let mut c = self.child.take().expect("started, and not waited for yet");
        c.kill().expect("stopping the server");
        let out = c.wait_with_output().expect("server output");
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The installed program `name` (searched in `$PATH`), or `None` after printing why the
/// test is skipped and what to do: `install` says how to install it.
pub fn program(name: &str, install: &str) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!("skipped: {name} is not installed; {install} to run this test");
    }
    found.map(|p| p.to_str().expect("utf-8 path").to_owned())
}

/// The install hint of the programs `scripts/setup.sh` installs, for [`program`].
pub const BY_SETUP: &str = "install it (scripts/setup.sh as root)";

/// Starts the server `cmd` (named `what` in messages) and waits until `listening` says
/// it listens. Panics with its output if it exits first, or after 60 s.
pub fn start_server(
    mut cmd: Command,
    what: impl Into<String>,
    listening: impl Fn() -> bool,
) -> Guarded {
    let mut srv = Guarded::new(cmd.spawn().expect("starting the server"), what);
    let t0 = Instant::now();
    while !listening() {
        if !srv.running() {
            let (st, out, err) = srv.finish(Duration::from_secs(60));
            panic!("{} exited before listening ({st}):\n{out}\n{err}", srv.what);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{} did not listen within 60 s",
            srv.what
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    srv
}

/// Runs the client `cmd` (named `what` in messages) to its end; returns its status and
/// output. Panics, having killed it, if it runs longer than `limit`.
pub fn run_client(
    mut cmd: Command,
    what: impl Into<String>,
    limit: Duration,
) -> (ExitStatus, String, String) {
    Guarded::new(cmd.spawn().expect("starting the client"), what).finish(limit)
}

/// True once a listener on `port` exists in the shm rendezvous directory `dir`: proof
/// that a server listens on this library's rsockets, not on a kernel socket.
pub fn rsocket_listening(dir: &Path, port: u16) -> bool {
    let suffix = format!("_{port}.sock");
    std::fs::read_dir(dir.join("listen")).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(&suffix))
    })
}

/// True once a kernel TCP listener on `port` exists (a preload listens on kernel
/// sockets; connections move to rsockets afterwards).
pub fn kernel_listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&hex) && cols[3] == "0A"
            })
        })
    })
}

/// `scripts/with-rsocket PROGRAM ARGS` with the test's library and rendezvous directory,
/// output captured.
pub fn with_rsocket(shm_dir: &Path, program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(repo().join("scripts/with-rsocket"));
    c.arg(program)
        .args(args)
        .env("DP_RSOCKET_LIB", library())
        .env("DP_SHM_DIR", shm_dir)
        .env_remove("DP_RSOCKET_PROVIDER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("dp-rsocket-c-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating a temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Owned program arguments.
pub fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// rstream's rows, by name, from its table.
pub fn rows(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("name"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}
