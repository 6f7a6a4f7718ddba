//! `dp-perf mempool`: the grid of DPDK's `mempool_perf_autotest` on `mempool::pool`.
//!
//! # Workload
//!
//! Each participating core owns a [`PoolCache`] (made by [`Pool::cache`]; with cache size 0 it
//! is a pass-through port that goes to the pool's ring on every call, as DPDK goes straight to
//! the ring when a pool has no cache). For a fixed time (`--seconds`, default 2 s; DPDK uses
//! 5 s) it repeats: **get `keep` objects in chunks of `bulk`, then put them back in chunks of
//! `bulk`**, 65,536 objects per round between clock reads, exactly like DPDK's
//! `per_lcore_mempool_test` with `n_get_bulk = n_put_bulk = bulk`. The objects are never
//! touched; this measures the allocator, not memory.
//!
//! `ops_per_sec` is DPDK's `rate_persec`: objects got and returned per second, summed over the
//! cores (each core's count divided by its own elapsed time).
//!
//! # Grid and pool
//!
//! Cache 0 and 512, bulk 1, 4 and 32, `keep` 128 (`--keep` adds 32 and 512), on 1 and 2 cores,
//! on pools whose free ring is in Multi mode (DPDK's default `ring_mp_mc` ops); `--ring-sync`
//! adds pools with RTS and HTS rings (DPDK's `ring_mt_rts` and `ring_mt_hts` ops). Each row
//! names its ring mode in the `ring` field.
//! Objects are 2048 bytes. The pool holds `2 x (MAX_KEEP + 512) - 1` = 2047 objects like
//! DPDK's `MEMPOOL_SIZE = lcores x (MAX_KEEP + RTE_MEMPOOL_CACHE_MAX_SIZE) - 1` with DPDK
//! running on two lcores, where `MAX_KEEP` is 512 as in DPDK 22.11.11 (or the largest `--keep`
//! if that is larger). A fresh pool is created for every case. Hugepages are used when the host has free ones ([`HugePolicy::Auto`]).
//!
//! [`HugePolicy::Auto`]: mempool::memory::HugePolicy::Auto

use core::sync::atomic::{AtomicBool, Ordering};
use std::io;
use std::sync::Arc;

use mempool::memory::{set_notice_sink, stderr_notice_sink};
use mempool::pool::{ObjId, Pool, PoolCache, PoolConfig};
use mempool::ring::SyncType;
use serde::Serialize;

use crate::harness::{CpuPair, SpinBarrier, Timer, run_on, run_pair};
use crate::{PerfError, Report};

/// Objects per round between clock reads (DPDK's `N`).
pub const ROUND_OBJECTS: usize = 65_536;
/// Object size in bytes (DPDK's `MEMPOOL_ELT_SIZE`).
pub const OBJ_SIZE: usize = 2048;
/// DPDK's `MAX_KEEP` in the 22.11.11 stable release this is compared with (its keep grid is
/// 32, 128 and 512; the original 22.11.0 had 128).
pub const DPDK_MAX_KEEP: usize = 512;
/// Largest cache size (DPDK's `RTE_MEMPOOL_CACHE_MAX_SIZE`).
pub const CACHE_MAX: u32 = mempool::pool::CACHE_MAX_SIZE;
/// Lcores DPDK's test runs on in the comparison (`-l A,B`); sizes the pool.
pub const POOL_LCORES: usize = 2;

/// Parameters of [`measure`].
#[derive(Debug, Clone, PartialEq)]
pub struct MempoolConfig {
    /// Core 1 is `first`; two-core cases add `second`.
    pub cpus: CpuPair,
    /// Cache sizes (each at most 512).
    pub caches: Vec<u32>,
    /// Get and put chunk sizes; each must divide every `keep`.
    pub bulks: Vec<usize>,
    /// Objects held before putting them back.
    pub keeps: Vec<usize>,
    /// Core counts (1 or 2).
    pub cores: Vec<usize>,
    /// Seconds each core runs per case.
    pub seconds: f64,
    /// Free-ring modes of the pools (shared modes only).
    pub rings: Vec<SyncType>,
}

