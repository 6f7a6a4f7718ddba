//! The rsocket context: sockets over one fabric device, with all progress made inside API
//! calls (or by an lcore poller calling [`RsContext::progress`]).
//!
//! A context owns the device's protection domain, one CM event channel, the buffer arena
//! and every socket made from it. Sockets are named by [`SockId`], like file descriptors;
//! [`RsStream`](super::RsStream) and [`RsListener`](super::RsListener) wrap them for Rust
//! callers, and the C library uses the ids directly. Each stream socket has its own queue
//! pair and completion queue, as in librdmacm; nothing runs in the background: credits,
//! completions and connection events are processed when the application calls in.
//!
//! A context is `Send + Sync` (an `Arc` of a spin lock inside: uncontended except by its CM thread); for parallelism use one context
//! per thread or lcore, as DPDK applications use one queue per lcore.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use dp_fabric::sync::{SpinGuard, SpinLock};
use std::time::{Duration, Instant as StdInstant};

use lcore::time::{Clock, RealClock};
use mempool::memory::Region;

use crate::arena::{ARENA_CHUNK, Arena, SockBufs};
use crate::conn::{Buf, Local, Ready, RsIo, RsWr, Shutdown, StreamConn};
use crate::error::{RsError, fabric_err};
use crate::opts::{RsConfig, SockOpt, SockOptName, SockOpts};
use crate::wait::Waiter;
use crate::wire::{ConnData, ConnDataRepr, RsSge};
use dp_fabric::{
    Access, CmChannel, CmEvent, Completion, CompletionQueue, ConnId, ConnRequest, Device,
    FabricError, ListenId, MemoryRegion, Payload, PostError, ProtectionDomain, Provider, QpCaps,
    QpInit, RcQueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
};
use dp_wire::Error as WireError;

/// Names a socket of a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockId(pub u32);

/// Flags of `send`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlagsRs {
    /// `MSG_DONTWAIT`: do not block even on a blocking socket.
    pub dontwait: bool,
}

/// Flags of `recv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// `MSG_DONTWAIT`.
    pub dontwait: bool,
    /// `MSG_PEEK`: copy without consuming.
    pub peek: bool,
    /// `MSG_WAITALL`: block until the buffer is full (or end of stream / error).
    pub waitall: bool,
}

/// How long a blocking connect or graceful close waits at most.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

struct Listening {
    id: ListenId,
    addr: SocketAddr,
    backlog: usize,
    /// Connections accepted in the background, waiting for `accept` to hand them out.
    accepted: VecDeque<SockId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Connecting,
    Established,
}

struct Stream<P: Provider> {
    conn: StreamConn,
    qp: P::Qp,
    cq: P::Cq,
    conn_id: ConnId,
    bufs: SockBufs<P>,
    phase: Phase,
    local: SocketAddr,
    peer: SocketAddr,
    maps: Vec<IoMapping<P>>,
}

struct IoMapping<P: Provider> {
    addr: u64,
    len: usize,
    index: Option<u32>,
    _mr: P::Mr,
}

enum Kind<P: Provider> {
    Fresh,
    Listening(Listening),
    Stream(Box<Stream<P>>),
    Failed(RsError),
}

struct Sock<P: Provider> {
    opts: SockOpts,
    nonblocking: bool,
    bound: Option<SocketAddr>,
    kind: Kind<P>,
    so_error: Option<RsError>,
}

/// The state machine's I/O through a real queue pair and arena buffers.
struct Io<'a, P: Provider> {
    qp: &'a mut P::Qp,
    bufs: &'a SockBufs<P>,
}

impl<P: Provider> RsIo for Io<'_, P> {
    fn read(&self, buf: Buf, off: u32, dst: &mut [u8]) {
        self.bufs
            .mem
            .copy_out(self.bufs.offset(buf) + off as usize, dst);
    }

    fn write(&mut self, buf: Buf, off: u32, src: &[u8]) {
        self.bufs
            .mem
            .copy_in(self.bufs.offset(buf) + off as usize, src);
    }

    fn post_send(&mut self, wr: &RsWr<'_>) -> Result<(), PostError> {
        let op = match wr.imm {
            Some(i) => SendOp::WriteImm(wr.remote, i),
            None => SendOp::Write(wr.remote),
        };
        let sge = |s: super::conn::Seg| Sge {
            addr: self.bufs.addr(s.buf, s.off),
            length: s.len,
            lkey: self.bufs.lkey,
        };
        let mut list = [Sge::default(); 2];
        let payload = match wr.local {
            Local::Empty => Payload::Sgl(&[]),
            Local::Inline(b) => Payload::Inline(b),
            Local::Segs(a, b) => {
                list[0] = sge(a);
                match b {
                    Some(b) => {
                        list[1] = sge(b);
                        Payload::Sgl(&list[..2])
                    }
                    None => Payload::Sgl(&list[..1]),
                }
            }
        };
        self.qp.post_send(&[SendWr {
            wr_id: wr.wr_id,
            op,
            payload,
            flags: SendFlags::SIGNALED,
        }])
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), PostError> {
        self.qp.post_recv(&[RecvWr { wr_id, sgl: &[] }])
    }
}

impl<P: Provider> Stream<P> {
    fn io(&mut self) -> (&mut StreamConn, Io<'_, P>) {
        (
            &mut self.conn,
            Io {
                qp: &mut self.qp,
                bufs: &self.bufs,
            },
        )
    }

