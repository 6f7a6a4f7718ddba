//! Plain data types of the verbs model: access rights, scatter/gather entries, work requests,
//! completions, queue-pair capabilities and states.
//!
//! These types are shared by every provider. Their meaning follows libibverbs exactly, so
//! that code written against them behaves the same on the software (`shm`) provider and on
//! real RDMA hardware (`verbs`). Where the two could differ, the doc comment says which
//! semantics both providers implement.

use core::fmt;

/// Memory-region access rights (`IBV_ACCESS_*`).
///
/// Local read access is always granted. `REMOTE_WRITE` requires `LOCAL_WRITE`, as verbs demands.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Self = Self(0);
    /// The local side may write into the region (receive buffers, READ destinations).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// Peers may RDMA READ from the region.
    pub const REMOTE_READ: Self = Self(1 << 2);
    /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`), which lets peers
    /// reach the windows' ranges through the windows' keys (never through the region's own
    /// key, which keeps only the region's own rights). A window granting remote write
    /// needs a region with [`LOCAL_WRITE`](Self::LOCAL_WRITE).
    pub const MW_BIND: Self = Self(1 << 3);
    /// Every data-access right (local write, remote write, remote read); `MW_BIND` is
    /// asked for on its own.
    pub const ALL: Self = Self(0b111);
    /// Every bit this model knows.
    const KNOWN: u32 = 0b1111;

    /// Raw bits, as stored in shared key tables.
    #[inline]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Rights from raw bits; unknown bits are dropped.
    #[inline]
    pub const fn from_bits_truncate(bits: u32) -> Self {
        Self(bits & Self::KNOWN)
    }

    /// True if every right in `other` is also in `self`.
    #[inline]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if peers may access the region at all.
    #[inline]
    pub const fn is_remote(self) -> bool {
        self.0 & (Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0) != 0
    }
}

impl core::ops::BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if self.contains(Self::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Self::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if self.contains(Self::REMOTE_READ) {
            parts.push("REMOTE_READ");
        }
        if self.contains(Self::MW_BIND) {
            parts.push("MW_BIND");
        }
        if parts.is_empty() {
            parts.push("LOCAL_READ");
        }
        write!(f, "Access({})", parts.join("|"))
    }
}

/// One scatter/gather entry (`struct ibv_sge`): a local virtual address range inside a
/// registered memory region named by its local key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region that contains the range.
    pub lkey: u32,
}

/// A peer's memory: remote virtual address and remote key (`wr.rdma`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Virtual address in the peer's address space, as the peer advertised it.
    pub addr: u64,
    /// Remote key of the peer's memory region.
    pub rkey: u32,
}

/// The operation of a send work request on a reliable-connected queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided SEND: consumes one receive at the peer, whose buffer gets the data.
    Send,
    /// SEND with a 32-bit immediate delivered in the peer's receive completion.
    SendImm(u32),
    /// One-sided RDMA WRITE into `remote`; the peer sees no completion.
    Write(RemoteAddr),
    /// RDMA WRITE with immediate: the data is placed at `remote` (may be zero bytes), then one
    /// receive is consumed at the peer and completes with `imm`. The data is visible to the
    /// peer before it can poll that completion.
    WriteImm(RemoteAddr, u32),
    /// One-sided RDMA READ from `remote` into the local scatter list.
    Read(RemoteAddr),
    /// SEND that also invalidates the peer's key `rkey` (`IBV_WR_SEND_WITH_INV`): one
    /// receive is consumed at the peer, which finds the key invalid once that receive
    /// completes, and that receive's completion names the key
    /// ([`Completion::invalidated`]). The key must be one the peer can have invalidated
    /// remotely: on verbs a fast-registered MR or a bound type-2 memory window; on shm a
    /// bound memory window ([`SendOp::BindMw`]). The peer validates the key (a window of
    /// the protection domain of the queue pair the SEND arrives on, currently bound under
    /// exactly this key); any other key fails the peer's receive with
    /// [`WcStatus::RemInvReqErr`] and the connection goes to the error state, leaving
    /// every other key alone. RTRS servers answer a client's `NEED_INVAL` read with it.
    /// Providers without remote invalidation refuse it at post time with
    /// [`PostErrorKind::Unsupported`](crate::PostErrorKind::Unsupported).
    SendInv(u32),
    /// Binds a type-2 memory window (`IBV_WR_BIND_MW`): from when this request executes
    /// (in order with the queue pair's other sends, signalled or not), `rkey` grants
    /// `access` on `[addr, addr + len)` of the memory region named by `lkey`, and nothing
    /// else. No data moves and the peer sees nothing.
    ///
    /// * `rkey`: the window's new key. Its upper 24 bits must be the window's
    ///   ([`MemoryWindow::rkey`](crate::MemoryWindow::rkey)); the low 8 bits (the consumer
    ///   key) are the poster's choice, normally [`inc_rkey`] of the previous key. The
    ///   window must belong to the queue pair's protection domain.
    /// * `lkey`: a memory region of the same protection domain registered with
    ///   [`Access::MW_BIND`]; the range must lie inside it.
    /// * `access`: remote rights only ([`Access::REMOTE_READ`], [`Access::REMOTE_WRITE`]);
    ///   remote write needs a region with [`Access::LOCAL_WRITE`].
    ///
    /// Binding a bound window again makes its previous key invalid at once (the shm
    /// provider allows it; verbs hardware requires a type-2 window to be invalidated
    /// first, IBA o10-36.2.2, so portable code posts [`SendOp::LocalInv`] before
    /// rebinding). Invalidation (local or remote) makes the key invalid; deallocating the
    /// window or deregistering the region does too. A key that is no longer valid fails a
    /// peer's access with a remote access error, as any bad key does. Requests that break
    /// these rules are refused at post time
    /// ([`PostErrorKind::BadBind`](crate::PostErrorKind::BadBind)) where the provider can
    /// tell; a bind whose window or region went away before it executed completes with
    /// [`WcStatus::MwBindErr`]. The payload must be empty. Providers without memory
    /// windows refuse it with [`PostErrorKind::Unsupported`](crate::PostErrorKind::Unsupported).
    BindMw {
        /// The window's new key: its upper 24 bits, the consumer key in the low 8.
        rkey: u32,
        /// Local key of the memory region the window is bound to.
        lkey: u32,
        /// Remote rights the window grants.
        access: Access,
        /// First byte of the range, in the region's (local virtual) addresses.
        addr: u64,
        /// Length of the range in bytes.
        len: u64,
    },
    /// Invalidates the local key `rkey` (`IBV_WR_LOCAL_INV`): once this request executes
    /// (in order with the queue pair's other sends, signalled or not), peers' accesses
    /// through it fail. `rkey` must be the current key of a bound memory window of the
    /// queue pair's protection domain (on verbs also a fast-registered MR); otherwise the
    /// request completes with [`WcStatus::LocQpOpErr`] and the queue pair goes to the
    /// error state. The payload must be empty. Providers without it refuse it with
    /// [`PostErrorKind::Unsupported`](crate::PostErrorKind::Unsupported).
    LocalInv(u32),
}

// A SendOp is copied into every pending request: keep it within four words.
const _: () = assert!(size_of::<SendOp>() <= 32);

/// The next key of a memory window (`ibv_inc_rkey`): the same upper 24 bits (which name
/// the window), the low 8 bits (the consumer key) plus one, wrapping.
#[inline]
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

impl SendOp {
    /// The completion opcode a successful request of this kind reports.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::Send | Self::SendImm(_) | Self::SendInv(_) => WcOpcode::Send,
            Self::Write(_) | Self::WriteImm(..) => WcOpcode::RdmaWrite,
            Self::Read(_) => WcOpcode::RdmaRead,
            Self::BindMw { .. } => WcOpcode::BindMw,
            Self::LocalInv(_) => WcOpcode::LocalInv,
        }
    }

    /// True if the request consumes a receive at the peer.
    pub const fn consumes_recv(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendImm(_) | Self::SendInv(_) | Self::WriteImm(..)
        )
    }
}

/// Flags of a send work request (`IBV_SEND_*`). Inline sends are expressed by
/// [`Payload::Inline`] rather than a flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No flags: an unsignalled request.
    pub const NONE: Self = Self(0);
    /// Generate a completion when the request finishes (`IBV_SEND_SIGNALED`).
    pub const SIGNALED: Self = Self(1);
    /// Wait for earlier RDMA READs to finish before starting (`IBV_SEND_FENCE`).
    pub const FENCE: Self = Self(1 << 2);
    /// Ask the peer to raise a solicited event (`IBV_SEND_SOLICITED`).
    pub const SOLICITED: Self = Self(1 << 3);
    /// A WRITE with immediate whose responder reads the destination only after polling
    /// the request's completion (a message protocol such as rsockets'): the provider may
    /// carry a small payload in the completion itself and place it when the responder
    /// polls, as NICs scatter small payloads into the completion entry. The data is still
    /// in place before the completion is returned. A later WRITE or READ of the same bytes
    /// by the requester is not ordered after such a placement, so use it only for
    /// destinations nothing else touches until then. Providers that place data on arrival
    /// (verbs) ignore it; ignored on other operations.
    pub const PLACE_ON_POLL: Self = Self(1 << 4);

    /// True if every flag in `other` is set.
    #[inline]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Raw bits.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Where a send request's data comes from (or, for READ, goes to).
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Registered local memory named by scatter/gather entries. The memory must stay valid
    /// until the request's completion (or a later signalled completion on the same queue
    /// pair) has been polled.
    Sgl(&'a [Sge]),
    /// Bytes copied at post time (`IBV_SEND_INLINE`): no registration needed, the buffer
    /// is free again when `post_send` returns. At most the queue pair's `max_inline_data`.
    /// Not valid for READ.
    Inline(&'a [u8]),
}

impl Payload<'_> {
    /// Total length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Sgl(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            Self::Inline(b) => b.len() as u64,
        }
    }

    /// True if there is no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request (`struct ibv_send_wr`) for a reliable-connected queue pair.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The data: gathered for SEND/WRITE, scattered into for READ.
    pub payload: Payload<'a>,
    /// Signalling flags.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A signalled request over registered memory.
    pub const fn signaled(wr_id: u64, op: SendOp, sgl: &'a [Sge]) -> Self {
        Self {
            wr_id,
            op,
            payload: Payload::Sgl(sgl),
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signalled inline request.
    pub const fn inline(wr_id: u64, op: SendOp, data: &'a [u8]) -> Self {
        Self {
            wr_id,
            op,
            payload: Payload::Inline(data),
            flags: SendFlags::SIGNALED,
        }
    }

    /// Total payload length.
    pub fn len(&self) -> u64 {
        self.payload.len()
    }

    /// True if the request carries no payload.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND payloads land; may be empty for receives that only catch
    /// immediates (as rsocket posts them).
    pub sgl: &'a [Sge],
}

/// Completion status (`enum ibv_wc_status`), with the numeric values libibverbs uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// The request completed.
    #[default]
    Success,
    /// A receive buffer was too small for the incoming message, or a request was too long.
    LocLenErr,
    /// An internal consistency error of the local queue pair.
    LocQpOpErr,
    /// A local scatter/gather entry named an invalid key, range or access right.
    LocProtErr,
    /// The queue pair was in the error state; the request was flushed without executing.
    WrFlushErr,
    /// A memory-window bind could not be done: its window or memory region went away
    /// before it executed, or they broke the binding rules.
    MwBindErr,
    /// The peer rejected the request as invalid (e.g. a SEND larger than the peer allows).
    RemInvReqErr,
    /// The peer's memory key, range or rights did not allow the access.
    RemAccessErr,
    /// The peer failed to execute the request.
    RemOpErr,
    /// The transport gave up: the peer stopped responding (dead or disconnected).
    RetryExcErr,
    /// The peer had no receive posted for longer than the retry budget allowed.
    RnrRetryExcErr,
    /// Any other failure.
    GeneralErr,
    /// A status value this model does not name (raw libibverbs value).
    Other(u32),
}

impl WcStatus {
    /// The libibverbs numeric value (`IBV_WC_*`).
    pub const fn to_raw(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocLenErr => 1,
            Self::LocQpOpErr => 2,
            Self::LocProtErr => 4,
            Self::WrFlushErr => 5,
            Self::MwBindErr => 6,
            Self::RemInvReqErr => 9,
            Self::RemAccessErr => 10,
            Self::RemOpErr => 11,
            Self::RetryExcErr => 12,
            Self::RnrRetryExcErr => 13,
            Self::GeneralErr => 21,
            Self::Other(v) => v,
        }
    }

    /// From the libibverbs numeric value.
    pub const fn from_raw(v: u32) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::LocLenErr,
            2 => Self::LocQpOpErr,
            4 => Self::LocProtErr,
            5 => Self::WrFlushErr,
            6 => Self::MwBindErr,
            9 => Self::RemInvReqErr,
            10 => Self::RemAccessErr,
            11 => Self::RemOpErr,
            12 => Self::RetryExcErr,
            13 => Self::RnrRetryExcErr,
            21 => Self::GeneralErr,
            v => Self::Other(v),
        }
    }

    /// True for [`WcStatus::Success`].
    #[inline]
    pub const fn is_ok(self) -> bool {
        matches!(self, Self::Success)
    }

    /// libibverbs' text for the status (`ibv_wc_status_str`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory bind operation error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::GeneralErr => "general error",
            Self::Other(_) => "unknown",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a completion completes (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A SEND or SEND with immediate finished.
    #[default]
    Send,
    /// An RDMA WRITE (with or without immediate) finished.
    RdmaWrite,
    /// An RDMA READ finished.
    RdmaRead,
    /// A receive caught an incoming SEND.
    Recv,
    /// A receive caught an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// A memory-window bind ([`SendOp::BindMw`]) finished.
    BindMw,
    /// A local invalidation ([`SendOp::LocalInv`]) finished.
    LocalInv,
}

/// One work completion (`struct ibv_wc`), written into the caller's slice by
/// [`CompletionQueue::poll`](super::CompletionQueue::poll).
///
/// For flushed or failed requests only `wr_id`, `status` and `qp_num` are meaningful, as in
/// libibverbs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Bytes received (receives, including the 40-byte GRH area on UD) or read.
    pub byte_len: u32,
    /// The immediate, host byte order, when the incoming message carried one.
    pub imm: Option<u32>,
    /// Local queue pair number.
    pub qp_num: u32,
    /// Sender's queue pair number (UD receives).
    pub src_qp: u32,
    /// The local key a received SEND with invalidate ([`SendOp::SendInv`]) invalidated
    /// (`IBV_WC_WITH_INV` and `invalidated_rkey`): the key is invalid once this completion
    /// is polled. `None` on every other completion.
    pub invalidated: Option<u32>,
}

impl Completion {
    /// True if the completion reports success.
    #[inline]
    pub const fn is_ok(&self) -> bool {
        self.status.is_ok()
    }
}

/// Queue-pair sizes requested at creation (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send requests (those whose completion is not yet generated).
    pub max_send_wr: u32,
    /// Posted, not yet consumed receives.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Largest payload a send may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        }
    }
}

/// Queue-pair state (`enum ibv_qp_state`), reduced to the states users observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created; receives may be posted, sends may not.
    Init,
    /// Ready to receive; the connection is being established.
    Rtr,
    /// Ready to send: connected.
    Rts,
    /// Failed or disconnected; every outstanding request is flushed.
    Error,
}

impl QpState {
    /// Stable numeric encoding used in shared memory.
    pub const fn to_raw(self) -> u32 {
        match self {
            Self::Init => 1,
            Self::Rtr => 2,
            Self::Rts => 3,
            Self::Error => 6,
        }
    }

    /// Decodes [`QpState::to_raw`]; unknown values read as `Error`.
    pub const fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            _ => Self::Error,
        }
    }
}

/// What a device can do (`ibv_query_device`, `ibv_query_port` and the CM's limits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Device name (`rxe0`, `mlx5_0`, `shm`).
    pub name: String,
    /// Provider name (`shm` or `verbs`).
    pub provider: &'static str,
    /// Largest `max_send_wr`/`max_recv_wr`.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list.
    pub max_sge: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Largest single SEND, WRITE or READ (`max_msg_sz`).
    pub max_msg_size: u64,
    /// Largest single SEND on this provider, which may be smaller than `max_msg_size`.
    pub max_send_size: u64,
    /// Path MTU in bytes: the largest UD payload.
    pub mtu: u32,
    /// Bytes of private data a connect request may carry.
    pub max_req_private_data: usize,
    /// Bytes of private data an accept may carry.
    pub max_rep_private_data: usize,
    /// Bytes of private data a reject may carry.
    pub max_rej_private_data: usize,
    /// True if a bound memory window ([`SendOp::BindMw`]) is reachable through every queue
    /// pair of its protection domain, whichever bound it (shm); false if only through the
    /// queue pair that bound it (verbs type-2 windows: Soft-RoCE's are type 2B), or if the
    /// provider has no windows. A protocol that binds a key on one connection and hands it
    /// to a peer that may use it on another (an RTRS server's `always_invalidate`) needs it.
    pub mw_domain_wide: bool,
}

/// Size of the Global Routing Header area at the start of every UD receive buffer.
pub const GRH_LEN: u32 = 40;
