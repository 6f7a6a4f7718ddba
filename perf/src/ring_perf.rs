//! `dp-perf ring`: the grid of DPDK's `ring_perf_autotest` on `mempool::ring`.
//!
//! # Grid
//!
//! For rings of 4096 `u64` slots (pointer-sized elements, like DPDK's legacy `void *` API) in
//! each selected [`Mode`]: SP/SC ([`Spsc`](mempool::ring::Spsc)), MP/MC
//! ([`Mpmc`](mempool::ring::Mpmc)), and both sides RTS or both HTS (DPDK's
//! `RING_F_MP_RTS_ENQ | RING_F_MC_RTS_DEQ` and `RING_F_MP_HTS_ENQ | RING_F_MC_HTS_DEQ`):
//!
//! | op | batch | cores | loop |
//! |----|-------|-------|------|
//! | single | 1 | 1 | `enqueue(x); dequeue()` |
//! | burst | 8, 32, 128 | 1 | `enqueue_burst(n); dequeue_burst(n)` |
//! | bulk | 8, 32, 128 | 1 | `enqueue_bulk(n); dequeue_bulk(n)` |
//! | bulk | 8, 32, 128 | 2 | producer on CPU A retries `enqueue_bulk(n)`, consumer on CPU B retries `dequeue_bulk(n)` |
//!
//! DPDK runs sizes 8 and 32; 128 is ours. DPDK's `ring_perf_autotest` has no RTS or HTS cases;
//! `scripts/bench-vs-dpdk.sh` runs the same loops on DPDK's RTS and HTS rings with a small C
//! harness (`perf/dpdk/dpdk-ring-mempool.c`). The two-core MP/MC, RTS and HTS cases have one
//! producer and one consumer thread, as in DPDK: they measure the cost of the multi-thread code
//! paths, not contention between producers (the cache-less pool of `dp-perf mempool` on two
//! cores is the contended case).
//!
//! # `ns_per_elem`
//!
//! Defined as DPDK defines its cycles per element, in nanoseconds:
//!
//! - **one core**: the time of one enqueue plus one dequeue, per element: loop time divided by
//!   the number of elements that went in and out. For `single` this is DPDK's "single" number.
//!   For burst and bulk, DPDK 22.11 prints the time per enqueue+dequeue *call pair*, i.e. this
//!   number times the batch size; later DPDK versions print per element, like us.
//! - **two cores**: DPDK times the producer's loop and the consumer's loop separately, divides
//!   each by the elements it moved, and prints the **sum of the two**. We do the same. Since the
//!   two loops run concurrently for about the same time, this is about twice the wall-clock time
//!   per element transferred; the table also shows that wall-clock figure (`wall ns/elem`),
//!   which is what criterion's two-core ring bench reports.
//!
//! Each case is repeated and the median reported. A warm-up pass (a tenth of the elements)
//! precedes every timed pass; on two cores both threads finish it and meet at a spin barrier,
//! with the ring empty, before starting their clocks.

use std::io;

use crossbeam_utils::CachePadded;
use mempool::ring::{Hts, Multi, Ring, Rts, Single, SyncMode};
use serde::Serialize;

use crate::harness::{Backoff, CpuPair, SpinBarrier, Timer, median, run_on, run_pair};
use crate::{PerfError, Report};

/// Slots per ring, as in DPDK's test.
pub const RING_SIZE: usize = 4096;

/// Ring synchronisation modes under test (the same mode on both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Single producer, single consumer.
    Spsc,
    /// Multi producer, multi consumer (DPDK's default MT sync).
    Mpmc,
    /// Both sides RTS (relaxed tail sync).
    Rts,
    /// Both sides HTS (head/tail sync).
    Hts,
}

impl Mode {
    /// Every mode, in grid order.
    pub const ALL: [Self; 4] = [Self::Spsc, Self::Mpmc, Self::Rts, Self::Hts];

    /// `"spsc"` / `"mpmc"` / `"rts"` / `"hts"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spsc => "spsc",
            Self::Mpmc => "mpmc",
            Self::Rts => "rts",
            Self::Hts => "hts",
        }
    }
}

