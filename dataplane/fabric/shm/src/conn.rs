//! Connections of the connection manager: the channel they report to, the connection
//! itself (a [`Link`] plus the queue pair it set up), listeners and the sockets they accept,
//! and what the service thread does when any of them has something to read.
//!
//! The service thread answers REQs with `ConnectRequest` events, completes the active
//! side's handshake, maps regions peers announce, and notices hang-ups: when a peer process
//! dies the kernel closes its sockets, `poll` wakes at once, and the connection's queue pair
//! is moved to the error state and a `Disconnected` event is queued. Malformed messages are
//! counted ([`ShmStats::malformed_cm_msgs`]) and drop the connection.
//!
//! [`ShmStats::malformed_cm_msgs`]: crate::ShmStats::malformed_cm_msgs

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::core::DevCore;
use crate::layout::{DOORBELL_SLOTS, Doorbell, MAX_KEY_SLOTS, key_table_len};
use crate::link::{ConnState, Link};
use crate::msg::{EndpointInfo, Msg, RegionDesc};
use crate::qpseg::{QpSegLayout, QpSegView};
use crate::rc::{ConnHook, Peer, QpCore};
use crate::remote::{PeerExport, RemoteKt};
use crate::seg::map_segment;
use crate::service::{Registry, Watch};
use crate::util::lock;
use crate::{Shm, unix};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{CmEvent, ConnId, ConnRequest, ListenId, PrivateData, UnreachableReason};
use dp_fabric::types::QpState;

/// Channel state shared with the service thread.
pub(crate) struct ChannelShared {
    pub events: Mutex<VecDeque<CmEvent<Shm>>>,
    pub pending: AtomicUsize,
    pub efd: OwnedFd,
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

