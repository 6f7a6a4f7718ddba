//! `libdp_rspreload.so`: an `LD_PRELOAD` library that runs an unmodified program's TCP
//! connections on rsockets, the dataplane's (`apps/rsocket-c`, found as `librdmacm.so.1`
//! under `scripts/with-rsocket`) or librdmacm's own. It plays the part of librdmacm's
//! `librspreload.so`, written anew for what that one cannot serve: programs that fork
//! between accepting a connection and using it (qperf's server), and blocking calls that a
//! signal must interrupt (qperf's timed tests).
//!
//! ```sh
//! LD_PRELOAD=target/release/libdp_rspreload.so scripts/with-rsocket qperf
//! LD_PRELOAD=target/release/libdp_rspreload.so scripts/with-rsocket qperf 127.0.0.1 tcp_lat
//! ```
//!
//! # What is interposed
//!
//! `socket`, `listen`, `accept`, `accept4`, `connect`, `close`, `shutdown`,
//! `getsockopt`, `setsockopt`, `fcntl`, `ioctl` (`FIONBIO`), `dup`, `dup2`, `dup3`
//! (`sock`); `read`, `write`, `readv`, `writev`, `recv`, `send`, `recvfrom`, `sendto`,
//! `recvmsg`, `sendmsg` and the fortified `__read_chk`, `__recv_chk`, `__recvfrom_chk`
//! (`io`); `poll`, `__poll_chk`, `ppoll`, `select`, `pselect` (`poll`); `sigaction`,
//! `signal` (`signals`). The C library's own functions are found with
//! `dlsym(RTLD_NEXT)` (`real`), the rsocket calls with `dlopen("librdmacm.so.1")` (`rs`).
//! Only `AF_INET`/`AF_INET6` `SOCK_STREAM` sockets are routed; every other descriptor
//! goes straight to the kernel, as do calls made from inside the rsocket library.
//!
//! # How a connection gets to rsockets
//!
//! Listening, connecting and accepting are the kernel's: the program's descriptors are
//! kernel TCP sockets throughout. A connection then moves to an rsocket with a short
//! handshake on its TCP connection (`migrate`, `wire`), on its first use by default, and
//! the TCP socket stays open behind the program's descriptor (`table`). Because of that:
//! listeners, addresses, `getsockname`/`getpeername`, `F_SETOWN` and close-on-exec are the
//! kernel's and correct; a listener or a not-yet-used connection is shared by `fork` as
//! any kernel socket is, and moves in whichever process uses it first.
//!
//! # Fork: what survives it
//!
//! * listeners, and connections not used yet: all of them, in parent and child alike;
//! * connections already on rsockets: only in the process that moved them; the other
//!   process's descriptor fails with `EBADF` and a message saying so;
//! * the rsocket engine: only in the process that started it; a child forked after that
//!   makes no rsockets (its connections stay on kernel TCP, said once on stderr). The shm
//!   provider's shared memory is mapped in the child too, but the engine's threads and its
//!   connection state are not the child's, so it never touches them.
//!
//! # Not supported
//!
//! `epoll` (an rsocket in an epoll set is never reported ready), `SIGIO`/`SIGURG` and
//! `MSG_OOB` on rsockets, datagram sockets (they stay kernel UDP), `sendfile`/`splice`,
//! descriptors numbered 65536 and above (they stay kernel sockets), a peer that does not
//! run this library (the connection stays on kernel TCP), and a single-threaded process
//! that waits on one new connection while its peer waits on another it has not used. A
//! connection's first use waits for its peer's first use (the handshake needs both), so a
//! first `write` to a peer that never reads, writes or polls that connection waits where
//! kernel TCP would have buffered it.
//!
//! # Environment
//!
//! `DP_RSPRELOAD_MIGRATE` (`first-use`, the default, or `connect`), `DP_RSPRELOAD_VERBOSE`
//! (a line on stderr per connection: on which rsocket, or kept on TCP),
//! `DP_RSPRELOAD_LIBRDMACM` (the rsocket library to open), and the engine's own
//! (`DP_RSOCKET_*`, `DP_SHM_DIR`; see `scripts/with-rsocket`).
//!
//! # Safety model
//!
//! The whole crate is an FFI island: each exported function's contract is its C
//! function's; every unsafe block says which invariant it relies on. Nothing here
//! allocates on a routed read or write.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::unnecessary_safety_comment)]

mod block;
mod io;
mod migrate;
mod poll;
mod real;
mod rs;
mod signals;
mod sock;
mod table;
mod wire;

/// The fork handler of the child: connections this process moved, and its engine, stay
/// with the parent.
extern "C" fn fork_child() {
    table::fork_child();
    rs::fork_child();
}

/// At exit (`exit`, or returning from `main`): the process's rsockets are closed, as the
/// kernel closes its sockets.
extern "C" fn at_exit() {
    sock::close_all();
}

/// Runs when the library is loaded: registers the fork and exit handlers.
extern "C" fn init() {
    // SAFETY: registers handlers that only touch this library's state.
    unsafe {
        libc::pthread_atfork(None, None, Some(fork_child));
        libc::atexit(at_exit);
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
