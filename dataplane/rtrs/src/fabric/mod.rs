//! The fabric drivers: the client and server state machines on real queue pairs, over any
//! `dp-fabric` provider (`shm`, `verbs`), never naming one.
//!
//! | file | what |
//! |---|---|
//! | [`client`] | [`ClientDriver`]: [`ClientIo`](crate::clt::ClientIo) over a provider, and the loop that runs a [`ClientSession`](crate::clt::ClientSession) |
//! | [`server`] | [`ServerDriver`]: [`ServerIo`](crate::srv::ServerIo) over a provider, and the loop that runs a [`Server`](crate::srv::Server) |
//! | `qp` | one connection: completion queue, queue pair, receive buffers, and the translation of [`Wr`](crate::work::Wr) into `SendWr` |
//!
//! # Resources
//!
//! * **One completion queue per connection** (send and receive), as Linux's RTRS has; the
//!   driver polls every connection's queue in its [`poll`](ClientDriver::poll) and hands
//!   each completion to the state machine with the connection it belongs to.
//! * **One protection domain per path** on both sides. The server registers a session's
//!   chunks in each of the session's paths' domains, so a client's connections can write
//!   only its own session's chunks (the provider checks keys against the queue pair's
//!   domain); the client registers its header buffers and data regions in each path's
//!   domain, so only that path's server connections reach them. `close_path` drops the
//!   path's queue pairs, then its registrations and domain: once it returns, nothing of the
//!   path moves data and old keys are revoked.
//! * **Receives** complete in the order they were posted (flushes too), so each
//!   connection keeps its posted receives in a FIFO: an empty receive (RDMA WRITE with
//!   immediate) takes no memory, an `rkey_rsp` takes an 8-byte slot of a small ring, the
//!   info exchange a control buffer made once per connection. Payloads are copied out of
//!   registered memory before the state machine reads them (a peer may write there).
//! * **Paths are connection sets to their own server address**: the client takes the
//!   addresses queued with [`ClientDriver::add_route`] in the order its paths first
//!   connect; the server listens on one address per path ([`ServerDriver::new`]; over shm,
//!   distinct ports).
//!
//! # A client lcore
//!
//! ```no_run
//! use std::sync::Arc;
//! use dp_fabric::Provider;
//! use dp_rtrs::clt::{ClientConfig, ClientEvent, ClientSession, DataRef, Request};
//! use dp_rtrs::fabric::{ClientDriver, ClientDriverConfig};
//! use dp_rtrs::permit::{ConType, Wait};
//! use dp_rtrs::work::Dir;
//! use lcore::time::{Clock, RealClock};
//! use mempool::memory::{Region, RegionConfig};
//!
//! fn read_one<P: Provider>(dev: Arc<P::Device>, server: std::net::SocketAddr)
//!     -> Result<(), Box<dyn std::error::Error>> {
//!     let clock = RealClock::new();
//!     let mut drv = ClientDriver::<P>::new(dev, ClientDriverConfig::default())?;
//!     drv.add_route(server); // path 0
//!     let buf = Arc::new(Region::new(&RegionConfig::new("io", 1 << 20).shareable(true))?);
//!     let region = drv.add_region(Arc::clone(&buf))?;
//!     let mut sess = ClientSession::new(ClientConfig::new(b"sess", [1; 16])?)?;
//!     sess.open(clock.now(), &[[2; 16]], &mut drv)?;
//!     loop {
//!         drv.poll(clock.now(), &mut sess);
//!         match sess.poll_event() {
//!             Some(ClientEvent::Opened { .. }) => break,
//!             Some(ClientEvent::OpenFailed { error, .. }) => return Err(error.into()),
//!             _ => {}
//!         }
//!     }
//!     let permits = Arc::clone(sess.permits().expect("open"));
//!     let p = permits.get(ConType::Io, 0, Wait::NoWait).expect("a free permit");
//!     let data = Some(DataRef { region, offset: 0, len: 4096 });
//!     let req = Request { dir: Dir::Read, usr: b"block 7", data, ctx: 7 };
//!     sess.request(clock.now(), &p, req, &mut drv)?;
//!     loop {
//!         drv.poll(clock.now(), &mut sess);
//!         if let Some(ClientEvent::Completed { result, .. }) = sess.poll_event() {
//!             permits.put(p);
//!             return Ok(result?); // the 4 KiB are in `buf` now
//!         }
//!     }
//! }
//! ```
//!
//! # Modes
//!
//! The drivers run the **registered-once** mode by default: client data registered once
//! per path ([`Mapped::register`](crate::clt::Mapped) `None`), server
//! `always_invalidate = false`. A client may register per IO instead, as Linux's does
//! ([`ClientDriver::set_per_io_registration`]): a type-2 memory window per permit, bound
//! under a fresh consumer key for each READ (`Wr::Register` posts the bind) and invalidated
//! before the request completes (the server's SEND_WITH_INV, or `Wr::LocalInv`); it needs
//! a provider with memory windows (shm and verbs).
//!
//! A server with `always_invalidate` (Linux's default) gives each chunk a type-2 memory
//! window of its own over the chunk alone (the chunks' region keeps no remote right):
//! the window's key is invalidated when a request lands (`Wr::LocalInv`) and the window
//! bound again under `inc_rkey` of it for the response (`Wr::RegChunk`), whose `rkey_rsp`
//! tells the client the new key; every window's first bind runs on connection 0 before
//! the `info_rsp` leaves, so before any request. It needs windows a client reaches through
//! any connection of the path, whichever connection bound them (a client picks the
//! connection per request): [`DeviceAttr::mw_domain_wide`](dp_fabric::DeviceAttr), which
//! shm has. Verbs has not: a type-2 window is reachable only through the queue pair that
//! bound it (Soft-RoCE's are type 2B), and Linux's server uses PD-wide fast-registration
//! MRs, which user verbs lack; so over verbs such a server refuses connections with
//! `-EOPNOTSUPP` (its `map_chunks` fails): run it with `always_invalidate = false`. On shm
//! the windows take `queue_depth` key slots of the path's protection domain, which has 256
//! (the chunks' region, the handler's sources and two control buffers take one each): a
//! queue depth up to about 250 (a larger one fails the connection with `-ENOMEM`).
//!
//! `SEND_WITH_INV` is posted too
//! ([`SendOp::SendInv`](dp_fabric::types::SendOp::SendInv)): a server answers a
//! client that asked `NEED_INVAL` (Linux's client does on every read, its buffers are
//! fast-registered MRs) with it, as Linux's server does. Linux 6.1's client needs it: when a
//! read's answer comes without it, `complete_rdma_req` posts its own `LOCAL_INV` but keeps
//! the reference it took for it, and the request never completes.
//!
//! What registered-once costs in trust: while a path is up, its server may RDMA-write any
//! byte of the client's data regions (they are registered for remote write on the path),
//! not only the buffer of a READ in flight; and a client may write any chunk of its own
//! session. Per-IO registration (Linux's default) narrows the first to the buffers of the
//! READs in flight, and a server's `always_invalidate` the second to the chunks no request
//! of the client holds; both need the invalidation above. Other sessions' chunks and other
//! paths' registrations are out of reach either way (their protection domains differ).
//!
//! # Cost on the data path
//!
//! A request is one `post_send` of a chain built on the stack (at most [`MAX_CHAIN`]
//! requests); a completion is a copy of at most 8 bytes of payload. No allocation, no
//! system call, no lock beyond the provider's.

/// How [`ClientDriver::kill_path_by`] and [`ServerDriver::kill_path_by`] tear a path down
/// from below, as the issue's reliability tests do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKill {
    /// Every connection disconnected through the connection manager (both sides see
    /// `DISCONNECTED`), as a peer that closes or a link the CM notices.
    Disconnect,
    /// Every queue pair moved to the error state (`IBV_QPS_ERR`), as a fatal local error
    /// or a link that fails under the transport: outstanding requests flush with
    /// `WR_FLUSH_ERR`, no CM event; the state machine sees the flushes, closes the path
    /// (disconnecting it) and reconnects.
    QpError,
}

/// The drivers poll the control path (connection-manager events, timers) once every this
/// many turns of their loop, busy or idle, so it stays off the round trip of a request (a
/// CM channel poll costs about as much as a completion-queue poll on shm).
pub const CTRL_EVERY: u32 = 16;

pub mod client;
mod qp;
pub mod server;

pub use client::{ClientDriver, ClientDriverConfig, DriverStats};
pub use qp::MAX_CHAIN;
pub use server::ServerDriver;
#[cfg(feature = "testing")]
pub use server::Tamper;
