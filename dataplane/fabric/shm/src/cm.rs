//! Connection management in the manner of the RDMA CM, over `SOCK_SEQPACKET` Unix sockets
//! in the rendezvous directory.
//!
//! A listener on `ip:port` is a socket at `<dir>/listen/<ip>_<port>.sock`, guarded by a lock
//! file so two listeners cannot share an address and a dead listener's socket is reclaimed.
//! A connection is one socket pair for its whole life. The exchange is the RDMA CM's:
//!
//! ```text
//!   active                         passive
//!   REQ(endpoint, fds, pdata) -->            ConnectRequest event; accept() or reject()
//!                             <-- REP(endpoint, fds, pdata) | REJ(pdata)
//!   RTU                       -->            Established event
//!   Established event
//!   ... DREQ either way, or a hang-up when a process dies: Disconnected event
//! ```
//!
//! The endpoint description carries the queue-pair segment, the receive CQ's doorbell, the
//! key table and every exported region (as descriptors). Each side maps the other's before
//! it reports the connection established, so keys exchanged in private data work at once.
//! Malformed messages are counted ([`ShmStats::malformed_cm_msgs`]) and drop the connection.
//!
//! [`ShmStats::malformed_cm_msgs`]: super::ShmStats::malformed_cm_msgs

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::device::{DevInner, lock};
use crate::layout::{DOORBELL_SLOTS, QpSegView};
use crate::msg::{EndpointInfo, Msg};
use crate::pd::RemotePd;
use crate::qp::{Peer, QpCore, ShmQp};
use crate::{Shm, unix};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{
    CmChannel, CmEvent, ConnId, ConnRequest, ListenId, PrepareQp, PrivateData, QpInit,
    UnreachableReason,
};
use dp_fabric::types::QpState;

/// Channel state shared with the service thread.
pub(crate) struct ChannelShared {
    events: Mutex<VecDeque<CmEvent<Shm>>>,
    pending: AtomicUsize,
    efd: OwnedFd,
    pub conns: Mutex<HashMap<ConnId, Arc<Conn>>>,
}

impl ChannelShared {
    pub(crate) fn push(&self, ev: CmEvent<Shm>) {
        lock(&self.events).push_back(ev);
        // Release: pairs with the Acquire in poll_event's fast check.
        self.pending.fetch_add(1, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.efd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    fn pop(&self) -> Option<CmEvent<Shm>> {
        // Acquire: pairs with the Release in push. Skips the lock (and the eventfd read)
        // when nothing is queued, so polling for events is cheap.
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let ev = lock(&self.events).pop_front()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our (semaphore, nonblocking) eventfd.
        unsafe { libc::read(self.efd.as_raw_fd(), (&raw mut v).cast(), 8) };
        Some(ev)
    }
}

/// Where a connection is in the CM exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnState {
    /// Active side: REQ sent, waiting for REP or REJ.
    Connecting,
    /// Passive side: REP sent, waiting for RTU.
    Accepted,
    /// Both sides mapped and ready.
    Established,
    /// Over.
    Closed,
}

/// One connection.
pub(crate) struct Conn {
    pub id: ConnId,
    pub channel: Weak<ChannelShared>,
    pub dev: Weak<DevInner>,
    pub sock: OwnedFd,
    wlock: Mutex<()>,
    pub state: Mutex<ConnState>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub qp: Weak<QpCore>,
    acked: Mutex<u64>,
    ack_cv: Condvar,
    gone: AtomicBool,
}

impl Conn {
    pub(crate) fn send(&self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(256);
        msg.encode(&mut buf);
        let _g = lock(&self.wlock);
        unix::send(self.sock.as_raw_fd(), &buf, fds)
    }

    /// Sends a region announcement (if the connection is not over).
    pub(crate) fn announce(&self, msg: &Msg, fd: BorrowedFd<'_>) -> io::Result<()> {
        if *lock(&self.state) == ConnState::Closed {
            return Err(io::ErrorKind::NotConnected.into());
        }
        self.send(msg, &[fd])
    }

