//! The shared stop signal and the SIGINT/SIGTERM helper.
//!
//! Stopping is two-phase (see the [crate docs](crate#stopping)):
//!
//! 1. **Signal.** Something sets the [`StopToken`]: [`StopToken::stop`], a panic on any lcore, or
//!    SIGINT/SIGTERM through [`install_stop_signals`]. Setting it is one atomic store; it never
//!    blocks and is async-signal-safe.
//! 2. **Drain.** Each poll loop notices the token at the end of an iteration, switches to
//!    draining (pollers see [`Ctx::is_stopping`](crate::Ctx::is_stopping) and should stop
//!    creating new work), keeps polling until it has been idle for
//!    [`DrainPolicy::idle_iterations`](crate::DrainPolicy::idle_iterations) consecutive
//!    iterations or [`DrainPolicy::timeout`](crate::DrainPolicy::timeout) passed, and returns;
//!    then the thread is joined.

use core::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::id::LcoreId;

const RUNNING: u64 = 0;
const REQUESTED: u64 = 1;
const TAG_SHIFT: u32 = 32;
const TAG_SIGNAL: u64 = 2 << TAG_SHIFT;
const TAG_PANIC: u64 = 3 << TAG_SHIFT;
const TAG_MASK: u64 = !((1 << TAG_SHIFT) - 1);

/// Why the stop signal was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// [`StopToken::stop`] was called.
    Requested,
    /// A signal arrived through [`install_stop_signals`]; carries the signal number.
    Signal(i32),
    /// The lcore panicked.
    Panic(LcoreId),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Requested => f.write_str("stop requested"),
            Self::Signal(s) => write!(f, "signal {s}"),
            Self::Panic(l) => write!(f, "panic on {l}"),
        }
    }
}

/// A cloneable handle on one shared stop flag.
///
/// All lcores of an [`Lcores`](crate::Lcores) share one token. Checking it is a single
/// `Acquire` load of a line that is written once, so polling it every loop iteration costs an L1
/// hit.
#[derive(Clone, Default)]
pub struct StopToken {
    inner: Arc<AtomicU64>,
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopToken")
            .field("reason", &self.reason())
            .finish()
    }
}

impl StopToken {
    /// A token that is not stopped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the stop signal (first reason wins; later calls change nothing).
    pub fn stop(&self) {
        self.raise(REQUESTED);
    }

    /// Raises the stop signal because `lcore` panicked.
    pub(crate) fn stop_for_panic(&self, lcore: LcoreId) {
        self.raise(TAG_PANIC | u64::from(lcore.index()));
    }

    fn raise(&self, code: u64) {
        // S1: Release, pairs with S2 in `is_stopped`: whatever the stopping thread wrote before
        // stopping is visible to a loop that sees the stop. Failure ordering Relaxed: on failure
        // nothing is read besides the existing reason, which we discard.
        let _ = self
            .inner
            .compare_exchange(RUNNING, code, Ordering::Release, Ordering::Relaxed);
    }

    /// Whether the stop signal was raised.
    #[inline]
    pub fn is_stopped(&self) -> bool {
        // S2: Acquire, pairs with S1 and with G3 in the signal handler.
        self.inner.load(Ordering::Acquire) != RUNNING
    }

    /// Why the signal was raised, if it was.
    pub fn reason(&self) -> Option<StopReason> {
        // S2 (same pairing as `is_stopped`).
        let v = self.inner.load(Ordering::Acquire);
        match (v, v & TAG_MASK) {
            (RUNNING, _) => None,
            (REQUESTED, _) => Some(StopReason::Requested),
            (_, TAG_SIGNAL) => Some(StopReason::Signal((v & 0xffff_ffff) as i32)),
            (_, TAG_PANIC) => Some(StopReason::Panic(LcoreId::new((v & 0xffff) as u16))),
            _ => Some(StopReason::Requested),
        }
    }

    /// Whether two handles refer to the same flag.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The flag the signal handler stores to; null when no handler is installed.
static SIGNAL_TARGET: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
/// Whether a [`SignalGuard`] is alive.
static SIGNALS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Signals wired by [`install_stop_signals`].
pub const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // G2: Acquire, pairs with G1 in `install_stop_signals`: the token allocation is visible.
    let target = SIGNAL_TARGET.load(Ordering::Acquire);
    if !target.is_null() {
        // SAFETY: a non-null target is a leaked `Arc<AtomicU64>` (never freed, see
        // `install_stop_signals`), so it is valid for the life of the process.
        let flag = unsafe { &*target };
        // G3: Release, pairs with S2 in `StopToken::is_stopped`. A plain atomic store: the only
        // thing this async-signal handler does.
        flag.store(TAG_SIGNAL | (sig as u32 as u64), Ordering::Release);
    }
}

