//! The provider trait family: the verbs objects every provider implements.
//!
//! | verbs / RDMA CM                     | here                                   |
//! |-------------------------------------|----------------------------------------|
//! | `ibv_context`                       | [`Device`]                             |
//! | `ibv_pd`                            | [`ProtectionDomain`]                   |
//! | `ibv_mr`                            | [`MemoryRegion`]                       |
//! | `ibv_mw` (type 2)                   | [`MemoryWindow`]                       |
//! | `ibv_cq` + `ibv_poll_cq`            | [`CompletionQueue`]                    |
//! | RC `ibv_qp` + `ibv_post_send/recv`  | [`RcQueuePair`]                        |
//! | UD `ibv_qp`                         | [`UdQueuePair`]                        |
//! | `ibv_ah` + remote QPN + Q_Key       | [`Provider::UdDest`]                   |
//! | `rdma_event_channel` + `rdma_cm_id` | [`CmChannel`], [`CmEvent`], [`ConnRequest`] |
//!
//! Ownership follows the rust-ibverbs safety model: every object keeps what it depends on
//! alive (a memory region keeps its protection domain and memory, a queue pair its completion
//! queues), so no object can outlive its parent. Posting is safe because providers validate
//! every key, range and right of a request against registered memory before touching it, and
//! registered memory stays mapped while its region is alive; a request that fails validation
//! completes with an error status, as it does on hardware.
//!
//! Data-path methods (`post_send`, `post_recv`, `poll`) make no system call and do not
//! allocate on either provider.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use mempool::memory::Region;

use crate::error::{PostError, Result};
use crate::types::{Access, Completion, DeviceAttr, QpCaps, QpState, RecvWr, SendWr, Sge};

/// A fabric provider: the family of object types one backend implements.
pub trait Provider: Sized + 'static {
    /// Short name, as `--provider` spells it.
    const NAME: &'static str;
    /// An opened device.
    type Device: Device<P = Self>;
    /// A protection domain.
    type Pd: ProtectionDomain<P = Self>;
    /// A registered memory region.
    type Mr: MemoryRegion;
    /// A type-2 memory window.
    type Mw: MemoryWindow;
    /// A completion queue.
    type Cq: CompletionQueue;
    /// A reliable-connected queue pair.
    type Qp: RcQueuePair;
    /// An unreliable-datagram queue pair.
    type UdQp: UdQueuePair<P = Self>;
    /// A resolved datagram destination: address handle, remote QPN and Q_Key.
    type UdDest: Send + Sync + core::fmt::Debug;
    /// A connection-manager event channel.
    type Cm: CmChannel<P = Self>;
    /// An incoming connection request, to accept or reject.
    type ConnRequest: ConnRequest;
}

/// An opened RDMA device (`ibv_context`).
pub trait Device: Send + Sync {
    /// The provider family.
    type P: Provider;

    /// Capabilities and limits.
    fn attr(&self) -> &DeviceAttr;

    /// Allocates a protection domain (`ibv_alloc_pd`).
    fn alloc_pd(&self) -> Result<<Self::P as Provider>::Pd>;

    /// Creates a completion queue holding at least `depth` completions (`ibv_create_cq`).
    fn create_cq(&self, depth: u32) -> Result<<Self::P as Provider>::Cq>;

    /// Creates a connection-manager event channel (`rdma_create_event_channel`).
    fn create_cm_channel(&self) -> Result<<Self::P as Provider>::Cm>;

