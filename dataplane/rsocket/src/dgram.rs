//! Datagram rsockets (`SOCK_DGRAM`), wire-compatible with librdmacm's (reference section 7).
//!
//! # Model
//!
//! An [`RsDatagram`] owns
//!
//! * a real, non-blocking [`UdpSocket`] bound to the socket's address: it names the socket,
//!   carries the first datagrams to a peer and the handshake, exactly as librdmacm's does;
//! * one UD queue pair per local source address (librdmacm's `ds_qp`; one with a single
//!   local address), each with its own completion queue and registered slots: `sq` send
//!   slots and `rq` receive slots of 2048 bytes (`RS_SNDLOWAT`), Q_Key [`RDMA_UDP_QKEY`];
//! * a destination map keyed by the peer's UDP address: which queue pair talks to it and,
//!   once known, the address handle of the peer's queue pair.
//!
//! Sizes follow librdmacm's `ds_set_qp_size`: `rq = min(RDMA_RQSIZE, SO_RCVBUF / 2048)`
//! and `sq = min(RDMA_SQSIZE, SO_SNDBUF / 2048)`, so the defaults give 64 of each.
//!
//! # Handshake (A sends to B first)
//!
//! 1. A has no address handle for B: the datagram goes over A's UDP socket as a
//!    [`DsUdpHeader`] (`Data`, A's queue pair number, A's source address) plus the payload.
//! 2. B validates it, answers with a header-only `Ctrl` datagram carrying B's queue pair
//!    number, resolves an address handle to A's queue pair, and queues the payload.
//! 3. A sees the `Ctrl` and resolves its address handle to B.
//! 4. From then on datagrams in both directions are UD SENDs of a [`DsHeader`] (the
//!    sender's source address and UDP port) plus the payload, queue pair to queue pair.
//!
//! [`DgramStats`] counts each path, so callers (and tests) can see which one was used.
//!
//! # Progress
//!
//! There is no service thread: every call ([`send_to`](RsDatagram::send_to),
//! [`recv_from`](RsDatagram::recv_from), [`readiness`](RsDatagram::readiness), or
//! [`progress`](RsDatagram::progress) from an lcore loop) first runs one progress step:
//!
//! 1. poll every completion queue (send completions free their slots at once; receive
//!    completions are set aside);
//! 2. drain the UDP socket (at most 32 datagrams): answer `Data` with `Ctrl`, resolve or
//!    refresh the sender's address handle, queue the payload in a staging slot;
//! 3. validate the UD receives set aside in step 1 and queue them.
//!
//! Unlike librdmacm, which forwards UDP-path payloads into its own queue pair through a
//! loopback address handle, payloads are queued directly from a staging slot: no send slot,
//! no loopback destination, and no datagram is lost when the staging slots are full (it
//! waits in the kernel's socket buffer instead).
//!
//! Ordering: one sender's datagrams stay in order across its switch from UDP to UD. It switches
//! only after our `Ctrl`, so on one host every datagram it sent over UDP is in our socket
//! buffer before its first UD datagram can be polled; the step that meets that first UD
//! datagram drains the socket before queueing it (step 2 runs before step 3, and is forced for
//! a sender's first UD datagram). The exception: when more UDP-path datagrams wait than one
//! step reads (32) or than free staging slots hold, the rest stay in the kernel and a UD
//! datagram may overtake them. Across hosts, as with UDP itself and as in librdmacm (whose
//! service thread forwards asynchronously), no order is promised.
//!
//! The UDP socket costs a system call to look at, so step 2 runs on every step only while the
//! UDP path is in use (while a peer we sent `Data` to has not answered, for up to 65536 steps,
//! and for [`UDP_HOT_STEPS`] steps after the last UDP datagram in or out), when a blocking call
//! has stopped spinning, and on [`readiness`](RsDatagram::readiness); otherwise on every 16th
//! step. Steady-state UD traffic thus makes no system call per datagram. The price: on a quiet
//! socket, a non-blocking receive may report `WouldBlock` while a new peer's first datagram
//! waits on the UDP socket; one of the next 16 calls, or `readiness`, finds it.
//!
//! # Sizes
//!
//! Every datagram must fit a 2048-byte slot with its header on both paths (a librdmacm
//! receiver reads UDP-path datagrams into a 2048-byte buffer), and the device MTU: at most
//! [`MAX_PAYLOAD_V4`] (2032) bytes of payload over IPv4 and [`MAX_PAYLOAD_V6`] (2020) over
//! IPv6. Larger sends fail with [`RsError::MsgSize`] (`EMSGSIZE`); librdmacm does not check
//! them at all (reference sections 7 and 9.10). The same limit on both paths means a
//! size that works for the first datagram works for every later one.
//!
//! # Truncation
//!
//! [`recv_from`](RsDatagram::recv_from) copies `min(buf.len(), datagram)` bytes and drops
//! the rest, like `recvfrom(2)` without `MSG_TRUNC` and like librdmacm (which never reports
//! it). [`recv_msg`](RsDatagram::recv_msg) also returns the datagram's full length, so a
//! caller can tell (the `MSG_TRUNC` flag of `recvmsg(2)`); [`DgramStats::truncated`] counts
//! them.
//!
//! # Threads
//!
//! Data-path calls take `&mut self`: a socket belongs to one thread or lcore at a time (it
//! is `Send`), as a DPDK queue does, and nothing on its fast path takes a lock. Creating
//! queue pairs and resolving address handles use the context's device and protection
//! domain, which take no lock (see the locking section of the [`ctx`](crate::ctx) docs).

