//! Signals: what lets a blocking call on an rsocket return `EINTR`.
//!
//! A blocking read on a kernel socket returns `EINTR` when a signal handler installed
//! without `SA_RESTART` runs; programs rely on it (qperf's `SIGALRM` ends a test while its
//! loop waits in `read`). The rsocket engine waits by polling memory, which no signal
//! interrupts. So `sigaction` and `signal` are interposed: a handler the program installs
//! is wrapped in [`trampoline`], which counts the deliveries of handlers without
//! `SA_RESTART` in [`interrupts`] and then calls the program's handler. A blocking call
//! takes the count when it starts and returns `EINTR` once it changed (see `block`).
//!
//! What the program reads back with `sigaction(sig, NULL, &old)` is what it installed.
//! Not wrapped: handlers installed through `sigvec`/`sysv_signal` or the raw system call,
//! and `SA_RESETHAND` handlers after their one delivery are still remembered here (their
//! next reading returns the program's handler, not `SIG_DFL`).

use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use libc::{c_int, sighandler_t, siginfo_t};

use crate::real;

/// Signal numbers below this may be wrapped (Linux's `_NSIG`).
const NSIG: usize = 65;

static INTERRUPTS: AtomicU64 = AtomicU64::new(0);
static HANDLER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static FLAGS: [AtomicI32; NSIG] = [const { AtomicI32::new(0) }; NSIG];
/// The actions the program installed, as it installed them (for `oldact`).
static SAVED: Mutex<[Option<libc::sigaction>; NSIG]> = Mutex::new([None; NSIG]);

/// How many handlers without `SA_RESTART` have run so far.
pub(crate) fn interrupts() -> u64 {
    // S1: Acquire pairs with S2: a call that sees the new count returns EINTR after the
    // handler's effects (qperf's `Finished = 1`) are visible to it.
    INTERRUPTS.load(Ordering::Acquire)
}

extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    let (h, f) = match (HANDLER.get(i), FLAGS.get(i)) {
        // S3: Acquire pairs with S4: the flags stored before the handler are seen.
        (Some(h), Some(f)) => (h.load(Ordering::Acquire), f.load(Ordering::Relaxed)),
        _ => return,
    };
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if f & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed h as an SA_SIGINFO handler of this type.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { core::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed h as a one-argument handler.
        let f: extern "C" fn(c_int) = unsafe { core::mem::transmute(h) };
        f(sig);
    }
    if f & libc::SA_RESTART == 0 {
        // S2: Release after the handler ran, pairs with S1.
        INTERRUPTS.fetch_add(1, Ordering::Release);
    }
}

/// Interposed `sigaction(2)`.
///
/// # Safety
/// As sigaction: `act` and `old` are null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let i = sig as usize;
    if !(1..NSIG).contains(&i) {
        // SAFETY: the caller's pointers, passed on.
        return unsafe { real::sigaction(sig, act, old) };
    }
    let mut saved = SAVED.lock().unwrap_or_else(PoisonError::into_inner);
    let before = saved[i];
    // SAFETY: act is null or a valid sigaction (the caller's contract).
    let new = unsafe { act.as_ref() }.copied();
    // SAFETY: a zeroed sigaction is a valid out buffer.
    let mut was: libc::sigaction = unsafe { core::mem::zeroed() };
    let r = match new {
        Some(a) if a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN => {
            let mut ours = a;
            ours.sa_sigaction = trampoline as *const () as sighandler_t;
            ours.sa_flags |= libc::SA_SIGINFO;
            FLAGS[i].store(a.sa_flags, Ordering::Relaxed);
            // S4: Release pairs with S3.
            HANDLER[i].store(a.sa_sigaction, Ordering::Release);
            // SAFETY: ours is a valid sigaction, was a valid out buffer.
            let r = unsafe { real::sigaction(sig, &ours, &mut was) };
            if r == 0 {
                saved[i] = Some(a);
            }
            r
        }
        Some(a) => {
            // SAFETY: as above.
            let r = unsafe { real::sigaction(sig, &a, &mut was) };
            if r == 0 {
                saved[i] = None;
                HANDLER[i].store(0, Ordering::Release);
            }
            r
        }
        // SAFETY: a query.
        None => unsafe { real::sigaction(sig, core::ptr::null(), &mut was) },
    };
    if r == 0 && !old.is_null() {
        // SAFETY: old is valid (the caller's contract).
        unsafe { *old = before.unwrap_or(was) };
    }
    r
}

/// Interposed `signal(3)`: BSD semantics (`SA_RESTART`), as glibc's.
///
/// # Safety
/// As signal.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
    // SAFETY: zeroed sigactions are valid values.
    let (mut act, mut old): (libc::sigaction, libc::sigaction) =
        unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: both point to live sigactions.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