impl MempoolConfig {
    /// The default grid: caches 0 and 512, bulk 1/4/32, keep 128, 1 and 2 cores, 2 s per case
    /// (about 25 s).
    pub fn full(cpus: CpuPair) -> Self {
        Self {
            cpus,
            caches: vec![0, CACHE_MAX],
            bulks: vec![1, 4, 32],
            keeps: vec![128],
            cores: vec![1, 2],
            seconds: 2.0,
            rings: vec![SyncType::Multi],
        }
    }

    /// The default grid for 10 ms per case; the numbers are not meaningful.
    pub fn quick(cpus: CpuPair) -> Self {
        Self {
            seconds: 0.01,
            ..Self::full(cpus)
        }
    }

    /// Objects in the pool of every case.
    pub fn pool_size(&self) -> u32 {
        let max_keep = self.keeps.iter().copied().max().unwrap_or(0);
        (POOL_LCORES * (max_keep.max(DPDK_MAX_KEEP) + CACHE_MAX as usize) - 1) as u32
    }

    fn validate(&self) -> Result<(), PerfError> {
        let usage = |m: String| Err(PerfError::Usage(m));
        if self.caches.is_empty()
            || self.bulks.is_empty()
            || self.keeps.is_empty()
            || self.cores.is_empty()
            || self.rings.is_empty()
        {
            return usage("cache, bulk, keep, core and ring lists must not be empty".into());
        }
        if self.rings.contains(&SyncType::Single) {
            return usage(
                "a pool's ring cannot be single: every core gets and puts; use multi, rts or hts"
                    .into(),
            );
        }
        if !(self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= 3600.0) {
            return usage(format!(
                "seconds must be in (0, 3600], got {}",
                self.seconds
            ));
        }
        if let Some(c) = self.caches.iter().find(|&&c| c > CACHE_MAX) {
            return usage(format!("cache size {c} exceeds the maximum {CACHE_MAX}"));
        }
        if let Some(c) = self.cores.iter().find(|&&c| c != 1 && c != 2) {
            return usage(format!("core count {c} is not 1 or 2"));
        }
        for &keep in &self.keeps {
            if keep == 0 || keep > ROUND_OBJECTS {
                return usage(format!("keep {keep} is outside 1..={ROUND_OBJECTS}"));
            }
            if let Some(b) = self.bulks.iter().find(|&&b| b == 0 || keep % b != 0) {
                return usage(format!("bulk {b} does not divide keep {keep}"));
            }
        }
        Ok(())
    }
}

/// One measured case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MempoolRow {
    /// Free-ring mode: `"multi"`, `"rts"` or `"hts"`.
    pub ring: &'static str,
    /// Cache size.
    pub cache: u32,
    /// Get and put chunk size.
    pub bulk: usize,
    /// Objects held per round trip.
    pub keep: usize,
    /// Cores running the workload.
    pub cores: usize,
    /// Objects got and returned per second, summed over cores.
    pub ops_per_sec: f64,
}

/// Result of [`measure`]: `{"mempool":[...]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MempoolReport {
    /// The rows, in grid order.
    pub mempool: Vec<MempoolRow>,
    /// Objects per pool.
    #[serde(skip)]
    pub pool_size: u32,
    /// Seconds per case.
    #[serde(skip)]
    pub seconds: f64,
    /// CPUs used.
    #[serde(skip)]
    pub cpus: CpuPair,
}

impl Report for MempoolReport {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "mempool": self.mempool })
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        writeln!(
            out,
            "mempool perf: {} objects of {OBJ_SIZE} B per pool, {} s per case, CPUs {}",
            self.pool_size, self.seconds, self.cpus
        )?;
        writeln!(
            out,
            "(lines in the format of DPDK's mempool_perf_autotest; Mops/s appended)\n"
        )?;
        for r in &self.mempool {
            writeln!(
                out,
                "mempool_autotest cache={} cores={} n_get_bulk={} n_put_bulk={} n_keep={} \
                 rate_persec={:.0}  ({:.1} Mops/s, ring {})",
                r.cache,
                r.cores,
                r.bulk,
                r.bulk,
                r.keep,
                r.ops_per_sec,
                r.ops_per_sec / 1e6,
                r.ring
            )?;
        }
        Ok(())
    }
}

