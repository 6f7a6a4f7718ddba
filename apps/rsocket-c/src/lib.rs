//! `librdmacm.so.1` for rsocket programs: librdmacm's rsocket API (`<rdma/rsocket.h>`) as a
//! C shared library whose calls run on the dataplane's rsockets
//! ([`dataplane::rsocket`]), over the shm provider by default or RDMA hardware (feature
//! `verbs`). Unmodified programs linked against librdmacm run on it when it is found first
//! (`scripts/with-rsocket PROGRAM ARGS...` arranges that).
//!
//! # Identity
//!
//! The file is `librdmacm.so` with the SONAME `librdmacm.so.1`, and every exported symbol
//! carries its librdmacm version node (`RDMACM_1.0` ... `RDMACM_1.3`; `build.rs`,
//! `src/export.rs`; the symbols are listed once, in `symbols.txt`), so a program's
//! `rsocket@RDMACM_1.0` binds here. Exported: every symbol of librdmacm's version script.
//! The 27 rsocket calls are ours, and so are `rdma_getaddrinfo`/`rdma_freeaddrinfo`
//! (`src/rdma.rs`: they must work with no RDMA device); everything else (`rdma_create_id`,
//! `rdma_resolve_addr`, `rdma_get_cm_event`, ...) is forwarded to the system's librdmacm
//! (`src/rdmacm_fwd.rs`, which explains why forwarding and not interposing), so programs
//! that use the RDMA CM and verbs as well as rsockets (`qperf`) load and run.
//!
//! # Layers
//!
//! * `export`: the symbol table (assembler trampolines bound to librdmacm's version nodes);
//! * `rdmacm_fwd`: the RDMA CM calls, forwarded to the system's librdmacm;
//! * `ffi`: the C entry points: pointer checks, C return conventions and `errno`;
//! * `socket`, `io`, `poll`, `opts`, `iomap`: the calls in safe Rust, as methods of
//!   `engine::Engine`, generic over the fabric provider;
//! * `engine`: the process-wide context (created on first use) and provider choice;
//! * `handles`: handle numbers, which are real descriptors this library opened.
//!
//! # Semantics
//!
//! librdmacm's, as `shared/reference/rsocket.md` describes them: -1 and `errno` on failure;
//! blocking calls unless `O_NONBLOCK` (`rfcntl`, `SOCK_NONBLOCK`) or `MSG_DONTWAIT`;
//! accepted sockets inherit the listener's `O_NONBLOCK` and options; `rshutdown` and
//! `rclose` are always blocking and graceful; sends after the peer closed fail with
//! `ECONNRESET`, never `EPIPE`/`SIGPIPE`; RDMA options (`SOL_RDMA`) only before
//! connecting. Progress is made inside calls (and, for connection setup, by the context's
//! connection-manager thread), so a peer that stops calling in stops returning credits, as
//! with librdmacm. Known librdmacm defects are fixed rather than copied; each module says
//! where it differs.
//!
//! # Threads and processes
//!
//! Every call is thread-safe. Stream sockets may be used from several threads at once;
//! a datagram socket serves one call at a time (a blocking receive holds it). `fork` after
//! creating rsockets is unsupported, as with librdmacm without `RDMAV_FORK_SAFE`: the child
//! shares the parent's context state. Nothing runs at exit: the process can always exit.
//!
//! # Safety model
//!
//! All unsafe code of the rsocket C API lives in this crate: pointer conversion in `ffi`,
//! `addr`, `rdma` and `opts`, the few system calls in `handles`, `poll` and `errno`, the
//! symbol trampolines in `export`, and the forwarders of `rdmacm_fwd`. Every unsafe block
//! states the invariant it relies on; the C caller's side of each contract is documented on
//! the entry point.
//!
//! # Non-goals
//!
//! AF_IB addressing and `RDMA_ROUTE` path records for rsockets, and librdmacm's epoll
//! emulation (`repoll_*`, node `RDMACM_1.5`, newer than Debian's librdmacm) are not
//! supported.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::unnecessary_safety_comment)]

mod addr;
mod engine;
mod errno;
mod export;
mod ffi;
mod handles;
mod io;
mod iomap;
mod opts;
mod poll;
mod rdma;
mod rdmacm_fwd;
mod socket;
