//! The C library's own functions, found with `dlsym(RTLD_NEXT)`: what every interposed call
//! falls back to, and what this library uses itself (never `libc::*` directly, which would
//! bind to this library's own definitions).
//!
//! Each is resolved on first use and cached in an `AtomicPtr`: no lock, so resolving can
//! never wait on itself whatever the loader or another thread does meanwhile.

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use libc::{
    c_int, c_ulong, fd_set, iovec, msghdr, nfds_t, pollfd, sigset_t, size_t, sockaddr, socklen_t,
    ssize_t, timespec, timeval,
};

/// Resolves `name` (NUL-terminated) in the libraries after this one; aborts if absent,
/// since a missing libc function leaves nothing to fall back to.
fn resolve(name: &'static str) -> *mut c_void {
    // SAFETY: name is a NUL-terminated literal (the macro appends "\0").
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if p.is_null() {
        let msg = b"dp-rspreload: a C library function is missing (dlsym RTLD_NEXT)\n";
        // SAFETY: a raw write of a static buffer to stderr, then abort.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p
}

macro_rules! real {
    ($( $name:ident ( $($arg:ident : $ty:ty),* $(, ...)? ) -> $ret:ty; )*) => {$(
        #[doc = concat!("The C library's `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C function's contract.
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            static P: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
            // Relaxed: the value is the address of immutable code; every thread that
            // resolves it stores the same one, so no other memory is published with it.
            let mut p = P.load(Ordering::Relaxed);
            if p.is_null() {
                p = resolve(concat!(stringify!($name), "\0"));
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: p is the C library's function of this name, whose C type this is.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { core::mem::transmute(p) };
            // SAFETY: the caller keeps the C function's contract.
            unsafe { f($($arg),*) }
        }
    )*};
}

real! {
    socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    close(fd: c_int) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t) -> c_int;
    select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int;
    pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *const timespec, mask: *const sigset_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int;
    dup(fd: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    __chk_fail() -> ();
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Writes one line to standard error, prefixed with the library's name and the pid (no
/// errno carries what went wrong in a preload; this is where it is said).
pub(crate) fn notice(line: &str) {
    let msg = format!("dp-rspreload[{}]: {line}\n", std::process::id());
    // SAFETY: msg is a live buffer of msg.len() bytes; fd 2 may be closed (then EBADF).
    let _ = unsafe { write(2, msg.as_ptr().cast(), msg.len()) };
}
