//! The two processes of a client/server benchmark (the fabric tests, `rstream`): the role
//! options (`--server`, `--client ADDR`, `--pair`, the hidden `--pin`), and under `--pair`
//! the server started as a child process of the same binary on the second CPU.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::PerfError;
use crate::harness::{CpuPair, ProviderKind, pin_current};

/// The shm (and TCP) `--pair` address: loopback.
pub(crate) const SHM_PAIR_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Checks that a role was given and applies `--pin`.
///
/// # Errors
///
/// A usage error when none of `--server`, `--client` and `--pair` was given; a pinning error.
pub(crate) fn start_role(
    server: bool,
    client: Option<&str>,
    pair: bool,
    pin: Option<usize>,
) -> Result<(), PerfError> {
    if !server && !pair && client.is_none() {
        return Err(PerfError::Usage(
            "say where to run: --server, --client ADDR, or --pair".into(),
        ));
    }
    if let Some(cpu) = pin {
        pin_current(cpu)?;
    }
    Ok(())
}

/// The shm rendezvous directory: `--shm-dir` when given; else under `--pair` a private one
/// named after `what` and this process, so concurrent pair runs cannot collide; else `None`
/// (the provider's default).
pub(crate) fn shm_dir(given: Option<&PathBuf>, pair: bool, what: &str) -> Option<PathBuf> {
    if pair {
        Some(
            given.cloned().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("{what}-{}", std::process::id()))
            }),
        )
    } else {
        given.cloned()
    }
}

/// `--client ADDR`: `ip:port`, or `ip` with `port`.
pub(crate) fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, PerfError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| {
            PerfError::Usage(format!(
                "--client {s:?} is not a numeric address: use ip or ip:port"
            ))
        })
}

/// The `--pair` server: `dp-perf <command> --server` with the client's options.
#[derive(Debug)]
pub(crate) struct Server<'a> {
    /// The subcommand (`write-lat`, `rstream`, ...).
    pub command: &'a str,
    /// The address it binds (and the client connects to).
    pub ip: IpAddr,
    /// `--port`.
    pub port: u16,
    /// `--provider`.
    pub provider: ProviderKind,
    /// `--shm-dir`, when there is one.
    pub shm_dir: Option<&'a Path>,
    /// `--device`, when given.
    pub device: Option<&'a str>,
    /// The command's own options the server needs too.
    pub extra: Vec<OsString>,
}

impl Server<'_> {
    /// Starts the server pinned to `cpu`, its stdout discarded, its stderr ours.
    fn spawn(&self, cpu: usize) -> Result<Child, PerfError> {
        let fail = |what: &str, e: std::io::Error| PerfError::Fabric(format!("{what}: {e}"));
        let exe = std::env::current_exe().map_err(|e| fail("finding dp-perf", e))?;
        let mut cmd = Command::new(exe);
        cmd.args([
            self.command,
            "--server",
            "--port",
            &self.port.to_string(),
            "--bind",
            &self.ip.to_string(),
            "--pin",
            &cpu.to_string(),
            "--provider",
            self.provider.name(),
        ]);
        if let Some(d) = self.shm_dir {
            cmd.arg("--shm-dir").arg(d);
        }
        if let Some(d) = self.device {
            cmd.args(["--device", d]);
        }
        cmd.args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail("starting the server process", e))
    }
}

/// The client's peer: the `--pair` server child, or the `--client` address.
#[derive(Debug)]
pub(crate) struct Peer {
    /// Where to connect.
    pub addr: SocketAddr,
    child: Option<Child>,
}

impl Peer {
    /// With `pair` (`--pair`): starts that server on the second of `cpus` and pins this
    /// thread to the first. Without: the address `client` names (`--client`), default port
    /// `port`.
    ///
    /// # Errors
    ///
    /// A usage error for a malformed `--client`; failing to start the server or to pin.
    pub(crate) fn start(
        pair: Option<Server<'_>>,
        client: Option<&str>,
        port: u16,
        cpus: CpuPair,
    ) -> Result<Self, PerfError> {
        if let Some(server) = pair {
            let [client_cpu, server_cpu] = cpus.as_array();
            let child = server.spawn(server_cpu)?;
            pin_current(client_cpu)?;
            Ok(Self {
                addr: SocketAddr::new(server.ip, server.port),
                child: Some(child),
            })
        } else {
            Ok(Self {
                addr: parse_addr(client.unwrap_or_default(), port)?,
                child: None,
            })
        }
    }

    /// Ends the run: waits for a server child (killing it first when the run failed) and
    /// returns the run's result.
    pub(crate) fn finish<T>(mut self, result: Result<T, PerfError>) -> Result<T, PerfError> {
        if let Some(c) = self.child.as_mut() {
            if result.is_err() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        result
    }
}