    /// Waits until the peer acknowledged announcement `seq`.
    pub(crate) fn wait_mr_ack(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut a = lock(&self.acked);
        while *a < seq {
            if *lock(&self.state) == ConnState::Closed {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            a = self
                .ack_cv
                .wait_timeout(a, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    pub(crate) fn got_ack(&self, seq: u64) {
        let mut a = lock(&self.acked);
        *a = (*a).max(seq);
        self.ack_cv.notify_all();
    }

    /// The connection ended (peer DREQ, hang-up, or local disconnect): error the queue
    /// pair and report it once.
    pub(crate) fn finish(&self, event: bool) {
        *lock(&self.state) = ConnState::Closed;
        self.ack_cv.notify_all();
        if let Some(q) = self.qp.upgrade() {
            q.set_error();
        }
        if !self.gone.swap(true, Ordering::AcqRel)
            && event
            && let Some(ch) = self.channel.upgrade()
        {
            ch.push(CmEvent::Disconnected { conn: self.id });
        }
        if let Some(d) = self.dev.upgrade() {
            d.service.unwatch(self.sock.as_raw_fd());
        }
    }

    /// Local disconnect: tell the peer, error the queue pair, report it.
    pub(crate) fn disconnect(&self) {
        let st = *lock(&self.state);
        if st != ConnState::Closed {
            let _ = self.send(&Msg::Dreq, &[]);
        }
        self.finish(true);
    }

    /// The application dropped the queue pair: disconnect without an event.
    pub(crate) fn qp_dropped(&self) {
        let st = *lock(&self.state);
        if st != ConnState::Closed {
            let _ = self.send(&Msg::Dreq, &[]);
        }
        self.gone.store(true, Ordering::Release);
        self.finish(false);
        if let Some(ch) = self.channel.upgrade() {
            lock(&ch.conns).remove(&self.id);
        }
    }
}

/// Maps a peer endpoint from its description and descriptors.
pub(crate) fn map_peer(dev: &DevInner, ep: &EndpointInfo, fds: Vec<OwnedFd>) -> Result<Peer> {
    if fds.len() != 3 + ep.regions.len() {
        return Err(FabricError::Protocol(
            "endpoint descriptors do not match its description",
        ));
    }
    if ep.cq_slot as usize >= DOORBELL_SLOTS {
        return Err(FabricError::Protocol("peer doorbell slot out of range"));
    }
    let mut it = fds.into_iter();
    let (Some(qp_fd), Some(db_fd), Some(kt_fd)) = (it.next(), it.next(), it.next()) else {
        return Err(FabricError::Protocol("missing endpoint descriptors"));
    };
    let seg = dev.map_segment(qp_fd, ep.qp_seg_len, 4096, "peer-qp")?;
    // SAFETY: seg is a live mapping of seg.len() bytes, kept alive by the Peer.
    let view =
        unsafe { QpSegView::attach(seg.as_ptr(), seg.len()) }.map_err(FabricError::Protocol)?;
    if view.header().qpn != ep.qpn {
        return Err(FabricError::Protocol(
            "peer queue-pair segment names another queue pair",
        ));
    }
    let db_seg = dev.map_doorbell(ep.ctx_id, ep.cq_id, db_fd, ep.cq_seg_len)?;
    let rpd = RemotePd::get_or_map(dev, ep.ctx_id, ep.pd_id, kt_fd, ep.kt_seg_len)?;
    for (desc, fd) in ep.regions.iter().zip(it) {
        rpd.add_region(dev, desc, fd)?;
    }
    Ok(Peer {
        _seg: seg,
        view,
        db_seg,
        db_slot: ep.cq_slot,
        rpd,
    })
}

fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(|e| FabricError::Io {
        op: "duplicating a segment descriptor",
        source: e,
    })
}

/// Describes our side of `core` to a peer.
fn our_endpoint(core: &QpCore, conn: &Arc<Conn>) -> Result<(EndpointInfo, Vec<OwnedFd>)> {
    let (regions, region_fds) = core.pd.exports_for_new_conn(conn)?;
    let seg_fd = core
        .seg
        .share_handle()
        .ok_or(FabricError::BadState("segment not shareable"))?;
    let db = core
        .recv_cq
        .db_seg
        .share_handle()
        .ok_or(FabricError::BadState("doorbell not shareable"))?;
    let kt = core
        .pd
        .kt_seg
        .share_handle()
        .ok_or(FabricError::BadState("key table not shareable"))?;
    let mut fds = vec![dup(seg_fd.fd)?, dup(db.fd)?, dup(kt.fd)?];
    fds.extend(region_fds);
    let ep = EndpointInfo {
        ctx_id: core.dev.ctx_id,
        pid: std::process::id(),
        qpn: core.qpn,
        pd_id: core.pd.id,
        cq_id: core.recv_cq.id,
        cq_slot: core.recv_slot,
        qp_seg_len: core.seg.len() as u64,
        cq_seg_len: core.recv_cq.db_seg.len() as u64,
        kt_seg_len: core.pd.kt_seg.len() as u64,
        regions,
    };
    Ok((ep, fds))
}

fn send_with_fds(conn: &Conn, msg: &Msg, fds: &[OwnedFd]) -> Result<()> {
    let b: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    conn.send(msg, &b).map_err(|e| FabricError::Io {
        op: "sending a CM message",
        source: e,
    })
}

/// `ip_port` file name of an address.
pub(crate) fn addr_name(a: &SocketAddr) -> String {
    match a.ip() {
        IpAddr::V4(ip) => format!("{ip}_{}", a.port()),
        IpAddr::V6(ip) => format!("[{ip}]_{}", a.port()),
    }
}

fn listen_path(dir: &Path, a: &SocketAddr) -> PathBuf {
    dir.join("listen").join(format!("{}.sock", addr_name(a)))
}

/// Listener socket paths that accept a connection to `dst`, most specific first.
fn candidate_paths(dir: &Path, dst: &SocketAddr) -> Vec<PathBuf> {
    let p = dst.port();
    let mut v = vec![listen_path(dir, dst)];
    v.push(listen_path(
        dir,
        &SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p),
    ));
    v.push(listen_path(
        dir,
        &SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), p),
    ));
    if dst.ip().is_loopback() || dst.ip().is_unspecified() {
        v.push(listen_path(
            dir,
            &SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p),
        ));
        v.push(listen_path(
            dir,
            &SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), p),
        ));
    }
    v.dedup();
    v
}

