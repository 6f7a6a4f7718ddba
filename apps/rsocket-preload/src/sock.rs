//! The socket calls: `socket`, `listen`, `accept`/`accept4`, `connect`, `close`,
//! `shutdown`, `getsockopt`/`setsockopt`, `fcntl`, `ioctl` (`FIONBIO`), `dup`/`dup2`/
//! `dup3`. (`bind`, `getsockname` and `getpeername` are not interposed: they act on the
//! kernel socket, which holds the real addresses.)
//!
//! TCP sockets are kernel sockets until their connection moves (`migrate`); a listener
//! stays one for good, so it is shared across fork like any kernel listener. What is
//! routed is recorded in `table`.

use core::ffi::c_void;

use libc::{c_int, c_ulong, sockaddr, socklen_t};

use crate::migrate::{Mode, Route, route, set_kernel_nonblock};
use crate::table::{self, Entry, Kind, Refs};
use crate::{real, rs};

fn fail(e: c_int) -> c_int {
    real::set_errno(e);
    -1
}

/// Interposed `socket(2)`: `AF_INET`/`AF_INET6` `SOCK_STREAM` (TCP) sockets are entered in
/// the table; everything else is the kernel's alone.
///
/// # Safety
/// As socket.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let fd = unsafe { real::socket(domain, ty, protocol) };
    if fd >= 0 {
        let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6)
            && ty & 0xf == libc::SOCK_STREAM
            && (protocol == 0 || protocol == libc::IPPROTO_TCP);
        if tcp && !rs::in_lib() {
            table::set(fd, Entry::new(Kind::Socket, ty & libc::SOCK_NONBLOCK != 0));
        } else {
            table::take(fd);
        }
    }
    fd
}

/// Interposed `listen(2)`.
///
/// # Safety
/// As listen.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::listen(fd, backlog) };
    if let Some(e) = table::get(fd).filter(|e| r == 0 && e.kind == Kind::Socket) {
        table::swap(fd, e, Entry::new(Kind::Listener, e.nonblock));
    }
    r
}

/// Interposed `accept4(2)`: what a routed listener accepts is entered as a connection to
/// move (and moved now with `DP_RSPRELOAD_MIGRATE=connect`).
///
/// # Safety
/// As accept4.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let routed = !rs::in_lib() && table::get(fd).is_some_and(|e| e.kind == Kind::Listener);
    if !routed {
        // SAFETY: the caller's arguments.
        return unsafe { real::accept4(fd, addr, len, flags) };
    }
    // The placeholder stays blocking: O_NONBLOCK is recorded.
    // SAFETY: the caller's arguments.
    let c = unsafe { real::accept4(fd, addr, len, flags & !libc::SOCK_NONBLOCK) };
    if c >= 0 {
        table::set(
            c,
            Entry::new(Kind::Passive, flags & libc::SOCK_NONBLOCK != 0),
        );
        if Mode::get() == Mode::Connect {
            // A failure shows on the connection's first call.
            let _ = route(c);
        }
    }
    c
}

/// Interposed `accept(2)`.
///
/// # Safety
/// As accept.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { accept4(fd, addr, len, 0) }
}

/// Interposed `connect(2)`: a routed socket connects (blocking, even when the program
/// asked for `O_NONBLOCK`: it then returns 0 rather than `EINPROGRESS`) and is entered as
/// a connection to move.
///
/// # Safety
/// As connect.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let e = table::get(fd).filter(|e| e.kind == Kind::Socket && !rs::in_lib());
    let Some(e) = e else {
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    };
    if e.nonblock {
        set_kernel_nonblock(fd, false);
    }
    let r = loop {
        // SAFETY: the caller's arguments.
        let r = unsafe { real::connect(fd, addr, len) };
        if r == 0 || real::errno() != libc::EINTR {
            break r;
        }
    };
    if r != 0 {
        let err = real::errno();
        if e.nonblock {
            set_kernel_nonblock(fd, true);
        }
        return fail(err);
    }
    if !table::swap(fd, e, Entry::new(Kind::Active, e.nonblock)) {
        // The program changed O_NONBLOCK meanwhile: enter the current one.
        let now = table::get(fd).map_or(e.nonblock, |n| n.nonblock);
        table::set(fd, Entry::new(Kind::Active, now));
    }
    if Mode::get() == Mode::Connect
        && let Err(err) = route(fd)
    {
        return fail(err);
    }
    0
}