/// Operation flavour under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// One element per call.
    Single,
    /// All `n` or nothing.
    Bulk,
    /// As many as possible, up to `n`.
    Burst,
}

impl Op {
    /// `"single"` / `"bulk"` / `"burst"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Bulk => "bulk",
            Self::Burst => "burst",
        }
    }
}

/// Parameters of [`measure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// CPUs: single-core cases and producers run on `first`, consumers on `second`.
    pub cpus: CpuPair,
    /// Enqueue+dequeue pairs per `single` pass.
    pub single_ops: u64,
    /// Elements per one-core burst/bulk pass (rounded down to a multiple of the batch).
    pub batch_elems: u64,
    /// Elements per two-core pass (rounded down to a multiple of the batch).
    pub two_core_elems: u64,
    /// Calls per side per two-core pass, instead of `two_core_elems`: each pass then moves
    /// `calls x batch` elements, as DPDK's `ring_perf_autotest` does with its 2^15 calls.
    pub two_core_calls: Option<u64>,
    /// Batch sizes of the burst and bulk cases.
    pub batches: Vec<usize>,
    /// Timed passes per one-core case; the median is reported.
    pub reps: usize,
    /// Timed passes per two-core case; the median is reported.
    pub two_core_reps: usize,
    /// Modes to measure, in this order.
    pub modes: Vec<Mode>,
    /// Core counts to measure: 1 (single, burst, bulk on one core) and/or 2 (two-core bulk).
    pub cores: Vec<u32>,
}

impl RingConfig {
    /// The full grid: about 20-40 s on an idle two-core host. Every timed pass lasts tens to
    /// hundreds of milliseconds.
    pub fn full(cpus: CpuPair) -> Self {
        Self {
            cpus,
            single_ops: 1 << 26,
            batch_elems: 1 << 27,
            two_core_elems: 1 << 26,
            two_core_calls: None,
            batches: vec![8, 32, 128],
            reps: 5,
            two_core_reps: 3,
            modes: Mode::ALL.to_vec(),
            cores: vec![1, 2],
        }
    }

    /// A smoke-test grid that finishes in milliseconds; the numbers are not meaningful.
    pub fn quick(cpus: CpuPair) -> Self {
        Self {
            cpus,
            single_ops: 4096,
            batch_elems: 4096,
            two_core_elems: 8192,
            two_core_calls: None,
            batches: vec![8, 32, 128],
            reps: 1,
            two_core_reps: 1,
            modes: Mode::ALL.to_vec(),
            cores: vec![1, 2],
        }
    }

    fn validate(&self) -> Result<(), PerfError> {
        if self.reps == 0 || self.two_core_reps == 0 {
            return Err(PerfError::Usage("repetitions must be > 0".into()));
        }
        if self.modes.is_empty() || self.cores.is_empty() {
            return Err(PerfError::Usage(
                "the mode and core lists must not be empty".into(),
            ));
        }
        if let Some(c) = self.cores.iter().find(|&&c| c != 1 && c != 2) {
            return Err(PerfError::Usage(format!("core count {c} is not 1 or 2")));
        }
        if self.two_core_calls == Some(0) {
            return Err(PerfError::Usage(
                "two-core calls per pass must be > 0".into(),
            ));
        }
        if self.single_ops == 0 {
            return Err(PerfError::Usage("single-op count must be > 0".into()));
        }
        for &b in &self.batches {
            if b == 0 || b > RING_SIZE / 2 {
                return Err(PerfError::Usage(format!(
                    "batch size {b} is outside 1..={}",
                    RING_SIZE / 2
                )));
            }
            if self.batch_elems < b as u64
                || (self.two_core_calls.is_none() && self.two_core_elems < b as u64)
            {
                return Err(PerfError::Usage(format!(
                    "element counts must be at least the batch size {b}"
                )));
            }
        }
        Ok(())
    }
}