/// A listening endpoint.
pub(crate) struct Listener {
    pub id: ListenId,
    pub addr: SocketAddr,
    path: PathBuf,
    _lock: File,
    pub sock: OwnedFd,
    pub channel: Weak<ChannelShared>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        unix::unlink(&self.path);
    }
}

fn try_lock_listen(dir: &Path, a: &SocketAddr) -> Result<Option<(File, PathBuf)>> {
    let path = listen_path(dir, a);
    let lockp = path.with_extension("lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lockp)
        .map_err(|e| FabricError::Io {
            op: "creating a listener lock file",
            source: e,
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Ok(None);
    }
    Ok(Some((f, path)))
}

/// An incoming connection request of the shm provider.
pub struct ShmConnRequest {
    listener: ListenId,
    sock: Option<OwnedFd>,
    src: SocketAddr,
    dst: SocketAddr,
    pdata: PrivateData,
    peer: Option<Peer>,
}

impl core::fmt::Debug for ShmConnRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmConnRequest")
            .field("listener", &self.listener)
            .field("from", &self.src)
            .field("to", &self.dst)
            .field("private_data", &self.pdata)
            .finish()
    }
}

impl ShmConnRequest {
    pub(crate) fn new(
        listener: ListenId,
        sock: OwnedFd,
        src: SocketAddr,
        dst: SocketAddr,
        pdata: PrivateData,
        peer: Peer,
    ) -> Self {
        Self {
            listener,
            sock: Some(sock),
            src,
            dst,
            pdata,
            peer: Some(peer),
        }
    }
}

impl Drop for ShmConnRequest {
    fn drop(&mut self) {
        // Neither accepted nor rejected: reject, so the peer does not wait forever.
        if let Some(s) = self.sock.take() {
            let mut buf = Vec::new();
            Msg::Rej {
                pdata: PrivateData::EMPTY,
            }
            .encode(&mut buf);
            let _ = unix::send(s.as_raw_fd(), &buf, &[]);
        }
    }
}

impl ConnRequest for ShmConnRequest {
    fn private_data(&self) -> &[u8] {
        self.pdata.as_bytes()
    }
    fn peer_addr(&self) -> SocketAddr {
        self.src
    }
    fn local_addr(&self) -> SocketAddr {
        self.dst
    }
}

/// A connection-manager event channel of the shm provider.
pub struct ShmCm {
    dev: Arc<DevInner>,
    ch: Arc<ChannelShared>,
    listeners: HashMap<ListenId, Arc<Listener>>,
}

impl core::fmt::Debug for ShmCm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmCm")
            .field("listeners", &self.listeners.len())
            .field("conns", &lock(&self.ch.conns).len())
            .finish()
    }
}

