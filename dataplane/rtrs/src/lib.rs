//! `dp-rtrs`: RTRS, the multipath RDMA transport for block IO, wire-compatible with Linux
//! RTRS protocol 2.0 (`drivers/infiniband/ulp/rtrs`), as sans-IO state machines.
//!
//! A client session spans several paths to one server; each path is a set of reliable
//! connections (cid 0 for service messages, 1.. for IO). The server keeps `queue_depth`
//! chunks per session; a client permit *is* a chunk. A request is RDMA-written into its
//! chunk (data, user message, RTRS header) with an immediate naming chunk and offset; the
//! response is an RDMA WRITE (or SEND) with an immediate naming the chunk and an errno. The
//! session survives the loss of any path while one is left: requests in flight on a failed
//! path are posted again on another, same permit, same chunk.
//!
//! # Layers
//!
//! | module | what |
//! |---|---|
//! | [`wire`] | every wire format: views + `Repr`s, open enums, the 28-bit [`wire::Geometry`] |
//! | [`permit`] | the lock-free permit bitmap (NOWAIT / WAIT), shared by every lcore of a session |
//! | [`timer`] | timer tables, the heartbeat, deterministic jitter; time is an argument |
//! | [`work`] | the vocabulary with the driver: paths, connections, work requests, completions, CM events |
//! | [`clt`] | the client: [`clt::ClientSession`] with its paths, policies, failover and reconnect |
//! | [`srv`] | the server: [`srv::Server`] with its sessions, paths and responses |
//! | [`stats`] | counters in the shape of Linux's sysfs files |
//! | [`error`] | `Copy` errors: peer violations, per-IO errors, control errors, each with its errno |
//! | [`fabric`] | the drivers that run both sides on a `dp-fabric` provider: [`fabric::ClientDriver`], [`fabric::ServerDriver`] |
//! | `sim` (feature `testing`) | a deterministic simulator: both sides over simulated paths in virtual time |
//!
//! The state machines do no I/O, read no clock, spawn no thread and allocate nothing on the
//! data path (the request and response paths use tables sized when a path connects); no
//! unsafe code anywhere in the crate. They use `dp-fabric` only for vocabulary
//! ([`dp_fabric::WcStatus`], [`dp_fabric::Sge`], [`dp_fabric::RemoteAddr`],
//! [`dp_fabric::PostError`]) and `lcore` for [`timer::Instant`]. The drivers in [`fabric`]
//! bind them to real queue pairs through `dp-fabric`'s traits, generic over the provider:
//! the crate depends on no provider and builds and tests with none (tests over `shm` live in
//! the facade crate, `dataplane/tests/rtrs_shm.rs`).
//!
//! # How a fabric driver runs a state machine
//!
//! The state machines call their driver trait ([`clt::ClientIo`], [`srv::ServerIo`]) for
//! every side effect, and take everything that happens as `handle_*` calls. A driver on an
//! lcore runs this loop (the simulator in `sim` is such a driver; so are
//! [`fabric::ClientDriver::poll`] and [`fabric::ServerDriver::poll`], which do steps 1 to 3
//! and leave 4 and 5 to their caller):
//!
//! 1. **Connection manager.** For each event of a connection the state machine created
//!    (`ClientIo::connect` / `ServerIo::accept` gave it a [`work::Conn`]), call
//!    `handle_cm(now, conn, event)`; a server calls `handle_connect_request(now, token,
//!    addr, private_data)` for each incoming request and answers it as told
//!    (`accept`/`reject`).
//! 2. **Completions.** Poll each connection's completion queue; for each completion call
//!    `handle_completion(now, conn, &wc, payload)`, where `payload` is the bytes a receive
//!    caught (empty for sends) and `wc.invalidated` the rkey a received SEND_WITH_INV
//!    invalidated.
//! 3. **Timers.** When `poll_timeout()` is due, call `handle_timeout(now)` (early or repeated
//!    calls do nothing).
//! 4. **Events.** Drain `poll_event()`: client completions ([`clt::ClientEvent::Completed`],
//!    exactly once per accepted request; the permit may be put back then), server requests
//!    ([`srv::ServerEvent::Request`], answered later with `resp_rdma`), path and link
//!    events.
//! 5. **Application.** Submit (`ClientSession::request` with a permit from
//!    `permits()`) and answer (`Server::resp_rdma`) between the steps above: the state
//!    machines are never re-entered from inside a driver call. A handler whose data
//!    already sits in registered memory (a RAM disk) answers a READ with
//!    `Server::resp_rdma_from` instead: the data is written to the client from that
//!    *source* ([`work::SrcRef`]; the driver registers it for local access only on every
//!    path, `ServerDriver::add_source`), not copied into the chunk first. The wire sees the
//!    same RDMA WRITE; Linux has no such call (its handler fills the chunk's pages).
//!
//! Every posted chain goes to `post_send(conn, chain)` as one `ibv_post_send`; receives to
//! `post_recv(conn, wr_id, buf)`. Work-request ids carry the connection's epoch: completions
//! and CM events of an older epoch (a connection closed before a reconnect) are ignored, so
//! the driver may deliver them late. `close_path(path)` must disconnect, move to the error
//! state and drain every connection of the path, and destroy them with the path's
//! registrations, before it returns: the client fails the path's requests over right after.
//!
//! # What the fabric must offer
//!
//! * RC queue pairs with RDMA WRITE, RDMA WRITE WITH IMMEDIATE (including zero-length, no
//!   SGE, remote address and key 0), SEND, SEND WITH IMMEDIATE, and completions that report
//!   the immediate (host order) and the byte count; connect/accept/reject carrying 56 bytes
//!   of private data each way (the shm and verbs providers have all of these).
//! * **Invalidation**, for Linux peers and for per-IO registration:
//!   - a server with `always_invalidate` (Linux's default) posts `LOCAL_INV` of a chunk's
//!     key when a request lands and re-registers the chunk under `ib_inc_rkey(key)` for the
//!     response ([`work::Wr::LocalInv`], [`work::Wr::RegChunk`]): the fabric needs a
//!     registration whose key can be invalidated and re-bound with a chosen 8-bit consumer
//!     key (kernel verbs: fast-registration MRs; user verbs: type-2 memory windows bound
//!     with `ibv_inc_rkey`; shm: a key-table entry whose generation the owner bumps);
//!   - a client that registers each request's buffer per IO (as Linux does) asks the server
//!     to `SEND_WITH_INV` its key (`NEED_INVAL`), and posts `LOCAL_INV` itself if the server
//!     did not: the fabric needs [`work::Wr::SendInv`], [`work::Wr::LocalInv`],
//!     [`work::Wr::Register`] (REG_MR or a window bind), and a receive completion that says
//!     which key a SEND_WITH_INV invalidated ([`work::Wc::invalidated`], `IB_WC_WITH_INV`).
//!
//!   `dp-fabric` has them as type-2 memory windows ([`dp_fabric::SendOp::BindMw`],
//!   [`dp_fabric::SendOp::LocalInv`], [`dp_fabric::SendOp::SendInv`],
//!   `Completion::invalidated`); both providers implement them (verbs: type 2, which must
//!   be invalidated before a rebind; on Soft-RoCE type 2B, and a window access is checked
//!   only against its region's bounds: see `dp-verbs`). The client driver in [`fabric`] registers per IO with them
//!   when asked (a window per permit); the server driver does `always_invalidate` with
//!   them (a window per chunk) on providers whose windows every queue pair of the domain
//!   reaches (`DeviceAttr::mw_domain_wide`: shm; not verbs, where a window is reachable
//!   only through the queue pair that bound it, and a client spreads a chunk's requests
//!   over its connections: see [`fabric`]). A client and server that both keep their
//!   memory registered once (client: [`clt::Mapped::register`] `None`; server:
//!   `always_invalidate = false`) need none of it, and spend two work requests less per IO.
//! * Registered memory the driver owns: the server's chunks (`queue_depth * chunk_size`
//!   per session, registered for remote write on every path's device, or with
//!   `always_invalidate` for window binding, a key per chunk,
//!   [`srv::ServerIo::map_chunks`]); the client's per-permit header buffers (`max_hdr_size`
//!   each, local access, registered on every path's device); the client's data buffers,
//!   named by [`clt::DataRef`] and resolved per path ([`clt::ClientIo::map_data`]).
//! * Queue sizes as [`work::QpSizes`] says (Linux's); the state machines never post more
//!   than a queue holds (they count, and signal at least every `min(queue_depth, 512)`
//!   requests).
//!
//! # Deviations from Linux, and why
//!
//! * **Peers are untrusted.** Linux trusts its peer in places: it `WARN`s and goes on at an
//!   out-of-range chunk in a response, reads the RTRS header past a chunk's end for an
//!   offset just below `max_chunk_size`, lets a second request into a busy chunk overwrite
//!   the first's state, sums chunk-table lengths in 32 bits. Here every such value is a
//!   counted [`error::Violation`] that resets the path (client) or closes it (server).
//! * **A `W_INV` response must follow the SEND_WITH_INV of the request's key** on the same
//!   connection; otherwise it is a violation (Linux believes the flag, so a lying server
//!   would keep write access to a completed buffer).
//! * **Flushes on a live connection are errors.** Linux ignores every `WR_FLUSH_ERR`, so a
//!   queue pair that went to the error state without a non-flush completion is noticed only
//!   by the heartbeat (30–35 s); here a flush on a connection we did not close fails the
//!   path at once. Flushes of connections we closed (old epoch, or not live) are ignored.
//! * **Stale server incarnations.** A Linux server rejects a reconnecting path ("Session
//!   in wrong state") until its own heartbeat closes the old incarnation (~30 s, rtrs.md
//!   10.9). A connect request with the same path UUID and a different `recon_cnt` proves the
//!   client gave the old one up: it is closed at once and the request rejected with
//!   `-EBUSY`; the client's next attempt gets through. This is what `recon_cnt` was meant
//!   for; the field is on the wire either way.
//! * **Server establishment timeout.** A CONNECTING server path that makes no progress for
//!   30 s ([`srv::ESTABLISH_TIMEOUT`]) is closed; Linux has no limit, so a client that
//!   connects once and vanishes pins a session's chunks.
//! * **Failover of answered requests.** A request already answered and waiting only for its
//!   client-side `LOCAL_INV` when its path fails completes with its answer (the key dies
//!   with the path's registrations); Linux posts it again.
//! * **Session close** completes in-flight requests with `ECONNABORTED` instead of failing
//!   them over to paths that are about to close too.
//! * **Asynchronous control.** `rtrs_clt_open`, sysfs `reconnect` and `add_path` block in
//!   Linux; here they start the work and the outcome is an event. The connections of a path
//!   are still set up one by one, each within 30 s, and the open fails if any initial path
//!   fails, as in Linux.
//! * `stats.inflight` counts every request (Linux counts only those sent under
//!   min-inflight); the reconnect jitter is 0–7 ms as Linux's code does (its comment says
//!   seconds); the chunk-table check uses the queue depth's bits (Linux checks `sg_cnt`'s,
//!   which equals the queue depth with `always_invalidate`).
//!
//! # For the next phase
//!
//! A session here is driven from one lcore (`&mut self`); only [`permit::Permits`] is shared
//! (lock-free, `loom`-checked), so other lcores may take and return permits and hand their
//! requests over through an inter-lcore ring. To bind each path to its own lcore, the
//! policy reads paths only through [`clt::policy::PathLoad`], which a shared view (atomics
//! per path: state, in-flight, latency) can implement; requests are kept per path, indexed
//! by permit, as in Linux, so a path's lcore owns its table and a failover moves one small
//! record. Heartbeats, reconnect and failover need nothing from the driver but timers.
//!
//! Invalidation on shm (for `always_invalidate` and per-IO registration): a dp-shm key is
//! `generation << 20 | index << 8 | consumer`, so `ib_inc_rkey` rotates the consumer key as
//! on hardware, and a memory window is a key-table entry of its own that a bind rewrites and
//! an invalidation (local, or a peer's `SEND_WITH_INV` checked by the owner) revokes.
#![deny(unsafe_code)]

pub mod clt;
pub mod error;
pub mod fabric;
pub mod permit;
#[cfg(feature = "testing")]
pub mod sim;
pub mod srv;
pub mod stats;
mod sync;
pub mod timer;
pub mod wire;
pub mod work;
