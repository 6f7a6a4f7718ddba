//! Sockets (`struct rds_sock`): the table, the bind table, readiness, and the types the
//! socket calls take and return.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};

use lcore::time::Instant;

use super::config::TransportKind;
use crate::addr::Addr;
use crate::idmap::{self, IdMap};
use crate::store::List;
use crate::uapi::{POLLERR, POLLIN, POLLOUT, POLLRDNORM, POLLWRBAND, POLLWRNORM};

/// A socket of an engine: a handle (index and generation), `Copy`, like a descriptor. A
/// handle of a closed socket is refused with `EBADF`, even after its slot is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RdsSocket {
    pub(crate) idx: u32,
    pub(crate) generation: u32,
}

impl RdsSocket {
    /// The slot index (stable while the socket is open; for tables indexed by socket).
    pub fn index(self) -> u32 {
        self.idx
    }
}

/// Poll readiness, as `rds_poll` computes it, with Linux's poll bits.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready(pub u16);

impl Ready {
    /// `POLLIN | POLLRDNORM`: a message, a notification, or (without congestion monitoring)
    /// a congestion update since the last poll.
    pub fn readable(self) -> bool {
        self.0 & POLLIN != 0
    }
    /// `POLLOUT | POLLWRNORM`: the send buffer has room. A send may still fail with
    /// `ENOBUFS` if its destination is congested.
    pub fn writable(self) -> bool {
        self.0 & POLLOUT != 0
    }
    /// `POLLWRBAND`: a congestion map changed (non-monitoring sockets).
    pub fn wrband(self) -> bool {
        self.0 & POLLWRBAND != 0
    }
    /// `POLLERR`.
    pub fn error(self) -> bool {
        self.0 & POLLERR != 0
    }
    pub(crate) const READ: u16 = POLLIN | POLLRDNORM;
    pub(crate) const WRITE: u16 = POLLOUT | POLLWRNORM;
    pub(crate) const CONG: u16 = POLLIN | POLLRDNORM | POLLWRBAND;
}

impl core::fmt::Debug for Ready {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Ready(")?;
        for (b, n) in [
            (POLLIN, "IN "),
            (POLLOUT, "OUT "),
            (POLLWRBAND, "WRBAND "),
            (POLLERR, "ERR "),
        ] {
            if self.0 & b != 0 {
                f.write_str(n)?;
            }
        }
        write!(f, ")")
    }
}

/// An RDMA completion notification (`struct rds_rdma_notify`), returned as
/// [`Received::RdmaStatus`], for an operation sent with `RDS_RDMA_NOTIFY_ME` (or a failed one
/// on a socket with `RDS_RECVERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaNotify {
    /// The operation's `user_token`.
    pub user_token: u64,
    /// `RDS_RDMA_SUCCESS`, `_REMOTE_ERROR`, `_CANCELED`, `_DROPPED`, `_OTHER_ERROR`.
    pub status: i32,
}

/// What one `recv_from` returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// A message.
    Data {
        /// The return value: bytes copied, or the message's full length with
        /// [`RecvFlags::TRUNC`].
        len: usize,
        /// The message's length.
        msg_len: usize,
        /// Where it came from (the peer's address and RDS port).
        from: SocketAddr,
        /// `MSG_TRUNC` in the returned flags: the buffer was shorter than the message.
        truncated: bool,
        /// `RDS_CMSG_RDMA_DEST`: the cookie of a memory region the sender offered.
        rdma_dest: Option<u64>,
        /// `SO_TIMESTAMP`: when it was queued to the socket (with the option on).
        timestamp: Option<Instant>,
    },
    /// `RDS_CMSG_RDMA_STATUS`: a notification, and no data (return value 0).
    RdmaStatus(RdmaNotify),
    /// `RDS_CMSG_CONG_UPDATE`: ports (as `RDS_CONG_MONITOR_MASK` bits) that became
    /// uncongested, and no data (return value 0).
    CongUpdate(u64),
    /// `MSG_OOB` was asked: RDS returns 0 and nothing else.
    Nothing,
}

/// Flags of `recv_from` (`MSG_DONTWAIT`, `MSG_PEEK`, `MSG_TRUNC`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvFlags(pub u32);