impl Drop for ShmCm {
    fn drop(&mut self) {
        for l in self.listeners.values() {
            self.dev.service.unwatch(l.sock.as_raw_fd());
        }
    }
}

fn check_pdata(p: &[u8], max: usize, msg: &'static str) -> Result<PrivateData> {
    if p.len() > max {
        return Err(FabricError::PrivateDataTooLong {
            len: p.len(),
            max,
            msg,
        });
    }
    PrivateData::new(p).ok_or(FabricError::PrivateDataTooLong {
        len: p.len(),
        max,
        msg,
    })
}

impl ShmCm {
    pub(crate) fn new(dev: &Arc<DevInner>) -> Result<Self> {
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_CLOEXEC | libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE,
            )
        };
        if fd < 0 {
            return Err(FabricError::last_os("eventfd for a CM channel"));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            dev: dev.clone(),
            ch: Arc::new(ChannelShared {
                events: Mutex::new(VecDeque::new()),
                pending: AtomicUsize::new(0),
                efd,
                conns: Mutex::new(HashMap::new()),
            }),
            listeners: HashMap::new(),
        })
    }

    fn new_conn(
        &self,
        sock: OwnedFd,
        state: ConnState,
        local: SocketAddr,
        peer: SocketAddr,
        qp: &Arc<QpCore>,
    ) -> Arc<Conn> {
        let c = Arc::new(Conn {
            id: qp.conn,
            channel: Arc::downgrade(&self.ch),
            dev: Arc::downgrade(&self.dev),
            sock,
            wlock: Mutex::new(()),
            state: Mutex::new(state),
            local,
            peer,
            qp: Arc::downgrade(qp),
            acked: Mutex::new(0),
            ack_cv: Condvar::new(),
            gone: AtomicBool::new(false),
        });
        let _ = qp.conn_ref.set(Arc::downgrade(&c));
        lock(&self.ch.conns).insert(c.id, c.clone());
        c
    }
}

impl CmChannel for ShmCm {
    type P = Shm;

    fn listen(&mut self, addr: SocketAddr, backlog: u32) -> Result<ListenId> {
        let (lockf, path, addr) = if addr.port() == 0 {
            let mut found = None;
            for port in 49152..=65535u16 {
                let a = SocketAddr::new(addr.ip(), port);
                if let Some((f, p)) = try_lock_listen(&self.dev.dir, &a)? {
                    found = Some((f, p, a));
                    break;
                }
            }
            found.ok_or(FabricError::Exhausted {
                what: "ephemeral ports",
                limit: 16384,
                hint: "close unused listeners",
            })?
        } else {
            let (f, p) =
                try_lock_listen(&self.dev.dir, &addr)?.ok_or(FabricError::AddrInUse { addr })?;
            (f, p, addr)
        };
        unix::unlink(&path);
        let sock = unix::listen(&path, backlog).map_err(|e| FabricError::Io {
            op: "listening on the rendezvous socket",
            source: e,
        })?;
        let id = ListenId(self.dev.next_id());
        let l = Arc::new(Listener {
            id,
            addr,
            path,
            _lock: lockf,
            sock,
            channel: Arc::downgrade(&self.ch),
        });
        self.dev.service.watch_listener(l.clone());
        self.listeners.insert(id, l);
        Ok(id)
    }

    fn stop_listen(&mut self, id: ListenId) -> Result<()> {
        let l = self
            .listeners
            .remove(&id)
            .ok_or(FabricError::BadState("no such listener"))?;
        self.dev.service.unwatch(l.sock.as_raw_fd());
        Ok(())
    }

    fn listen_addr(&self, id: ListenId) -> Option<SocketAddr> {
        self.listeners.get(&id).map(|l| l.addr)
    }

