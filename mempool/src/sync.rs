//! Concurrency primitives for the lock-free parts of the crate.
//!
//! Everything that is shared between threads (or processes) and must be model-checked takes its
//! atomics, cells and spin hints from here rather than from `core`/`std` directly. Under
//! `RUSTFLAGS="--cfg loom"` the items come from [loom](https://docs.rs/loom), which explores
//! thread interleavings and weak-memory reorderings; otherwise they are the zero-cost `core`/`std`
//! items. This is the `primitive` shim pattern of crossbeam-utils.
//!
//! `crossbeam_utils::CachePadded` is used directly in both configurations: it is only a layout
//! wrapper and loom does not need to see it.

#[cfg(not(loom))]
pub(crate) mod atomic {
    //! `core` atomics.
    #[allow(
        unused_imports,
        reason = "shared shim: not every lock-free module uses every type"
    )]
    pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
}

#[cfg(loom)]
pub(crate) mod atomic {
    //! loom's model-checked atomics.
    #[allow(
        unused_imports,
        reason = "shared shim: not every lock-free module uses every type"
    )]
    pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
}

#[cfg(not(loom))]
pub(crate) use core::hint::spin_loop;

#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's closure-based access API.
///
/// `#[repr(transparent)]`, so an array of `UnsafeCell<T>` has exactly the layout of an array of
/// `T`; the rings rely on that to place slots in shared memory and to copy bulk runs with one
/// `memcpy`.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
#[allow(
    dead_code,
    reason = "API parity with loom::cell::UnsafeCell; rings use raw slot pointers"
)]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    #[inline(always)]
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Exponential backoff after a lost claim CAS: [`Backoff::spin`] pauses 1, 2, 4, then 8 spin
/// hints on successive calls.
///
/// Without it two threads claiming on one side in lockstep retry at once: each retry pulls the
/// head line back from the thread that just won it, which then needs the line again for its
/// tail store, and both stay in step (a failed CAS keeps them synchronised). A few pauses let
/// the winner finish its operation with the line in its own cache, and the two threads drift
/// out of step. Measured on the 2-vCPU box with `dp-perf mempool --cache 0 --cores 2 --ring-sync
/// multi`: bulk 1 about 2x, bulk 32 about 1.5x (the commit that added it has the runs). The cap
/// of 8 hints (a few hundred ns on this host) bounds the delay a loser adds to its own claim;
/// it never waits for another thread, so it adds no blocking. Under loom it does nothing: the
/// model's CAS retries are its scheduling points.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// Spin hints of the next [`Backoff::spin`].
    #[cfg(not(loom))]
    spins: u32,
}

impl Backoff {
    /// Most spin hints of one [`Backoff::spin`].
    #[cfg(not(loom))]
    const MAX_SPINS: u32 = 8;

    /// A backoff whose first spin is one hint.
    #[inline(always)]
    pub(crate) const fn new() -> Self {
        Self {
            #[cfg(not(loom))]
            spins: 1,
        }
    }

    /// Pauses, then doubles the next pause up to the cap.
    #[inline(always)]
    pub(crate) fn spin(&mut self) {
        #[cfg(not(loom))]
        {
            for _ in 0..self.spins {
                spin_loop();
            }
            self.spins = (self.spins * 2).min(Self::MAX_SPINS);
        }
    }
}

/// Spin-then-yield waiting for a value another thread is about to publish: the ring's waits on
/// a same-side predecessor (the Multi tail wait, the HTS head wait, the RTS head/tail distance
/// wait).
///
/// Every call to [`SpinWait::snooze`] is one `spin_loop` hint (a `pause` on x86, `isb`/`yield`
/// on aarch64), as in DPDK's `rte_wait_until_equal_32`. Only once the wait has lasted
/// [`SpinWait::SPIN_BUDGET`] does each further call also yield the CPU: long enough that a
/// predecessor that is merely slow (an interrupt, a VM exit, a cache miss chain) is waited out
/// on the spot, short enough that a waiter whose predecessor was preempted *on the waiter's own
/// CPU* (threads outnumbering cores) hands the CPU back within a fraction of a time slice.
///
/// Why a time budget and not a count: the first version yielded after 63 `pause`s. On the
/// shared 2-vCPU KVM development box a `pause` takes 35-60 ns, and `perf record` of the
/// two-core cache-less bulk-1 pool benchmark put 70 % of the samples in `sched_yield` under that
/// rule: a yield while other (even niced) work is runnable on the CPU gives that work a whole
/// slice, turning a microsecond stall into milliseconds. Measured wait times in the same
/// benchmark (holder on the other CPU): most under 1 us, a tail up to ~30 us, then the
/// preemptions of the holder (1-60 ms), where neither spinning nor yielding helps the waiter.
/// The clock is read once every [`SpinWait::CLOCK_EVERY`] spins, in the cold path only.
///
/// Under loom every call is a single yield, so the model sees one scheduling point per retry.
#[derive(Debug, Default)]
pub(crate) struct SpinWait {
    /// Spins so far.
    #[cfg(not(loom))]
    spins: u32,
    /// When the clock was first read (after [`SpinWait::CLOCK_EVERY`] spins).
    #[cfg(not(loom))]
    since: Option<std::time::Instant>,
    /// Whether the budget is used up: from then on every call yields.
    #[cfg(not(loom))]
    yielding: bool,
}

impl SpinWait {
    /// How long a waiter spins before it starts yielding.
    #[cfg(not(loom))]
    pub(crate) const SPIN_BUDGET: core::time::Duration = core::time::Duration::from_micros(50);

    /// Spins between two clock reads.
    #[cfg(not(loom))]
    pub(crate) const CLOCK_EVERY: u32 = 64;

    /// Waits a little: one spin hint, and a yield once the budget is used up.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        yield_now();
        #[cfg(not(loom))]
        {
            if self.yielding {
                yield_now();
                return;
            }
            spin_loop();
            self.spins = self.spins.wrapping_add(1);
            if self.spins.is_multiple_of(Self::CLOCK_EVERY) {
                let now = std::time::Instant::now();
                let since = *self.since.get_or_insert(now);
                self.yielding = now.duration_since(since) >= Self::SPIN_BUDGET;
            }
        }
    }

    /// Whether this wait has started yielding (for tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_yielding(&self) -> bool {
        self.yielding
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::SpinWait;

    #[test]
    fn spin_wait_yields_only_after_its_budget() {
        let mut w = SpinWait::default();
        let t0 = std::time::Instant::now();
        while !w.is_yielding() {
            w.snooze();
        }
        let waited = t0.elapsed();
        // The budget is counted from the first clock read, CLOCK_EVERY spins in.
        assert!(waited >= SpinWait::SPIN_BUDGET, "yielded after {waited:?}");
        assert!(w.spins >= 2 * SpinWait::CLOCK_EVERY, "{} spins", w.spins);
    }
}
