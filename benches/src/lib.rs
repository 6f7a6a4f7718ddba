//! Criterion micro-benchmarks of the dataplane's building blocks, and the harness they share.
//!
//! `benches/ring.rs` and `benches/mempool.rs` cover the cases of DPDK's `ring_perf_autotest`
//! and `mempool_perf_autotest` that criterion can express: every bench reports time per
//! iteration and, through [`Throughput::Elements`](criterion::Throughput::Elements), elements
//! per second, so the per-element time is `1 / thrpt`. Two-core benches pin a producer (or
//! first worker) to CPU 0 and a consumer (or second worker) to CPU 1, start them from a spin
//! barrier, and report **wall-clock** time from the first start to the last finish
//! (`iter_custom`), i.e. elapsed time per element transferred. (`dp-perf ring` reports DPDK's
//! different two-core figure, the sum of both sides' per-element times; see the `perf` crate.)
//!
//! ```text
//! cargo bench -p benches                 # everything, a few minutes on two cores
//! cargo bench -p benches --bench ring -- spsc/2core
//! ```
//!
//! Runs are short (1 s warm-up, 2.5 s measurement, 30 samples) so the suite fits in a few
//! minutes on a two-core host; the two CPUs must otherwise be idle for the numbers to mean
//! anything.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::Criterion;
use perf::harness::{CpuPair, SpinBarrier, pin_current, run_pair};

/// The criterion configuration of every bench in this crate.
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
        .sample_size(30)
}

/// CPUs 0 and 1 if this process may use both, else `None` (two-core benches are skipped).
///
/// Decided once, on the first call: the allowed set is read from the main thread's affinity,
/// which [`pin_bench_thread`] narrows to CPU 0 (it calls this first).
pub fn two_cores() -> Option<CpuPair> {
    static CPUS: OnceLock<Option<CpuPair>> = OnceLock::new();
    *CPUS.get_or_init(|| {
        let cpus = CpuPair::default();
        match cpus.check() {
            Ok(()) => Some(cpus),
            Err(e) => {
                eprintln!("skipping two-core benches: {e}");
                None
            }
        }
    })
}

/// Pins the calling (criterion) thread to CPU 0 for the one-core benches; warns and carries on
/// unpinned if that is not possible.
pub fn pin_bench_thread() {
    two_cores();
    if let Err(e) = pin_current(0) {
        eprintln!("one-core benches run unpinned: {e}");
    }
}

/// Runs `a` pinned to `cpus.first` and `b` pinned to `cpus.second`; each waits at a shared spin
/// barrier handed to it, then runs its timed part. Returns the wall-clock time from the earlier
/// start to the later finish.
///
/// Each closure receives the barrier and must call [`SpinBarrier::wait`] exactly once, right
/// before its timed part, and return `(start, end)` instants around that part.
///
/// # Panics
///
/// If a thread cannot be pinned or a closure panics (a bench cannot report a number then).
pub fn two_core_wall<A, B>(cpus: CpuPair, a: A, b: B) -> Duration
where
    A: FnOnce(&SpinBarrier) -> (Instant, Instant) + Send,
    B: FnOnce(&SpinBarrier) -> (Instant, Instant) + Send,
{
    let barrier = SpinBarrier::new(2);
    let barrier = &barrier;
    let (ta, tb) = run_pair(cpus.as_array(), move || a(barrier), move || b(barrier))
        .unwrap_or_else(|e| panic!("two-core bench on CPUs {cpus}: {e}"));
    ta.1.max(tb.1) - ta.0.min(tb.0)
}