impl RecvFlags {
    /// Do not wait: `EAGAIN` if nothing is queued.
    pub const DONTWAIT: Self = Self(crate::uapi::MSG_DONTWAIT);
    /// Leave the message queued.
    pub const PEEK: Self = Self(crate::uapi::MSG_PEEK);
    /// Return the message's full length even if the buffer was shorter.
    pub const TRUNC: Self = Self(crate::uapi::MSG_TRUNC);
    /// `MSG_OOB`: RDS returns 0 at once.
    pub const OOB: Self = Self(crate::uapi::MSG_OOB);
    /// Blocking, no peek, no trunc.
    pub const NONE: Self = Self(0);

    /// True if every flag of `o` is set.
    pub const fn has(self, o: Self) -> bool {
        self.0 & o.0 == o.0
    }
    /// Both.
    #[must_use]
    pub const fn with(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}

/// Flags of `send_to` (`MSG_DONTWAIT`, `MSG_ZEROCOPY`, `MSG_CMSG_COMPAT`); any other bit
/// fails with `EOPNOTSUPP`, as in Linux.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// Do not wait: `ENOBUFS` on congestion, `EAGAIN` on a full send buffer.
    pub const DONTWAIT: Self = Self(crate::uapi::MSG_DONTWAIT);
    /// `MSG_ZEROCOPY` (TCP only).
    pub const ZEROCOPY: Self = Self(crate::uapi::MSG_ZEROCOPY);
    /// Blocking.
    pub const NONE: Self = Self(0);

    /// True if every flag of `o` is set.
    pub const fn has(self, o: Self) -> bool {
        self.0 & o.0 == o.0
    }
}

/// A send-side control message (`SOL_RDS` cmsg). The RDMA ones are checked by the engine
/// and carried out by the fabric transport once it has an RDMA window; on a transport
/// without RDMA they fail with `EOPNOTSUPP`, as on RDS-TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendCmsg {
    /// `RDS_CMSG_RDMA_ARGS`: one RDMA read or write against the peer's memory region.
    RdmaArgs {
        /// The peer's cookie.
        cookie: u64,
        /// Remote address and length.
        remote_addr: u64,
        /// Remote bytes.
        remote_bytes: u64,
        /// Local scatter entries (`nr_local`): Linux takes 1..=1024; this engine takes
        /// one local range (below), in its RDMA window, so it must be 1.
        nr_local: u64,
        /// The local range (`local_vec_addr`'s one `rds_iovec`): its first byte, a process
        /// address inside the node's RDMA window.
        local_addr: u64,
        /// The local range's length: the bytes moved (at most `remote_bytes`).
        local_bytes: u64,
        /// `RDS_RDMA_*` flags.
        flags: u64,
        /// Returned in the completion notification.
        user_token: u64,
    },
    /// `RDS_CMSG_RDMA_DEST`: offer an existing memory region (its cookie) to the receiver.
    RdmaDest(u64),
    /// `RDS_CMSG_RDMA_MAP`: register a region on the fly and offer it.
    RdmaMap {
        /// Address.
        addr: u64,
        /// Bytes.
        bytes: u64,
        /// `RDS_RDMA_*` flags.
        flags: u64,
    },
    /// `RDS_CMSG_ATOMIC_*` (6..=9).
    Atomic(i32),
    /// `RDS_CMSG_ZCOPY_COOKIE`.
    ZcopyCookie(u32),
    /// Any other `SOL_RDS` type: `EINVAL`.
    Other(i32),
}

/// Where a socket is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Bound {
    pub(crate) addr: Addr,
    pub(crate) port: u16,
    pub(crate) scope: u32,
}

/// One socket's state.
#[derive(Debug)]
pub(crate) struct Socket {
    pub(crate) generation: u32,
    pub(crate) live: bool,
    pub(crate) bound: Option<Bound>,
    pub(crate) transport: Option<TransportKind>,
    pub(crate) conn_addr: Option<(Addr, u16, u32)>,
    /// `sk_sndbuf` / `sk_rcvbuf` as Linux stores them (doubled); RDS uses half.
    pub(crate) sk_sndbuf: u32,
    pub(crate) sk_rcvbuf: u32,
    pub(crate) snd_bytes: u64,
    pub(crate) rcv_bytes: u64,
    pub(crate) congested: bool,
    pub(crate) cong_monitor: bool,
    pub(crate) cong_mask: u64,
    pub(crate) cong_notify: u64,
    pub(crate) cong_track: u64,
    pub(crate) seen_congestion: bool,
    pub(crate) recverr: bool,
    pub(crate) timestamp: bool,
    pub(crate) tos: u8,
    pub(crate) cached_conn: Option<u32>,
    pub(crate) send_list: List,
    pub(crate) recv_list: List,
    pub(crate) notify: VecDeque<RdmaNotify>,
    pub(crate) event_pending: bool,
}

