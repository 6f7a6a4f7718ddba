//! `dp-verbs`: the verbs provider, real RDMA hardware through rdma-core (libibverbs and
//! librdmacm), behind this crate's feature `verbs` (the `dataplane` crate's feature `verbs`
//! turns it on). Without the feature the crate is empty, so a workspace build needs neither
//! rdma-core's headers nor libclang.
//!
//! # Model
//!
//! Every object wraps one rdma-core object and keeps what it depends on alive through an
//! `Arc`'d inner struct, so `Drop` runs in dependency order by construction:
//!
//! | object | wraps | keeps alive |
//! |---|---|---|
//! | [`VerbsDevice`] | librdmacm's `ibv_context` for the device | the `rdma_get_devices` list |
//! | [`VerbsPd`] | `ibv_pd` | device |
//! | [`VerbsMr`] | `ibv_mr` | protection domain, and the mempool region (`reg_region`) |
//! | [`VerbsMw`] | `ibv_mw` (type 2) | protection domain |
//! | [`VerbsCq`] | `ibv_cq` | device |
//! | [`VerbsQp`] | `rdma_cm_id` + its `ibv_qp` | CM channel, both CQs, protection domain |
//! | [`VerbsUdQp`] | `ibv_qp` (UD) | both CQs, protection domain, recently used address handles |
//! | [`VerbsUdDest`] | `ibv_ah` + remote QPN + Q_Key | protection domain |
//! | [`VerbsCm`] | `rdma_event_channel` + listening ids | device; queue pairs keep the channel |
//!
//! Protection domains and completion queues are created on librdmacm's own device contexts
//! (from `rdma_get_devices`), which are the contexts its `rdma_cm_id`s point at: a PD from
//! any other `ibv_open_device` context could not be used with `rdma_create_qp`.
//!
//! # Data path
//!
//! `post_send`, `post_recv` and `poll` call the provider's `ibv_post_send`,
//! `ibv_post_recv` and `ibv_poll_cq` directly (through rdma-sys' ports of the static-inline
//! verbs). Work requests are built in per-queue-pair scratch arrays allocated at creation;
//! completions are polled into a stack array and converted into the caller's slice. No
//! allocation and no system call of ours (the completion queue's table of queue pairs is
//! behind a mutex that only queue-pair creation and destruction contend for); whether the
//! provider library makes one is the provider's business (hardware providers ring a
//! doorbell in user space, Soft-RoCE calls into the kernel to kick its send queue).
//!
//! Send-queue accounting follows the verbs rule that an unsignalled request's slot is
//! freed only by a later signalled completion: each queue pair stamps its requests with a
//! sequence number in the hardware `wr_id` (the caller's `wr_id` is kept in a per-queue-pair
//! table and restored in the completion), and the completion queue retires every request up
//! to the one a completion names. This also tells send and receive completions apart when
//! an error completion's opcode is undefined, and lets a completion left over from a
//! destroyed queue pair be recognised (by a per-queue-pair tag) and dropped instead of being
//! attributed to a new queue pair that got the same number.
//!
//! # Memory windows
//!
//! [`VerbsPd::alloc_mw`](dp_fabric::ProtectionDomain::alloc_mw) allocates a type-2 window
//! (`ibv_alloc_mw`); devices reporting `max_mw = 0` get `EOPNOTSUPP`. Each protection domain
//! keeps a table of its regions (by local key) and windows (by the upper 24 bits of their
//! key), updated under a mutex as they are created and destroyed. A
//! [`SendOp::BindMw`](dp_fabric::SendOp::BindMw) is checked against it before it is posted
//! (the device's rules, IBA C10-72 to C10-75: a window and a `MW_BIND` region of this domain,
//! a non-empty range inside the region, remote rights only, remote write only over local
//! write), refused with `BadBind` otherwise, and posted in a chain of its own with the table
//! locked: the request carries the `ibv_mw`/`ibv_mr` pointers, and the window's
//! `ibv_mw.rkey` is then set to the new key, since the next bind passes it to the device as
//! the window's current key (libibverbs' `ibv_bind_mw` does the same for type-1 windows).
//!
//! A bound type-2 window cannot be bound again before it is invalidated (o10-37.2.30): post
//! [`SendOp::LocalInv`](dp_fabric::SendOp::LocalInv) first, or have the peer's SEND with
//! invalidate do it. What the Soft-RoCE lab (Linux 6.1 `rdma_rxe`) showed:
//! - windows are type 2B: a bound window is reachable only through the queue pair that
//!   bound it;
//! - an access through a window is checked against the bounds of the region it is bound
//!   to, not the window's own range (the kernel's `check_rkey`), so on rxe a window exposes
//!   its whole region to the peer;
//! - a received SEND with invalidate reports the kernel's `IB_WC_WITH_INVALIDATE` bit
//!   (`1 << 2`, libibverbs' `IBV_WC_IP_CSUM_OK`) rather than `IBV_WC_WITH_INV`; reliable
//!   receives here take either as the invalidation flag;
//! - a responder that fails an invalidation (a key that names no bound window) moves to the
//!   error state without a NAK, and the sender's queue pair saw no error for a minute;
//! - a bound window holds the queue pair that bound it until the window is invalidated or
//!   deallocated: destroying that queue pair first blocks `ibv_destroy_qp` in the kernel
//!   (`__rxe_cleanup`) for 50 s, then warns. Deallocate (drop) the windows a queue pair may
//!   still have bound before the queue pair, as the RTRS client does when it closes a path.
//!
//! Immediate data is a host-order `u32` in this API and network order on the wire
//! (`htonl` at post, `ntohl` at poll), as librdmacm's rsocket expects.
//!
//! # Connection management
//!
//! [`VerbsCm`] is one `rdma_event_channel` (non-blocking; its descriptor is
//! [`CmChannel::event_fd`](dp_fabric::CmChannel::event_fd)). [`CmChannel::connect`](dp_fabric::CmChannel::connect)
//! resolves address and route *synchronously* on a private channel, with a bounded timeout
//! per attempt and a few retries ([`VerbsConfig::resolve_timeout`],
//! [`VerbsConfig::resolve_attempts`]), then moves the id to the channel
//! (`rdma_migrate_id`), creates the queue pair (`rdma_create_qp`) and sends the request
//! (`rdma_connect`). Resolution failures are returned by `connect` itself; everything after
//! the request is on the wire (established, rejected, no listener, timeout, disconnect,
//! device removal) arrives as a [`CmEvent`](dp_fabric::CmEvent). Requests ask for infinite RNR
//! retries (`rnr_retry_count = 7`), so a SEND that finds no receive waits, never fails; once
//! a connection is established its RNR NAK timer is cut from the CM's 655 ms to 0.64 ms, so
//! the wait ends soon after the receiver posts. A local `disconnect` is reported to the
//! caller at once; the peer sees it when the DREQ arrives.
//!
//! IB and RoCE carry connection private data in fixed-size CM messages: the receiver sees
//! 56 bytes for a REQ, 196 for a REP and 148 for a REJ whatever the sender gave, zero
//! padded. The default [`PrivateDataFormat::Raw`] sends the bytes as they are, which is
//! what every RDMA CM application (librdmacm's rsockets, rping) sends and expects; protocols
//! read their fixed-size structures from the front of the field. [`PrivateDataFormat::Framed`]
//! puts a two-byte header (magic, length) in front so both ends of a connection between two
//! instances of this provider see exact lengths, at two bytes of each limit (see
//! [`DeviceAttr`](dp_fabric::DeviceAttr)).
//!
//! # Without a device
//!
//! Every entry point ([`devices`], [`VerbsDevice::open`]) fails with
//! [`FabricError::NoDevice`](dp_fabric::FabricError::NoDevice), whose message says how to create
//! a Soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`).