    /// Creates an unreliable-datagram queue pair bound to `local` (the source address its
    /// datagrams come from).
    fn create_ud_qp(
        &self,
        init: &QpInit<'_, Self::P>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<<Self::P as Provider>::UdQp>;

    /// Resolves a datagram destination: the route from `local` to `remote`, the address
    /// handle, and the peer's queue pair number and Q_Key.
    fn resolve_ud_dest(
        &self,
        pd: &<Self::P as Provider>::Pd,
        local: IpAddr,
        remote: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<<Self::P as Provider>::UdDest>;
}

/// A protection domain (`ibv_pd`): the scope of memory keys.
pub trait ProtectionDomain: Clone + Send + Sync {
    /// The provider family.
    type P: Provider;

    /// Registers `len` bytes of `region` starting at `offset` (`ibv_reg_mr`). The memory
    /// region keeps the region alive.
    ///
    /// # Errors
    /// Fails if the range is outside the region, if remote write is asked without local
    /// write, or if the provider cannot expose the memory to peers (the `shm` provider needs
    /// a shareable region for remote access).
    fn reg_region(
        &self,
        region: &Arc<Region>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<<Self::P as Provider>::Mr>;

    /// Registers arbitrary process memory (`ibv_reg_mr` on a raw pointer).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped, readable and (with write rights) writable
    /// until the returned memory region is dropped, and the caller accepts that the local
    /// provider and, with remote rights, peers write into it at any time while it is
    /// registered: no Rust reference to the memory may be alive while that can happen.
    #[allow(unsafe_code)]
    unsafe fn reg_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<<Self::P as Provider>::Mr>;

    /// Allocates a type-2 memory window (`ibv_alloc_mw(pd, IBV_MW_TYPE_2)`), unbound: its
    /// key grants nothing until a [`SendOp::BindMw`](crate::SendOp::BindMw) on a queue
    /// pair of this domain binds it. Only this domain can bind or invalidate it (locally
    /// with [`SendOp::LocalInv`](crate::SendOp::LocalInv) on one of its queue pairs, or
    /// remotely by a peer's [`SendOp::SendInv`](crate::SendOp::SendInv) arriving on one).
    /// Dropping the window invalidates its key.
    ///
    /// # Errors
    /// Fails if the provider has no memory windows, or the domain has no room for one.
    fn alloc_mw(&self) -> Result<<Self::P as Provider>::Mw>;
}

/// A type-2 memory window (`ibv_mw`): a key of its own over a range of a memory region
/// registered with [`Access::MW_BIND`], re-bindable under a new consumer key (the low 8
/// bits of the key, [`inc_rkey`](crate::types::inc_rkey)) and invalidatable locally or
/// remotely. Dropping it invalidates its key.
pub trait MemoryWindow: Send + Sync {
    /// The key the window was allocated with: its upper 24 bits name the window, and a
    /// bind's new key must keep them. The window itself does not track later binds: the
    /// poster knows the key it bound last.
    fn rkey(&self) -> u32;
}

/// A registered memory region (`ibv_mr`). Dropping it deregisters it, which revokes its keys.
pub trait MemoryRegion: Send + Sync {
    /// First byte.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for an empty registration.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key, for scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Remote key, for peers' RDMA operations.
    fn rkey(&self) -> u32;
    /// Rights.
    fn access(&self) -> Access;

    /// A scatter/gather entry covering `len` bytes at `offset` into the region.
    ///
    /// # Panics
    /// If the range is outside the region (a programming error, checked here so it never
    /// reaches the provider).
    fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset
                .checked_add(len as usize)
                .is_some_and(|end| end <= self.len()),
            "sge {offset}+{len} outside memory region of {} bytes",
            self.len()
        );
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
}

/// A completion queue (`ibv_cq`).
pub trait CompletionQueue: Send {
    /// Writes up to `out.len()` completions into `out` and returns how many
    /// (`ibv_poll_cq`). Never blocks, never allocates, never makes a system call. Software
    /// providers also make progress on their queue pairs' pending work here.
    fn poll(&mut self, out: &mut [Completion]) -> usize;

    /// The capacity the queue was created with.
    fn depth(&self) -> u32;

    /// A cheap look for a caller that spins on this queue: `false` only if a
    /// [`poll`](Self::poll) now would certainly return nothing and make no progress (no
    /// completion, no inbound message, nothing pending for the provider to run). Loads
    /// only: no completion is consumed and nothing is written. A message published after
    /// the look is seen by the next one. The default, for providers that cannot tell
    /// cheaply, is `true`: poll.
    fn may_have_work(&self) -> bool {
        true
    }

    /// A handle to sleep until this queue may have news, usable without the queue (its
    /// owner keeps polling it under its own lock): the provider's completion channel, like
    /// `ibv_req_notify_cq` + `ibv_get_cq_event`. `None` (the default) if the provider
    /// cannot wake a sleeping poller; callers then nap.
    fn notifier(&self) -> Option<Arc<dyn CqNotify>> {
        None
    }
}

/// Sleeping until a completion queue may have news ([`CompletionQueue::notifier`]).
///
/// The protocol: [`arm`](Self::arm), then poll the queue once more (anything that arrived
/// before the arm is found there), then [`sleep`](Self::sleep) with the token if nothing
/// came, or [`disarm`](Self::disarm). A message that arrives after the arm ends the sleep
/// (or makes it return at once). Sleeps are bounded by their timeout, and spurious wakes
/// are possible: callers re-check.
pub trait CqNotify: Send + Sync {
    /// Announces a sleeper; returns the token for [`sleep`](Self::sleep).
    fn arm(&self) -> u32;
    /// Sleeps until news after the arm, or `timeout`; ends the arm.
    fn sleep(&self, token: u32, timeout: Duration);
    /// Ends an arm without sleeping.
    fn disarm(&self);
}

/// A reliable-connected queue pair, created by [`CmChannel::connect`] or
/// [`CmChannel::accept`]. Dropping it disconnects it.
pub trait RcQueuePair: Send {
    /// The queue pair number.
    fn qp_num(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// Capabilities it was created with (as granted by the device).
    fn caps(&self) -> QpCaps;
    /// The connection it belongs to, as the CM channel's events name it.
    fn conn_id(&self) -> ConnId;
    /// Posts send requests in order (`ibv_post_send`). Requests are executed in order; a
    /// SEND or WRITE with immediate that finds no receive posted at the peer waits and is
    /// retried (receiver not ready), never dropped.
    ///
    /// # Errors
    /// Refuses the first request that cannot be queued and everything after it.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError>;
    /// Posts receive requests (`ibv_post_recv`). Receives may be posted before the
    /// connection is established.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError>;
    /// Moves the queue pair to the error state (`ibv_modify_qp` to `IBV_QPS_ERR`), as a
    /// failing link or a fatal local error does: every outstanding and later request
    /// completes with [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr), receives
    /// included; nothing more moves. The connection manager is not told (no
    /// `DISCONNECTED`); the peer finds out as it would on hardware, when its own requests
    /// to this queue pair fail. Idempotent.
    fn move_to_error(&mut self);
}

/// A send work request on an unreliable-datagram queue pair.
#[derive(Debug)]
pub struct UdSendWr<'a, P: Provider> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where the datagram goes.
    pub dest: &'a P::UdDest,
    /// Payload (at most the path MTU).
    pub payload: super::types::Payload<'a>,
    /// Signalling flags.
    pub flags: super::types::SendFlags,
    /// Optional immediate.
    pub imm: Option<u32>,
}

/// An unreliable-datagram queue pair. Datagrams that find no receive posted are dropped, as
/// on hardware; every receive buffer starts with a 40-byte GRH area
/// ([`GRH_LEN`](super::types::GRH_LEN)).
pub trait UdQueuePair: Send {
    /// The provider family.
    type P: Provider;
    /// The queue pair number peers address.
    fn qp_num(&self) -> u32;
    /// The Q_Key incoming datagrams must carry.
    fn qkey(&self) -> u32;
    /// Posts datagram sends.
    fn post_send(&mut self, wrs: &[UdSendWr<'_, Self::P>]) -> core::result::Result<(), PostError>;
    /// Posts receives.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError>;
}

/// What a queue pair is created with.
#[derive(Debug)]
pub struct QpInit<'a, P: Provider> {
    /// Protection domain whose keys the queue pair may use.
    pub pd: &'a P::Pd,
    /// Where send completions go.
    pub send_cq: &'a P::Cq,
    /// Where receive completions go.
    pub recv_cq: &'a P::Cq,
    /// Requested sizes.
    pub caps: QpCaps,
}

/// Names a connection within one CM channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Names a listener within one CM channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenId(pub u64);

/// Largest private data any CM message carries here (the RDMA CM REP limit).
pub const MAX_PRIVATE_DATA: usize = 196;

/// Connection private data, held inline (no allocation).
#[derive(Clone, Copy)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; MAX_PRIVATE_DATA],
}

impl PrivateData {
    /// Empty private data.
    pub const EMPTY: Self = Self {
        len: 0,
        bytes: [0; MAX_PRIVATE_DATA],
    };

    /// Copies `data`; `None` if longer than [`MAX_PRIVATE_DATA`].
    pub fn new(data: &[u8]) -> Option<Self> {
        if data.len() > MAX_PRIVATE_DATA {
            return None;
        }
        let mut p = Self::EMPTY;
        p.bytes[..data.len()].copy_from_slice(data);
        p.len = data.len() as u8;
        Some(p)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl core::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

impl PartialEq for PrivateData {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for PrivateData {}

impl Default for PrivateData {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Why a connection attempt failed without a reject from the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnreachableReason {
    /// Nothing listens at the address (`ECONNREFUSED`).
    NoListener,
    /// The peer did not answer in time (`ETIMEDOUT`).
    Timeout,
    /// The peer answered with something that is not a valid CM message.
    Protocol,
}

/// A connection-manager event (`struct rdma_cm_event`).
pub enum CmEvent<P: Provider> {
    /// A peer asks to connect to one of our listeners; accept or reject the request.
    ConnectRequest {
        /// The listener that got it.
        listener: ListenId,
        /// The request.
        request: P::ConnRequest,
    },
    /// The connection is up; its queue pair is in [`QpState::Rts`]. On the active side the
    /// private data is the peer's accept data.
    Established {
        /// The connection.
        conn: ConnId,
        /// The peer's private data (active side), else empty.
        private_data: PrivateData,
    },
    /// The peer rejected our connect request.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// The peer's reject private data.
        private_data: PrivateData,
    },
    /// The connect request got no valid answer.
    Unreachable {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: UnreachableReason,
    },
    /// The connection is gone: the peer disconnected or died, or we disconnected. Its queue
    /// pair is in [`QpState::Error`] and flushes everything outstanding.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// The device is going away; every queue pair on it is in the error state.
    DeviceRemoval,
}

impl<P: Provider> core::fmt::Debug for CmEvent<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::ConnectRequest { listener, request } => f
                .debug_struct("ConnectRequest")
                .field("listener", listener)
                .field("request", request)
                .finish(),
            Self::Established { conn, private_data } => f
                .debug_struct("Established")
                .field("conn", conn)
                .field("private_data", private_data)
                .finish(),
            Self::Rejected { conn, private_data } => f
                .debug_struct("Rejected")
                .field("conn", conn)
                .field("private_data", private_data)
                .finish(),
            Self::Unreachable { conn, reason } => f
                .debug_struct("Unreachable")
                .field("conn", conn)
                .field("reason", reason)
                .finish(),
            Self::Disconnected { conn } => {
                f.debug_struct("Disconnected").field("conn", conn).finish()
            }
            Self::DeviceRemoval => f.write_str("DeviceRemoval"),
        }
    }
}

/// An incoming connection request.
pub trait ConnRequest: Send + core::fmt::Debug {
    /// The peer's private data.
    fn private_data(&self) -> &[u8];
    /// The peer's address.
    fn peer_addr(&self) -> SocketAddr;
    /// The listener's address.
    fn local_addr(&self) -> SocketAddr;
}

/// A hook run on a new connection's queue pair before the connection message leaves
/// (see [`CmChannel::connect_prepared`]).
pub type PrepareQp<'a, P> = dyn FnMut(&mut <P as Provider>::Qp) -> Result<()> + 'a;

/// A connection-manager event channel (`rdma_event_channel` plus its `rdma_cm_id`s).
pub trait CmChannel: Send {
    /// The provider family.
    type P: Provider;

    /// Listens on `addr` (`rdma_bind_addr` + `rdma_listen`).
    fn listen(&mut self, addr: SocketAddr, backlog: u32) -> Result<ListenId>;

    /// Stops a listener.
    fn stop_listen(&mut self, id: ListenId) -> Result<()>;

    /// The address a listener is bound to (with the actual port if 0 was asked).
    fn listen_addr(&self, id: ListenId) -> Option<SocketAddr>;

    /// Starts connecting to `dst` with a new queue pair (`rdma_resolve_addr`,
    /// `rdma_resolve_route`, `rdma_create_qp`, `rdma_connect`). Receives may be posted on
    /// the returned queue pair at once; sends once [`CmEvent::Established`] arrives.
    ///
    /// The passive side may send as soon as it has accepted, so a protocol that needs
    /// receives in place before the first message uses [`connect_prepared`](Self::connect_prepared).
    fn connect(
        &mut self,
        dst: SocketAddr,
        init: &QpInit<'_, Self::P>,
        private_data: &[u8],
    ) -> Result<(ConnId, <Self::P as Provider>::Qp)> {
        self.connect_prepared(dst, init, private_data, &mut |_| Ok(()))
    }

    /// [`connect`](Self::connect), calling `prepare` on the new queue pair before the
    /// request leaves (to post receives, as `rs_create_ep` does before `rdma_connect`). If
    /// `prepare` fails, nothing is sent and its error is returned.
    fn connect_prepared(
        &mut self,
        dst: SocketAddr,
        init: &QpInit<'_, Self::P>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Self::P>,
    ) -> Result<(ConnId, <Self::P as Provider>::Qp)>;

    /// Accepts a request with a new queue pair (`rdma_create_qp` + `rdma_accept`). As with
    /// `rdma_accept`, the queue pair is ready to send when this returns; the peer's
    /// ready-to-use later produces [`CmEvent::Established`].
    ///
    /// The active side may send as soon as the reply reaches it, so a protocol that needs
    /// receives in place first uses [`accept_prepared`](Self::accept_prepared).
    fn accept(
        &mut self,
        request: <Self::P as Provider>::ConnRequest,
        init: &QpInit<'_, Self::P>,
        private_data: &[u8],
    ) -> Result<(ConnId, <Self::P as Provider>::Qp)> {
        self.accept_prepared(request, init, private_data, &mut |_| Ok(()))
    }

    /// [`accept`](Self::accept), calling `prepare` on the new queue pair before the reply
    /// leaves (to post receives, as rsocket does before `rdma_accept`). If `prepare`
    /// fails, the request is rejected and its error returned.
    fn accept_prepared(
        &mut self,
        request: <Self::P as Provider>::ConnRequest,
        init: &QpInit<'_, Self::P>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Self::P>,
    ) -> Result<(ConnId, <Self::P as Provider>::Qp)>;

    /// Rejects a request (`rdma_reject`).
    fn reject(
        &mut self,
        request: <Self::P as Provider>::ConnRequest,
        private_data: &[u8],
    ) -> Result<()>;

    /// Disconnects (`rdma_disconnect`): the queue pair moves to the error state and both
    /// sides get [`CmEvent::Disconnected`].
    fn disconnect(&mut self, conn: ConnId) -> Result<()>;

    /// Local and peer address of a connection.
    fn conn_addrs(&self, conn: ConnId) -> Option<(SocketAddr, SocketAddr)>;

    /// The next event, if one is pending. Never blocks.
    fn poll_event(&mut self) -> Option<CmEvent<Self::P>>;

    /// Waits up to `timeout` (forever with `None`) for the next event.
    fn wait_event(&mut self, timeout: Option<Duration>) -> Option<CmEvent<Self::P>>;

    /// A descriptor that is readable while events are pending, for `poll(2)`.
    fn event_fd(&self) -> RawFd;
}