/// Runs the grid; see the [module docs](self).
///
/// # Errors
///
/// [`PerfError::Usage`] for an invalid configuration, [`PerfError::Pool`] if a pool cannot be
/// created, [`PerfError::Misbehaved`] if a get fails although the pool is sized for the
/// workload, pinning errors.
pub fn measure(cfg: &MempoolConfig) -> Result<MempoolReport, PerfError> {
    cfg.validate()?;
    // Every case creates a pool, and every pool region prints a notice; one is enough to say
    // which pages the grid runs on.
    set_notice_sink(first_notice_only);
    let report = measure_grid(cfg);
    set_notice_sink(stderr_notice_sink);
    report
}

/// A region-notice sink that prints the first notice of the process to stderr and drops the
/// rest.
fn first_notice_only(line: &str) {
    static SEEN: AtomicBool = AtomicBool::new(false);
    // Relaxed: a flag with no data attached; at worst two racing notices both print.
    if !SEEN.swap(true, Ordering::Relaxed) {
        stderr_notice_sink(line);
    }
}

fn measure_grid(cfg: &MempoolConfig) -> Result<MempoolReport, PerfError> {
    let timer = Timer::new();
    let mut rows = Vec::new();
    for &ring in &cfg.rings {
        for &cache in &cfg.caches {
            for &cores in &cfg.cores {
                for &bulk in &cfg.bulks {
                    for &keep in &cfg.keeps {
                        let case = Case {
                            bulk,
                            keep,
                            nanos: (cfg.seconds * 1e9) as u64,
                            timer,
                        };
                        let pool = Pool::new(
                            PoolConfig::new("dp-perf", OBJ_SIZE, cfg.pool_size())
                                .cache_size(cache)
                                .ring_sync(ring),
                        )?;
                        let ops_per_sec = run_case(&pool, cfg.cpus, cores, case)?;
                        rows.push(MempoolRow {
                            ring: ring.name(),
                            cache,
                            bulk,
                            keep,
                            cores,
                            ops_per_sec,
                        });
                    }
                }
            }
        }
    }
    Ok(MempoolReport {
        mempool: rows,
        pool_size: cfg.pool_size(),
        seconds: cfg.seconds,
        cpus: cfg.cpus,
    })
}

/// The per-core parameters of one case.
#[derive(Debug, Clone, Copy)]
struct Case {
    bulk: usize,
    keep: usize,
    nanos: u64,
    timer: Timer,
}

/// Objects cycled and nanoseconds spent by one core.
type CoreResult = Result<(u64, u64), PerfError>;

fn run_case(pool: &Arc<Pool>, cpus: CpuPair, cores: usize, case: Case) -> Result<f64, PerfError> {
    let rate = |(objects, ns): (u64, u64)| objects as f64 * 1e9 / ns.max(1) as f64;
    if cores == 1 {
        let barrier = SpinBarrier::new(1);
        let r = run_on(cpus.first, || worker(pool, case, &barrier))??;
        Ok(rate(r))
    } else {
        let barrier = SpinBarrier::new(2);
        let (a, b) = run_pair(
            cpus.as_array(),
            || worker(pool, case, &barrier),
            || worker(pool, case, &barrier),
        )?;
        Ok(rate(a?) + rate(b?))
    }
}

/// One core's share of a case: DPDK's `per_lcore_mempool_test` loop on this thread's cache.
fn worker(pool: &Arc<Pool>, case: Case, barrier: &SpinBarrier) -> CoreResult {
    let mut cache = pool.cache();
    let mut table = vec![ObjId::default(); case.keep];
    let rounds = ROUND_OBJECTS / case.keep;
    barrier.wait();
    let t0 = case.timer.now_ns();
    let deadline = t0.saturating_add(case.nanos);
    let mut objects = 0u64;
    loop {
        for _ in 0..rounds {
            keep_cycle(&mut cache, &mut table, case.bulk)?;
        }
        objects += (rounds * case.keep) as u64;
        let now = case.timer.now_ns();
        if now >= deadline {
            return Ok((objects, now - t0));
        }
    }
}