/// One measured case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RingRow {
    /// Synchronisation mode.
    pub mode: Mode,
    /// Operation flavour.
    pub op: Op,
    /// Elements per call.
    pub batch: usize,
    /// 1 or 2.
    pub cores: u32,
    /// Nanoseconds per element, as defined in the [module docs](self).
    pub ns_per_elem: f64,
    /// Two-core cases: wall-clock nanoseconds per element transferred.
    #[serde(skip)]
    pub wall_ns_per_elem: Option<f64>,
}

/// Result of [`measure`]: `{"ring":[...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct RingReport {
    /// The rows, in grid order.
    pub ring: Vec<RingRow>,
    /// The timer used (for the cycle columns of the table).
    #[serde(skip)]
    pub timer: Timer,
    /// CPUs used.
    #[serde(skip)]
    pub cpus: CpuPair,
}

impl Report for RingReport {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "ring": self.ring })
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        writeln!(
            out,
            "ring perf: {RING_SIZE}-slot rings of u64, CPUs {}, clock {}{}",
            self.cpus,
            self.timer.source(),
            self.timer
                .tsc_hz()
                .map(|hz| format!(" ({:.3} GHz TSC)", hz as f64 / 1e9))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "two-core ns/elem is DPDK's sum of producer and consumer time per element\n"
        )?;
        writeln!(
            out,
            "{:<5} {:<6} {:>5} {:>5} {:>10} {:>12} {:>14}",
            "mode", "op", "batch", "cores", "ns/elem", "cycles/elem", "wall ns/elem"
        )?;
        for r in &self.ring {
            let cycles = self
                .timer
                .ns_to_cycles(r.ns_per_elem)
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "-".into());
            let wall = r
                .wall_ns_per_elem
                .map(|w| format!("{w:.2}"))
                .unwrap_or_else(|| "-".into());
            writeln!(
                out,
                "{:<5} {:<6} {:>5} {:>5} {:>10.2} {:>12} {:>14}",
                r.mode.name(),
                r.op.name(),
                r.batch,
                r.cores,
                r.ns_per_elem,
                cycles,
                wall
            )?;
        }
        Ok(())
    }
}

/// Runs the whole grid; see the [module docs](self).
///
/// # Errors
///
/// [`PerfError::Usage`] for an invalid configuration, pinning and ring-creation errors.
pub fn measure(cfg: &RingConfig) -> Result<RingReport, PerfError> {
    cfg.validate()?;
    let timer = Timer::new();
    let mut rows = Vec::new();
    for &mode in &cfg.modes {
        match mode {
            Mode::Spsc => grid::<Single, Single>(cfg, mode, timer, &mut rows)?,
            Mode::Mpmc => grid::<Multi, Multi>(cfg, mode, timer, &mut rows)?,
            Mode::Rts => grid::<Rts, Rts>(cfg, mode, timer, &mut rows)?,
            Mode::Hts => grid::<Hts, Hts>(cfg, mode, timer, &mut rows)?,
        }
    }
    Ok(RingReport {
        ring: rows,
        timer,
        cpus: cfg.cpus,
    })
}

/// All cases of one mode, in DPDK's order: single, burst, bulk, then two cores.
fn grid<P: SyncMode, C: SyncMode>(
    cfg: &RingConfig,
    mode: Mode,
    timer: Timer,
    rows: &mut Vec<RingRow>,
) -> Result<(), PerfError> {
    let one_core = |op: Op, batch: usize| -> Result<RingRow, PerfError> {
        let mut samples = Vec::with_capacity(cfg.reps);
        for _ in 0..cfg.reps {
            let ns = run_on(cfg.cpus.first, || {
                one_core_pass::<P, C>(cfg, op, batch, timer)
            })??;
            samples.push(ns);
        }
        Ok(RingRow {
            mode,
            op,
            batch,
            cores: 1,
            ns_per_elem: median(&mut samples).unwrap_or(f64::NAN),
            wall_ns_per_elem: None,
        })
    };
    if cfg.cores.contains(&1) {
        rows.push(one_core(Op::Single, 1)?);
        for op in [Op::Burst, Op::Bulk] {
            for &batch in &cfg.batches {
                rows.push(one_core(op, batch)?);
            }
        }
    }
    if !cfg.cores.contains(&2) {
        return Ok(());
    }
    for &batch in &cfg.batches {
        let (mut dpdk, mut wall) = (Vec::new(), Vec::new());
        for _ in 0..cfg.two_core_reps {
            let (d, w) = two_core_pass::<P, C>(cfg, batch, timer)?;
            dpdk.push(d);
            wall.push(w);
        }
        rows.push(RingRow {
            mode,
            op: Op::Bulk,
            batch,
            cores: 2,
            ns_per_elem: median(&mut dpdk).unwrap_or(f64::NAN),
            wall_ns_per_elem: median(&mut wall),
        });
    }
    Ok(())
}