mod progress;
mod qp;
mod rx;
// Fuzz-target entry points (`--cfg fuzzing` only); uses `qp` and `rx`.
#[cfg(fuzzing)]
pub mod fuzzing;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use self::qp::{DsQp, Geometry, INLINE_MAX, SLOT};
use self::rx::{Loc, Msg, Staging, UDP_SLOT, dest_key};
use crate::conn::{RS_QP_MAX_SIZE, Ready};
use crate::ctx::{RecvFlags, RsContext, SendFlagsRs};
use crate::error::{RsError, io_err};
use crate::opts::{SockOpt, SockOptName, SockOpts};
use crate::wait::Waiter;
use crate::wire::{
    DS_IPV4_HDR_LEN, DS_IPV6_HDR_LEN, DS_UDP_IPV4_HDR_LEN, DS_UDP_IPV6_HDR_LEN, DsHeader,
    DsUdpHeader, RsOp,
};
use dp_fabric::{Completion, Device, Provider};

/// The Q_Key of every rsocket UD queue pair: librdmacm's `RDMA_UDP_QKEY` (`rdma_cma.h`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Largest payload over IPv4: a 2048-byte slot less the 16-byte UDP-path header.
pub const MAX_PAYLOAD_V4: usize = SLOT - DS_UDP_IPV4_HDR_LEN as usize;

/// Largest payload over IPv6: a 2048-byte slot less the 28-byte UDP-path header.
pub const MAX_PAYLOAD_V6: usize = SLOT - DS_UDP_IPV6_HDR_LEN as usize;

/// Progress steps that poll the UDP socket every time after the last UDP-path datagram.
pub const UDP_HOT_STEPS: u32 = 4096;

