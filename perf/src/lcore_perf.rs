//! `dp-perf lcore`: the cost of the lcore poll loop and of inter-lcore messages, measured by
//! [`lcore::perf::measure`] on two pinned lcores in busy mode.
//!
//! - `empty_iter_ns`: nanoseconds per iteration of a poll loop whose pollers never report work
//!   (by default one poller; `--idle-pollers` adds more) and whose inbox is empty: the floor
//!   every real poller pays per round.
//! - `msg_oneway_ns_p50`: median one-way latency of a message between the two lcores' inboxes,
//!   including up to one loop iteration of waiting on each side (half a ping-pong round trip).
//! - `msg_per_sec`: messages per second from one lcore to the other in bursts of 32.

use std::io;

use lcore::perf::{PerfConfig, PerfReport};
use serde::Serialize;

use crate::harness::CpuPair;
use crate::{PerfError, Report};

/// Parameters of [`measure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LcoreConfig {
    /// Main lcore on `first`, worker on `second`.
    pub cpus: CpuPair,
    /// Idle pollers in the loop-overhead run (at least 1).
    pub idle_pollers: usize,
    /// Smoke-test sizes.
    pub quick: bool,
}

/// Result of [`measure`]: `{"lcore":{...}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct LcoreReport {
    /// The three headline numbers.
    pub lcore: LcoreNumbers,
    /// Everything `lcore::perf::measure` reported.
    pub detail: PerfReport,
}

/// The JSON payload of `dp-perf lcore`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LcoreNumbers {
    /// Nanoseconds per idle poll-loop iteration.
    pub empty_iter_ns: f64,
    /// Median one-way message latency, nanoseconds.
    pub msg_oneway_ns_p50: f64,
    /// Messages per second.
    pub msg_per_sec: f64,
}

impl Report for LcoreReport {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "lcore": self.lcore })
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let d = &self.detail;
        writeln!(
            out,
            "lcore perf: CPUs {},{}, clock {}{}",
            d.cpus[0],
            d.cpus[1],
            d.clock,
            d.tsc_hz
                .map(|hz| format!(" ({:.3} GHz TSC)", hz as f64 / 1e9))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "loop iteration, {} idle poller(s): {:>10.2} ns  ({} iterations)",
            d.idle_pollers, d.loop_ns_per_iter, d.loop_iterations
        )?;
        writeln!(
            out,
            "message one-way latency:     p50 {:>6} ns  p99 {} ns  min {} ns  ({} round trips)",
            d.latency_p50_ns, d.latency_p99_ns, d.latency_min_ns, d.latency_samples
        )?;
        writeln!(
            out,
            "message throughput:          {:>10.3} Mmsg/s  (bursts of {}, {} messages)",
            d.msgs_per_sec / 1e6,
            d.burst,
            d.throughput_messages
        )
    }
}

/// Runs [`lcore::perf::measure`] with the perf lab's parameters.
///
/// # Errors
///
/// [`PerfError::Usage`] if `idle_pollers` is 0, [`PerfError::Lcore`] if the lcores cannot be
/// set up or fail.
pub fn measure(cfg: &LcoreConfig) -> Result<LcoreReport, PerfError> {
    if cfg.idle_pollers == 0 {
        return Err(PerfError::Usage("--idle-pollers must be at least 1".into()));
    }
    let mut pc = PerfConfig {
        cpus: cfg.cpus.as_array(),
        idle_pollers: cfg.idle_pollers,
        ..PerfConfig::default()
    };
    if cfg.quick {
        pc.loop_iterations = 10_000;
        pc.latency_samples = 1_000;
        pc.throughput_messages = 100_000;
    }
    let detail = lcore::perf::measure(&pc)?;
    Ok(LcoreReport {
        lcore: LcoreNumbers {
            empty_iter_ns: detail.loop_ns_per_iter,
            msg_oneway_ns_p50: detail.latency_p50_ns as f64,
            msg_per_sec: detail.msgs_per_sec,
        },
        detail,
    })
}
