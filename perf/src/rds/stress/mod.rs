//! `dp-perf rds-stress`: rds-tools' rds-stress over this RDS.
//!
//! The active side keeps `tasks × depth` requests of `-q` bytes outstanding, spread round
//! robin over `--sockets` sockets (default: one per task) bound to `port+1+k`, each sending
//! to the passive side's socket `k`; the passive side answers each request with an ack of
//! `-a` bytes. With `-o` (one way) nothing is acked by the application: the active side
//! sends as fast as its send buffers and the receiver's congestion allow, and the rate is
//! what the passive side received. Every second a line of rds-stress's columns; then the
//! average. Socket readiness comes from the engine's events, so the loop costs the same
//! with one socket or thousands. As in rds-stress, the socket buffers come to
//! `tasks × depth × (request + ack) × 2` bytes (split over the `--sockets`, each holding at
//! least one request), so `-d` also bounds what a one-way sender keeps queued.
//!
//! `--rdma` (rds-stress's `-D`): the payload moves by RDMA WRITE and the request message
//! (16 bytes) notifies the passive side; see the `rdma` module.
//!
//! # Files
//!
//! From the top down: this file runs the command (both sides here with `--pair`, one side
//! otherwise, or the kernel's sockets with `--kernel`); `active.rs` is the active side's
//! loop (requests out, acks or RDMA notifications in, the per-second rows) and
//! `passive.rs` the passive side's (requests in, acks out); `sides.rs` holds what both
//! loops use (the phase they share, binding the sockets, readiness); `args.rs` the options
//! and their checks, and `report.rs` the result with its table, `--json` object and
//! figure.

mod active;
mod args;
mod passive;
mod report;
mod sides;

pub use args::StressArgs;
pub use report::{SecRow, StressReport};

use std::sync::atomic::{AtomicU8, AtomicU64};
use std::time::Duration;

use self::args::WARMUP;
use self::sides::{Shared, WARM};
use crate::PerfError;
use crate::common::Common;
use crate::harness::{run_on, run_pair};
use crate::rds::kernel::{self, KernelLoad, Phase};
use crate::rds::{PAIR_ACTIVE_TCP, PAIR_PASSIVE_TCP, rendezvous};

impl StressArgs {
    /// Runs the command.
    ///
    /// # Errors
    ///
    /// Bad options; a node that cannot be made; a transfer that fails.
    pub fn run(&self, common: &Common) -> Result<StressReport, PerfError> {
        let sockets = self.check()?;
        let secs = if common.quick { 1 } else { self.seconds };
        if self.kernel {
            return self.run_kernel(common, sockets, secs);
        }
        let dir = rendezvous(self.dir.as_ref(), self.pair, "rds-stress");
        let shared = Shared {
            phase: AtomicU8::new(WARM),
            passive_rx: AtomicU64::new(0),
        };
        let [ca, cb] = common.cpus.as_array();
        let d = dir.as_deref();
        if self.pair {
            if let Some(d) = d {
                let _ = std::fs::create_dir_all(d);
            }
            let (pa, pp) = self.fabric.pair_addrs();
            let (a, b) = run_pair(
                [ca, cb],
                || self.active(d, pa, pp, sockets, secs, &shared),
                || self.passive(d, pp, sockets, &shared, None),
            )?;
            if let Some(d) = d {
                let _ = std::fs::remove_dir_all(d);
            }
            let (_, piters, pstats) = b?;
            a.map(|mut r| {
                r.iterations[1] = piters;
                for (c, (_, v)) in r.counters.iter_mut().zip(pstats) {
                    c.2 = v;
                }
                r.counters.retain(|c| c.1 != 0 || c.2 != 0);
                r
            })
        } else {
            let local = self.local.expect("checked");
            match self.peer {
                Some(peer) => run_on(ca, || self.active(d, local, peer, sockets, secs, &shared))?,
                None => {
                    let limit = Duration::from_secs(secs + 30);
                    let (served, _, _) =
                        run_on(ca, || self.passive(d, local, sockets, &shared, Some(limit)))??;
                    Ok(StressReport {
                        served: Some(served),
                        ..self.report(sockets, 0.0)
                    })
                }
            }
        }
    }

    /// `--kernel`: the load on the kernel's AF_RDS sockets.
    fn run_kernel(
        &self,
        common: &Common,
        sockets: u32,
        secs: u64,
    ) -> Result<StressReport, PerfError> {
        let load = KernelLoad {
            port: self.port,
            req: self.req,
            ack: self.ack.max(1),
            inflight: u64::from(self.tasks * self.depth),
            sockets,
            one_way: self.one_way,
            warmup: WARMUP,
            transport: self.kernel_transport.kernel_value(),
        };
        let phase = Phase(AtomicU8::new(WARM));
        let [ca, cb] = common.cpus.as_array();
        let report = |rate: f64, waits: u64, served: Option<u64>| StressReport {
            served,
            waits: [waits, 0, 0],
            ..self.report(sockets, rate)
        };
        if self.pair {
            let (a, b) = run_pair(
                [ca, cb],
                || kernel::active(&load, PAIR_ACTIVE_TCP, PAIR_PASSIVE_TCP, secs, &phase),
                || {
                    kernel::passive(
                        &load,
                        PAIR_PASSIVE_TCP,
                        &phase,
                        Some(Duration::from_secs(secs + 30)),
                    )
                },
            )?;
            b?;
            let (rate, waits) = a?;
            return Ok(report(rate, waits, None));
        }
        let local = self.local.expect("checked");
        match self.peer {
            Some(peer) => {
                let (rate, waits) =
                    run_on(ca, || kernel::active(&load, local, peer, secs, &phase))??;
                Ok(report(rate, waits, None))
            }
            None => {
                let limit = Some(Duration::from_secs(secs + 30));
                let served = run_on(ca, || kernel::passive(&load, local, &phase, limit))??;
                Ok(report(0.0, 0, Some(served)))
            }
        }
    }
}