/// After sending over UDP, the answer is looked for on every step for this many steps.
const AWAIT_STEPS: u64 = 1 << 16;
/// Otherwise the UDP socket is polled on every this many steps.
const UDP_POLL_EVERY: u64 = 16;
/// Most UDP datagrams handled per progress step.
const UDP_BATCH: usize = 32;
/// Most UDP staging slots per socket.
const UDP_STAGING_MAX: u32 = 32;
/// Completions polled per completion queue per step.
const CQ_BATCH: usize = 32;
/// Most destinations per socket: beyond it, new senders are served without a handshake
/// (their datagrams are delivered, they stay on the UDP path) and sends to new
/// destinations fail with `ENOMEM`.
const MAX_DESTS: usize = 4096;
/// Most local source addresses (queue pairs) per socket.
const MAX_QPS: usize = 16;
/// How long dropping a socket waits for its sends to complete.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Counters of one datagram socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DgramStats {
    /// Datagrams sent over the UDP socket (no address handle for the peer yet).
    pub udp_sent: u64,
    /// Datagrams sent over a UD queue pair.
    pub ud_sent: u64,
    /// Datagrams received over the UDP socket and queued.
    pub udp_received: u64,
    /// Datagrams received over a UD queue pair and queued.
    pub ud_received: u64,
    /// Header-only `Ctrl` replies sent (one per `Data` datagram received over UDP).
    pub ctrl_sent: u64,
    /// `Ctrl` replies received.
    pub ctrl_received: u64,
    /// Address handles resolved (or re-resolved after a peer's queue pair changed).
    pub ah_resolved: u64,
    /// Address-handle resolutions that failed (the peer stays on the UDP path).
    pub resolve_failures: u64,
    /// UDP datagrams dropped as invalid: short, wrong tag, version not matching the
    /// sender's family, inconsistent header length, unknown operation, oversized.
    pub invalid_udp: u64,
    /// UD receives dropped as invalid: error status, short, malformed header.
    pub invalid_ud: u64,
    /// Datagrams dropped because a connected socket only takes its peer's.
    pub filtered: u64,
    /// Datagrams delivered into a buffer shorter than them (the rest was dropped).
    pub truncated: u64,
    /// Send completions with an error status.
    pub send_errors: u64,
    /// UDP-path datagrams served without a handshake (no `Ctrl` answer, no address handle)
    /// because no destination entry could be made for the sender: the map was full or a
    /// queue pair could not be created.
    pub handshake_skipped: u64,
}

/// What [`RsDatagram::recv_msg`] received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes copied into the buffer.
    pub len: usize,
    /// Bytes of the datagram: more than `len` if it was truncated.
    pub msg_len: usize,
    /// The sender.
    pub src: SocketAddr,
}

impl RecvMeta {
    /// True if the datagram did not fit the buffer (`MSG_TRUNC`).
    pub const fn truncated(&self) -> bool {
        self.msg_len > self.len
    }
}

/// A peer: which of our queue pairs talks to it and, once its queue pair number is known,
/// the address handle.
struct Dest<P: Provider> {
    qp: u16,
    ah: Option<P::UdDest>,
    qpn: u32,
    /// A queue pair number whose resolution failed: not retried for every datagram.
    failed_qpn: Option<u32>,
    /// We sent it `Data` over UDP and have no address handle yet: its `Ctrl` is awaited.
    awaiting: bool,
    /// It sent us `Data` over UDP and no UD datagram since: it has not switched yet.
    udp_in: bool,
}

fn unspecified(v6: bool) -> SocketAddr {
    if v6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    }
}

/// A datagram rsocket, like `std::net::UdpSocket`. See the [module docs](self).
pub struct RsDatagram<P: Provider> {
    // Address handles and queue pairs go before the context that owns the device.
    dests: HashMap<SocketAddr, Dest<P>>,
    qps: Vec<DsQp<P>>,
    rx: VecDeque<Msg>,
    staging: Staging,
    udp: Option<UdpSocket>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    geom: Option<Geometry>,
    opts: SockOpts,
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    polling_time: Duration,
    scratch: Vec<Completion>,
    pending: Vec<(u16, Completion)>,
    udp_out: Vec<u8>,
    steps: u64,
    udp_hot: u32,
    /// Destinations whose `Ctrl` answer is awaited (`Dest::awaiting`).
    awaiting: usize,
    /// Until this step, answers are awaited on every step.
    await_until: u64,
    /// Destinations that have not switched from the UDP path yet (`Dest::udp_in`).
    switching: usize,
    /// The step that last looked at the UDP socket.
    drained_at: u64,
    stats: DgramStats,
    pd: P::Pd,
    ctx: RsContext<P>,
}

impl<P: Provider> std::fmt::Debug for RsDatagram<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsDatagram")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("qps", &self.qps.len())
            .field("dests", &self.dests.len())
            .field("queued", &self.rx.len())
            .finish()
    }
}

