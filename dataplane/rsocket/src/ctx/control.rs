//! The control plane of a context: the state behind the control lock (the CM channel, the
//! buffer arena, and which socket each connection and listener belongs to), the operations
//! that block (connect, accept, listen, close) and the CM thread that feeds connection
//! events in.
//!
//! Every operation here holds the control lock for its whole length and takes the data
//! lock only for short, non-blocking steps: reading or reserving a socket, then publishing
//! the result. Resources are built (memory registration, completion queue, address and
//! route resolution, the connection exchange) and dropped with the data lock released.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use lcore::time::Clock;

use super::engine::Base;
use super::sock::{Kind, Listening, Phase, Sock, SockId, Stream, post_initial_recvs};
use crate::arena::{Arena, SockBufs};
use crate::conn::StreamConn;
use crate::error::{RsError, fabric_err};
use crate::opts::SockOpts;
use crate::wire::{ConnData, ConnDataRepr};
use dp_fabric::{
    CmChannel, CmEvent, CompletionQueue, ConnId, ConnRequest, Device, ListenId, Provider, QpCaps,
    QpInit, RcQueuePair,
};
use dp_wire::Error as WireError;

/// The state behind the control lock.
pub(super) struct Control<P: Provider> {
    /// Declared first so it stops (and joins) the CM thread before the CM channel closes.
    pub(super) cm_thread: Option<CmThread>,
    pub(super) cm: P::Cm,
    /// Socket buffers: carving a block and registering it (which may wait for peers) are
    /// control-plane work.
    pub(super) arena: Arena<P>,
    /// The socket of each published connection. An entry exists exactly while its stream
    /// is in the socket table, so an event never reaches a socket that reused the id.
    pub(super) by_conn: HashMap<ConnId, SockId>,
    pub(super) by_listen: HashMap<ListenId, SockId>,
}

/// A new stream's resources, before it has a queue pair.
struct Parts<P: Provider> {
    conn: StreamConn,
    bufs: SockBufs<P>,
    cq: P::Cq,
    caps: QpCaps,
    pd: P::Pd,
}

impl<P: Provider> Control<P> {
    pub(super) fn new(cm: P::Cm, arena: Arena<P>) -> Self {
        Self {
            cm_thread: None,
            cm,
            arena,
            by_conn: HashMap::new(),
            by_listen: HashMap::new(),
        }
    }

    /// Processes every pending CM event.
    pub(super) fn cm_events(&mut self, sh: &Base<P>) -> usize {
        let mut n = 0;
        while let Some(ev) = self.cm.poll_event() {
            n += 1;
            self.on_cm(sh, ev);
        }
        n
    }