/// Forgets `fd`'s entry; closes its rsocket when no other descriptor names it.
fn forget(fd: c_int) {
    loop {
        match table::get(fd) {
            // Wait for a move in progress to finish (it owns the rsocket until then).
            Some(e) if e.kind == Kind::Busy => std::thread::yield_now(),
            _ => break,
        }
    }
    if let Some(e) = table::take(fd)
        && e.kind == Kind::Rs
        && Refs::drop_one(e.handle)
    {
        // SAFETY: the last descriptor naming this rsocket is going.
        unsafe { rs::rclose(e.handle) };
    }
}

/// At exit: closes every rsocket this process still holds, gracefully, as the kernel
/// closes a process's sockets when it exits (rsocket engines run nothing at exit, so
/// without this the peer waits for its close timeout). Connections moved in another
/// process are not this process's and are left alone.
pub(crate) fn close_all() {
    for fd in 0..table::high() {
        if table::get(fd).is_some_and(|e| e.kind == Kind::Rs) {
            forget(fd);
        }
    }
}

/// Interposed `close(2)`. A connection on rsockets is closed gracefully (as `rclose`);
/// one that moved in the parent before a fork is only dropped here (the parent owns it).
///
/// # Safety
/// As close.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !rs::in_lib() {
        forget(fd);
    }
    // SAFETY: the caller's descriptor.
    unsafe { real::close(fd) }
}

/// Interposed `shutdown(2)`: a connection not yet moved moves first, so the peer sees the
/// end where it reads.
///
/// # Safety
/// As shutdown.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    match route(fd) {
        Err(e) => fail(e),
        // SAFETY: the caller's arguments.
        Ok(Route::Kernel) => unsafe { real::shutdown(fd, how) },
        // SAFETY: an rsocket of the table.
        Ok(Route::Rs { handle, .. }) => unsafe { rs::rshutdown(handle, how) },
    }
}

/// The rsocket behind `fd` if it already moved (options never make a connection move).
fn moved(fd: c_int) -> Option<c_int> {
    table::get(fd)
        .filter(|e| e.kind == Kind::Rs && !rs::in_lib())
        .map(|e| e.handle)
}

/// Interposed `getsockopt(2)`: an rsocket's options where it has them, else the kernel
/// socket's.
///
/// # Safety
/// As getsockopt.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(h) = moved(fd)
        // SAFETY: the caller's arguments.
        && unsafe { rs::rgetsockopt(h, level, name, val, len) } == 0
    {
        return 0;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::getsockopt(fd, level, name, val, len) }
}

/// Interposed `setsockopt(2)`: on the rsocket where it has the option, else on the kernel
/// socket (before a connection moves, always the kernel socket's).
///
/// # Safety
/// As setsockopt.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(h) = moved(fd)
        // SAFETY: the caller's arguments.
        && unsafe { rs::rsetsockopt(h, level, name, val, len) } == 0
    {
        return 0;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::setsockopt(fd, level, name, val, len) }
}

/// Records the program's `O_NONBLOCK` for a routed descriptor; true if `fd` is a
/// placeholder (its kernel socket must not change).
fn record_nonblock(fd: c_int, on: bool) -> bool {
    match table::get(fd) {
        Some(e) if !rs::in_lib() => {
            table::set_nonblock(fd, on);
            e.kind.is_placeholder()
        }
        _ => false,
    }
}