impl<P: Provider> RsDatagram<P> {
    /// A socket that is not bound yet (`rsocket(AF_INET, SOCK_DGRAM, 0)`): the first
    /// [`send_to`](Self::send_to) or [`connect`](Self::connect) binds it to the unspecified
    /// address and an ephemeral port, as Linux does. Options that size the queues must be
    /// set before that.
    pub fn unbound(ctx: &RsContext<P>) -> Self {
        let (pd, opts) = ctx.with_device(|_, pd, cfg| (pd.clone(), SockOpts::new(cfg)));
        Self {
            dests: HashMap::new(),
            qps: Vec::new(),
            rx: VecDeque::new(),
            staging: Staging::new(0),
            udp: None,
            local: None,
            peer: None,
            geom: None,
            opts,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            polling_time: ctx.polling_time(),
            scratch: vec![Completion::default(); CQ_BATCH],
            pending: Vec::new(),
            udp_out: vec![0; UDP_SLOT],
            steps: 0,
            udp_hot: 0,
            awaiting: 0,
            await_until: 0,
            switching: 0,
            drained_at: 0,
            stats: DgramStats::default(),
            pd,
            ctx: ctx.clone(),
        }
    }

    /// A socket bound to `addr` (port 0 picks an ephemeral port; see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// `AddrInUse` and the other errors of binding a UDP socket.
    pub fn bind(ctx: &RsContext<P>, addr: SocketAddr) -> Result<Self, RsError> {
        Self::bind_with(ctx, addr, &[])
    }

    /// Like [`bind`](Self::bind), setting options first (`SO_SNDBUF`/`SO_RCVBUF` and
    /// `RDMA_SQSIZE`/`RDMA_RQSIZE`/`RDMA_INLINE` size the queue pairs).
    ///
    /// # Errors
    /// Invalid options, then as `bind`.
    pub fn bind_with(
        ctx: &RsContext<P>,
        addr: SocketAddr,
        opts: &[SockOpt],
    ) -> Result<Self, RsError> {
        let mut s = Self::unbound(ctx);
        for o in opts {
            s.set_option(*o)?;
        }
        s.bind_addr(addr)?;
        Ok(s)
    }

    /// Binds an unbound socket (`rbind`).
    ///
    /// # Errors
    /// `Invalid` if already bound; the errors of binding a UDP socket.
    pub fn bind_addr(&mut self, addr: SocketAddr) -> Result<(), RsError> {
        if self.udp.is_some() {
            return Err(RsError::Invalid);
        }
        let udp = UdpSocket::bind(addr).map_err(|e| io_err(&e))?;
        udp.set_nonblocking(true).map_err(|e| io_err(&e))?;
        self.local = Some(udp.local_addr().map_err(|e| io_err(&e))?);
        self.udp = Some(udp);
        self.init_endpoint();
        Ok(())
    }

    /// Sets the queue geometry from the options (librdmacm's `ds_init_ep` and
    /// `ds_set_qp_size`) and allocates the UDP staging slots.
    fn init_endpoint(&mut self) {
        let (max_qp_wr, max_inline, mtu) = self
            .ctx
            .with_device(|d, _, _| (d.attr().max_qp_wr, d.attr().max_inline_data, d.attr().mtu));
        let qmax = max_qp_wr.clamp(1, RS_QP_MAX_SIZE);
        let slots = |size: u32, buf: u32| size.min(qmax).min(buf / SLOT as u32).max(1);
        let geom = Geometry {
            sq: slots(self.opts.sq_size, self.opts.sbuf),
            rq: slots(self.opts.rq_size, self.opts.rbuf),
            inline: self.opts.inline.min(max_inline).min(INLINE_MAX as u32),
            mtu,
        };
        let n = geom.rq.min(UDP_STAGING_MAX);
        self.staging = Staging::new(n as u16);
        self.rx = VecDeque::with_capacity(self.staging.len());
        self.geom = Some(geom);
    }

    /// Binds to the unspecified address of `dest`'s family if not bound yet.
    fn ensure_bound(&mut self, dest: &SocketAddr) -> Result<(), RsError> {
        if self.udp.is_none() {
            self.bind_addr(unspecified(dest.is_ipv6()))?;
        }
        Ok(())
    }

    fn check_family(&self, dest: &SocketAddr) -> Result<(), RsError> {
        match self.local {
            Some(l) if l.is_ipv6() != dest.is_ipv6() => Err(RsError::Invalid),
            _ => Ok(()),
        }
    }