// Without the feature the crate is empty but keeps this documentation, whose links name
// the feature's items: they are checked by `cargo doc -p dp-verbs --features verbs`.
#![cfg_attr(not(feature = "verbs"), allow(rustdoc::broken_intra_doc_links))]
#![cfg(feature = "verbs")]
#![allow(unsafe_code)]

mod chan;
mod cm;
mod conv;
mod cq;
mod dev;
mod device;
mod pd;
mod pdata;
mod post;
mod qp;
mod resolve;
mod sys;
mod track;
mod ud;

use std::time::Duration;

pub use cm::{VerbsCm, VerbsConnRequest};
pub use cq::VerbsCq;
pub use device::{VerbsDevice, devices};
pub use pd::{VerbsMr, VerbsMw, VerbsPd};
pub use qp::VerbsQp;
pub use ud::{VerbsUdDest, VerbsUdQp};

use dp_fabric::traits::Provider;

/// Scatter/gather entries per request this provider accepts (the device may allow more).
pub(crate) const MAX_SGE: u32 = 16;

/// The verbs provider family.
#[derive(Debug, Clone, Copy)]
pub enum Verbs {}

impl Provider for Verbs {
    const NAME: &'static str = "verbs";
    type Device = VerbsDevice;
    type Pd = VerbsPd;
    type Mr = VerbsMr;
    type Mw = VerbsMw;
    type Cq = VerbsCq;
    type Qp = VerbsQp;
    type UdQp = VerbsUdQp;
    type UdDest = VerbsUdDest;
    type Cm = VerbsCm;
    type ConnRequest = VerbsConnRequest;
}

/// How connection private data is put on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrivateDataFormat {
    /// A two-byte header (magic `0xD9`, length) before the data, so the receiver gets the
    /// exact bytes the sender gave. Both sides must be this provider in this mode; data
    /// from a peer that does not frame is delivered as received.
    Framed,
    /// The bytes as given, as every RDMA CM application sends them; the receiver sees them
    /// padded with zeros to the CM message's fixed size (REQ 56, REP 196, REJ 148 bytes on
    /// IB and RoCE). The default: it is what librdmacm peers (rsockets, rping) speak.
    #[default]
    Raw,
}

/// Options of a verbs device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Connection private data encoding.
    pub private_data: PrivateDataFormat,
    /// Bound on each address or route resolution attempt.
    pub resolve_timeout: Duration,
    /// Resolution attempts before `connect` or `resolve_ud_dest` gives up (at least 1).
    pub resolve_attempts: u32,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            private_data: PrivateDataFormat::Raw,
            resolve_timeout: Duration::from_secs(2),
            resolve_attempts: 3,
        }
    }
}