/// One keep cycle, the unit of DPDK's mempool workload: gets `table.len()` objects in chunks
/// of `bulk`, then puts them all back in chunks of `bulk`. If `bulk` does not divide
/// `table.len()`, the remainder of the table is left out. On a failed get, puts back what this
/// cycle took and reports the failure.
///
/// # Errors
///
/// [`PerfError::Usage`] if `bulk` is 0, [`PerfError::Misbehaved`] if a get fails (the pool is
/// too small for the workload).
#[inline]
pub fn keep_cycle(
    cache: &mut PoolCache,
    table: &mut [ObjId],
    bulk: usize,
) -> Result<(), PerfError> {
    if bulk == 0 {
        return Err(PerfError::Usage("bulk must be > 0".into()));
    }
    let mut got = 0;
    let mut failed = false;
    for chunk in table.chunks_exact_mut(bulk) {
        if cache.get_bulk(chunk).is_err() {
            failed = true;
            break;
        }
        got += bulk;
    }
    for chunk in table[..got].chunks_exact(bulk) {
        // SAFETY: every id in `table[..got]` was handed out by a successful get on this pool
        // in this cycle and is put back exactly once (the chunks are disjoint and cover it).
        unsafe { cache.put_bulk(chunk) };
    }
    if failed {
        return Err(PerfError::Misbehaved(
            "a get failed although the pool holds enough objects for every core's keep and \
             cache",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_grid_is_complete_and_positive() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let mut cfg = MempoolConfig::quick(cpus);
        cfg.seconds = 0.002;
        let r = measure(&cfg).unwrap();
        assert_eq!(r.mempool.len(), 2 * 2 * 3);
        for row in &r.mempool {
            assert!(
                row.ops_per_sec.is_finite() && row.ops_per_sec > 0.0,
                "{row:?}"
            );
        }
        let json = r.to_json();
        let row = json["mempool"][0].as_object().unwrap();
        assert_eq!(row["ring"], "multi");
        for key in ["cache", "bulk", "cores", "ops_per_sec"] {
            assert!(row.contains_key(key), "{key} missing from {row:?}");
        }
    }

    #[test]
    fn ring_modes_are_rows_of_their_own() {
        let cpus = CpuPair::default();
        if cpus.check().is_err() {
            return;
        }
        let cfg = MempoolConfig {
            seconds: 0.002,
            caches: vec![0],
            bulks: vec![4],
            cores: vec![2],
            rings: vec![SyncType::Rts, SyncType::Hts],
            ..MempoolConfig::quick(cpus)
        };
        let r = measure(&cfg).unwrap();
        let rings: Vec<&str> = r.mempool.iter().map(|r| r.ring).collect();
        assert_eq!(rings, ["rts", "hts"]);
        assert!(r.mempool.iter().all(|r| r.ops_per_sec > 0.0));
    }

    #[test]
    fn pool_size_follows_dpdk() {
        let mut cfg = MempoolConfig::full(CpuPair::default());
        assert_eq!(cfg.pool_size(), 2 * (512 + 512) - 1);
        cfg.keeps = vec![32, 1024];
        assert_eq!(cfg.pool_size(), 2 * (1024 + 512) - 1);
    }

    #[test]
    fn invalid_grids_are_usage_errors() {
        let base = MempoolConfig::quick(CpuPair::default());
        let bad = [
            MempoolConfig {
                bulks: vec![3],
                ..base.clone()
            },
            MempoolConfig {
                caches: vec![513],
                ..base.clone()
            },
            MempoolConfig {
                cores: vec![3],
                ..base.clone()
            },
            MempoolConfig {
                seconds: 0.0,
                ..base.clone()
            },
            MempoolConfig {
                keeps: vec![],
                ..base.clone()
            },
            MempoolConfig {
                rings: vec![SyncType::Single],
                ..base.clone()
            },
        ];
        for cfg in bad {
            assert!(matches!(measure(&cfg), Err(PerfError::Usage(_))), "{cfg:?}");
        }
    }
}
