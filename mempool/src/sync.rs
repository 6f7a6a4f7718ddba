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
pub(crate) use loom::hint::spin_loop;

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

/// Spin-then-yield waiting for a value another thread is about to publish.
///
/// The first [`Backoff::SPIN_ROUNDS`] calls to [`Backoff::snooze`] spin with exponentially more
/// `spin_loop` hints (1, 2, 4, ... pause instructions); after that every call yields the CPU. A
/// waiter whose peer was preempted therefore hands its core back to the scheduler after a few
/// microseconds instead of burning a whole time slice, which matters when threads outnumber cores.
/// Under loom every call is a single yield, so the model sees one scheduling point per retry.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    /// Spinning rounds before switching to `yield_now`: 2^0 + ... + 2^5 = 63 pause hints.
    pub(crate) const SPIN_ROUNDS: u32 = 6;

    /// Waits a little; escalates from spinning to yielding.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        if cfg!(loom) {
            yield_now();
        } else if self.step < Self::SPIN_ROUNDS {
            for _ in 0..1u32 << self.step {
                spin_loop();
            }
            self.step += 1;
        } else {
            yield_now();
        }
    }
}