/// A duplicate of routed `fd` (moved first) as `new`, which the kernel just made.
fn enter_dup(fd: c_int, new: c_int) {
    if let Some(e) = table::get(fd) {
        if e.kind == Kind::Rs {
            Refs::add(e.handle);
        }
        table::set(new, e);
    }
}

/// Interposed `fcntl(2)`: `F_GETFL`/`F_SETFL` keep the program's `O_NONBLOCK` for a routed
/// connection (its kernel socket stays blocking); `F_DUPFD`/`F_DUPFD_CLOEXEC` duplicate the
/// routing; everything else (`F_SETOWN`, `F_GETFD`, `F_SETFD`, ...) acts on the kernel
/// socket. (Declared with one integer argument, which is how the C ABIs of Linux's 64-bit
/// targets pass fcntl's optional one.)
///
/// # Safety
/// As fcntl.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let e = table::get(fd).filter(|_| !rs::in_lib());
    match (cmd, e) {
        (libc::F_GETFL, Some(e)) if e.kind.is_placeholder() => {
            // SAFETY: a flag query.
            let fl = unsafe { real::fcntl(fd, cmd, 0) };
            if fl < 0 {
                return fl;
            }
            if e.nonblock {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            }
        }
        (libc::F_SETFL, Some(_)) => {
            let on = arg as c_int & libc::O_NONBLOCK != 0;
            let keep = if record_nonblock(fd, on) {
                arg & !(libc::O_NONBLOCK as c_ulong)
            } else {
                arg
            };
            // SAFETY: the caller's flags (O_NONBLOCK held back for a placeholder).
            unsafe { real::fcntl(fd, cmd, keep) }
        }
        (libc::F_DUPFD | libc::F_DUPFD_CLOEXEC, Some(_)) => {
            if let Err(err) = route(fd) {
                return fail(err);
            }
            // SAFETY: the caller's arguments.
            let n = unsafe { real::fcntl(fd, cmd, arg) };
            if n >= 0 {
                enter_dup(fd, n);
            }
            n
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real::fcntl(fd, cmd, arg) },
    }
}

/// Interposed `ioctl(2)`: `FIONBIO` as `F_SETFL`'s `O_NONBLOCK`; everything else on the
/// kernel socket.
///
/// # Safety
/// As ioctl.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    if req == libc::FIONBIO as c_ulong && arg != 0 {
        // SAFETY: FIONBIO's argument points to an int (the caller's contract).
        let on = unsafe { *(arg as *const c_int) } != 0;
        if record_nonblock(fd, on) {
            return 0;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ioctl(fd, req, arg) }
}

/// Interposed `dup(2)`.
///
/// # Safety
/// As dup.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if table::get(fd).is_some() && !rs::in_lib() {
        if let Err(err) = route(fd) {
            return fail(err);
        }
        // SAFETY: the caller's descriptor.
        let n = unsafe { real::dup(fd) };
        if n >= 0 {
            enter_dup(fd, n);
        }
        return n;
    }
    // SAFETY: the caller's descriptor.
    unsafe { real::dup(fd) }
}

/// Interposed `dup3(2)`.
///
/// # Safety
/// As dup3.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if rs::in_lib() || old == new {
        // SAFETY: the caller's arguments.
        return unsafe { real::dup3(old, new, flags) };
    }
    if table::get(old).is_some()
        && let Err(err) = route(old)
    {
        return fail(err);
    }
    // SAFETY: the caller's arguments.
    let n = unsafe { real::dup3(old, new, flags) };
    if n >= 0 {
        forget(new);
        enter_dup(old, new);
    }
    n
}

/// Interposed `dup2(2)`.
///
/// # Safety
/// As dup2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new || rs::in_lib() {
        // SAFETY: the caller's arguments.
        return unsafe { real::dup2(old, new) };
    }
    // SAFETY: the caller's arguments.
    unsafe { dup3(old, new, 0) }
}