    /// The largest payload a datagram to `dest` may carry: [`MAX_PAYLOAD_V4`] or
    /// [`MAX_PAYLOAD_V6`], less if the device MTU is smaller than a slot.
    pub fn max_payload(&self, dest: &SocketAddr) -> usize {
        let mtu = match self.geom {
            Some(g) => g.mtu,
            None => self.ctx.with_device(|d, _, _| d.attr().mtu),
        } as usize;
        let (udp_max, ud_hdr) = if dest.is_ipv6() {
            (MAX_PAYLOAD_V6, usize::from(DS_IPV6_HDR_LEN))
        } else {
            (MAX_PAYLOAD_V4, usize::from(DS_IPV4_HDR_LEN))
        };
        udp_max.min(mtu.min(SLOT).saturating_sub(ud_hdr))
    }

    // --------------------------------------------------------------------------------------
    // Progress
    // --------------------------------------------------------------------------------------

    /// Runs one progress step (see the [module docs](self)): completions, the UDP socket,
    /// received datagrams. Returns the work done (0 when idle). Call it from an lcore loop
    /// to keep handshakes and send slots moving without sending or receiving.
    pub fn progress(&mut self) -> usize {
        self.step(false)
    }

    /// Runs `op` after a progress step; on a blocking socket, repeats until it does not
    /// return `WouldBlock` or `timeout` passes (then `WouldBlock`, as a timed-out
    /// `recvfrom(2)` returns `EAGAIN`).
    fn blocking<T>(
        &mut self,
        dontwait: bool,
        timeout: Option<Duration>,
        mut op: impl FnMut(&mut Self) -> Result<T, RsError>,
    ) -> Result<T, RsError> {
        let nonblocking = self.nonblocking || dontwait;
        let mut w = Waiter::new(self.polling_time);
        loop {
            self.step(w.spun_out());
            match op(self) {
                Err(RsError::WouldBlock) if !nonblocking => {}
                r => return r,
            }
            if w.expired(timeout) {
                return Err(RsError::WouldBlock);
            }
            w.wait();
        }
    }

    // --------------------------------------------------------------------------------------
    // Sending
    // --------------------------------------------------------------------------------------

    /// Sends one datagram to `dest` (`rsendto`), binding the socket first if needed. Blocks
    /// (unless non-blocking) while every send slot is in flight. Returns the payload length.
    ///
    /// # Errors
    /// `MsgSize` beyond [`max_payload`](Self::max_payload); `Invalid` for an address of the
    /// other family; `WouldBlock` (non-blocking, no free slot, or the write timeout
    /// passed); `NoMemory` when the destination map is full; UDP socket errors.
    pub fn send_to(&mut self, buf: &[u8], dest: SocketAddr) -> Result<usize, RsError> {
        self.send_to_with(buf, dest, SendFlagsRs::default())
    }

    /// [`send_to`](Self::send_to) with flags (`MSG_DONTWAIT`).
    ///
    /// # Errors
    /// As [`send_to`](Self::send_to).
    pub fn send_to_with(
        &mut self,
        buf: &[u8],
        dest: SocketAddr,
        flags: SendFlagsRs,
    ) -> Result<usize, RsError> {
        self.ensure_bound(&dest)?;
        self.check_family(&dest)?;
        if buf.len() > self.max_payload(&dest) {
            return Err(RsError::MsgSize);
        }
        let key = dest_key(dest);
        self.ensure_dest(key)?;
        let timeout = self.write_timeout;
        self.blocking(flags.dontwait, timeout, |s| s.try_send(buf, key))
    }

    /// Sends to the connected peer (`rsend`).
    ///
    /// # Errors
    /// `NotConnected` without [`connect`](Self::connect); then as [`send_to`](Self::send_to).
    pub fn send(&mut self, buf: &[u8]) -> Result<usize, RsError> {
        self.send_with(buf, SendFlagsRs::default())
    }