    fn on_cm(&mut self, sh: &Base<P>, ev: CmEvent<P>) {
        match ev {
            CmEvent::ConnectRequest { listener, request } => {
                let Some(&lid) = self.by_listen.get(&listener) else {
                    let _ = self.cm.reject(request, &[]);
                    return;
                };
                // Accept at once, as librdmacm's listen service thread does: connects
                // complete whether or not the application is in `accept`.
                let _ = self.accept_request(sh, lid, request);
            }
            CmEvent::Established { conn, private_data } => {
                let Some(&id) = self.by_conn.get(&conn) else {
                    return;
                };
                let failed = {
                    let mut d = sh.data();
                    let Ok(sock) = d.sock(id) else {
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
                    let now = sh.clock.now();
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
                    if r.is_ok() && sock.opts.keepalive {
                        st.conn.set_keepalive(Some(sock.opts.keepidle), now);
                    }
                    r.err()
                };
                if let Some(e) = failed {
                    self.fail_socket(sh, id, e);
                    let _ = self.cm.disconnect(conn);
                }
            }
            CmEvent::Rejected { conn, .. } | CmEvent::Unreachable { conn, .. } => {
                if let Some(&id) = self.by_conn.get(&conn) {
                    self.fail_socket(sh, id, RsError::ConnRefused);
                }
            }
            CmEvent::Disconnected { conn } => {
                let Some(&id) = self.by_conn.get(&conn) else {
                    return;
                };
                let connecting = {
                    let mut d = sh.data();
                    let super::engine::Data { socks, scratch, .. } = &mut *d;
                    let Some(Some(Sock {
                        kind: Kind::Stream(st),
                        ..
                    })) = socks.get_mut(id.0 as usize)
                    else {
                        return;
                    };
                    // Deliver what arrived before the disconnect (the peer's DISCONNECT
                    // message travels ahead of the CM's), then treat anything abrupt as a
                    // reset.
                    st.progress(scratch);
                    if st.phase == Phase::Established {
                        st.conn.peer_gone();
                    }
                    st.phase != Phase::Established
                };
                if connecting {
                    self.fail_socket(sh, id, RsError::ConnRefused);
                }
            }
            CmEvent::DeviceRemoval => {
                for s in sh.data().socks.iter_mut().flatten() {
                    if let Kind::Stream(st) = &mut s.kind {
                        st.conn.fail(RsError::Io);
                    }
                }
            }
        }
    }

    /// A connect failed: the socket reports the error once (`SO_ERROR`), then `ENOTCONN`.
    fn fail_socket(&mut self, sh: &Base<P>, id: SockId, e: RsError) {
        let old = {
            let mut d = sh.data();
            let Ok(sock) = d.sock(id) else {
                return;
            };
            if !matches!(sock.kind, Kind::Stream(_)) {
                return;
            }
            sock.so_error = Some(e);
            std::mem::replace(&mut sock.kind, Kind::Failed(e))
        };
        if let Kind::Stream(st) = old {
            self.by_conn.remove(&st.conn_id);
            self.release(*st);
        }
    }

    /// Frees a stream's resources. Called without the data lock: dropping a queue pair or
    /// a registration may make system calls or wait for the provider's own locks.
    fn release(&mut self, st: Stream<P>) {
        let Stream {
            qp, cq, bufs, maps, ..
        } = st;
        drop(maps);
        drop(qp);
        drop(cq);
        self.arena.free(bufs);
    }

    /// Builds a new stream's buffers and completion queue. Registering the buffers for
    /// remote write may block (the shm provider waits for every connected peer to map a
    /// newly exported region), so this runs without the data lock.
    fn new_stream(&mut self, sh: &Base<P>, opts: &SockOpts) -> Result<Parts<P>, RsError> {
        // The socket's own protection domain: its memory and queue pair live in it, so its
        // peer can name (and, on the shm provider, is sent) this socket's buffers and
        // nothing of any other socket's.
        let pd = sh.dev.alloc_pd().map_err(|e| fabric_err(&e))?;
        let attr = sh.dev.attr();
        let cfg = opts.stream_config(attr.max_qp_wr, attr.max_inline_data);
        let bufs = self.arena.stream_bufs(&pd, &cfg)?;
        let conn = StreamConn::new(cfg, bufs.keys());
        let cq = match sh.dev.create_cq(cfg.sq_size + cfg.rq_size) {
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
        Ok(Parts {
            conn,
            bufs,
            cq,
            caps,
            pd,
        })
    }

    /// Connects socket `id` (`rconnect`), returning whether it is non-blocking. Three
    /// phases: the socket is checked and marked [`Kind::Opening`] under the data lock;
    /// its resources are built and the request sent without it (address and route
    /// resolution on verbs, memory registration on shm: both may block for seconds); the
    /// stream is published under the data lock. The control lock is held throughout, so
    /// no CM event for the new connection is processed before it is published, and no
    /// other control operation (close included) sees the socket while it is opening.
    pub(super) fn connect(
        &mut self,
        sh: &Base<P>,
        id: SockId,
        addr: SocketAddr,
    ) -> Result<bool, RsError> {
        let (opts, nonblocking) = {
            let mut d = sh.data();
            let sock = d.sock(id)?;
            match &sock.kind {
                Kind::Fresh => {}
                Kind::Stream(st) if st.phase == Phase::Established => {
                    return Err(RsError::IsConnected);
                }
                Kind::Stream(_) | Kind::Opening => return Err(RsError::InProgress),
                Kind::Failed(_) => return Err(RsError::NotConnected),
                Kind::Listening(_) => return Err(RsError::Invalid),
            }
            sock.kind = Kind::Opening;
            (sock.opts.clone(), sock.nonblocking)
        };
        let r = self.open_active(sh, &opts, addr);
        let mut d = sh.data();
        let Ok(sock) = d.sock(id).and_then(|s| match s.kind {
            Kind::Opening => Ok(s),
            _ => Err(RsError::BadSocket),
        }) else {
            // Unreachable while the control lock is held across the phases; kept so a
            // change to that cannot leak a connection.
            drop(d);
            if let Ok(st) = r {
                let cid = st.conn_id;
                self.release(*st);
                let _ = self.cm.disconnect(cid);
            }
            return Err(RsError::BadSocket);
        };
        match r {
            Ok(st) => {
                let cid = st.conn_id;
                sock.kind = Kind::Stream(st);
                drop(d);
                self.by_conn.insert(cid, id);
                Ok(nonblocking)
            }
            Err(e) => {
                sock.kind = Kind::Fresh;
                Err(e)
            }
        }
    }

    /// The blocking part of a connect, without the data lock.
    fn open_active(
        &mut self,
        sh: &Base<P>,
        opts: &SockOpts,
        addr: SocketAddr,
    ) -> Result<Box<Stream<P>>, RsError> {
        let Parts {
            mut conn,
            bufs,
            cq,
            caps,
            pd,
        } = self.new_stream(sh, opts)?;
        let pdata = conn.conn_data().to_bytes();
        let init = QpInit {
            pd: &pd,
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
            pd,
            qp,
            notify: cq.notifier(),
            cq,
            conn_id,
            bufs,
            phase: Phase::Connecting,
            local,
            peer: addr,
            maps: Vec::new(),
        });
        st.conn.clamp_inline(st.qp.caps().max_inline_data);
        Ok(st)
    }

    /// Accepts one connection request on listener `lid` into a new socket, queued on the
    /// listener's backlog. Phases as in [`connect`](Self::connect): the listener is read
    /// under the data lock, the socket built and accepted without it, then published.
    fn accept_request(
        &mut self,
        sh: &Base<P>,
        lid: SockId,
        request: P::ConnRequest,
    ) -> Result<SockId, RsError> {
        let listener = {
            let mut d = sh.data();
            match d.sock(lid) {
                Ok(Sock {
                    kind: Kind::Listening(l),
                    opts,
                    nonblocking,
                    ..
                }) if l.accepted.len() < l.backlog => Some((opts.clone(), *nonblocking)),
                _ => None,
            }
        };
        let Some((opts, nonblocking)) = listener else {
            let _ = self.cm.reject(request, &[]);
            return Err(RsError::WouldBlock);
        };
        let st = self.open_passive(sh, &opts, request)?;
        let cid = st.conn_id;
        let mut d = sh.data();
        // Only the control lock (held) closes a listener, and accept only drains its
        // backlog, so the listener still has room; checked anyway.
        if !matches!(d.sock(lid), Ok(Sock { kind: Kind::Listening(l), .. }) if l.accepted.len() < l.backlog)
        {
            drop(d);
            self.release(*st);
            let _ = self.cm.disconnect(cid);
            return Err(RsError::WouldBlock);
        }
        if opts.keepalive {
            d.keepalive_socks += 1;
        }
        // Accepted sockets inherit the listener's options and O_NONBLOCK, as in librdmacm
        // (unlike Linux accept).
        let mut s = Sock::new(opts, nonblocking);
        s.kind = Kind::Stream(st);
        let id = d.alloc_id(s);
        if let Ok(Sock {
            kind: Kind::Listening(l),
            ..
        }) = d.sock(lid)
        {
            l.accepted.push_back(id);
        }
        drop(d);
        self.by_conn.insert(cid, id);
        Ok(id)
    }

    /// The blocking part of an accept, without the data lock: the new stream is not
    /// published yet, so establishing it needs no lock either.
    fn open_passive(
        &mut self,
        sh: &Base<P>,
        opts: &SockOpts,
        request: P::ConnRequest,
    ) -> Result<Box<Stream<P>>, RsError> {
        let Ok(peer) =
            ConnData::new_checked(request.private_data()).and_then(|p| ConnDataRepr::parse(&p))
        else {
            // librdmacm rejects requests of another version (or malformed ones).
            let _ = self.cm.reject(request, &[]);
            return Err(RsError::NotSupported);
        };
        let (peer_addr, local_addr) = (request.peer_addr(), request.local_addr());
        let Parts {
            mut conn,
            bufs,
            cq,
            caps,
            pd,
        } = match self.new_stream(sh, opts) {
            Ok(x) => x,
            Err(e) => {
                let _ = self.cm.reject(request, &[]);
                return Err(e);
            }
        };
        let pdata = conn.conn_data().to_bytes();
        let init = QpInit {
            pd: &pd,
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
            pd,
            qp,
            notify: cq.notifier(),
            cq,
            conn_id,
            bufs,
            phase: Phase::Established,
            local: local_addr,
            peer: peer_addr,
            maps: Vec::new(),
        });
        st.conn.clamp_inline(st.qp.caps().max_inline_data);
        // The accepted queue pair can send at once (as after rdma_accept), so the
        // connection is established now, with the peer's data from its request.
        let now = sh.clock.now();
        let (c, mut io) = st.io();
        let established = c.establish(&peer, &mut io, now);
        if established.is_ok() && opts.keepalive {
            c.set_keepalive(Some(opts.keepidle), now);
        }
        if let Err(e) = established {
            self.release(*st);
            let _ = self.cm.disconnect(conn_id);
            return Err(e);
        }
        Ok(st)
    }

