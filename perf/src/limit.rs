//! The physical limits of the host on the two perf-lab cores: how fast one cache line moves
//! from one core to the other, and how fast one core copies memory.
//!
//! Every inter-core mechanism in the dataplane (rings, inboxes, the shared-memory transport,
//! completion polling) pays at least one cache-line hand-off per message, and every byte a
//! transport moves without RDMA is at best a `memcpy`. These two numbers are the floor and the
//! ceiling that the other perf-lab results are judged against: a ring's two-core latency is
//! compared with [`cacheline_oneway`], a software transport's bandwidth with
//! [`memcpy_bandwidth`].
//!
//! Units: nanoseconds, and **gigabits per second of payload** (every Gb/s in the perf lab counts
//! payload bytes only, times 8, divided by 10^9).

use core::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use serde::Serialize;
use std::io;

use crate::{PerfError, Report};
use dp_plot::{Figure, PercentileSeries};

use crate::harness::{CpuPair, SpinBarrier, Summary, Timer, median, run_on, run_pair};

/// Parameters of [`measure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitConfig {
    /// The two cores: the ping side and the memcpy run on `first`, the pong side on `second`.
    pub cpus: CpuPair,
    /// Timed round trips of the cache-line ping-pong (after `round_trips / 10` warm-up ones).
    pub round_trips: usize,
    /// Size of the memcpy source and destination buffers, in bytes.
    pub memcpy_bytes: usize,
    /// Timed copies of the whole buffer (after one warm-up copy); the median is reported.
    pub memcpy_reps: usize,
}

impl LimitConfig {
    /// The full measurement: 1,000,000 round trips, 21 copies of 64 MiB.
    pub fn full(cpus: CpuPair) -> Self {
        Self {
            cpus,
            round_trips: 1_000_000,
            memcpy_bytes: 64 << 20,
            memcpy_reps: 21,
        }
    }

    /// A smoke-test run that finishes in milliseconds; the numbers are not meaningful.
    pub fn quick(cpus: CpuPair) -> Self {
        Self {
            cpus,
            round_trips: 2_000,
            memcpy_bytes: 1 << 20,
            memcpy_reps: 3,
        }
    }
}

/// Result of the cache-line ping-pong.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PingPong {
    /// Median round trip divided by two, in nanoseconds.
    pub oneway_ns: f64,
    /// Round-trip times, in nanoseconds.
    pub rtt: Summary,
    /// The distribution of the one-way times (half of each round trip), for `--plot`.
    #[serde(skip)]
    pub oneway: Option<PercentileSeries>,
}

/// Result of the memcpy run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bandwidth {
    /// Median over repetitions, in gigabits of payload per second.
    pub gbps: f64,
    /// Bytes per copy.
    pub bytes: usize,
    /// Timed copies.
    pub reps: usize,
}

/// Both limits; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitReport {
    /// CPUs used.
    #[serde(skip)]
    pub cpus: CpuPair,
    /// Cache-line hand-off.
    pub pingpong: PingPong,
    /// Single-core memcpy.
    pub memcpy: Bandwidth,
}

impl Report for LimitReport {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "limit": {
                "cacheline_oneway_ns": self.pingpong.oneway_ns,
                "memcpy_gbps": self.memcpy.gbps,
            }
        })
    }

    fn figure(&self) -> Option<Figure> {
        let mut f = Figure::new(format!(
            "cache-line hand-off between CPUs {} and {}",
            self.cpus.first, self.cpus.second
        ));
        f.percentiles.push(self.pingpong.oneway.clone()?);
        Some(f)
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let rtt = &self.pingpong.rtt;
        writeln!(out, "host limits: CPUs {}", self.cpus)?;
        writeln!(
            out,
            "cache-line one-way hand-off: {:>8.1} ns  (round trip p50 {} p99 {} p99.9 {} \
             max {} ns over {} round trips)",
            self.pingpong.oneway_ns, rtt.p50, rtt.p99, rtt.p999, rtt.max, rtt.count
        )?;
        writeln!(
            out,
            "single-core memcpy:          {:>8.1} Gb/s payload  ({:.1} GB/s; median of {} copies \
             of {} MiB on CPU {})",
            self.memcpy.gbps,
            self.memcpy.gbps / 8.0,
            self.memcpy.reps,
            self.memcpy.bytes >> 20,
            self.cpus.first
        )
    }
}

/// Runs both measurements.
///
/// # Errors
///
/// Pinning, allocation or argument errors ([`PerfError`]).
pub fn measure(cfg: &LimitConfig) -> Result<LimitReport, PerfError> {
    Ok(LimitReport {
        cpus: cfg.cpus,
        pingpong: cacheline_oneway(cfg.cpus, cfg.round_trips)?,
        memcpy: memcpy_bandwidth(cfg.cpus.first, cfg.memcpy_bytes, cfg.memcpy_reps)?,
    })
}