    /// Polls this socket's completions into its state machine; returns the work done.
    fn progress(&mut self, scratch: &mut [Completion]) -> usize {
        let mut work = 0;
        loop {
            let n = self.cq.poll(scratch);
            for c in &scratch[..n] {
                let (conn, mut io) = self.io();
                conn.handle_completion(c, &mut io);
            }
            work += n;
            if n < scratch.len() {
                break;
            }
        }
        if self.phase == Phase::Established {
            let (conn, mut io) = self.io();
            conn.after_completions(&mut io);
        }
        work
    }
}

/// Posts a new connection's initial receives on its queue pair (the `prepare` hook of
/// connect and accept).
fn post_initial_recvs<P: Provider>(
    conn: &mut StreamConn,
    qp: &mut P::Qp,
    bufs: &SockBufs<P>,
) -> Result<(), FabricError> {
    let rq = conn.config().rq_size;
    conn.post_initial_recvs(&mut Io { qp, bufs })
        .map_err(|_| FabricError::Exhausted {
            what: "receives on a new queue pair",
            limit: u64::from(rq),
            hint: "lower the receive queue size (RDMA_RQSIZE) or raise the provider's limit",
        })
}

pub(crate) struct Ctx<P: Provider> {
    /// Declared first so it stops (and joins) the CM thread before the CM channel closes.
    cm_thread: Option<CmThread>,
    dev: P::Device,
    pd: P::Pd,
    cm: P::Cm,
    arena: Arena<P>,
    socks: Vec<Option<Sock<P>>>,
    free_ids: Vec<u32>,
    by_conn: HashMap<ConnId, SockId>,
    by_listen: HashMap<ListenId, SockId>,
    cfg: RsConfig,
    clock: RealClock,
    scratch: Vec<Completion>,
    keepalive_socks: usize,
}

impl<P: Provider> Ctx<P> {
    fn sock(&mut self, id: SockId) -> Result<&mut Sock<P>, RsError> {
        self.socks
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(RsError::BadSocket)
    }

