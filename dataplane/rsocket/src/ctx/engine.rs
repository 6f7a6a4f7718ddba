//! The state behind a context's lock: the device, protection domain, CM channel, arena
//! and every socket, with the operations the public API performs on them, and the CM
//! thread that feeds connection events in.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dp_fabric::sync::SpinLock;
use lcore::time::{Clock, RealClock};

use super::sock::{Kind, Listening, Phase, Sock, SockId, Stream, post_initial_recvs};
use crate::arena::{Arena, SockBufs};
use crate::conn::{Ready, StreamConn};
use crate::error::{RsError, fabric_err};
use crate::opts::{RsConfig, SockOpts};
use crate::wire::{ConnData, ConnDataRepr};
use dp_fabric::{
    CmChannel, CmEvent, Completion, ConnId, ConnRequest, Device, ListenId, Provider, QpCaps,
    QpInit, RcQueuePair,
};
use dp_wire::Error as WireError;

/// How long a blocking connect or graceful close waits at most.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct Ctx<P: Provider> {
    /// Declared first so it stops (and joins) the CM thread before the CM channel closes.
    pub(super) cm_thread: Option<CmThread>,
    pub(super) dev: P::Device,
    pub(super) pd: P::Pd,
    pub(super) cm: P::Cm,
    pub(super) arena: Arena<P>,
    pub(super) socks: Vec<Option<Sock<P>>>,
    pub(super) free_ids: Vec<u32>,
    pub(super) by_conn: HashMap<ConnId, SockId>,
    pub(super) by_listen: HashMap<ListenId, SockId>,
    pub(super) cfg: RsConfig,
    pub(super) clock: RealClock,
    pub(super) scratch: Vec<Completion>,
    pub(super) keepalive_socks: usize,
}

impl<P: Provider> Ctx<P> {
    pub(super) fn sock(&mut self, id: SockId) -> Result<&mut Sock<P>, RsError> {
        self.socks
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(RsError::BadSocket)
    }

    pub(super) fn stream(&mut self, id: SockId) -> Result<&mut Stream<P>, RsError> {
        match &mut self.sock(id)?.kind {
            Kind::Stream(s) => Ok(s),
            Kind::Failed(e) => Err(*e),
            _ => Err(RsError::NotConnected),
        }
    }

    pub(super) fn alloc_id(&mut self, s: Sock<P>) -> SockId {
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

    pub(super) fn new_sock(&self, opts: SockOpts, nonblocking: bool) -> Sock<P> {
        Sock {
            opts,
            nonblocking,
            bound: None,
            kind: Kind::Fresh,
            so_error: None,
        }
    }

    /// Processes CM events and every socket's completions.
    pub(super) fn progress(&mut self) -> usize {
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
    pub(super) fn progress_one(&mut self, id: SockId) -> usize {
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

    pub(super) fn cm_events(&mut self) -> usize {
        let mut n = 0;
        while let Some(ev) = self.cm.poll_event() {
            n += 1;
            self.on_cm(ev);
        }
        n
    }

    pub(super) fn on_cm(&mut self, ev: CmEvent<P>) {
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
    pub(super) fn fail_socket(&mut self, id: SockId, e: RsError) {
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

    pub(super) fn release_stream(&mut self, st: Stream<P>) {
        let Stream {
            qp, cq, bufs, maps, ..
        } = st;
        drop(maps);
        drop(qp);
        drop(cq);
        self.arena.free(bufs);
    }

    pub(super) fn new_stream(
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

    pub(super) fn connect(&mut self, id: SockId, addr: SocketAddr) -> Result<(), RsError> {
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
    pub(super) fn accept(&mut self, lid: SockId) -> Result<SockId, RsError> {
        let sock = self.sock(lid)?;
        let Kind::Listening(l) = &mut sock.kind else {
            return Err(RsError::Invalid);
        };
        l.accepted.pop_front().ok_or(RsError::WouldBlock)
    }

    /// Accepts one connection request on listener `lid` into a new socket.
    pub(super) fn accept_request(
        &mut self,
        lid: SockId,
        request: P::ConnRequest,
    ) -> Result<SockId, RsError> {
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

    pub(super) fn listen(&mut self, id: SockId, backlog: u32) -> Result<(), RsError> {
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

    pub(super) fn send(&mut self, id: SockId, data: &[u8]) -> Result<usize, RsError> {
        let st = self.stream(id)?;
        match st.phase {
            Phase::Established => {}
            _ => return Err(RsError::WouldBlock),
        }
        let (c, mut io) = st.io();
        c.send(data, &mut io)
    }

    pub(super) fn recv(
        &mut self,
        id: SockId,
        buf: &mut [u8],
        peek: bool,
    ) -> Result<usize, RsError> {
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

    pub(super) fn readiness(&mut self, id: SockId) -> Result<Ready, RsError> {
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

    pub(super) fn close(&mut self, id: SockId) -> Option<(ConnId, bool)> {
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
pub(super) struct CmThread {
    pub(super) stop: Arc<dp_fabric::sys::EventFd>,
    pub(super) handle: Option<std::thread::JoinHandle<()>>,
}

impl CmThread {
    pub(super) fn spawn<P: Provider>(
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
