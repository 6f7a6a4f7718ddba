//! `dp-shm`: software RDMA between processes (or threads) on one host, through shared memory.
//!
//! # Model
//!
//! Every object a peer must touch lives in a memfd segment that is passed over a Unix
//! socket (`SCM_RIGHTS`) when a connection is set up, and mapped by the peer once:
//!
//! | object | segment | written by |
//! |---|---|---|
//! | protection domain | key table | owner (peers read keys) |
//! | completion queue | doorbell bitmap | peers set bits, owner clears |
//! | RC queue pair | state, credits, inbound slots, bounce buffer | owner and its one peer, disjoint fields |
//! | UD queue pair | datagram slot queue | any sender, owner consumes |
//! | memory region with remote rights | the mempool region itself | peers, by RDMA WRITE |
//!
//! Regions registered without remote rights are never sent to peers. Send work is done by
//! the initiator at `post_send` (or, if it must wait for the peer, at the next `poll` of
//! its send completion queue); receive work is done by the receiver's `poll`. The data path
//! is memcpy plus a handful of atomics: no system call, no allocation, no lock other than a
//! per-queue-pair spin lock that is only contended when a queue pair is posted to from one
//! thread and its completion queue polled from another.
//!
//! # Semantics
//!
//! Reliable-connected queue pairs are in order; a WRITE stores its last byte once, after all
//! the others, so responders may poll it as they do on RDMA hardware (module `place`); a
//! WRITE with immediate places its data before its completion can be polled (one of at most
//! 80 bytes posted with [`SendFlags::PLACE_ON_POLL`](dp_fabric::SendFlags::PLACE_ON_POLL)
//! travels in the inbound slot and is placed by that poll, module `qpseg`); a SEND or
//! WRITE with immediate that finds no receive posted waits (receiver not ready, retried
//! forever like `rnr_retry = 7`), it is never dropped; remote key, bounds and rights
//! violations complete with `REM_ACCESS_ERR` and move both queue pairs to the error state;
//! a queue pair in error flushes everything outstanding with `WR_FLUSH_ERR`. Connection
//! management follows the RDMA CM (see [`cm`]). A peer process that dies is seen as a
//! hang-up of its connection sockets by the device's service thread (module `service`),
//! which errors the queue pairs and queues `Disconnected` events.
//!
//! # Limits
//!
//! SENDs are limited to the bounce buffer size ([`ShmConfig::bounce_bytes`], reported as
//! `max_send_size`); WRITE and READ to 2 GiB; UD payloads to 4096 bytes; 4 scatter/gather
//! entries; 1024 inline bytes; 4095 queue pairs per device and 4095 devices per rendezvous
//! directory; private data 196 bytes (REQ and REP) and 148 (REJ).

//!
//! # Modules, bottom up
//!
//! Each module uses only modules listed before it (`scripts/check-imports.py` checks it):
//! `util`, `layout` (shared-memory layouts), `qpseg` (the queue-pair segment and its
//! inbound slots), `msg` (control messages), `place`, `unix`,
//! `seg` (segments), `share` (remotely accessible memory in memfds of its own), `remote`
//! (a peer's key table), `service` (the control thread), `core` (per-device state), `link`
//! (a connection's control socket), `pd`, `cq_shared`, `rc` and `dgram` (the RC and UD
//! engines), `cq` (the poller), `qp` and `ud` (the application's handles), `conn`
//! (connections and their service-thread handlers), [`cm`], `device`.

#![allow(unsafe_code)]

pub mod cm;
mod conn;
mod core;
mod cq;
mod cq_shared;
mod device;
mod dgram;
#[cfg(test)]
mod doorbell_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod inline_tests;
mod layout;
mod link;
mod msg;
#[cfg(test)]
mod mw_tests;
mod pd;
mod place;
mod qp;
mod qpseg;
mod rc;
mod remote;
mod seg;
mod service;
mod share;
mod ud;
mod unix;
mod util;
// Fuzz-target entry points (`--cfg fuzzing` only); uses `layout` and `msg`.
#[cfg(fuzzing)]
pub mod fuzzing;

use std::path::PathBuf;

pub use crate::core::ShmStats;
pub use cm::ShmCm;
pub use conn::ShmConnRequest;
pub use cq::ShmCq;
pub use device::{ShmDevice, default_rendezvous_dir};
pub use pd::{ShmMr, ShmMw, ShmPd};
pub use qp::ShmQp;
pub use ud::{ShmUdDest, ShmUdQp};

use dp_fabric::traits::Provider;

/// Scatter/gather entries per request.
pub(crate) const MAX_SGE: usize = 4;
/// Largest inline payload.
pub(crate) const MAX_INLINE: usize = 1024;

/// The shm provider family.
#[derive(Debug, Clone, Copy)]
pub enum Shm {}

impl Provider for Shm {
    const NAME: &'static str = "shm";
    type Device = ShmDevice;
    type Pd = ShmPd;
    type Mr = ShmMr;
    type Mw = ShmMw;
    type Cq = ShmCq;
    type Qp = ShmQp;
    type UdQp = ShmUdQp;
    type UdDest = ShmUdDest;
    type Cm = ShmCm;
    type ConnRequest = ShmConnRequest;
}

/// Configuration of an shm device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Device name reported in [`DeviceAttr::name`](dp_fabric::DeviceAttr::name).
    pub name: String,
    /// Rendezvous directory; `None` uses [`default_rendezvous_dir`].
    pub dir: Option<PathBuf>,
    /// Bytes of bounce buffer per queue pair and direction: the largest SEND. Pages are
    /// touched only when SENDs use them.
    pub bounce_bytes: u32,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            name: "shm".into(),
            dir: None,
            bounce_bytes: 256 << 10,
        }
    }
}