    fn stream(&mut self, id: SockId) -> Result<&mut Stream<P>, RsError> {
        match &mut self.sock(id)?.kind {
            Kind::Stream(s) => Ok(s),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    fn alloc_id(&mut self, s: Sock<P>) -> SockId {
        match self.free_ids.pop() {
            Some(i) => {
                self.socks[i as usize] = Some(s);
                SockId(i)
            }
            None => {
                self.socks.push(Some(s));
                SockId(self.socks.len() as u32 - 1)
            }
        }
    }

    fn new_sock(&self, opts: SockOpts, nonblocking: bool) -> Sock<P> {
        Sock {
            opts,
            nonblocking,
            bound: None,
            kind: Kind::Fresh,
            so_error: None,
        }
    }

    /// Processes CM events and every socket's completions.
    fn progress(&mut self) -> usize {
        let mut work = self.cm_events();
        let (socks, scratch) = (&mut self.socks, &mut self.scratch);
        for s in socks.iter_mut().flatten() {
            if let Kind::Stream(st) = &mut s.kind {
                work += st.progress(scratch);
            }
        }
        if self.keepalive_socks > 0 {
            let now = self.clock.now();
            for s in self.socks.iter_mut().flatten() {
                if let Kind::Stream(st) = &mut s.kind
                    && st.conn.poll_timeout().is_some_and(|t| t <= now)
                {
                    let (conn, mut io) = st.io();
                    conn.handle_timeout(now, &mut io);
                    work += 1;
                }
            }
        }
        work
    }

    /// Progress for one socket only (plus connection events): the cheap path of a
    /// blocking call on that socket.
    fn progress_one(&mut self, id: SockId) -> usize {
        let mut work = self.cm_events();
        let scratch = &mut self.scratch;
        if let Some(Some(Sock {
            kind: Kind::Stream(st),
            ..
        })) = self.socks.get_mut(id.0 as usize)
        {
            work += st.progress(scratch);
        }
        work
    }

    fn cm_events(&mut self) -> usize {
        let mut n = 0;
        while let Some(ev) = self.cm.poll_event() {
            n += 1;
            self.on_cm(ev);
        }
        n
    }

    fn on_cm(&mut self, ev: CmEvent<P>) {
        let now = self.clock.now();
        match ev {
            CmEvent::ConnectRequest { listener, request } => {
                let Some(&id) = self.by_listen.get(&listener) else {
                    let _ = self.cm.reject(request, &[]);
                    return;
                };
                let room = matches!(self.sock(id), Ok(Sock { kind: Kind::Listening(l), .. }) if l.accepted.len() < l.backlog);
                if !room {
                    let _ = self.cm.reject(request, &[]);
                    return;
                }
                // Accept at once, as librdmacm's listen service thread does: connects
                // complete whether or not the application is in `accept`.
                if let Ok(new) = self.accept_request(id, request)
                    && let Ok(Sock {
                        kind: Kind::Listening(l),
                        ..
                    }) = self.sock(id)
                {
                    l.accepted.push_back(new);
                }
            }
            CmEvent::Established { conn, private_data } => {
                let Some(&id) = self.by_conn.get(&conn) else {
                    return;
                };
                let Ok(sock) = self.sock(id) else {
                    return;
                };
                let Kind::Stream(st) = &mut sock.kind else {
                    return;
                };
                let peer = match st.phase {
                    Phase::Connecting => ConnData::new_checked(private_data.as_bytes())
                        .and_then(|p| ConnDataRepr::parse(&p)),
                    // Accepted sockets are established at accept; the RTU adds nothing.
                    Phase::Established => return,
                };
                let r = match peer {
                    Ok(p) => {
                        let (c, mut io) = st.io();
                        c.establish(&p, &mut io, now)
                            .map(|()| st.phase = Phase::Established)
                            .map_err(|_| RsError::ConnRefused)
                    }
                    // rsocket: a REP of another version fails the connect with ENOTSUP.
                    Err(WireError::Version) => Err(RsError::NotSupported),
                    Err(_) => Err(RsError::ConnRefused),
                };
                match r {
                    Ok(()) => {
                        if sock.opts.keepalive {
                            st.conn.set_keepalive(Some(sock.opts.keepidle), now);
                        }
                    }
                    Err(e) => {
                        let cid = st.conn_id;
                        self.fail_socket(id, e);
                        let _ = self.cm.disconnect(cid);
                    }
                }
            }
            CmEvent::Rejected { conn, .. } | CmEvent::Unreachable { conn, .. } => {
                if let Some(&id) = self.by_conn.get(&conn) {
                    self.fail_socket(id, RsError::ConnRefused);
                }
            }
            CmEvent::Disconnected { conn } => {
                let Some(&id) = self.by_conn.get(&conn) else {
                    return;
                };
                let scratch = &mut self.scratch;
                if let Some(Some(Sock {
                    kind: Kind::Stream(st),
                    ..
                })) = self.socks.get_mut(id.0 as usize)
                {
                    // Deliver what arrived before the disconnect (the peer's DISCONNECT
                    // message travels ahead of the CM's), then treat anything abrupt as a
                    // reset.
                    st.progress(scratch);
                    if st.phase == Phase::Established {
                        st.conn.peer_gone();
                    } else {
                        self.fail_socket(id, RsError::ConnRefused);
                    }
                }
            }
            CmEvent::DeviceRemoval => {
                for s in self.socks.iter_mut().flatten() {
                    if let Kind::Stream(st) = &mut s.kind {
                        st.conn.fail(RsError::Io);
                    }
                }
            }
        }
    }

    /// A connect failed: the socket reports the error once (`SO_ERROR`), then `ENOTCONN`.
    fn fail_socket(&mut self, id: SockId, e: RsError) {
        let Ok(sock) = self.sock(id) else {
            return;
        };
        let old = std::mem::replace(&mut sock.kind, Kind::Failed(e));
        sock.so_error = Some(e);
        if let Kind::Stream(st) = old {
            self.by_conn.remove(&st.conn_id);
            self.release_stream(*st);
        }
    }

    fn release_stream(&mut self, st: Stream<P>) {
        let Stream {
            qp, cq, bufs, maps, ..
        } = st;
        drop(maps);
        drop(qp);
        drop(cq);
        self.arena.free(bufs);
    }

    fn new_stream(
        &mut self,
        opts: &SockOpts,
    ) -> Result<(StreamConn, SockBufs<P>, P::Cq, QpCaps), RsError> {
        let attr = self.dev.attr();
        let cfg = opts.stream_config(attr.max_qp_wr, attr.max_inline_data);
        let bufs = self.arena.stream_bufs(&self.pd, &cfg)?;
        let conn = StreamConn::new(cfg, bufs.keys());
        let cq = match self.dev.create_cq(cfg.sq_size + cfg.rq_size) {
            Ok(c) => c,
            Err(e) => {
                self.arena.free(bufs);
                return Err(fabric_err(&e));
            }
        };
        let caps = QpCaps {
            max_send_wr: cfg.sq_size,
            max_recv_wr: cfg.rq_size,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: cfg.sq_inline,
        };
        Ok((conn, bufs, cq, caps))
    }

    fn connect(&mut self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
        let sock = self.sock(id)?;
        match &sock.kind {
            Kind::Fresh => {}
            Kind::Stream(st) if st.phase == Phase::Established => return Err(RsError::IsConnected),
            Kind::Stream(_) => return Err(RsError::InProgress),
            Kind::Failed(_) => return Err(RsError::NotConnected),
            Kind::Listening(_) => return Err(RsError::Invalid),
        }
        let opts = sock.opts.clone();
        let (mut conn, bufs, cq, caps) = self.new_stream(&opts)?;
        let pdata = conn.conn_data().to_bytes();
        let init = QpInit {
            pd: &self.pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        // Receives go in before the request leaves (`rs_create_ep` before `rdma_connect`).
        let r = self.cm.connect_prepared(addr, &init, &pdata, &mut |qp| {
            post_initial_recvs(&mut conn, qp, &bufs)
        });
        let (conn_id, qp) = match r {
            Ok(x) => x,
            Err(e) => {
                self.arena.free(bufs);
                return Err(fabric_err(&e));
            }
        };
        let local = self.cm.conn_addrs(conn_id).map_or(addr, |(l, _)| l);
        let mut st = Box::new(Stream {
            conn,
            qp,
            cq,
            conn_id,
            bufs,
            phase: Phase::Connecting,
            local,
            peer: addr,
            maps: Vec::new(),
        });
        st.conn.clamp_inline(st.qp.caps().max_inline_data);
        self.sock(id)?.kind = Kind::Stream(st);
        self.by_conn.insert(conn_id, id);
        Ok(())
    }

    /// Hands out a connection accepted in the background.
    fn accept(&mut self, lid: SockId) -> Result<SockId, RsError> {
        let sock = self.sock(lid)?;
        let Kind::Listening(l) = &mut sock.kind else {
            return Err(RsError::Invalid);
        };
        l.accepted.pop_front().ok_or(RsError::WouldBlock)
    }

    /// Accepts one connection request on listener `lid` into a new socket.
    fn accept_request(&mut self, lid: SockId, request: P::ConnRequest) -> Result<SockId, RsError> {
        let (opts, nonblocking) = {
            let sock = self.sock(lid)?;
            (sock.opts.clone(), sock.nonblocking)
        };
        let Ok(peer) =
            ConnData::new_checked(request.private_data()).and_then(|p| ConnDataRepr::parse(&p))
        else {
            // librdmacm rejects requests of another version (or malformed ones).
            let _ = self.cm.reject(request, &[]);
            return Err(RsError::NotSupported);
        };
        let (peer_addr, local_addr) = (request.peer_addr(), request.local_addr());
        let (mut conn, bufs, cq, caps) = match self.new_stream(&opts) {
            Ok(x) => x,
            Err(e) => {
                let _ = self.cm.reject(request, &[]);
                return Err(e);
            }
        };
        let pdata = conn.conn_data().to_bytes();
        let init = QpInit {
            pd: &self.pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        // Receives go in before the reply leaves, as rsocket posts them before
        // `rdma_accept`: the peer may send the moment it has the reply.
        let r = self.cm.accept_prepared(request, &init, &pdata, &mut |qp| {
            post_initial_recvs(&mut conn, qp, &bufs)
        });
        let (conn_id, qp) = match r {
            Ok(x) => x,
            Err(e) => {
                self.arena.free(bufs);
                return Err(fabric_err(&e));
            }
        };
        let mut st = Box::new(Stream {
            conn,
            qp,
            cq,
            conn_id,
            bufs,
            phase: Phase::Established,
            local: local_addr,
            peer: peer_addr,
            maps: Vec::new(),
        });
        st.conn.clamp_inline(st.qp.caps().max_inline_data);
        {
            // The accepted queue pair can send at once (as after rdma_accept), so the
            // connection is established now, with the peer's data from its request.
            let now = self.clock.now();
            let (c, mut io) = st.io();
            c.establish(&peer, &mut io, now)?;
            if opts.keepalive {
                c.set_keepalive(Some(opts.keepidle), now);
            }
        }
        if opts.keepalive {
            self.keepalive_socks += 1;
        }
        // Accepted sockets inherit the listener's options and O_NONBLOCK, as in librdmacm
        // (unlike Linux accept).
        let mut s = self.new_sock(opts, nonblocking);
        s.kind = Kind::Stream(st);
        let id = self.alloc_id(s);
        self.by_conn.insert(conn_id, id);
        Ok(id)
    }

    fn listen(&mut self, id: SockId, backlog: u32) -> Result<(), RsError> {
        let sock = self.sock(id)?;
        match sock.kind {
            Kind::Listening(_) => return Ok(()),
            Kind::Fresh => {}
            _ => return Err(RsError::Invalid),
        }
        let addr = sock.bound.ok_or(RsError::Invalid)?;
        let lid = self
            .cm
            .listen(addr, backlog.max(1))
            .map_err(|e| fabric_err(&e))?;
        let bound = self.cm.listen_addr(lid).unwrap_or(addr);
        let sock = self.sock(id)?;
        sock.bound = Some(bound);
        sock.kind = Kind::Listening(Listening {
            id: lid,
            addr: bound,
            backlog: backlog.clamp(1, 4096) as usize,
            accepted: VecDeque::new(),
        });
        self.by_listen.insert(lid, id);
        Ok(())
    }

    fn send(&mut self, id: SockId, data: &[u8]) -> Result<usize, RsError> {
        let st = self.stream(id)?;
        match st.phase {
            Phase::Established => {}
            _ => return Err(RsError::WouldBlock),
        }
        let (c, mut io) = st.io();
        c.send(data, &mut io)
    }

    fn recv(&mut self, id: SockId, buf: &mut [u8], peek: bool) -> Result<usize, RsError> {
        let st = self.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::WouldBlock);
        }
        let (c, mut io) = st.io();
        let r = c.recv(buf, peek, &io);
        if matches!(r, Ok(n) if n > 0) && !peek {
            // Return credits at once: senders stall otherwise.
            c.after_completions(&mut io);
        }
        r
    }

    fn readiness(&mut self, id: SockId) -> Result<Ready, RsError> {
        let sock = self.sock(id)?;
        Ok(match &mut sock.kind {
            Kind::Fresh => Ready::default(),
            Kind::Listening(l) => Ready {
                readable: !l.accepted.is_empty(),
                ..Ready::default()
            },
            Kind::Failed(_) => Ready {
                readable: true,
                writable: true,
                hup: false,
                err: true,
            },
            Kind::Stream(st) => match st.phase {
                Phase::Established => {
                    let (c, io) = st.io();
                    c.readiness(&io)
                }
                _ => Ready::default(),
            },
        })
    }

    fn close(&mut self, id: SockId) -> Option<(ConnId, bool)> {
        let sock = self.socks.get_mut(id.0 as usize)?.take()?;
        self.free_ids.push(id.0);
        match sock.kind {
            Kind::Listening(l) => {
                self.by_listen.remove(&l.id);
                let _ = self.cm.stop_listen(l.id);
                // Connections accepted in the background but never handed out are reset.
                for a in l.accepted {
                    if let Some((cid, _)) = self.close(a) {
                        let _ = self.cm.disconnect(cid);
                    }
                }
                None
            }
            Kind::Stream(st) => {
                if sock.opts.keepalive {
                    self.keepalive_socks = self.keepalive_socks.saturating_sub(1);
                }
                let cid = st.conn_id;
                self.by_conn.remove(&cid);
                self.release_stream(*st);
                Some((cid, true))
            }
            Kind::Fresh | Kind::Failed(_) => None,
        }
    }
}

/// The context's connection-manager thread: it blocks in `poll(2)` on the CM channel and,
/// when events arrive, takes the context lock and processes them, accepting connection
/// requests into their listeners' backlogs as librdmacm's listen service thread does. So a
/// connect completes whether or not the peer application is inside `accept`, and a
/// single-threaded program can connect to itself. It never touches the data path.
struct CmThread {
    stop: Arc<dp_fabric::sys::EventFd>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl CmThread {
    fn spawn<P: Provider>(
        ctx: std::sync::Weak<SpinLock<Ctx<P>>>,
        event_fd: std::os::fd::RawFd,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(dp_fabric::sys::EventFd::new()?);
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("rs-cm".into())
            .spawn(move || {
                use std::os::fd::AsRawFd;
                loop {
                    let Ok(ready) =
                        dp_fabric::sys::poll_readable(&[event_fd, stop2.as_raw_fd()], None)
                    else {
                        return;
                    };
                    if ready & 2 != 0 {
                        return;
                    }
                    let Some(c) = ctx.upgrade() else {
                        return;
                    };
                    c.lock().cm_events();
                    drop(c);
                    if ctx.strong_count() == 0 {
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for CmThread {
    fn drop(&mut self) {
        self.stop.notify();
        if let Some(h) = self.handle.take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

/// A context: sockets over one fabric device.
pub struct RsContext<P: Provider> {
    inner: Arc<SpinLock<Ctx<P>>>,
    polling_time: Duration,
}

impl<P: Provider> Clone for RsContext<P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            polling_time: self.polling_time,
        }
    }
}

impl<P: Provider> std::fmt::Debug for RsContext<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsContext")
            .field("provider", &P::NAME)
            .finish()
    }
}

impl<P: Provider> RsContext<P> {
    /// A context on `dev` with the system defaults ([`RsConfig::from_system`]).
    ///
    /// # Errors
    /// Failing to allocate the protection domain or the CM channel.
    pub fn new(dev: P::Device) -> Result<Self, FabricError> {
        Self::with_config(dev, RsConfig::from_system())
    }

    /// A context with explicit defaults.
    ///
    /// # Errors
    /// As [`RsContext::new`].
    pub fn with_config(dev: P::Device, cfg: RsConfig) -> Result<Self, FabricError> {
        let pd = dev.alloc_pd()?;
        let cm = dev.create_cm_channel()?;
        let polling_time = cfg.polling_time;
        let event_fd = cm.event_fd();
        let ctx = Self {
            inner: Arc::new(SpinLock::new(Ctx {
                cm_thread: None,
                dev,
                pd,
                cm,
                arena: Arena::new(ARENA_CHUNK),
                socks: Vec::new(),
                free_ids: Vec::new(),
                by_conn: HashMap::new(),
                by_listen: HashMap::new(),
                cfg,
                clock: RealClock::new(),
                scratch: vec![Completion::default(); 64],
                keepalive_socks: 0,
            })),
            polling_time,
        };
        let t =
            CmThread::spawn(Arc::downgrade(&ctx.inner), event_fd).map_err(|e| FabricError::Io {
                op: "starting the rsocket connection-manager thread",
                source: e,
            })?;
        ctx.lock().cm_thread = Some(t);
        Ok(ctx)
    }

    fn lock(&self) -> SpinGuard<'_, Ctx<P>> {
        self.inner.lock()
    }

    /// Makes progress on every socket and connection event; returns the work done (0 when
    /// idle). Call it from an lcore poller to serve many sockets from one loop.
    pub fn progress(&self) -> usize {
        self.lock().progress()
    }

    /// Runs `f` with the context's device and protection domain (for socket kinds that
    /// manage their own queue pairs, such as datagram sockets).
    pub(crate) fn with_device<R>(&self, f: impl FnOnce(&P::Device, &P::Pd, &RsConfig) -> R) -> R {
        let c = self.lock();
        f(&c.dev, &c.pd, &c.cfg)
    }

    /// The busy-poll time of blocking calls.
    pub fn polling_time(&self) -> Duration {
        self.polling_time
    }

    /// Sets the busy-poll time of blocking calls (latency-sensitive callers raise it).
    pub fn set_polling_time(&mut self, d: Duration) {
        self.polling_time = d;
    }

    /// Creates a stream socket (`rsocket(AF_INET, SOCK_STREAM, 0)`).
    pub fn socket(&self, nonblocking: bool) -> SockId {
        let mut c = self.lock();
        let opts = SockOpts::new(&c.cfg);
        let s = c.new_sock(opts, nonblocking);
        c.alloc_id(s)
    }

    /// Binds a socket (`rbind`).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket, `EINVAL` once it is in use.
    pub fn bind(&self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
        let mut c = self.lock();
        let s = c.sock(id)?;
        if !matches!(s.kind, Kind::Fresh) {
            return Err(RsError::Invalid);
        }
        s.bound = Some(addr);
        Ok(())
    }

    /// Listens (`rlisten`); idempotent on a listening socket.
    ///
    /// # Errors
    /// `EINVAL` without a bound address; `EADDRINUSE`.
    pub fn listen(&self, id: SockId, backlog: u32) -> Result<(), RsError> {
        self.lock().listen(id, backlog)
    }

    /// Connects (`rconnect`). A non-blocking socket returns [`RsError::InProgress`] and
    /// becomes writable (or reports its error through [`take_error`](Self::take_error)).
    ///
    /// # Errors
    /// `ECONNREFUSED`, `EISCONN`, `EINPROGRESS`, `ETIMEDOUT`, ...
    pub fn connect(&self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
        let nonblocking = {
            let mut c = self.lock();
            c.connect(id, addr)?;
            c.sock(id)?.nonblocking
        };
        if nonblocking {
            self.lock().progress_one(id);
            return if self.is_established(id)? {
                Ok(())
            } else {
                Err(RsError::InProgress)
            };
        }
        let deadline = StdInstant::now() + CONNECT_TIMEOUT;
        let mut w = Waiter::new(self.polling_time);
        loop {
            self.lock().progress_one(id);
            match self.is_established(id) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.lock().sock(id)?.so_error = None;
                    return Err(e);
                }
            }
            if StdInstant::now() > deadline {
                return Err(RsError::TimedOut);
            }
            w.wait();
        }
    }

    fn is_established(&self, id: SockId) -> Result<bool, RsError> {
        let mut c = self.lock();
        match &c.sock(id)?.kind {
            Kind::Stream(st) => Ok(st.phase == Phase::Established),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    /// Accepts a connection (`raccept`).
    ///
    /// # Errors
    /// `EWOULDBLOCK` on a non-blocking listener with nothing pending; `EINVAL` if not
    /// listening.
    pub fn accept(&self, id: SockId) -> Result<SockId, RsError> {
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.lock();
                c.cm_events();
                let r = c.accept(id);
                (r, c.sock(id)?.nonblocking)
            };
            match r {
                Err(RsError::WouldBlock) if !nonblocking => w.wait(),
                other => return other,
            }
        }
    }

    /// Sends (`rsend`). A blocking socket blocks until every byte is queued (not
    /// acknowledged); a non-blocking one returns what it could queue.
    ///
    /// # Errors
    /// `EWOULDBLOCK` (non-blocking, nothing queued), `ECONNRESET` (closed or reset; never
    /// `EPIPE`), `ENOTCONN`.
    pub fn send(&self, id: SockId, data: &[u8], flags: SendFlagsRs) -> Result<usize, RsError> {
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.lock();
                let r = c.send(id, &data[done..]);
                let nb = c.sock(id)?.nonblocking || flags.dontwait;
                if r.is_err() || done + r.unwrap_or(0) < data.len() {
                    c.progress_one(id);
                }
                (r, nb)
            };
            match r {
                Ok(n) => {
                    done += n;
                    if done == data.len() || nonblocking {
                        return Ok(done);
                    }
                    w.reset();
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(RsError::WouldBlock) if done > 0 => return Ok(done),
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if data.is_empty() {
                return Ok(0);
            }
            w.wait();
        }
    }

    /// Receives (`rrecv`): `Ok(0)` at end of stream.
    ///
    /// # Errors
    /// `EWOULDBLOCK` (non-blocking, nothing queued), `ECONNRESET` after a transport error,
    /// `ENOTCONN`.
    pub fn recv(&self, id: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<usize, RsError> {
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.lock();
                let mut r = c.recv(id, &mut buf[done..], flags.peek);
                if matches!(r, Err(RsError::WouldBlock)) {
                    c.progress_one(id);
                    r = c.recv(id, &mut buf[done..], flags.peek);
                }
                (r, c.sock(id)?.nonblocking || flags.dontwait)
            };
            match r {
                Ok(0) => return Ok(done),
                Ok(n) => {
                    done += n;
                    if !flags.waitall || flags.peek || done == buf.len() || nonblocking {
                        return Ok(done);
                    }
                    w.reset();
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if buf.is_empty() {
                return Ok(0);
            }
            w.wait();
        }
    }

    /// Shuts down one or both directions (`rshutdown`); waits (always blocking, as in
    /// librdmacm) until the control message and every send completed.
    ///
    /// # Errors
    /// `ENOTCONN` if not connected.
    pub fn shutdown(&self, id: SockId, how: Shutdown) -> Result<(), RsError> {
        {
            let mut c = self.lock();
            let st = c.stream(id)?;
            if st.phase != Phase::Established {
                return Err(RsError::NotConnected);
            }
            let (conn, mut io) = st.io();
            conn.shutdown(how, &mut io);
        }
        self.wait_sends(id);
        let mut c = self.lock();
        let st = c.stream(id)?;
        if st.conn.is_disconnected() {
            let cid = st.conn_id;
            let _ = c.cm.disconnect(cid);
        }
        Ok(())
    }

    fn wait_sends(&self, id: SockId) {
        let deadline = StdInstant::now() + CLOSE_TIMEOUT;
        let mut w = Waiter::new(self.polling_time);
        loop {
            {
                let mut c = self.lock();
                c.progress_one(id);
                match c.stream(id) {
                    Ok(st) if !st.conn.shutdown_done() => {}
                    _ => return,
                }
            }
            if StdInstant::now() > deadline {
                return;
            }
            w.wait();
        }
    }

    /// Closes a socket (`rclose`): a connected stream shuts down both directions
    /// gracefully first (blocking), then disconnects and frees everything.
    pub fn close(&self, id: SockId) {
        let graceful = {
            let mut c = self.lock();
            match c.stream(id) {
                Ok(st) if st.phase == Phase::Established && st.conn.is_connected() => {
                    let (conn, mut io) = st.io();
                    conn.shutdown(Shutdown::Both, &mut io);
                    true
                }
                _ => false,
            }
        };
        if graceful {
            self.wait_sends(id);
        }
        let mut c = self.lock();
        if let Some((cid, _)) = c.close(id) {
            let _ = c.cm.disconnect(cid);
        }
    }

    /// Sets `O_NONBLOCK`.
    ///
    /// # Errors
    /// `EBADF`.
    pub fn set_nonblocking(&self, id: SockId, on: bool) -> Result<(), RsError> {
        self.lock().sock(id)?.nonblocking = on;
        Ok(())
    }

    /// `O_NONBLOCK`.
    ///
    /// # Errors
    /// `EBADF`.
    pub fn is_nonblocking(&self, id: SockId) -> Result<bool, RsError> {
        Ok(self.lock().sock(id)?.nonblocking)
    }

    /// Readiness after one progress pass on the socket (for `poll`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn readiness(&self, id: SockId) -> Result<Ready, RsError> {
        let mut c = self.lock();
        c.progress_one(id);
        c.readiness(id)
    }

    /// Readiness of many sockets under one lock, without making progress: calls
    /// `f(index, readiness)` for each id.
    pub fn readiness_batch(
        &self,
        ids: &[SockId],
        mut f: impl FnMut(usize, Result<Ready, RsError>),
    ) {
        let mut c = self.lock();
        for (i, id) in ids.iter().enumerate() {
            f(i, c.readiness(*id));
        }
    }

    /// Readiness without making progress (after [`progress`](Self::progress)).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn readiness_now(&self, id: SockId) -> Result<Ready, RsError> {
        self.lock().readiness(id)
    }

    /// Takes the pending socket error (`SO_ERROR`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn take_error(&self, id: SockId) -> Result<Option<RsError>, RsError> {
        let mut c = self.lock();
        let s = c.sock(id)?;
        if let Some(e) = s.so_error.take() {
            return Ok(Some(e));
        }
        Ok(match &mut s.kind {
            Kind::Stream(st) => st.conn.take_so_error(),
            _ => None,
        })
    }

    /// Sets an option (`rsetsockopt`).
    ///
    /// # Errors
    /// `EINVAL` as [`SockOpts::set`] says; `EBADF`.
    pub fn set_option(&self, id: SockId, opt: SockOpt) -> Result<(), RsError> {
        let mut c = self.lock();
        let now = c.clock.now();
        let s = c.sock(id)?;
        let opening = matches!(s.kind, Kind::Stream(_));
        let was_keepalive = s.opts.keepalive;
        s.opts.set(opt, opening)?;
        let keepalive = s.opts.keepalive.then_some(s.opts.keepidle);
        let changed = was_keepalive != s.opts.keepalive;
        if let Kind::Stream(st) = &mut s.kind
            && st.phase == Phase::Established
            && matches!(opt, SockOpt::KeepAlive(_) | SockOpt::KeepIdle(_))
        {
            st.conn.set_keepalive(keepalive, now);
        }
        if changed {
            if keepalive.is_some() {
                c.keepalive_socks += 1;
            } else {
                c.keepalive_socks = c.keepalive_socks.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Reads an option (`rgetsockopt`).
    ///
    /// # Errors
    /// `EBADF`.
    pub fn option(&self, id: SockId, name: SockOptName) -> Result<SockOpt, RsError> {
        Ok(self.lock().sock(id)?.opts.get(name))
    }

    /// Local address (`rgetsockname`).
    ///
    /// # Errors
    /// `EBADF`, `ENOTCONN` when unbound.
    pub fn local_addr(&self, id: SockId) -> Result<SocketAddr, RsError> {
        let mut c = self.lock();
        let s = c.sock(id)?;
        match &s.kind {
            Kind::Stream(st) => Ok(st.local),
            Kind::Listening(l) => Ok(l.addr),
            _ => s.bound.ok_or(RsError::NotConnected),
        }
    }

    /// Peer address (`rgetpeername`).
    ///
    /// # Errors
    /// `EBADF`, `ENOTCONN`.
    pub fn peer_addr(&self, id: SockId) -> Result<SocketAddr, RsError> {
        let mut c = self.lock();
        match &c.sock(id)?.kind {
            Kind::Stream(st) => Ok(st.peer),
            _ => Err(RsError::NotConnected),
        }
    }

    /// Publishes `len` bytes of `region` at `off` for the peer's `riowrite` (`riomap` with
    /// `PROT_WRITE`); `offset` is the application offset (`None`: the buffer's address, as
    /// librdmacm's `-1`). Returns the offset. The registration lives until `iounmap` or
    /// close.
    ///
    /// # Errors
    /// `EINVAL` (not connected, bad range), `ENOMEM` (no free slot at the peer).
    pub fn iomap(
        &self,
        id: SockId,
        region: &Arc<Region>,
        off: usize,
        len: usize,
        offset: Option<u64>,
    ) -> Result<u64, RsError> {
        let mut c = self.lock();
        let pd = c.pd.clone();
        let st = c.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::Invalid);
        }
        let mr = pd
            .reg_region(region, off, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|_| RsError::Invalid)?;
        let addr = mr.addr();
        let offset = offset.unwrap_or(addr);
        let index = st.conn.iomap(
            offset,
            RsSge {
                addr,
                key: mr.rkey(),
                length: u32::try_from(len).map_err(|_| RsError::Invalid)?,
            },
        )?;
        st.maps.push(IoMapping {
            addr,
            len,
            index: Some(index),
            _mr: mr,
        });
        Ok(offset)
    }

    /// [`iomap`](Self::iomap) on raw process memory (`riomap` on a caller's buffer, such as
    /// a `malloc`ed one): registers `[addr, addr + len)` for the peer's direct writes and
    /// publishes it at `offset` (`None`: the buffer's address). Withdraw it with
    /// [`iounmap`](Self::iounmap)`(addr, len)`.
    ///
    /// On the shm provider, memory outside shareable regions is made shareable in place
    /// (see `fabric::shm`'s protection domain docs for what that costs the program).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped and writable until the mapping is withdrawn or
    /// the socket is closed; the peer writes into it at any time meanwhile, so no Rust
    /// reference to it may be alive while it is mapped. On the shm provider, no other
    /// thread may store into the pages holding the range during this call.
    ///
    /// # Errors
    /// `EINVAL` (not connected, or memory the provider cannot register), `ENOMEM` (no free
    /// slot at the peer).
    #[allow(unsafe_code)]
    pub unsafe fn iomap_raw(
        &self,
        id: SockId,
        addr: *mut u8,
        len: usize,
        offset: Option<u64>,
    ) -> Result<u64, RsError> {
        let mut c = self.lock();
        let pd = c.pd.clone();
        let st = c.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::Invalid);
        }
        let length = u32::try_from(len).map_err(|_| RsError::Invalid)?;
        // SAFETY: the range stays mapped and writable while registered, and nothing holds
        // a Rust reference into it: this function's own contract.
        let mr = unsafe { pd.reg_raw(addr, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }
            .map_err(|_| RsError::Invalid)?;
        let addr = mr.addr();
        let offset = offset.unwrap_or(addr);
        let index = st.conn.iomap(
            offset,
            RsSge {
                addr,
                key: mr.rkey(),
                length,
            },
        )?;
        st.maps.push(IoMapping {
            addr,
            len,
            index: Some(index),
            _mr: mr,
        });
        Ok(offset)
    }

    /// Bytes received and not yet read on a stream socket (0 for other sockets).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket.
    pub fn readable_bytes(&self, id: SockId) -> Result<usize, RsError> {
        let mut c = self.lock();
        Ok(match &c.sock(id)?.kind {
            Kind::Stream(st) => st.conn.readable_bytes(),
            _ => 0,
        })
    }

    /// True once a stream socket's connection is established (for `TCP_INFO`).
    ///
    /// # Errors
    /// `EBADF` for an unknown socket.
    pub fn established(&self, id: SockId) -> Result<bool, RsError> {
        let mut c = self.lock();
        Ok(match &c.sock(id)?.kind {
            Kind::Stream(st) => st.phase == Phase::Established && st.conn.is_connected(),
            _ => false,
        })
    }

    /// Withdraws a mapping made with [`iomap`](Self::iomap) (`riounmap`): `addr` and `len`
    /// must match it.
    ///
    /// # Errors
    /// `EINVAL` if no such mapping.
    pub fn iounmap(&self, id: SockId, addr: u64, len: usize) -> Result<(), RsError> {
        let mut c = self.lock();
        let st = c.stream(id)?;
        let i = st
            .maps
            .iter()
            .position(|m| m.addr == addr && m.len == len)
            .ok_or(RsError::Invalid)?;
        let m = st.maps.swap_remove(i);
        if let Some(idx) = m.index {
            st.conn.iounmap(idx);
        }
        Ok(())
    }

    /// Writes directly into the peer's mapping at `offset` (`riowrite`). Blocks like
    /// `send` on a blocking socket.
    ///
    /// # Errors
    /// `EINVAL` (offset not mapped by the peer), `EWOULDBLOCK`, `ECONNRESET`.
    pub fn iowrite(
        &self,
        id: SockId,
        data: &[u8],
        offset: u64,
        flags: SendFlagsRs,
    ) -> Result<usize, RsError> {
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.lock();
                let st = c.stream(id)?;
                let r = if st.phase == Phase::Established {
                    let (conn, mut io) = st.io();
                    conn.iowrite(&data[done..], offset + done as u64, &mut io)
                } else {
                    Err(RsError::WouldBlock)
                };
                c.progress_one(id);
                (r, c.sock(id)?.nonblocking || flags.dontwait)
            };
            match r {
                Ok(n) => {
                    done += n;
                    if done == data.len() || nonblocking {
                        return Ok(done);
                    }
                    w.reset();
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if data.is_empty() {
                return Ok(0);
            }
            w.wait();
        }
    }

    /// Protocol counters of a stream socket.
    ///
    /// # Errors
    /// `ENOTCONN` if not a stream.
    pub fn conn_stats(&self, id: SockId) -> Result<super::conn::ConnStats, RsError> {
        Ok(self.lock().stream(id)?.conn.stats())
    }
}
