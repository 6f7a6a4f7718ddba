//! The vocabulary between the state machines and the fabric driver that runs them: handles
//! for paths and connections, the work requests the state machines post (a chain of [`Wr`]),
//! the receives they post ([`RecvBuf`]), and the inputs they take ([`Wc`], [`CmEvent`]).
//!
//! The state machines never touch a queue pair: they call their driver trait
//! ([`ClientIo`](crate::clt::ClientIo), [`ServerIo`](crate::srv::ServerIo)), which maps each
//! item here onto the verbs of its provider. The mapping is in the variant docs.

use dp_fabric::{Completion, PostError, PostErrorKind, RemoteAddr, Sge, WcOpcode, WcStatus};

/// A path of a client session or of a server, as the state machine that owns it numbers it.
/// `generation` changes when a slot is reused, so events for a removed path never reach its
/// successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId {
    /// Slot in the owner's path table.
    pub idx: u16,
    /// Generation of the slot.
    pub generation: u16,
}

/// One connection (queue pair) of a path, in one incarnation.
///
/// `epoch` is the path's connection attempt (its `recon_cnt`): every reconnect makes new
/// connections with a new epoch, and events or completions that carry an old one are
/// ignored. The driver hands back exactly the `Conn` the state machine gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conn {
    /// The path.
    pub path: PathId,
    /// Connection index: 0 is the service connection, 1.. carry IO.
    pub cid: u16,
    /// The path's connection attempt this connection belongs to.
    pub epoch: u16,
}

/// Queue sizes for one connection's queue pair and completion queue, as Linux sizes them
/// (`create_con_cq_qp` on the client, `create_con` on the server); the driver clamps them to
/// the device's `max_qp_wr` and tells the state machine nothing: the state machine bounds
/// what it posts by these numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSizes {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send (2 on client IO connections: data + header).
    pub max_send_sge: u32,
}

/// A local memory access outside the buffer it named: refused by the driver, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutOfBounds;

/// The direction of an IO request (`READ` or `WRITE` in `rtrs_clt_request`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// The server writes data into the client's buffer.
    Read,
    /// The client writes data into the server's chunk.
    Write,
}

/// A registration the driver made for one request's data, identified by a driver token; see
/// [`Wr::Register`].
pub type RegToken = u64;

/// Server: handler memory a READ's answer is written from instead of the chunk (zero copy,
/// as SPDK's `zcopy` bdev path): source `id`, which the driver registered for local access
/// only on every path (`ServerDriver::add_source`), from byte `offset` on. See
/// [`Server::resp_rdma_from`](crate::srv::Server::resp_rdma_from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrcRef {
    /// The driver's number for the source.
    pub id: u32,
    /// Where in it the answer starts.
    pub offset: u64,
}

