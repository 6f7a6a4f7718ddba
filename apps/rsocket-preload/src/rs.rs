//! The rsocket calls, from the `librdmacm.so.1` the loader finds: the dataplane's drop-in
//! (`apps/rsocket-c`, first on `LD_LIBRARY_PATH` under `scripts/with-rsocket`), or
//! librdmacm's own. `DP_RSPRELOAD_LIBRDMACM` names another file.
//!
//! The library is opened on the first call that needs it. While a thread is inside an
//! rsocket call, this library's interposed functions pass that thread's calls straight to
//! the C library ([`in_lib`]): the rsocket library's own descriptors are never routed.
//!
//! # Fork
//!
//! The rsocket engine (its connection-manager thread, its context) belongs to the process
//! that started it. A child forked after the engine started inherits a copy whose threads
//! do not exist, so [`usable`] is false in it: its new connections stay on kernel TCP
//! (see `migrate`), and it never calls into the inherited engine.

use core::cell::Cell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::OnceLock;

use libc::{c_int, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};

use crate::real;

/// Names the rsocket library to open instead of `librdmacm.so.1`.
pub(crate) const LIB_VAR: &str = "DP_RSPRELOAD_LIBRDMACM";

thread_local! {
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

/// Set once this process made its first rsocket: the engine runs in this process.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Set in a child forked after the engine started: the engine is its parent's.
static INHERITED: AtomicBool = AtomicBool::new(false);

/// True while the calling thread is inside an rsocket call.
pub(crate) fn in_lib() -> bool {
    IN_LIB.with(Cell::get)
}

/// The `dlopen` handle (as an address), or 0 when the library could not be opened.
fn handle() -> usize {
    static H: OnceLock<usize> = OnceLock::new();
    *H.get_or_init(|| {
        let name = std::env::var(LIB_VAR).unwrap_or_else(|_| "librdmacm.so.1".into());
        let Ok(c) = std::ffi::CString::new(name.clone()) else {
            real::notice(&format!("{LIB_VAR}={name:?} contains a NUL byte"));
            return 0;
        };
        // SAFETY: c is a NUL-terminated path; RTLD_NOW resolves everything at once.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            real::notice(&format!(
                "cannot open {name} (the rsocket library): connections stay on kernel TCP; \
                 run the program under scripts/with-rsocket or set {LIB_VAR}"
            ));
        }
        h as usize
    })
}

/// True when this process can make rsockets: the library is there and the engine, if it
/// started, started in this process.
pub(crate) fn usable() -> bool {
    // Relaxed: a flag written before fork() returns in the child, read by the child.
    !INHERITED.load(Ordering::Relaxed) && handle() != 0
}

/// Called in the child after fork().
pub(crate) fn fork_child() {
    // Relaxed: single-threaded at this point (the child of fork has one thread).
    if STARTED.load(Ordering::Relaxed) {
        INHERITED.store(true, Ordering::Relaxed);
    }
}

/// Runs `f` with the calling thread marked as inside the rsocket library.
fn inside<R>(f: impl FnOnce() -> R) -> R {
    let was = IN_LIB.with(|c| c.replace(true));
    let r = f();
    IN_LIB.with(|c| c.set(was));
    r
}

macro_rules! rcalls {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {$(
        #[doc = concat!("librdmacm's `", stringify!($name), "` (-1 and `ENOSYS` without the library).")]
        ///
        /// # Safety
        /// The C function's contract.
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            static P: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
            // Relaxed: the address of immutable code, the same for every thread.
            let mut p = P.load(Ordering::Relaxed);
            if p.is_null() {
                let h = handle();
                if h == 0 {
                    real::set_errno(libc::ENOSYS);
                    return -1 as $ret;
                }
                let name = concat!(stringify!($name), "\0");
                // SAFETY: h is a live dlopen handle, name is NUL-terminated.
                p = unsafe { libc::dlsym(h as *mut c_void, name.as_ptr().cast()) };
                if p.is_null() {
                    real::set_errno(libc::ENOSYS);
                    return -1 as $ret;
                }
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: p is the library's function of this name, whose C type this is.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { core::mem::transmute(p) };
            // SAFETY: the caller keeps the C function's contract.
            inside(|| unsafe { f($($arg),*) })
        }
    )*};
}

rcalls! {
    rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    rlisten(s: c_int, backlog: c_int) -> c_int;
    raccept(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    rshutdown(s: c_int, how: c_int) -> c_int;
    rclose(s: c_int) -> c_int;
    rread(s: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    rwrite(s: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    rreadv(s: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    rwritev(s: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    rsend(s: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    rrecvfrom(s: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    rsendto(s: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    rrecvmsg(s: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    rsendmsg(s: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    rpoll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    rgetsockname(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    rgetsockopt(s: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    rsetsockopt(s: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    rfcntl(s: c_int, cmd: c_int, arg: libc::c_long) -> c_int;
    rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
}

/// librdmacm's `rsocket`: a new stream rsocket; starts the engine in this process.
pub(crate) fn new_stream(domain: c_int) -> c_int {
    // Relaxed: read only by this process's fork child handler, after fork().
    STARTED.store(true, Ordering::Relaxed);
    // SAFETY: plain integer arguments.
    unsafe { rsocket(domain, libc::SOCK_STREAM, 0) }
}
