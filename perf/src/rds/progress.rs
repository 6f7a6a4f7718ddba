//! `--progress FILE` of `dp-perf rds-check`: twice a second, one line appended to FILE with
//! what the run has done and the state of the node's RDS-TCP connections, so that a run
//! that stalls (in the kernel lab, say) can be read afterwards:
//!
//! ```text
//! 13884 ms recv 199 | 10.0.0.1>10.0.0.2 p0 DOWN backoff 1ms | tcp_conn_lost=1 ... | conn_reset=1 ...
//! ```
//!
//! Fields: milliseconds since the run started, the role and its count (messages received or
//! sent), each TCP connection's paths with their state (and the reconnect backoff of a path
//! that is not up), then every non-zero counter of the TCP transport and of the engine.
//! Lines are built only when due; the file is opened once.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;
use std::time::Duration;

use dataplane::rds::node::RdsNode;
use dataplane::rds::path::ConnState;
use dataplane::rds::{PathId, TransportKind};
use lcore::time::Instant;

const EVERY: Duration = Duration::from_millis(500);

/// The progress log of one run (a no-op without `--progress`).
pub(super) struct Progress {
    out: Option<(File, Instant, Instant)>,
}

impl Progress {
    /// Creates (truncates) `path`, if given; `t0` is the start of the run.
    pub(super) fn open(path: Option<&Path>, t0: Instant) -> io::Result<Self> {
        let out = match path {
            Some(p) => Some((File::create(p)?, t0, t0)),
            None => None,
        };
        Ok(Self { out })
    }

    /// Appends a line if half a second has passed since the last one (or `force`).
    pub(super) fn tick(
        &mut self,
        now: Instant,
        role: &str,
        count: u64,
        n: &mut RdsNode,
        force: bool,
    ) {
        let Some((file, t0, last)) = self.out.as_mut() else {
            return;
        };
        if !force && now.nanos_since(*last) < EVERY.as_nanos() as u64 {
            return;
        }
        *last = now;
        let line = line(now.nanos_since(*t0) / 1_000_000, role, count, n);
        // A full disk must not end the run: the log is a diagnostic.
        let _ = writeln!(file, "{line}");
    }
}

fn line(ms: u64, role: &str, count: u64, n: &mut RdsNode) -> String {
    let mut s = format!("{ms} ms {role} {count} |");
    let e = n.engine();
    for (conn, key, npaths) in e.connections() {
        if key.transport != TransportKind::Tcp {
            continue;
        }
        let _ = write!(s, " {}>{}", key.laddr.ip(), key.faddr.ip());
        for index in 0..npaths.max(1) {
            let id = PathId { conn, index };
            let Some(state) = e.path_state(id) else {
                continue;
            };
            let _ = write!(s, " p{index} {}", state.name());
            if state != ConnState::Up
                && let Some(p) = e.path(id)
            {
                let _ = write!(s, " backoff {:?}", p.backoff_window());
            }
        }
    }
    s.push_str(" |");
    if let Some(t) = n.transport_mut(TransportKind::Tcp) {
        t.counters(&mut |k, v| {
            if v != 0 {
                let _ = write!(s, " {k}={v}");
            }
        });
    }
    s.push_str(" |");
    for (k, v) in n.engine().stats().iter() {
        if v != 0 {
            let _ = write!(s, " {k}={v}");
        }
    }
    s
}
