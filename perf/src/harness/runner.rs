//! Running closures on pinned threads.

use core::sync::atomic::{AtomicBool, Ordering};

use super::affinity::pin_current;
use super::barrier::SpinBarrier;
use crate::PerfError;

/// Runs `f` on a new thread pinned to `cpu` and returns its result. The calling thread's
/// affinity is not touched.
///
/// # Errors
///
/// [`PerfError::Pin`] / [`PerfError::CpuNotAllowed`] if the thread cannot be pinned (then `f`
/// does not run), [`PerfError::Panicked`] if `f` panics.
pub fn run_on<F, R>(cpu: usize, f: F) -> Result<R, PerfError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    std::thread::scope(|s| {
        s.spawn(move || -> Result<R, PerfError> {
            pin_current(cpu)?;
            Ok(f())
        })
        .join()
        .map_err(|_| PerfError::Panicked("single-core measurement"))?
    })
}

/// Runs `a` on a thread pinned to `cpus[0]` and `b` on a thread pinned to `cpus[1]`, starting
/// both closures only once both threads are pinned (they leave a spin barrier together), and
/// returns both results.
///
/// If either thread cannot be pinned, neither closure runs. The closures usually meet at a
/// [`SpinBarrier`] of their own right before their timed section.
///
/// # Errors
///
/// The pinning error, or [`PerfError::Panicked`] if a closure panics. A closure that panics
/// while its peer waits for it forever (at a barrier, or for ring elements) hangs the peer:
/// measurement closures must not panic.
pub fn run_pair<A, B, RA, RB>(cpus: [usize; 2], a: A, b: B) -> Result<(RA, RB), PerfError>
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    let start = SpinBarrier::new(2);
    let failed = AtomicBool::new(false);
    let (start, failed) = (&start, &failed);
    let pinned = move |cpu: usize| -> Result<bool, PerfError> {
        let pin = pin_current(cpu);
        if pin.is_err() {
            // Relaxed: the barrier below (B2/B3/B4) orders this store before the peer's load.
            failed.store(true, Ordering::Relaxed);
        }
        start.wait();
        pin?;
        // Relaxed: after the barrier, see above.
        Ok(!failed.load(Ordering::Relaxed))
    };
    std::thread::scope(|s| {
        let ha = s.spawn(move || -> Result<Option<RA>, PerfError> { Ok(pinned(cpus[0])?.then(a)) });
        let hb = s.spawn(move || -> Result<Option<RB>, PerfError> { Ok(pinned(cpus[1])?.then(b)) });
        let ra = ha.join().map_err(|_| PerfError::Panicked("first core"));
        let rb = hb.join().map_err(|_| PerfError::Panicked("second core"));
        match (ra??, rb??) {
            (Some(ra), Some(rb)) => Ok((ra, rb)),
            // One side failed to pin and returned its error above; the other saw `failed`.
            _ => Err(PerfError::Panicked("pinning failed on the peer thread")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_pair_runs_both_on_their_cpus() {
        let cpus = [0, 1];
        if crate::harness::CpuPair::new(0, 1).unwrap().check().is_err() {
            return; // a host without CPUs 0 and 1 cannot run this
        }
        let (a, b) = run_pair(cpus, lcore::cpuset::current_cpu, lcore::cpuset::current_cpu)
            .expect("pinned run");
        assert_eq!((a, b), (Some(0), Some(1)));
        assert_eq!(run_on(1, lcore::cpuset::current_cpu).unwrap(), Some(1));
    }

    #[test]
    fn run_pair_reports_pin_failure_and_runs_nothing() {
        let ran = AtomicBool::new(false);
        let err = run_pair(
            [0, lcore::cpuset::MAX_CPUS + 1],
            || ran.store(true, Ordering::Relaxed),
            || ran.store(true, Ordering::Relaxed),
        )
        .unwrap_err();
        assert!(matches!(err, PerfError::CpuNotAllowed { .. }), "{err}");
        assert!(!ran.load(Ordering::Relaxed));
    }
}