/// Spins until `cell` holds `want`: a tight load loop (no pause hint, to see the hand-off as
/// soon as it lands) for a bounded number of reads, then a `sched_yield` per read so an
/// oversubscribed host still makes progress.
#[inline]
fn wait_for(cell: &AtomicU64, want: u64) {
    const TIGHT_READS: u32 = 1 << 16;
    let mut reads = 0u32;
    // P2: Acquire, pairs with P1 of the peer: the peer's write of `want` (and anything before
    // it) is visible once we see it. The hand-off itself is the measured quantity.
    while cell.load(Ordering::Acquire) != want {
        if reads < TIGHT_READS {
            reads += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// One-way cache-line hand-off latency between `cpus.first` and `cpus.second`.
///
/// Two pinned threads share one cache-padded `AtomicU64`. The ping thread writes the odd value
/// `2i + 1` and waits for `2i + 2`; the pong thread waits for `2i + 1` and answers `2i + 2`.
/// Every round trip moves the line to the other core and back, so half the round trip is the
/// one-way latency. Each round trip is timed on the ping thread with one TSC read (the end of
/// one round trip is the start of the next), so one TSC read (roughly 10 ns) is included.
///
/// # Errors
///
/// [`PerfError::Usage`] if `round_trips` is 0, pinning errors.
pub fn cacheline_oneway(cpus: CpuPair, round_trips: usize) -> Result<PingPong, PerfError> {
    if round_trips == 0 {
        return Err(PerfError::Usage("round trips must be > 0".into()));
    }
    let warmup = round_trips / 10;
    let total = (warmup + round_trips) as u64;
    let cell = CachePadded::new(AtomicU64::new(0));
    let barrier = SpinBarrier::new(2);
    let timer = Timer::new();
    let (cell, barrier) = (&cell, &barrier);
    let ping = move || {
        let mut rtts = Vec::with_capacity(round_trips);
        barrier.wait();
        let mut prev = timer.now_ns();
        for i in 0..total {
            // P1: Release, pairs with P2 in the pong thread's `wait_for`.
            cell.store(2 * i + 1, Ordering::Release);
            wait_for(cell, 2 * i + 2);
            let now = timer.now_ns();
            if i >= warmup as u64 {
                rtts.push(now - prev);
            }
            prev = now;
        }
        rtts
    };
    let pong = move || {
        barrier.wait();
        for i in 0..total {
            wait_for(cell, 2 * i + 1);
            // P1 (pong side): Release, pairs with P2 in the ping thread's `wait_for`.
            cell.store(2 * i + 2, Ordering::Release);
        }
    };
    let (rtts, ()) = run_pair(cpus.as_array(), ping, pong)?;
    let oneway = PercentileSeries::from_samples(
        "one way (half of each round trip)",
        rtts.iter().map(|r| r / 2),
    );
    let rtt = Summary::from_samples(rtts).ok_or(PerfError::Usage("no round trips".into()))?;
    Ok(PingPong {
        oneway_ns: rtt.p50 as f64 / 2.0,
        rtt,
        oneway,
    })
}

/// Allocates `bytes` bytes filled with `fill`, failing cleanly instead of aborting.
fn buffer(bytes: usize, fill: u8, what: &'static str) -> Result<Vec<u8>, PerfError> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes)
        .map_err(|_| PerfError::Alloc { what, bytes })?;
    // Writing every byte faults the pages in now, not inside the timed copies.
    v.resize(bytes, fill);
    Ok(v)
}

/// Single-core memcpy bandwidth on `cpu`: copies a `bytes`-byte buffer into another `reps`
/// times (after one warm-up copy) and reports the median copy as payload gigabits per second.
///
/// With buffers much larger than the last-level cache (the default 64 MiB) this is the
/// DRAM-bound copy rate a software transport can at best reach on one core.
///
/// # Errors
///
/// [`PerfError::Usage`] if `bytes` or `reps` is 0, [`PerfError::Alloc`], pinning errors.
pub fn memcpy_bandwidth(cpu: usize, bytes: usize, reps: usize) -> Result<Bandwidth, PerfError> {
    if bytes == 0 || reps == 0 {
        return Err(PerfError::Usage(
            "memcpy bytes and repetitions must be > 0".into(),
        ));
    }
    let timer = Timer::new();
    let mut rates = run_on(cpu, move || -> Result<Vec<f64>, PerfError> {
        // Allocated on the pinned thread so first-touch places the pages near `cpu`.
        let src = buffer(bytes, 0x5a, "the memcpy source")?;
        let mut dst = buffer(bytes, 0xa5, "the memcpy destination")?;
        dst.copy_from_slice(&src);
        let mut rates = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t0 = timer.now_ns();
            dst.copy_from_slice(core::hint::black_box(&src));
            core::hint::black_box(&mut dst);
            let ns = (timer.now_ns() - t0).max(1);
            rates.push(bytes as f64 * 8.0 / ns as f64);
        }
        Ok(rates)
    })??;
    Ok(Bandwidth {
        gbps: median(&mut rates).unwrap_or(0.0),
        bytes,
        reps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_positive_and_finite() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let r = measure(&LimitConfig::quick(cpus)).unwrap();
        assert!(r.pingpong.oneway_ns.is_finite() && r.pingpong.oneway_ns > 0.0);
        assert_eq!(r.pingpong.rtt.count, 2_000);
        assert!(r.memcpy.gbps.is_finite() && r.memcpy.gbps > 0.0);
    }

    #[test]
    fn zero_sizes_are_usage_errors() {
        let cpus = CpuPair::default();
        assert!(matches!(
            cacheline_oneway(cpus, 0),
            Err(PerfError::Usage(_))
        ));
        assert!(matches!(
            memcpy_bandwidth(0, 0, 1),
            Err(PerfError::Usage(_))
        ));
    }
}
