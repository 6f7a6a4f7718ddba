//! A minimal spin lock for data-path state that is almost never contended: a queue pair's
//! send side (shared by its poster and its completion queue's progress engine) and an
//! rsocket context (shared by the application and its connection-manager thread).
//! Uncontended, it costs one compare-and-swap to take and a plain store to release (a
//! futex mutex needs a second read-modify-write to release), and it never makes a system
//! call, which the data path must not. Under contention it spins, then yields.
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// A test-and-test-and-set spin lock.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (S1/S2).
unsafe impl<T: Send> Send for SpinLock<T> {}
// SAFETY: as above; T only needs to be Send because access is exclusive.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // S1: Acquire on success, pairs with S2 in `SpinGuard::drop`: the previous holder's
        // writes to `value` are visible.
        // The guard is built only on success: a guard dropped after a failed attempt would
        // release the lock another thread holds.
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            Some(SpinGuard { lock: self })
        } else {
            None
        }
    }

    /// Takes the lock, spinning (and yielding after a while, so an overcommitted host makes
    /// progress) until it is free.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            // Relaxed: read-only wait for the holder to release; S1 re-synchronises.
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 1 << 12 {
                    core::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl<T> core::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never reads the value: that would need the lock.
        f.debug_struct("SpinLock")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Exclusive access to a [`SpinLock`]'s value.
#[derive(Debug)]
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock, and &mut self makes this unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        // S2: Release, pairs with S1: publishes our writes to the next holder.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes() {
        let l = Arc::new(SpinLock::new(0u64));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 200_000);
        let g = l.lock();
        assert!(l.try_lock().is_none());
        // A failed attempt must leave the holder's lock taken.
        assert!(
            l.try_lock().is_none(),
            "a failed try_lock released the lock"
        );
        drop(g);
        assert!(l.try_lock().is_some());
    }
}