/// One timed one-core pass; returns nanoseconds per element (enqueue + dequeue).
fn one_core_pass<P: SyncMode, C: SyncMode>(
    cfg: &RingConfig,
    op: Op,
    batch: usize,
    timer: Timer,
) -> Result<f64, PerfError> {
    let (mut tx, mut rx) = Ring::<u64>::with_capacity::<P, C>(RING_SIZE)?;
    // Opaque to the optimiser, like DPDK's `volatile` bulk sizes.
    let batch = core::hint::black_box(batch);
    let mut buf = vec![0u64; batch];
    let (ops, elems_per_op) = match op {
        Op::Single => (cfg.single_ops, 1),
        Op::Bulk | Op::Burst => (cfg.batch_elems / batch as u64, batch as u64),
    };
    // Counting what moved costs an add per call and catches a ring that silently drops.
    let mut pass = |n: u64| -> u64 {
        let mut moved = 0u64;
        match op {
            Op::Single => {
                let mut v = 0u64;
                for _ in 0..n {
                    moved += u64::from(tx.enqueue(v).is_ok());
                    if let Some(x) = rx.dequeue() {
                        v = x.wrapping_add(1);
                        moved += 1;
                    }
                }
                core::hint::black_box(v);
            }
            Op::Bulk => {
                for _ in 0..n {
                    moved += tx.enqueue_bulk(&buf) as u64;
                    moved += rx.dequeue_bulk(&mut buf) as u64;
                }
            }
            Op::Burst => {
                for _ in 0..n {
                    moved += tx.enqueue_burst(&buf) as u64;
                    moved += rx.dequeue_burst(&mut buf) as u64;
                }
            }
        }
        moved
    };
    let warm = (ops / 10).max(1);
    if pass(warm) != 2 * warm * elems_per_op {
        return Err(PerfError::Misbehaved(
            "an enqueue or dequeue on an uncontended ring moved fewer elements than asked",
        ));
    }
    let t0 = timer.now_ns();
    let moved = pass(ops);
    let ns = timer.now_ns() - t0;
    if moved != 2 * ops * elems_per_op {
        return Err(PerfError::Misbehaved(
            "an enqueue or dequeue on an uncontended ring moved fewer elements than asked",
        ));
    }
    Ok(ns as f64 / (ops * elems_per_op) as f64)
}

/// Times of one side of a two-core pass: `(start_ns, end_ns)`.
type Span = (u64, u64);

