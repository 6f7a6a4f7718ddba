//! Waiting: `poll`, `ppoll`, `select`, `pselect`. A set with no routed descriptor goes to
//! the kernel as is. Otherwise each routed descriptor is routed first, which moves a
//! connection due to move (so a process that waits before it reads, like qperf's forked
//! server, moves its connections here), then the set is polled with `rpoll`, rsockets and
//! kernel descriptors together, in slices that a signal handler interrupts (`block`).
//!
//! `epoll` is not interposed: an rsocket added to an epoll set is never reported ready.

use libc::{c_int, fd_set, nfds_t, pollfd, sigset_t, timespec, timeval};

use crate::migrate::{Route, route};
use crate::{block, real, signals, table};

/// True if any entry of `fds` is routed.
fn any_routed(fds: &[pollfd]) -> bool {
    fds.iter()
        .any(|p| table::get(p.fd).is_some_and(|e| e.kind.is_placeholder()))
}

/// Entries of a poll set copied on the stack (more go to the heap).
const INLINE: usize = 32;

const NONE: pollfd = pollfd {
    fd: -1,
    events: 0,
    revents: 0,
};

/// A poll set: on the stack up to [`INLINE`] entries, so waiting on a few routed
/// descriptors allocates nothing; on the heap beyond.
#[allow(
    clippy::large_enum_variant,
    reason = "the inline variant is the point: no allocation"
)]
enum PollSet {
    Inline([pollfd; INLINE], usize),
    Heap(Vec<pollfd>),
}

impl PollSet {
    fn new() -> Self {
        Self::Inline([NONE; INLINE], 0)
    }

    fn push(&mut self, p: pollfd) {
        match self {
            Self::Inline(a, n) if *n < INLINE => {
                a[*n] = p;
                *n += 1;
            }
            Self::Inline(a, n) => {
                let mut v = a[..*n].to_vec();
                v.push(p);
                *self = Self::Heap(v);
            }
            Self::Heap(v) => v.push(p),
        }
    }

    fn as_mut(&mut self) -> &mut [pollfd] {
        match self {
            Self::Inline(a, n) => &mut a[..*n],
            Self::Heap(v) => v,
        }
    }
}

/// `poll` over a set with routed descriptors.
fn poll_routed(fds: &mut [pollfd], timeout: c_int) -> c_int {
    let since = signals::interrupts();
    let mut copy = PollSet::new();
    let mut failed = 0;
    let mut any_rs = false;
    for &p in fds.iter() {
        let mut q = p;
        q.revents = 0;
        if p.fd < 0 {
            // Ignored, as by the kernel: no events, so none are reported below.
            q.events = 0;
        } else {
            match route(p.fd) {
                Ok(Route::Kernel) => {}
                Ok(Route::Rs { handle, .. }) => {
                    q.fd = handle;
                    any_rs = true;
                }
                Err(_) => {
                    // Hidden from the wait (fd -1), the events to report kept in `events`:
                    // POLLERR|POLLHUP for a failed move, POLLNVAL for one moved in the parent.
                    let broken = table::get(p.fd).is_some_and(|e| e.kind == table::Kind::Broken);
                    q.events = if broken {
                        libc::POLLERR | libc::POLLHUP
                    } else {
                        libc::POLLNVAL
                    };
                    q.fd = -1;
                    failed += 1;
                }
            }
        }
        copy.push(q);
    }
    let set = copy.as_mut();
    // With something to report now, look at the rest without waiting.
    let wait = if failed > 0 { 0 } else { timeout };
    let r = if any_rs {
        block::poll_sliced(set, since, wait)
    } else {
        // SAFETY: set is a live array of set.len() pollfds.
        let n = unsafe { real::poll(set.as_mut_ptr(), set.len() as nfds_t, wait) };
        if n < 0 { Err(real::errno()) } else { Ok(n) }
    };
    match r {
        Ok(n) => {
            for (p, q) in fds.iter_mut().zip(set.iter()) {
                p.revents = if q.fd < 0 { q.events } else { q.revents };
            }
            n + failed
        }
        Err(e) => {
            real::set_errno(e);
            -1
        }
    }
}

/// Interposed `poll(2)`.
///
/// # Safety
/// As poll: `fds` points to `n` pollfds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() || n == 0 || crate::rs::in_lib() {
        // SAFETY: the caller's arguments.
        return unsafe { real::poll(fds, n, timeout) };
    }
    // SAFETY: fds points to n pollfds (the caller's contract).
    let set = unsafe { core::slice::from_raw_parts_mut(fds, n as usize) };
    if !any_routed(set) {
        // SAFETY: the caller's arguments.
        return unsafe { real::poll(fds, n, timeout) };
    }
    poll_routed(set, timeout)
}