/// Why the signal handlers could not be installed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// Another [`SignalGuard`] is alive.
    #[error("stop signals are already wired to a token; drop the existing SignalGuard first")]
    AlreadyInstalled,
    /// `sigaction` failed.
    #[error("sigaction({signal}) failed: {source}")]
    Sigaction {
        /// The signal number.
        signal: i32,
        /// The OS error.
        source: io::Error,
    },
}

/// Keeps SIGINT/SIGTERM wired to a [`StopToken`]; dropping it restores the previous handlers.
#[must_use = "dropping the guard unwires the signals immediately"]
#[derive(Debug)]
pub struct SignalGuard {
    previous: [libc::sigaction; 2],
}

/// Wires SIGINT and SIGTERM to `token` with `sigaction`: the handler does one atomic store into
/// the token and nothing else (async-signal-safe), and the poll loops see it at their next
/// iteration.
///
/// The handler is installed with `SA_RESTART`, so blocking syscalls on non-lcore threads are
/// restarted rather than failing with `EINTR`. One token allocation is leaked per call, because
/// a handler may still be running on another thread when the guard is dropped.
///
/// # Errors
///
/// [`SignalError::AlreadyInstalled`] if a guard is alive; [`SignalError::Sigaction`] if the
/// kernel refused (the handlers installed so far are restored).
pub fn install_stop_signals(token: &StopToken) -> Result<SignalGuard, SignalError> {
    if SIGNALS_INSTALLED
        // I1: AcqRel on success: orders this install after a previous guard's restore (I2).
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return Err(SignalError::AlreadyInstalled);
    }
    let leaked = Arc::into_raw(Arc::clone(&token.inner)).cast_mut();
    // G1: Release, pairs with G2 in the handler.
    SIGNAL_TARGET.store(leaked, Ordering::Release);

    // SAFETY: an all-zero sigaction is a valid "default" value to be overwritten by the kernel.
    let mut previous: [libc::sigaction; 2] = unsafe { core::mem::zeroed() };
    for (i, &sig) in STOP_SIGNALS.iter().enumerate() {
        // SAFETY: all-zero is a valid sigaction; the fields we need are set below.
        let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
        act.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        act.sa_flags = libc::SA_RESTART;
        // SAFETY: `act.sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: `act` and `previous[i]` are valid sigaction structs; the handler only performs
        // atomic operations on process-lifetime memory.
        if unsafe { libc::sigaction(sig, &act, &mut previous[i]) } != 0 {
            let source = io::Error::last_os_error();
            for j in 0..i {
                // SAFETY: restores an action the kernel gave us above.
                unsafe { libc::sigaction(STOP_SIGNALS[j], &previous[j], core::ptr::null_mut()) };
            }
            // G1 (same pairing): the handler sees either the target or null, both valid.
            SIGNAL_TARGET.store(core::ptr::null_mut(), Ordering::Release);
            // I2: Release, pairs with I1.
            SIGNALS_INSTALLED.store(false, Ordering::Release);
            return Err(SignalError::Sigaction {
                signal: sig,
                source,
            });
        }
    }
    Ok(SignalGuard { previous })
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (i, &sig) in STOP_SIGNALS.iter().enumerate() {
            // SAFETY: restores the action the kernel returned when the guard was created.
            unsafe { libc::sigaction(sig, &self.previous[i], core::ptr::null_mut()) };
        }
        // G1 (same pairing): the handler sees either the old target or null, both valid.
        SIGNAL_TARGET.store(core::ptr::null_mut(), Ordering::Release);
        // I2: Release, pairs with I1.
        SIGNALS_INSTALLED.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins() {
        let t = StopToken::new();
        assert!(!t.is_stopped());
        assert_eq!(t.reason(), None);
        t.stop_for_panic(LcoreId::new(3));
        t.stop();
        assert!(t.is_stopped());
        assert_eq!(t.reason(), Some(StopReason::Panic(LcoreId::new(3))));
        let u = t.clone();
        assert!(u.same_as(&t));
        assert!(!StopToken::new().same_as(&t));
    }

    #[test]
    fn sigterm_sets_the_token_and_guard_restores() {
        let t = StopToken::new();
        let guard = install_stop_signals(&t).unwrap();
        assert!(matches!(
            install_stop_signals(&t),
            Err(SignalError::AlreadyInstalled)
        ));
        // SAFETY: raise delivers SIGTERM to this thread; our handler is installed.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert!(t.is_stopped());
        assert_eq!(t.reason(), Some(StopReason::Signal(libc::SIGTERM)));
        drop(guard);
        // After the guard, installing again works.
        let t2 = StopToken::new();
        let g2 = install_stop_signals(&t2).unwrap();
        // SAFETY: as above, for SIGINT.
        assert_eq!(unsafe { libc::raise(libc::SIGINT) }, 0);
        assert_eq!(t2.reason(), Some(StopReason::Signal(libc::SIGINT)));
        drop(g2);
    }
}