    /// [`send`](Self::send) with flags.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_with(&mut self, buf: &[u8], flags: SendFlagsRs) -> Result<usize, RsError> {
        let peer = self.peer.ok_or(RsError::NotConnected)?;
        self.send_to_with(buf, peer, flags)
    }

    fn try_send(&mut self, buf: &[u8], key: SocketAddr) -> Result<usize, RsError> {
        let (Some(d), Some(local)) = (self.dests.get_mut(&key), self.local) else {
            return Err(RsError::Invalid);
        };
        let q = &mut self.qps[usize::from(d.qp)];
        if let Some(ah) = &d.ah {
            let hdr = DsHeader {
                port: local.port(),
                addr: q.ip,
                flowinfo: 0,
            };
            q.send(ah, &hdr, buf)?;
            self.stats.ud_sent += 1;
            return Ok(buf.len());
        }
        let Some(udp) = &self.udp else {
            return Err(RsError::Invalid);
        };
        let h = DsUdpHeader {
            op: RsOp::Data,
            qpn: q.qpn(),
            addr: q.ip,
        };
        let hl = h.buffer_len();
        h.emit(&mut self.udp_out[..hl]);
        self.udp_out[hl..hl + buf.len()].copy_from_slice(buf);
        udp.send_to(&self.udp_out[..hl + buf.len()], key)
            .map_err(|e| io_err(&e))?;
        self.stats.udp_sent += 1;
        if !d.awaiting && d.failed_qpn.is_none() {
            d.awaiting = true;
            self.awaiting += 1;
        }
        self.await_until = self.steps + AWAIT_STEPS;
        self.udp_hot = UDP_HOT_STEPS;
        Ok(buf.len())
    }

    // --------------------------------------------------------------------------------------
    // Receiving
    // --------------------------------------------------------------------------------------

    /// Receives one datagram (`rrecvfrom`): copies `min(buf.len(), datagram)` bytes and
    /// returns that count and the sender. The rest of a longer datagram is dropped; use
    /// [`recv_msg`](Self::recv_msg) to learn its full length.
    ///
    /// # Errors
    /// `WouldBlock` (non-blocking and nothing queued, or the read timeout passed);
    /// `Invalid` if the socket is not bound.
    pub fn recv_from(&mut self, buf: &mut [u8]) -> Result<(usize, SocketAddr), RsError> {
        self.recv_msg(buf, RecvFlags::default())
            .map(|m| (m.len, m.src))
    }

    /// [`recv_from`](Self::recv_from) with flags: `MSG_PEEK` leaves the datagram queued,
    /// `MSG_DONTWAIT` does not block; `MSG_WAITALL` means nothing for datagrams.
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    pub fn recv_from_with(
        &mut self,
        buf: &mut [u8],
        flags: RecvFlags,
    ) -> Result<(usize, SocketAddr), RsError> {
        self.recv_msg(buf, flags).map(|m| (m.len, m.src))
    }

    /// Receives from the connected peer (`rrecv`).
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, RsError> {
        self.recv_msg(buf, RecvFlags::default()).map(|m| m.len)
    }

    /// Receives one datagram and reports its full length too, so truncation is visible
    /// (`recvmsg(2)`'s `MSG_TRUNC`).
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    pub fn recv_msg(&mut self, buf: &mut [u8], flags: RecvFlags) -> Result<RecvMeta, RsError> {
        if self.udp.is_none() {
            return Err(RsError::Invalid);
        }
        let timeout = self.read_timeout;
        self.blocking(flags.dontwait, timeout, |s| s.try_recv(buf, flags.peek))
    }

    fn try_recv(&mut self, buf: &mut [u8], peek: bool) -> Result<RecvMeta, RsError> {
        let Some(m) = self.rx.front().copied() else {
            return Err(RsError::WouldBlock);
        };
        let (off, len) = (usize::from(m.off), usize::from(m.len));
        let n = len.min(buf.len());
        match m.loc {
            Loc::Ud { qp, slot } => self.qps[usize::from(qp)].read(slot, off, &mut buf[..n]),
            Loc::Udp { slot } => buf[..n].copy_from_slice(self.staging.bytes(slot, off, n)),
        }
        if !peek {
            self.rx.pop_front();
            match m.loc {
                Loc::Ud { qp, slot } => {
                    self.qps[usize::from(qp)].post_recv(slot);
                }
                Loc::Udp { slot } => self.staging.release(slot),
            }
            if n < len {
                self.stats.truncated += 1;
            }
        }
        Ok(RecvMeta {
            len: n,
            msg_len: len,
            src: m.src,
        })
    }

    // --------------------------------------------------------------------------------------
    // Socket state
    // --------------------------------------------------------------------------------------

    /// Connects to `addr` (`rconnect`): [`send`](Self::send) and [`recv`](Self::recv) use
    /// it, and only its datagrams are received from now on (the UDP socket is connected
    /// too; datagrams from others on the UD path are dropped and counted in
    /// [`DgramStats::filtered`]). Binds first if needed.
    ///
    /// # Errors
    /// `Invalid` for an address of the other family; UDP socket errors.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<(), RsError> {
        self.ensure_bound(&addr)?;
        self.check_family(&addr)?;
        let key = dest_key(addr);
        if let Some(udp) = &self.udp {
            udp.connect(key).map_err(|e| io_err(&e))?;
            // Connecting a socket bound to the unspecified address fixes its source address.
            self.local = udp.local_addr().ok().or(self.local);
        }
        self.ensure_dest(key)?;
        self.peer = Some(key);
        Ok(())
    }

    /// Sets `O_NONBLOCK`.
    pub fn set_nonblocking(&mut self, on: bool) {
        self.nonblocking = on;
    }

    /// `O_NONBLOCK`.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Sets how long a blocking receive waits (`SO_RCVTIMEO`; `None`: forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Sets how long a blocking send waits for a free slot (`SO_SNDTIMEO`).
    pub fn set_write_timeout(&mut self, t: Option<Duration>) {
        self.write_timeout = t;
    }

    /// Readiness after one progress step (which always looks at the UDP socket): readable
    /// if a datagram is queued, writable if every queue pair has a free send slot (a
    /// socket without one yet sends over UDP).
    pub fn readiness(&mut self) -> Ready {
        self.step(true);
        Ready {
            readable: !self.rx.is_empty(),
            writable: self.qps.iter().all(DsQp::can_send),
            hup: false,
            err: false,
        }
    }

    /// The bound address (`rgetsockname`).
    ///
    /// # Errors
    /// `NotConnected` if the socket is not bound.
    pub fn local_addr(&self) -> Result<SocketAddr, RsError> {
        self.local.ok_or(RsError::NotConnected)
    }

    /// The connected peer (`rgetpeername`).
    ///
    /// # Errors
    /// `NotConnected` without [`connect`](Self::connect).
    pub fn peer_addr(&self) -> Result<SocketAddr, RsError> {
        self.peer.ok_or(RsError::NotConnected)
    }

    /// Sets an option. Queue sizes (`SO_SNDBUF`, `SO_RCVBUF`, `RDMA_*`) count only before
    /// the socket is bound: afterwards buffer sizes are kept silently and `RDMA_*` options
    /// fail, as in librdmacm. Options are not applied to the UDP socket.
    ///
    /// # Errors
    /// `Invalid` as [`SockOpts::set`] says.
    pub fn set_option(&mut self, opt: SockOpt) -> Result<(), RsError> {
        self.opts.set(opt, self.geom.is_some())
    }

    /// Reads an option.
    pub fn option(&self, name: SockOptName) -> SockOpt {
        self.opts.get(name)
    }

    /// Send and receive slots per queue pair, once bound.
    pub fn slots(&self) -> Option<(u32, u32)> {
        self.geom.map(|g| (g.sq, g.rq))
    }

    /// Datagrams queued for the application.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }

    /// The socket's counters.
    pub fn stats(&self) -> DgramStats {
        self.stats
    }
}

impl<P: Provider> Drop for RsDatagram<P> {
    /// Waits (at most a second) for sends in flight, as librdmacm's close does, so no
    /// queue pair is destroyed under a send it still reads.
    fn drop(&mut self) {
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        let mut w = Waiter::new(self.polling_time);
        while self.qps.iter().any(|q| q.outstanding() > 0) && Instant::now() < deadline {
            for q in &mut self.qps {
                let n = q.poll(&mut self.scratch);
                for c in &self.scratch[..n] {
                    if q.recv_slot(c).is_none() {
                        q.complete_send(c);
                    }
                }
            }
            w.wait();
        }
    }
}