/// Interposed `__poll_chk` (`poll` under `_FORTIFY_SOURCE`).
///
/// # Safety
/// As poll; `fdslen` is the size of the array in pollfds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: usize,
) -> c_int {
    if n as usize > fdslen {
        // SAFETY: aborts, as the C library's check does.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: the caller's arguments.
    unsafe { poll(fds, n, timeout) }
}

/// Milliseconds of a timespec, rounded up (negative: none given).
fn ms_of(t: Option<&timespec>) -> c_int {
    t.map_or(-1, |t| {
        let ms = t
            .tv_sec
            .saturating_mul(1000)
            .saturating_add((t.tv_nsec + 999_999) / 1_000_000);
        ms.clamp(0, c_int::MAX as i64) as c_int
    })
}

/// Runs `f` with the thread's signal mask set to `mask` (if any), as ppoll/pselect do.
fn with_mask<R>(mask: *const sigset_t, f: impl FnOnce() -> R) -> R {
    if mask.is_null() {
        return f();
    }
    // SAFETY: a zeroed sigset_t is a valid out buffer; mask is valid (caller's contract).
    let mut old: sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, &mut old) };
    let r = f();
    // SAFETY: restores the mask read above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    r
}

/// Interposed `ppoll(2)`. With routed descriptors the signal mask is set around the wait
/// rather than atomically with it.
///
/// # Safety
/// As ppoll.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: fds points to n pollfds (the caller's contract).
    let routed = !fds.is_null()
        && !crate::rs::in_lib()
        && any_routed(unsafe { core::slice::from_raw_parts(fds, n as usize) });
    if !routed {
        // SAFETY: the caller's arguments.
        return unsafe { real::ppoll(fds, n, t, mask) };
    }
    // SAFETY: as above; t is null or valid.
    let (set, ms) = unsafe {
        (
            core::slice::from_raw_parts_mut(fds, n as usize),
            ms_of(t.as_ref()),
        )
    };
    with_mask(mask, || poll_routed(set, ms))
}

/// The descriptors of three fd_sets below `nfds` as pollfds (in, out, pri).
///
/// # Safety
/// The sets are null or valid.
unsafe fn to_pollfds(nfds: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set) -> PollSet {
    let mut v = PollSet::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        // SAFETY: each set is null or valid; fd < FD_SETSIZE.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && libc::FD_ISSET(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            v.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    v
}

/// `select` over routed descriptors: as poll, then the sets rewritten.
///
/// # Safety
/// The sets are null or valid.
unsafe fn select_routed(
    set: &mut [pollfd],
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ms: c_int,
) -> c_int {
    let n = poll_routed(set, ms);
    if n < 0 {
        return n;
    }
    let mut count = 0;
    // SAFETY: each set is null or valid.
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
        for p in set.iter() {
            let bad = p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
            if !r.is_null()
                && p.events & libc::POLLIN != 0
                && (p.revents & libc::POLLIN != 0 || bad)
            {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if !w.is_null()
                && p.events & libc::POLLOUT != 0
                && (p.revents & libc::POLLOUT != 0 || bad)
            {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if !e.is_null() && p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, e);
                count += 1;
            }
        }
    }
    count
}

/// Interposed `select(2)`. With routed descriptors the timeout is not updated.
///
/// # Safety
/// As select.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *mut timeval,
) -> c_int {
    if crate::rs::in_lib() {
        // SAFETY: the caller's arguments.
        return unsafe { real::select(nfds, r, w, e, t) };
    }
    // SAFETY: the sets are null or valid (the caller's contract).
    let mut set = unsafe { to_pollfds(nfds, r, w, e) };
    if !any_routed(set.as_mut()) {
        // SAFETY: the caller's arguments.
        return unsafe { real::select(nfds, r, w, e, t) };
    }
    // SAFETY: t is null or valid.
    let ms = unsafe { t.as_ref() }.map_or(-1, |t| {
        let ms = t
            .tv_sec
            .saturating_mul(1000)
            .saturating_add((t.tv_usec + 999) / 1000);
        ms.clamp(0, c_int::MAX as i64) as c_int
    });
    // SAFETY: the sets are null or valid.
    unsafe { select_routed(set.as_mut(), r, w, e, ms) }
}

/// Interposed `pselect(2)`. With routed descriptors the signal mask is set around the
/// wait rather than atomically with it.
///
/// # Safety
/// As pselect.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if crate::rs::in_lib() {
        // SAFETY: the caller's arguments.
        return unsafe { real::pselect(nfds, r, w, e, t, mask) };
    }
    // SAFETY: the sets are null or valid (the caller's contract).
    let mut set = unsafe { to_pollfds(nfds, r, w, e) };
    if !any_routed(set.as_mut()) {
        // SAFETY: the caller's arguments.
        return unsafe { real::pselect(nfds, r, w, e, t, mask) };
    }
    // SAFETY: t is null or valid.
    let ms = ms_of(unsafe { t.as_ref() });
    // SAFETY: the sets are null or valid.
    with_mask(mask, || unsafe { select_routed(set.as_mut(), r, w, e, ms) })
}