/// One work request of a chain the state machine posts on one connection.
///
/// Every variant carries the `wr_id` the completion must return and whether it is
/// signalled; unsignalled requests complete silently on success but always report errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wr<'a> {
    /// `IB_WR_SEND` of a service message (`info_req`, `info_rsp`): the driver copies `bytes`
    /// into a registered send buffer (control path; at most 8 + 16 * 65535 bytes).
    SendMsg {
        /// Completion id.
        wr_id: u64,
        /// The message.
        bytes: &'a [u8],
        /// Signalled.
        signaled: bool,
    },
    /// `IB_WR_RDMA_WRITE_WITH_IMM` of zero bytes (no SGE, remote address and key 0):
    /// heartbeats, their answers, and IO responses when the server does not re-key chunks.
    WriteImmEmpty {
        /// Completion id.
        wr_id: u64,
        /// The immediate (host order; the driver converts to big-endian).
        imm: u32,
        /// Signalled.
        signaled: bool,
    },
    /// The client's IO request: `IB_WR_RDMA_WRITE_WITH_IMM` to `remote` (a server chunk)
    /// gathering `data` (WRITE requests with data) then the first `iu_len` bytes of the
    /// header buffer of permit `slot` (user message + RTRS header), with `imm`.
    IoRequest {
        /// Completion id.
        wr_id: u64,
        /// Where in the server's chunk.
        remote: RemoteAddr,
        /// The data to gather first (a WRITE's payload), in this path's keys.
        data: Option<Sge>,
        /// The permit (chunk) whose header buffer to gather.
        slot: u16,
        /// Bytes of the header buffer.
        iu_len: u32,
        /// The immediate.
        imm: u32,
        /// Signalled.
        signaled: bool,
    },
    /// Posts the registration the driver prepared in
    /// [`ClientIo::map_data`](crate::clt::ClientIo::map_data) for a request's data: a
    /// fast-registration (`IB_WR_REG_MR`) or a type-2 memory-window bind
    /// (`IBV_WR_BIND_MW`), with the key it returned.
    Register {
        /// Completion id.
        wr_id: u64,
        /// The driver's token.
        token: RegToken,
        /// Signalled.
        signaled: bool,
    },
    /// `IB_WR_LOCAL_INV` of `key` (always signalled: the state machine waits for it).
    LocalInv {
        /// Completion id.
        wr_id: u64,
        /// The key to invalidate.
        key: u32,
    },
    /// Server: `IB_WR_RDMA_WRITE` of the first `len` bytes of chunk `chunk` to the client's
    /// buffer `remote` (a READ's data). Unsignalled and followed by a [`Wr::WriteImmEmpty`]
    /// (the answer), the fabric driver posts the two as one `IB_WR_RDMA_WRITE_WITH_IMM`
    /// carrying the data: the client sees the same (the data in place before the completion
    /// of the immediate, which consumes the same empty receive).
    WriteChunk {
        /// Completion id.
        wr_id: u64,
        /// The chunk.
        chunk: u16,
        /// Bytes.
        len: u32,
        /// The client's buffer.
        remote: RemoteAddr,
        /// Signalled.
        signaled: bool,
    },
    /// Server: `IB_WR_RDMA_WRITE` of `len` bytes of handler memory `src` to the client's
    /// buffer `remote` (a READ's data answered with
    /// [`Server::resp_rdma_from`](crate::srv::Server::resp_rdma_from)): the same write as
    /// [`Wr::WriteChunk`] on the wire, gathered from elsewhere.
    WriteSource {
        /// Completion id.
        wr_id: u64,
        /// The source and offset.
        src: SrcRef,
        /// Bytes.
        len: u32,
        /// The client's buffer.
        remote: RemoteAddr,
        /// Signalled.
        signaled: bool,
    },
    /// Server: `IB_WR_SEND_WITH_INV` with no payload, invalidating the client's `rkey`
    /// (the client asked with `NEED_INVAL`).
    SendInv {
        /// Completion id.
        wr_id: u64,
        /// The client's key to invalidate.
        rkey: u32,
        /// Signalled.
        signaled: bool,
    },
    /// Server: re-register chunk `chunk`'s region on this path under `key`
    /// (`IB_WR_REG_MR` after `ib_inc_rkey`; with memory windows, a bind with that key).
    RegChunk {
        /// Completion id.
        wr_id: u64,
        /// The chunk.
        chunk: u16,
        /// Its new key.
        key: u32,
        /// Signalled.
        signaled: bool,
    },
    /// Server: `IB_WR_SEND_WITH_IMM` of an 8-byte `rtrs_msg_rkey_rsp` with the IO
    /// response's immediate (`NEW_RKEY` mode).
    SendImmMsg {
        /// Completion id.
        wr_id: u64,
        /// The message.
        bytes: [u8; 8],
        /// The immediate.
        imm: u32,
        /// Signalled.
        signaled: bool,
    },
}

impl Wr<'_> {
    /// The completion id.
    pub const fn wr_id(&self) -> u64 {
        match *self {
            Self::SendMsg { wr_id, .. }
            | Self::WriteImmEmpty { wr_id, .. }
            | Self::IoRequest { wr_id, .. }
            | Self::Register { wr_id, .. }
            | Self::LocalInv { wr_id, .. }
            | Self::WriteChunk { wr_id, .. }
            | Self::WriteSource { wr_id, .. }
            | Self::SendInv { wr_id, .. }
            | Self::RegChunk { wr_id, .. }
            | Self::SendImmMsg { wr_id, .. } => wr_id,
        }
    }

    /// True if it completes on success too.
    pub const fn signaled(&self) -> bool {
        match *self {
            Self::SendMsg { signaled, .. }
            | Self::WriteImmEmpty { signaled, .. }
            | Self::IoRequest { signaled, .. }
            | Self::Register { signaled, .. }
            | Self::WriteChunk { signaled, .. }
            | Self::WriteSource { signaled, .. }
            | Self::SendInv { signaled, .. }
            | Self::RegChunk { signaled, .. }
            | Self::SendImmMsg { signaled, .. } => signaled,
            Self::LocalInv { .. } => true,
        }
    }
}