    pub(crate) fn pop(&self) -> Option<CmEvent<Shm>> {
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

/// One connection: its control link, the queue pair it set up and the channel it reports to.
pub(crate) struct Conn {
    pub id: ConnId,
    pub channel: Weak<ChannelShared>,
    pub dev: Weak<DevCore>,
    pub link: Arc<Link>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub qp: Weak<QpCore>,
    gone: AtomicBool,
    /// Exports the peer announced before its REP (active side), installed with the peer.
    early_exports: Mutex<Vec<(u32, PeerExport)>>,
}

impl Conn {
    pub(crate) fn new(
        channel: &Arc<ChannelShared>,
        dev: &Arc<DevCore>,
        sock: OwnedFd,
        state: ConnState,
        local: SocketAddr,
        peer: SocketAddr,
        qp: &Arc<QpCore>,
    ) -> Arc<Self> {
        let c = Arc::new(Self {
            id: qp.conn,
            channel: Arc::downgrade(channel),
            dev: Arc::downgrade(dev),
            link: Arc::new(Link::new(sock, state)),
            local,
            peer,
            qp: Arc::downgrade(qp),
            gone: AtomicBool::new(false),
            early_exports: Mutex::new(Vec::new()),
        });
        let hook: Weak<dyn ConnHook> = Arc::downgrade(&c) as Weak<dyn ConnHook>;
        let _ = qp.conn_ref.set(hook);
        lock(&channel.conns).insert(c.id, c.clone());
        c
    }

    fn send(&self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        self.link.send(msg, fds)
    }

    /// Watches the connection's socket from the service thread.
    pub(crate) fn watch(self: &Arc<Self>, dev: &DevCore) {
        let fd = self.link.sock.as_raw_fd();
        let _ = unix::set_nonblocking(fd, true);
        dev.service.registry().add(fd, self.clone());
    }

    /// The connection ended (peer DREQ, hang-up, or local disconnect): error the queue
    /// pair and report it once.
    pub(crate) fn finish(&self, event: bool) {
        self.link.close();
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
            d.service.registry().remove(self.link.sock.as_raw_fd());
        }
    }

    /// The socket hung up after this side closed the connection: `finish` ran, or is
    /// running on another thread, and reports the end itself. Only stop watching: taking
    /// the report here (as `finish(false)` would) could win the race against that
    /// `finish(true)` and leave the application with no event at all for a connection it
    /// disconnected, stuck waiting for one.
    fn forget(&self) {
        if let Some(d) = self.dev.upgrade() {
            d.service.registry().remove(self.link.sock.as_raw_fd());
        }
    }

    /// Local disconnect: tell the peer, error the queue pair, report it.
    pub(crate) fn disconnect(&self) {
        let st = self.link.state();
        if st != ConnState::Closed {
            let _ = self.send(&Msg::Dreq, &[]);
        }
        self.finish(true);
    }
}

impl ConnHook for Conn {
    /// The application dropped the queue pair: disconnect without an event.
    fn qp_dropped(&self) {
        let st = self.link.state();
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

/// A peer endpoint mapped here, ready to be installed in a queue pair.
pub(crate) struct MappedPeer {
    pub peer: Peer,
    pub exports: Vec<(u32, PeerExport)>,
}

impl MappedPeer {
    /// Installs the peer in `q`.
    pub(crate) fn install(self, q: &QpCore) -> Result<()> {
        q.install_peer(self.peer, self.exports)
    }
}

/// Maps a peer endpoint from its description and descriptors.
pub(crate) fn map_peer(dev: &DevCore, ep: &EndpointInfo, fds: Vec<OwnedFd>) -> Result<MappedPeer> {
    if fds.len() != 3 + ep.regions.len() {
        return Err(FabricError::Protocol(
            "endpoint descriptors do not match its description",
        ));
    }
    if ep.cq_slot as usize >= DOORBELL_SLOTS {
        return Err(FabricError::Protocol("peer doorbell slot out of range"));
    }
    // Sizes the peer could only get wrong by lying: bound them before mapping anything.
    let page = |n: usize| n.next_multiple_of(4096) as u64;
    if ep.qp_seg_len > QpSegLayout::MAX_TOTAL as u64
        || ep.cq_seg_len != page(size_of::<Doorbell>())
        || ep.kt_seg_len > page(key_table_len(MAX_KEY_SLOTS))
    {
        return Err(FabricError::Protocol(
            "peer endpoint announces impossible segment sizes",
        ));
    }
    let mut it = fds.into_iter();
    let (Some(qp_fd), Some(db_fd), Some(kt_fd)) = (it.next(), it.next(), it.next()) else {
        return Err(FabricError::Protocol("missing endpoint descriptors"));
    };
    let seg = map_segment(qp_fd, ep.qp_seg_len, 4096, "peer-qp")?;
    // SAFETY: seg is a live mapping of seg.len() bytes, kept alive by the Peer.
    let view =
        unsafe { QpSegView::attach(seg.as_ptr(), seg.len()) }.map_err(FabricError::Protocol)?;
    if view.header().qpn != ep.qpn {
        return Err(FabricError::Protocol(
            "peer queue-pair segment names another queue pair",
        ));
    }
    let db_seg = dev.map_doorbell(ep.ctx_id, ep.cq_id, db_fd, ep.cq_seg_len)?;
    let kt = RemoteKt::map(kt_fd, ep.kt_seg_len)?;
    let mut exports = Vec::with_capacity(ep.regions.len());
    for (desc, fd) in ep.regions.iter().zip(it) {
        exports.push((desc.slot, PeerExport::map(desc, fd)?));
    }
    Ok(MappedPeer {
        peer: Peer {
            _seg: seg,
            view,
            db_seg,
            db_slot: ep.cq_slot,
            kt,
        },
        exports,
    })
}

fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(|e| FabricError::Io {
        op: "duplicating a segment descriptor",
        source: e,
    })
}

/// Describes our side of `core` to a peer.
pub(crate) fn our_endpoint(core: &QpCore, conn: &Conn) -> Result<(EndpointInfo, Vec<OwnedFd>)> {
    // A queue pair is described to its one peer once: its segment's descriptor goes with
    // the description and is not kept.
    let seg_fd = lock(&core.seg_fd).take().ok_or(FabricError::BadState(
        "queue pair described to a peer already",
    ))?;
    let (regions, region_fds) = core.pd.exports_for_new_conn(&conn.link)?;
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
    let mut fds = vec![seg_fd, dup(db.fd)?, dup(kt.fd)?];
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

pub(crate) fn send_with_fds(conn: &Conn, msg: &Msg, fds: &[OwnedFd]) -> Result<()> {
    let b: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    conn.send(msg, &b).map_err(|e| FabricError::Io {
        op: "sending a CM message",
        source: e,
    })
}

/// A listening endpoint.
pub(crate) struct Listener {
    pub id: ListenId,
    pub addr: SocketAddr,
    pub path: PathBuf,
    /// The `flock`ed lock file that reserves `addr`; `None` once [`Listener::close`]d.
    pub lock: Mutex<Option<File>>,
    pub sock: OwnedFd,
    pub channel: Weak<ChannelShared>,
    pub dev: Weak<DevCore>,
    /// Itself, for the pending sockets it accepts.
    pub me: Weak<Self>,
}

impl Listener {
    /// Gives the address back: unlinks the rendezvous path, then unlocks the address.
    ///
    /// The owner calls this when it stops listening, not when the last `Arc` goes: the
    /// service thread holds a clone until its `poll` wakes, and a listener that lived on
    /// in it would refuse a new listener on the same address (`AddrInUse`) and, dropped
    /// later, unlink the new listener's path. The path goes before the lock, so whoever
    /// takes the lock next binds a fresh path.
    pub(crate) fn close(&self) {
        if let Some(f) = lock(&self.lock).take() {
            unix::unlink(&self.path);
            drop(f);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

/// A socket a listener accepted, waiting for its REQ.
pub(crate) struct PendingSock {
    sock: Mutex<Option<OwnedFd>>,
    listener: Weak<Listener>,
}

/// An incoming connection request of the shm provider.
pub struct ShmConnRequest {
    listener: ListenId,
    pub(crate) sock: Option<OwnedFd>,
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pdata: PrivateData,
    pub(crate) peer: Option<MappedPeer>,
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
        peer: MappedPeer,
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

impl Watch for Listener {
    fn ready(&self, reg: &Registry, _fd: RawFd, _buf: &mut [u8]) {
        while let Ok(Some(s)) = unix::accept(self.sock.as_raw_fd()) {
            let _ = unix::set_nonblocking(s.as_raw_fd(), true);
            let fd = s.as_raw_fd();
            let Some(me) = self.me.upgrade() else {
                return;
            };
            reg.add(
                fd,
                Arc::new(PendingSock {
                    sock: Mutex::new(Some(s)),
                    listener: Arc::downgrade(&me),
                }),
            );
        }
    }
}

impl Watch for PendingSock {
    fn ready(&self, reg: &Registry, fd: RawFd, buf: &mut [u8]) {
        let Some(dev) = self.listener.upgrade().and_then(|l| l.dev.upgrade()) else {
            reg.remove(fd);
            return;
        };
        on_pending(&dev, reg, fd, self, buf);
    }
}

fn on_pending(dev: &DevCore, reg: &Registry, fd: RawFd, ps: &PendingSock, buf: &mut [u8]) {
    let mut guard = lock(&ps.sock);
    let Some(sock) = guard.as_ref() else {
        return;
    };
    let mut fds = Vec::new();
    let r = unix::recv(sock.as_raw_fd(), buf, &mut fds);
    let n = match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
        Ok(Some(n)) => n,
        _ => {
            // Hang-up or error before a request: forget the socket. The watcher goes
            // first, while the descriptor is still open: once it is closed its number can
            // be reused at once by a connection another thread is setting up, whose
            // watcher a late `remove(fd)` would take away (that connection would never
            // see its reply, RTU or hang-up).
            reg.remove(fd);
            drop(guard.take());
            return;
        }
    };
    reg.remove(fd);
    let Some(sock) = guard.take() else {
        return;
    };
    let (
        Some(l),
        Ok(Msg::Req {
            src,
            dst,
            ep,
            pdata,
        }),
    ) = (ps.listener.upgrade(), Msg::decode(&buf[..n]))
    else {
        dev.malformed();
        return;
    };
    let Some(ch) = l.channel.upgrade() else {
        return;
    };
    match map_peer(dev, &ep, fds) {
        Ok(peer) => ch.push(CmEvent::ConnectRequest {
            listener: l.id,
            request: ShmConnRequest::new(l.id, sock, src, dst, pdata, peer),
        }),
        Err(_) => {
            dev.malformed();
            let mut out = Vec::new();
            Msg::Rej {
                pdata: PrivateData::EMPTY,
            }
            .encode(&mut out);
            let _ = unix::send(sock.as_raw_fd(), &out, &[]);
        }
    }
}

impl Watch for Conn {
    fn ready(&self, reg: &Registry, fd: RawFd, buf: &mut [u8]) {
        let Some(dev) = self.dev.upgrade() else {
            reg.remove(fd);
            return;
        };
        on_conn(&dev, self, buf);
    }
}

fn on_conn(dev: &DevCore, c: &Conn, buf: &mut [u8]) {
    loop {
        let mut fds = Vec::new();
        let n = match unix::recv(c.link.sock.as_raw_fd(), buf, &mut fds) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => {
                hang_up(dev, c);
                return;
            }
        };
        let st = c.link.state();
        let msg = match Msg::decode(&buf[..n]) {
            Ok(m) if m.fd_count() == fds.len() => m,
            _ => {
                dev.malformed();
                drop_conn(c, st);
                return;
            }
        };
        let ok = match (st, msg) {
            (ConnState::Connecting, Msg::Rep { ep, pdata }) => on_rep(dev, c, &ep, fds, pdata),
            (ConnState::Connecting, Msg::Rej { pdata }) => {
                if let Some(ch) = c.channel.upgrade() {
                    ch.push(CmEvent::Rejected {
                        conn: c.id,
                        private_data: pdata,
                    });
                }
                c.finish(false);
                return;
            }
            (ConnState::Accepted, Msg::Rtu) => {
                c.link.set_state(ConnState::Established);
                if let Some(q) = c.qp.upgrade() {
                    q.set_state(QpState::Rts);
                }
                if let Some(ch) = c.channel.upgrade() {
                    ch.push(CmEvent::Established {
                        conn: c.id,
                        private_data: PrivateData::EMPTY,
                    });
                }
                true
            }
            (ConnState::Accepted | ConnState::Established, Msg::Dreq) => {
                c.finish(true);
                return;
            }
            (
                ConnState::Accepted | ConnState::Established | ConnState::Connecting,
                Msg::MrAdd { seq, region },
            ) => on_mr_add(c, seq, &region, fds),
            (
                ConnState::Accepted | ConnState::Established | ConnState::Connecting,
                Msg::MrDel { slot },
            ) => on_mr_del(c, slot),
            (_, Msg::MrAck { seq }) => {
                c.link.got_ack(seq);
                true
            }
            _ => false,
        };
        if !ok {
            dev.malformed();
            drop_conn(c, st);
            return;
        }
    }
}

fn on_rep(
    dev: &DevCore,
    c: &Conn,
    ep: &EndpointInfo,
    fds: Vec<OwnedFd>,
    pdata: PrivateData,
) -> bool {
    let Some(q) = c.qp.upgrade() else {
        return true;
    };
    let Ok(mut peer) = map_peer(dev, ep, fds) else {
        return false;
    };
    peer.exports.append(&mut lock(&c.early_exports));
    if peer.install(&q).is_err() {
        return false;
    }
    q.set_state(QpState::Rts);
    c.link.set_state(ConnState::Established);
    // If the RTU cannot be sent the peer has already gone: the connection was established
    // and the hang-up (read next) reports the disconnect.
    let _ = c.link.send(&Msg::Rtu, &[]);
    if let Some(ch) = c.channel.upgrade() {
        ch.push(CmEvent::Established {
            conn: c.id,
            private_data: pdata,
        });
    }
    true
}

fn on_mr_add(c: &Conn, seq: u64, region: &RegionDesc, mut fds: Vec<OwnedFd>) -> bool {
    let (Some(fd), true) = (fds.pop(), fds.is_empty()) else {
        return false;
    };
    let Some(q) = c.qp.upgrade() else {
        return true;
    };
    let Ok(e) = PeerExport::map(region, fd) else {
        return false;
    };
    if q.peer.get().is_some() {
        if q.add_export(region.slot, e).is_err() {
            return false;
        }
    } else {
        // Connecting: announced before the REP; installed with the peer.
        lock(&c.early_exports).push((region.slot, e));
    }
    c.link.send(&Msg::MrAck { seq }, &[]).is_ok()
}

fn on_mr_del(c: &Conn, slot: u32) -> bool {
    if let Some(q) = c.qp.upgrade() {
        if q.peer.get().is_some() {
            q.remove_export(slot);
        } else {
            lock(&c.early_exports).retain(|(s, _)| *s != slot);
        }
    }
    true
}

fn hang_up(dev: &DevCore, c: &Conn) {
    let st = c.link.state();
    match st {
        ConnState::Connecting => {
            if let Some(ch) = c.channel.upgrade() {
                ch.push(CmEvent::Unreachable {
                    conn: c.id,
                    reason: UnreachableReason::Protocol,
                });
            }
            c.finish(false);
        }
        ConnState::Accepted | ConnState::Established => {
            // Relaxed: statistics.
            dev.stats.peer_deaths.fetch_add(1, Ordering::Relaxed);
            c.finish(true);
        }
        ConnState::Closed => c.forget(),
    }
}

fn drop_conn(c: &Conn, st: ConnState) {
    if st == ConnState::Connecting {
        if let Some(ch) = c.channel.upgrade() {
            ch.push(CmEvent::Unreachable {
                conn: c.id,
                reason: UnreachableReason::Protocol,
            });
        }
        c.finish(false);
    } else {
        c.disconnect();
    }
}