    /// Listens on socket `id` (`rlisten`).
    pub(super) fn listen(&mut self, sh: &Base<P>, id: SockId, backlog: u32) -> Result<(), RsError> {
        let addr = {
            let mut d = sh.data();
            let sock = d.sock(id)?;
            match sock.kind {
                Kind::Listening(_) => return Ok(()),
                Kind::Fresh => {}
                _ => return Err(RsError::Invalid),
            }
            sock.bound.ok_or(RsError::Invalid)?
        };
        let lid = self
            .cm
            .listen(addr, backlog.max(1))
            .map_err(|e| fabric_err(&e))?;
        let bound = self.cm.listen_addr(lid).unwrap_or(addr);
        let mut d = sh.data();
        match d.sock(id) {
            Ok(sock) if matches!(sock.kind, Kind::Fresh) => {
                sock.bound = Some(bound);
                sock.kind = Kind::Listening(Listening {
                    id: lid,
                    addr: bound,
                    backlog: backlog.clamp(1, 4096) as usize,
                    accepted: VecDeque::new(),
                });
            }
            // Another thread connected the socket meanwhile.
            _ => {
                drop(d);
                let _ = self.cm.stop_listen(lid);
                return Err(RsError::Invalid);
            }
        }
        drop(d);
        self.by_listen.insert(lid, id);
        Ok(())
    }