/// The buffer a receive is posted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvBuf {
    /// No SGE: catches an RDMA WRITE with immediate or a SEND_WITH_INV without payload.
    Empty,
    /// 8 bytes: an `rkey_rsp` (client IO receives in `NEW_RKEY` mode).
    Small,
    /// `len` bytes: the `info_rsp` of a path (client, connection 0).
    InfoRsp(u32),
    /// 272 bytes: the `info_req` (server, connection 0).
    InfoReq,
}

impl RecvBuf {
    /// Bytes the buffer holds.
    pub const fn len(&self) -> u32 {
        match *self {
            Self::Empty => 0,
            Self::Small => 8,
            Self::InfoRsp(n) => n,
            Self::InfoReq => 272,
        }
    }

    /// True for [`RecvBuf::Empty`].
    pub const fn is_empty(&self) -> bool {
        matches!(self, Self::Empty)
    }
}

/// A work completion as the state machines read it: `dp_fabric`'s [`Completion`] plus the
/// key a received SEND_WITH_INV invalidated (`IB_WC_WITH_INVALIDATE`, `ex.invalidate_rkey`),
/// which the fabric layer must report for RTRS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind (meaningful for receives: `Recv` or `RecvRdmaWithImm`).
    pub opcode: WcOpcode,
    /// Bytes received.
    pub byte_len: u32,
    /// The immediate, host order.
    pub imm: Option<u32>,
    /// The rkey a received SEND_WITH_INV invalidated.
    pub invalidated: Option<u32>,
}

impl Wc {
    /// From a fabric completion and the invalidated key, if the fabric reported one.
    pub fn from_fabric(c: &Completion, invalidated: Option<u32>) -> Self {
        Self {
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            byte_len: c.byte_len,
            imm: c.imm,
            invalidated,
        }
    }

    /// True if it reports success.
    pub const fn is_ok(&self) -> bool {
        self.status.is_ok()
    }

    /// True for a receive completion.
    pub const fn is_recv(&self) -> bool {
        matches!(self.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// A connection-manager event for one connection (`struct rdma_cm_event`, reduced to what
/// RTRS distinguishes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEvent<'a> {
    /// `RDMA_CM_EVENT_ESTABLISHED`: on the client, with the server's accept data.
    Established {
        /// The peer's private data (the client reads the `conn_rsp` from it).
        private_data: &'a [u8],
    },
    /// `RDMA_CM_EVENT_REJECTED`, with the peer's reject data.
    Rejected {
        /// The reject private data (possibly empty: a CM-level reject).
        private_data: &'a [u8],
    },
    /// `CONNECT_ERROR`, `UNREACHABLE`: the connect got no valid answer.
    Unreachable,
    /// `ADDR_ERROR`, `ROUTE_ERROR`: resolution failed.
    AddrError,
    /// `DISCONNECTED`, `ADDR_CHANGE`, `TIMEWAIT_EXIT`: the connection is gone.
    Disconnected,
    /// `DEVICE_REMOVAL`.
    DeviceRemoval,
}

/// A send queue's occupancy, so a state machine never posts more than the queue holds.
///
/// Verbs complete a signalled request only after every earlier request of the queue, so
/// each signalled request's completion frees itself and the unsignalled ones posted before
/// it: the count travels in its `wr_id` (see [`WrId`]). At least every `interval`-th
/// request is signalled (Linux's `signal_interval`, `min(queue_depth, 512)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendQueue {
    cap: u32,
    used: u32,
    run: u32,
    interval: u32,
}

impl SendQueue {
    /// A queue of `cap` requests, signalling at least every `interval`.
    pub const fn new(cap: u32, interval: u32) -> Self {
        Self {
            cap,
            used: 0,
            run: 0,
            interval: if interval == 0 { 1 } else { interval },
        }
    }

    /// Requests posted and not known complete.
    pub const fn used(&self) -> u32 {
        self.used
    }

    /// True if `n` more requests fit.
    pub const fn fits(&self, n: u32) -> bool {
        self.used + n <= self.cap
    }

