//! The data calls: `read`, `write`, `readv`, `writev`, `recv`, `send`, `recvfrom`,
//! `sendto`, `recvmsg`, `sendmsg` (and the fortified `__read_chk`, `__recv_chk`,
//! `__recvfrom_chk`). A routed descriptor's call goes to its rsocket; blocking is done
//! here (`block`), so that signals interrupt it as they would a kernel socket.

use core::ffi::c_void;

use libc::{c_int, c_short, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::migrate::{Route, route};
use crate::{block, real, signals};

const IN: c_short = libc::POLLIN;
const OUT: c_short = libc::POLLOUT;

/// Runs one data call: `kernel` for a kernel descriptor, else `rs(handle)` on the rsocket
/// (non-blocking). When the program's call blocks, a try that finds nothing is retried at
/// once for the polling time, then after yields, then after waits for `want`
/// ([`block::Retry`]: each try makes progress on the socket, and the one that finds the
/// data returns it).
fn call(
    fd: c_int,
    want: c_short,
    dontwait: bool,
    kernel: impl FnOnce() -> ssize_t,
    mut rs: impl FnMut(c_int) -> ssize_t,
) -> ssize_t {
    let since = signals::interrupts();
    match route(fd) {
        Err(e) => {
            real::set_errno(e);
            -1
        }
        Ok(Route::Kernel) => kernel(),
        Ok(Route::Rs { handle, nonblock }) => {
            let mut retry = block::Retry::new();
            loop {
                let r = rs(handle);
                if r >= 0 || nonblock || dontwait || real::errno() != libc::EAGAIN {
                    return r;
                }
                let waited = match retry.next() {
                    block::Next::Wait => block::wait(handle, want, since, -1),
                    next => {
                        if next == block::Next::Yield {
                            std::thread::yield_now();
                        }
                        if signals::interrupts() != since {
                            Err(libc::EINTR)
                        } else {
                            Ok(true)
                        }
                    }
                };
                if let Err(e) = waited {
                    real::set_errno(e);
                    return -1;
                }
            }
        }
    }
}

/// Flags rsockets take: `MSG_NOSIGNAL` is implied (rsockets never raise `SIGPIPE`), and
/// blocking is done here.
fn rs_flags(flags: c_int) -> c_int {
    (flags & !libc::MSG_NOSIGNAL) | libc::MSG_DONTWAIT
}

/// Interposed `read(2)`.
///
/// # Safety
/// As read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    call(
        fd,
        IN,
        false,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::read(fd, buf, n) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rread(h, buf, n) },
    )
}

/// Interposed `write(2)`.
///
/// # Safety
/// As write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    call(
        fd,
        OUT,
        false,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::write(fd, buf, n) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rwrite(h, buf, n) },
    )
}

/// Interposed `readv(2)`.
///
/// # Safety
/// As readv.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    call(
        fd,
        IN,
        false,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::readv(fd, iov, n) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rreadv(h, iov, n) },
    )
}

/// Interposed `writev(2)`.
///
/// # Safety
/// As writev.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    call(
        fd,
        OUT,
        false,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::writev(fd, iov, n) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rwritev(h, iov, n) },
    )
}

/// Interposed `recv(2)`. `MSG_WAITALL` on an rsocket gathers here until the buffer is
/// full, the stream ends, or an error (then what arrived is returned, as TCP does).
///
/// # Safety
/// As recv.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's arguments.
    unsafe {
        recvfrom(
            fd,
            buf,
            n,
            flags,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    }
}

/// Interposed `send(2)`.
///
/// # Safety
/// As send.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    call(
        fd,
        OUT,
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::send(fd, buf, n, flags) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rsend(h, buf, n, rs_flags(flags)) },
    )
}

/// Interposed `recvfrom(2)`.
///
/// # Safety
/// As recvfrom.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_PEEK == 0;
    let mut got = 0usize;
    loop {
        let r = call(
            fd,
            IN,
            flags & libc::MSG_DONTWAIT != 0,
            // SAFETY: the caller's arguments, passed on.
            || unsafe { real::recvfrom(fd, buf, n, flags, addr, len) },
            // SAFETY: buf[got..n] is within the caller's buffer.
            |h| unsafe {
                let f = rs_flags(flags) & !libc::MSG_WAITALL;
                crate::rs::rrecvfrom(h, buf.cast::<u8>().add(got).cast(), n - got, f, addr, len)
            },
        );
        if r < 0 {
            return if got > 0 { got as ssize_t } else { r };
        }
        // A kernel descriptor did all of it (MSG_WAITALL included).
        if r == 0 || !waitall || !matches!(route(fd), Ok(Route::Rs { .. })) {
            return (got + r as usize) as ssize_t;
        }
        got += r as usize;
        if got >= n {
            return got as ssize_t;
        }
    }
}

/// Interposed `sendto(2)`. On a connected rsocket an address fails with `EISCONN` unless
/// the rsocket library is told otherwise (`DP_RSOCKET_SENDTO=linux` for the dataplane's).
///
/// # Safety
/// As sendto.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    call(
        fd,
        OUT,
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::sendto(fd, buf, n, flags, addr, len) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rsendto(h, buf, n, rs_flags(flags), addr, len) },
    )
}

/// Interposed `recvmsg(2)`.
///
/// # Safety
/// As recvmsg.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    call(
        fd,
        IN,
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::recvmsg(fd, msg, flags) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rrecvmsg(h, msg, rs_flags(flags) & !libc::MSG_WAITALL) },
    )
}

/// Interposed `sendmsg(2)`.
///
/// # Safety
/// As sendmsg.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    call(
        fd,
        OUT,
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's arguments, passed on.
        || unsafe { real::sendmsg(fd, msg, flags) },
        // SAFETY: as above.
        |h| unsafe { crate::rs::rsendmsg(h, msg, rs_flags(flags)) },
    )
}

/// Interposed `__read_chk` (`read` under `_FORTIFY_SOURCE`).
///
/// # Safety
/// As read; `buflen` is the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: aborts, as the C library's check does.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: the caller's arguments.
    unsafe { read(fd, buf, n) }
}

/// Interposed `__recv_chk`.
///
/// # Safety
/// As recv; `buflen` is the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        // SAFETY: aborts, as the C library's check does.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: the caller's arguments.
    unsafe { recv(fd, buf, n, flags) }
}

/// Interposed `__recvfrom_chk`.
///
/// # Safety
/// As recvfrom; `buflen` is the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: aborts, as the C library's check does.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: the caller's arguments.
    unsafe { recvfrom(fd, buf, n, flags, addr, len) }
}