    fn connect_prepared(
        &mut self,
        dst: SocketAddr,
        init: &QpInit<'_, Shm>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Shm>,
    ) -> Result<(ConnId, ShmQp)> {
        let pdata = check_pdata(private_data, self.dev.attr.max_req_private_data, "REQ")?;
        let conn_id = ConnId(self.dev.next_id());
        let mut qp = ShmQp::create(
            &self.dev,
            &init.pd.inner,
            init.send_cq.shared(),
            init.recv_cq.shared(),
            init.caps,
            conn_id,
        )?;
        prepare(&mut qp)?;
        let local_ip = if dst.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            dst.ip()
        };
        let local = SocketAddr::new(local_ip, 32768 + (conn_id.0 % 28000) as u16);
        let mut sock = None;
        for p in candidate_paths(&self.dev.dir, &dst) {
            if let Ok(s) = unix::connect(&p) {
                sock = Some(s);
                break;
            }
        }
        let Some(sock) = sock else {
            qp.core.set_state(QpState::Error);
            self.ch.push(CmEvent::Unreachable {
                conn: conn_id,
                reason: UnreachableReason::NoListener,
            });
            return Ok((conn_id, qp));
        };
        let conn = self.new_conn(sock, ConnState::Connecting, local, dst, &qp.core);
        let (ep, fds) = our_endpoint(&qp.core, &conn)?;
        let msg = Msg::Req {
            src: local,
            dst,
            ep,
            pdata,
        };
        if send_with_fds(&conn, &msg, &fds).is_err() {
            qp.core.set_state(QpState::Error);
            *lock(&conn.state) = ConnState::Closed;
            self.ch.push(CmEvent::Unreachable {
                conn: conn_id,
                reason: UnreachableReason::NoListener,
            });
            return Ok((conn_id, qp));
        }
        qp.core.set_state(QpState::Rtr);
        self.dev.service.watch_conn(conn);
        Ok((conn_id, qp))
    }

    fn accept_prepared(
        &mut self,
        mut request: ShmConnRequest,
        init: &QpInit<'_, Shm>,
        private_data: &[u8],
        prepare: &mut PrepareQp<'_, Shm>,
    ) -> Result<(ConnId, ShmQp)> {
        let pdata = check_pdata(private_data, self.dev.attr.max_rep_private_data, "REP")?;
        let conn_id = ConnId(self.dev.next_id());
        let mut qp = ShmQp::create(
            &self.dev,
            &init.pd.inner,
            init.send_cq.shared(),
            init.recv_cq.shared(),
            init.caps,
            conn_id,
        )?;
        // Receives go in before the reply: the peer may send the moment it has it. On an
        // error the request is dropped, which rejects it.
        prepare(&mut qp)?;
        let (Some(sock), Some(peer)) = (request.sock.take(), request.peer.take()) else {
            return Err(FabricError::BadState("connection request already answered"));
        };
        let _ = qp.core.peer.set(peer);
        let conn = self.new_conn(
            sock,
            ConnState::Accepted,
            request.dst,
            request.src,
            &qp.core,
        );
        let (ep, fds) = our_endpoint(&qp.core, &conn)?;
        // As rdma_accept does on InfiniBand and RoCE, the passive queue pair is ready to
        // send at once (RTR then RTS); the RTU later only produces the Established event.
        qp.core.set_state(QpState::Rts);
        if let Err(e) = send_with_fds(&conn, &Msg::Rep { ep, pdata }, &fds) {
            conn.finish(false);
            lock(&self.ch.conns).remove(&conn_id);
            return Err(e);
        }
        self.dev.service.watch_conn(conn);
        Ok((conn_id, qp))
    }

    fn reject(&mut self, mut request: ShmConnRequest, private_data: &[u8]) -> Result<()> {
        let pdata = check_pdata(private_data, self.dev.attr.max_rej_private_data, "REJ")?;
        if let Some(s) = request.sock.take() {
            let mut buf = Vec::new();
            Msg::Rej { pdata }.encode(&mut buf);
            unix::send(s.as_raw_fd(), &buf, &[]).map_err(|e| FabricError::Io {
                op: "sending a reject",
                source: e,
            })?;
        }
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<()> {
        let c = lock(&self.ch.conns)
            .get(&conn)
            .cloned()
            .ok_or(FabricError::BadState("no such connection on this channel"))?;
        c.disconnect();
        Ok(())
    }

    fn conn_addrs(&self, conn: ConnId) -> Option<(SocketAddr, SocketAddr)> {
        lock(&self.ch.conns).get(&conn).map(|c| (c.local, c.peer))
    }

    fn poll_event(&mut self) -> Option<CmEvent<Shm>> {
        self.ch.pop()
    }

    fn wait_event(&mut self, timeout: Option<Duration>) -> Option<CmEvent<Shm>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.ch.pop() {
                return Some(e);
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    (d - now).as_millis().clamp(1, i32::MAX as u128) as i32
                }
            };
            let mut p = libc::pollfd {
                fd: self.ch.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&raw mut p, 1, ms) };
        }
    }

    fn event_fd(&self) -> RawFd {
        self.ch.efd.as_raw_fd()
    }
}