    /// Closes socket `id` and frees everything it holds: a stream is disconnected, a
    /// listener stops and resets the connections it accepted but never handed out.
    pub(super) fn close(&mut self, sh: &Base<P>, id: SockId) {
        let Some(sock) = sh.data().take(id) else {
            return;
        };
        match sock.kind {
            Kind::Listening(l) => {
                self.by_listen.remove(&l.id);
                let _ = self.cm.stop_listen(l.id);
                for a in l.accepted {
                    self.close(sh, a);
                }
            }
            Kind::Stream(st) => {
                let cid = st.conn_id;
                self.by_conn.remove(&cid);
                self.release(*st);
                let _ = self.cm.disconnect(cid);
            }
            // Opening cannot be seen here: its connect holds the control lock.
            Kind::Fresh | Kind::Opening | Kind::Failed(_) => {}
        }
    }
}

/// The context's connection-manager thread: it blocks in `poll(2)` on the CM channel and,
/// when events arrive, takes the control lock and processes them, accepting connection
/// requests into their listeners' backlogs as librdmacm's listen service thread does. So a
/// connect completes whether or not the peer application is inside `accept`, and a
/// single-threaded program can connect to itself. It is the only consumer of CM events:
/// the data path never takes the control lock.
pub(super) struct CmThread {
    pub(super) stop: Arc<dp_fabric::sys::EventFd>,
    pub(super) handle: Option<std::thread::JoinHandle<()>>,
}

impl CmThread {
    /// Spawns the thread: each time `event_fd` is readable it calls `on_events`, and stops
    /// when that returns false (the context is gone) or the thread is dropped.
    pub(super) fn spawn(
        event_fd: std::os::fd::RawFd,
        mut on_events: impl FnMut() -> bool + Send + 'static,
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
                    if !on_events() {
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