/// One timed two-core pass; returns `(DPDK ns/elem, wall ns/elem)`.
fn two_core_pass<P: SyncMode, C: SyncMode>(
    cfg: &RingConfig,
    batch: usize,
    timer: Timer,
) -> Result<(f64, f64), PerfError> {
    let (tx, rx) = Ring::<u64>::with_capacity::<P, C>(RING_SIZE)?;
    let calls = cfg
        .two_core_calls
        .unwrap_or(cfg.two_core_elems / batch as u64);
    let warm = (calls / 10).max(1);
    let barrier = SpinBarrier::new(2);
    let barrier = &barrier;
    let producer = move || -> Span {
        // Each handle moves into its own padded allocation made by its own thread: left in the
        // closure that carried it here, the producer's and the consumer's cursors can share a
        // cache line (the closures are boxed next to each other by the spawning thread), and
        // that false sharing costs about 10 % on two cores.
        let mut tx = Box::new(CachePadded::new(tx));
        let tx = &mut **tx;
        let buf = vec![0u64; batch];
        let mut push = |n: u64| {
            for _ in 0..n {
                let mut backoff = Backoff::measuring();
                while tx.enqueue_bulk(&buf) == 0 {
                    backoff.snooze();
                }
            }
        };
        push(warm);
        barrier.wait();
        let t0 = timer.now_ns();
        push(calls);
        (t0, timer.now_ns())
    };
    let consumer = move || -> Span {
        let mut rx = Box::new(CachePadded::new(rx));
        let rx = &mut **rx;
        let mut buf = vec![0u64; batch];
        let mut pull = |n: u64| {
            for _ in 0..n {
                let mut backoff = Backoff::measuring();
                while rx.dequeue_bulk(&mut buf) == 0 {
                    backoff.snooze();
                }
            }
            core::hint::black_box(&buf);
        };
        pull(warm);
        barrier.wait();
        let t0 = timer.now_ns();
        pull(calls);
        (t0, timer.now_ns())
    };
    let (p, c) = run_pair(cfg.cpus.as_array(), producer, consumer)?;
    let elems = (calls * batch as u64) as f64;
    let dpdk = ((p.1 - p.0) + (c.1 - c.0)) as f64 / elems;
    let wall = (p.1.max(c.1) - p.0.min(c.0)) as f64 / elems;
    Ok((dpdk, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_grid_has_every_case_with_positive_times() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let r = measure(&RingConfig::quick(cpus)).unwrap();
        // Per mode: single + 3 burst + 3 bulk on one core + 3 bulk on two cores.
        assert_eq!(r.ring.len(), 4 * 10);
        let modes: Vec<&str> = r.ring.iter().step_by(10).map(|r| r.mode.name()).collect();
        assert_eq!(modes, ["spsc", "mpmc", "rts", "hts"]);
        for row in &r.ring {
            assert!(
                row.ns_per_elem.is_finite() && row.ns_per_elem > 0.0,
                "{row:?}"
            );
            assert_eq!(row.wall_ns_per_elem.is_some(), row.cores == 2, "{row:?}");
        }
        let json = r.to_json();
        let first = &json["ring"][0];
        assert_eq!(first["mode"], "spsc");
        assert_eq!(first["op"], "single");
        assert_eq!(first["batch"], 1);
        assert_eq!(first["cores"], 1);
        assert_eq!(first.as_object().unwrap().len(), 5, "{first}");
    }

    #[test]
    fn mode_and_core_selection() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let mut cfg = RingConfig::quick(cpus);
        cfg.modes = vec![Mode::Hts, Mode::Spsc];
        cfg.cores = vec![2];
        cfg.batches = vec![32];
        let r = measure(&cfg).unwrap();
        let got: Vec<(&str, u32, usize)> = r
            .ring
            .iter()
            .map(|r| (r.mode.name(), r.cores, r.batch))
            .collect();
        assert_eq!(got, [("hts", 2, 32), ("spsc", 2, 32)]);
        assert_eq!(r.to_json()["ring"][0]["mode"], "hts");
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let mut cfg = RingConfig::quick(CpuPair::default());
        cfg.batches = vec![0];
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
        let mut cfg = RingConfig::quick(CpuPair::default());
        cfg.reps = 0;
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
        let mut cfg = RingConfig::quick(CpuPair::default());
        cfg.cores = vec![3];
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
        let mut cfg = RingConfig::quick(CpuPair::default());
        cfg.modes.clear();
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
        let mut cfg = RingConfig::quick(CpuPair::default());
        cfg.two_core_calls = Some(0);
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
    }

    /// `--two-core-calls`: passes of a fixed number of calls per side, whatever the element
    /// count says (an element count below the batch is no longer an error then).
    #[test]
    fn two_core_calls_replace_the_element_count() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let mut cfg = RingConfig::quick(cpus);
        cfg.modes = vec![Mode::Spsc];
        cfg.cores = vec![2];
        cfg.two_core_elems = 1;
        assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))));
        cfg.two_core_calls = Some(64);
        let r = measure(&cfg).unwrap();
        assert_eq!(r.ring.len(), 3);
        assert!(
            r.ring.iter().all(|row| row.ns_per_elem > 0.0),
            "{:?}",
            r.ring
        );
    }
}