    /// Reserves `n` requests of a chain. Returns `Some(batch)` if its last request must be
    /// signalled (`batch` requests are freed by that completion; always the case when
    /// `force`), `None` if it goes unsignalled, or `Err` if the queue is full.
    ///
    /// # Errors
    /// [`PostErrorKind::QueueFull`] if `n` requests do not fit.
    pub fn reserve(&mut self, n: u32, force: bool) -> Result<Option<u32>, PostError> {
        if !self.fits(n) {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::QueueFull,
            });
        }
        self.used += n;
        self.run += n;
        if force || self.run >= self.interval || !self.fits(self.interval.min(self.cap)) {
            let b = self.run;
            self.run = 0;
            Ok(Some(b))
        } else {
            Ok(None)
        }
    }

    /// Gives back a reservation whose post failed (nothing was posted).
    pub fn unreserve(&mut self, n: u32, batch: Option<u32>) {
        self.used = self.used.saturating_sub(n);
        match batch {
            Some(b) => self.run = b.saturating_sub(n),
            None => self.run = self.run.saturating_sub(n),
        }
    }

    /// A signalled completion freed `batch` requests.
    pub fn complete(&mut self, batch: u32) {
        self.used = self.used.saturating_sub(batch);
    }

    /// Forgets everything (the queue pair is gone).
    pub fn reset(&mut self) {
        self.used = 0;
        self.run = 0;
    }
}

/// The layout of a `wr_id`: `[63:48]` epoch, `[47:40]` kind, `[39:16]` batch (requests a
/// signalled send frees), `[15:0]` argument (a chunk or permit index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrId(pub u64);

impl WrId {
    /// Builds one.
    pub const fn new(epoch: u16, kind: u8, batch: u32, arg: u16) -> Self {
        Self(
            (epoch as u64) << 48
                | (kind as u64) << 40
                | ((batch as u64) & 0xFF_FFFF) << 16
                | arg as u64,
        )
    }
    /// The epoch.
    pub const fn epoch(self) -> u16 {
        (self.0 >> 48) as u16
    }
    /// The kind.
    pub const fn kind(self) -> u8 {
        (self.0 >> 40) as u8
    }
    /// The batch.
    pub const fn batch(self) -> u32 {
        ((self.0 >> 16) & 0xFF_FFFF) as u32
    }
    /// The argument.
    pub const fn arg(self) -> u16 {
        self.0 as u16
    }
}

/// `ib_inc_rkey`: the next key of a registration (the low 8 bits are the consumer's and
/// rotate; the rest names the registration).
pub const fn inc_rkey(key: u32) -> u32 {
    (key & 0xFFFF_FF00) | (key.wrapping_add(1) & 0xFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_wr_id_fields() {
        let w = WrId::new(0xBEEF, 7, 0x12_3456, 0xCAFE);
        assert_eq!(
            (w.epoch(), w.kind(), w.batch(), w.arg()),
            (0xBEEF, 7, 0x12_3456, 0xCAFE)
        );
    }

    #[test]
    fn test_send_queue_signals_every_interval() {
        let mut q = SendQueue::new(10, 4);
        let b: Vec<_> = (0..4).map(|_| q.reserve(1, false).unwrap()).collect();
        assert_eq!(b, [None, None, None, Some(4)]);
        assert_eq!(q.used(), 4);
        q.complete(4);
        assert_eq!(q.used(), 0);
        assert_eq!(q.reserve(2, true).unwrap(), Some(2), "forced");
    }

    #[test]
    fn test_send_queue_full_and_near_full_signals() {
        let mut q = SendQueue::new(5, 4);
        // Less than an interval of room left: signal now, so room comes back.
        assert_eq!(q.reserve(3, false).unwrap(), Some(3));
        assert_eq!(q.reserve(1, false).unwrap(), Some(1));
        assert_eq!(q.reserve(1, false).unwrap(), Some(1));
        assert!(q.reserve(1, false).is_err(), "full");
        q.complete(3);
        assert_eq!(q.used(), 2);
        assert!(q.reserve(1, false).is_ok());
        // A refused post gives its reservation back.
        let b = q.reserve(2, false).unwrap();
        q.unreserve(2, b);
        assert_eq!(q.used(), 3);
    }

    #[test]
    fn test_inc_rkey_rotates_low_byte() {
        assert_eq!(inc_rkey(0x1234_56FF), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
    }
}