impl Socket {
    fn new(generation: u32, sndbuf: u32, rcvbuf: u32) -> Self {
        Self {
            generation,
            live: true,
            bound: None,
            transport: None,
            conn_addr: None,
            sk_sndbuf: sndbuf,
            sk_rcvbuf: rcvbuf,
            snd_bytes: 0,
            rcv_bytes: 0,
            congested: false,
            cong_monitor: false,
            cong_mask: 0,
            cong_notify: 0,
            cong_track: 0,
            seen_congestion: false,
            recverr: false,
            timestamp: false,
            tos: 0,
            cached_conn: None,
            send_list: List::new(),
            recv_list: List::new(),
            notify: VecDeque::new(),
            event_pending: false,
        }
    }

    /// `rds_sk_sndbuf`: the send-buffer limit in payload bytes.
    pub(crate) fn sndbuf(&self) -> u64 {
        u64::from(self.sk_sndbuf / 2)
    }

    /// `rds_sk_rcvbuf`: the receive-buffer limit in payload bytes.
    pub(crate) fn rcvbuf(&self) -> u64 {
        u64::from(self.sk_rcvbuf / 2)
    }

    /// Readiness without the congestion-generation part (which polling consumes).
    pub(crate) fn base_ready(&self) -> u16 {
        let mut r = 0;
        if !self.recv_list.is_empty() || !self.notify.is_empty() {
            r |= Ready::READ;
        }
        if self.cong_monitor && self.cong_notify != 0 {
            r |= Ready::READ;
        }
        if self.snd_bytes < self.sndbuf() {
            r |= Ready::WRITE;
        }
        r
    }
}

/// The socket slab and the bind table.
#[derive(Debug)]
pub(crate) struct SocketTable {
    pub(crate) slots: Vec<Socket>,
    free: Vec<u32>,
    /// Entries only local binds make: an [`IdMap`](crate::idmap::IdMap).
    pub(crate) bound: IdMap<Bound, u32>,
    cap: u32,
}

impl SocketTable {
    pub(crate) fn new(cap: u32) -> Self {
        Self {
            slots: Vec::with_capacity(cap as usize),
            free: Vec::with_capacity(cap as usize),
            bound: idmap::with_capacity(cap as usize),
            cap,
        }
    }

    pub(crate) fn open(&mut self, sndbuf: u32, rcvbuf: u32) -> Option<RdsSocket> {
        if let Some(idx) = self.free.pop() {
            let generation = self.slots[idx as usize].generation.wrapping_add(1);
            self.slots[idx as usize] = Socket::new(generation, sndbuf, rcvbuf);
            return Some(RdsSocket { idx, generation });
        }
        if self.slots.len() as u32 >= self.cap {
            return None;
        }
        let idx = self.slots.len() as u32;
        self.slots.push(Socket::new(0, sndbuf, rcvbuf));
        Some(RdsSocket { idx, generation: 0 })
    }

    pub(crate) fn release(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        s.live = false;
        if let Some(b) = s.bound.take() {
            self.bound.remove(&b);
        }
        self.free.push(idx);
    }

    pub(crate) fn get(&self, s: RdsSocket) -> Option<&Socket> {
        self.slots
            .get(s.idx as usize)
            .filter(|x| x.live && x.generation == s.generation)
    }

    pub(crate) fn get_mut(&mut self, s: RdsSocket) -> Option<&mut Socket> {
        self.slots
            .get_mut(s.idx as usize)
            .filter(|x| x.live && x.generation == s.generation)
    }

    pub(crate) fn handle(&self, idx: u32) -> RdsSocket {
        RdsSocket {
            idx,
            generation: self.slots[idx as usize].generation,
        }
    }

    pub(crate) fn open_count(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// A socket address from an RDS address, port and scope (v4-mapped become IPv4).
pub(crate) fn sockaddr(addr: Addr, port: u16, scope: u32) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope)),
    }
}

/// Splits a socket address into RDS address, port, scope id.
pub(crate) fn split(sa: SocketAddr) -> (Addr, u16, u32) {
    match sa {
        SocketAddr::V4(v4) => (Addr::new(IpAddr::V4(*v4.ip())), v4.port(), 0),
        SocketAddr::V6(v6) => (Addr::new(IpAddr::V6(*v6.ip())), v6.port(), v6.scope_id()),
    }
}
