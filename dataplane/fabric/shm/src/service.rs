//! The device's control service thread.
//!
//! One thread per device blocks in `poll(2)` on the context socket, every listener, every
//! connection being set up and every live connection. It answers datagram address
//! resolution, turns incoming requests into `ConnectRequest` events, completes the
//! active side's handshake, maps regions peers announce, and notices hang-ups: when a peer
//! process dies the kernel closes its sockets, `poll` wakes at once, and the connection's
//! queue pair is moved to the error state and a `Disconnected` event is queued. Detection
//! time is therefore the scheduling latency of this thread (microseconds; bounded in
//! practice by one scheduler tick on a busy host), not a timeout.
//!
//! The thread never runs data-path code and the data path never waits for it.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::{JoinHandle, ThreadId};

use crate::cm::{Conn, ConnState, Listener, ShmConnRequest, map_peer};
use crate::device::{DevInner, lock};
use crate::msg::{MAX_MSG, Msg};
use crate::ud::answer_resolve;
use crate::unix;
use dp_fabric::traits::{CmEvent, PrivateData, UnreachableReason};
use dp_fabric::types::QpState;

/// A socket waiting for its REQ.
pub(crate) struct PendingSock {
    sock: Mutex<Option<OwnedFd>>,
    listener: Weak<Listener>,
}

#[derive(Clone)]
enum Item {
    Ctx(Arc<OwnedFd>),
    Listener(Arc<Listener>),
    Pending(Arc<PendingSock>),
    Conn(Arc<Conn>),
}

struct Reg {
    items: HashMap<RawFd, Item>,
}

pub(crate) struct Service {
    wake: Arc<OwnedFd>,
    reg: Mutex<Reg>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    tid: OnceLock<ThreadId>,
}

impl Service {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) with valid flags; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: fresh descriptor we own.
            wake: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }),
            reg: Mutex::new(Reg {
                items: HashMap::new(),
            }),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            tid: OnceLock::new(),
        })
    }

    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    fn add(&self, fd: RawFd, item: Item) {
        lock(&self.reg).items.insert(fd, item);
        self.kick();
    }

    pub(crate) fn watch_listener(&self, l: Arc<Listener>) {
        self.add(l.sock.as_raw_fd(), Item::Listener(l));
    }

    pub(crate) fn watch_conn(&self, c: Arc<Conn>) {
        let _ = unix::set_nonblocking(c.sock.as_raw_fd(), true);
        self.add(c.sock.as_raw_fd(), Item::Conn(c));
    }

    pub(crate) fn unwatch(&self, fd: RawFd) {
        if lock(&self.reg).items.remove(&fd).is_some() {
            self.kick();
        }
    }

    pub(crate) fn start(&self, dev: &Arc<DevInner>, ctx_sock: OwnedFd) -> io::Result<()> {
        self.add(ctx_sock.as_raw_fd(), Item::Ctx(Arc::new(ctx_sock)));
        let weak = Arc::downgrade(dev);
        let wake = self.wake.clone();
        let h = std::thread::Builder::new()
            .name(format!("dp-shm-svc-{}", dev.ctx_id))
            .spawn(move || run(&weak, &wake))?;
        let _ = self.tid.set(h.thread().id());
        *lock(&self.thread) = Some(h);
        Ok(())
    }

    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.kick();
        let h = lock(&self.thread).take();
        if let Some(h) = h
            && Some(&std::thread::current().id()) != self.tid.get()
        {
            let _ = h.join();
        }
        lock(&self.reg).items.clear();
    }
}

fn run(weak: &Weak<DevInner>, wake: &Arc<OwnedFd>) {
    let mut buf = vec![0u8; MAX_MSG];
    loop {
        let items: Vec<(RawFd, Item)> = {
            let Some(dev) = weak.upgrade() else {
                return;
            };
            if dev.service.stop.load(Ordering::Acquire) {
                return;
            }
            lock(&dev.service.reg)
                .items
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(items.len() + 1);
        pfds.push(libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for (fd, _) in &items {
            pfds.push(libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: pfds is a live array of pfds.len() pollfd structs.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if r < 0 {
            continue;
        }
        if pfds[0].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a live u64 from our nonblocking eventfd.
            unsafe { libc::read(wake.as_raw_fd(), (&raw mut v).cast(), 8) };
        }
        let Some(dev) = weak.upgrade() else {
            return;
        };
        for (p, (fd, item)) in pfds[1..].iter().zip(items) {
            if p.revents == 0 {
                continue;
            }
            // Skip items removed while we were blocked.
            if !lock(&dev.service.reg).items.contains_key(&fd) {
                continue;
            }
            match item {
                Item::Ctx(s) => on_ctx(&dev, &s, &mut buf),
                Item::Listener(l) => on_listener(&dev, &l),
                Item::Pending(ps) => on_pending(&dev, fd, &ps, &mut buf),
                Item::Conn(c) => on_conn(&dev, &c, &mut buf),
            }
        }
        drop(dev);
    }
}

fn malformed(dev: &DevInner) {
    // Relaxed: statistics.
    dev.stats.malformed_cm_msgs.fetch_add(1, Ordering::Relaxed);
}

/// Waits up to `ms` for `fd` to become readable.
fn wait_readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&raw mut p, 1, ms) > 0 }
}

fn on_ctx(dev: &DevInner, s: &OwnedFd, buf: &mut [u8]) {
    while let Ok(Some(c)) = unix::accept(s.as_raw_fd()) {
        if !wait_readable(c.as_raw_fd(), 1000) {
            continue;
        }
        let mut fds = Vec::new();
        if let Ok(Some(n)) = unix::recv(c.as_raw_fd(), buf, &mut fds) {
            match Msg::decode(&buf[..n]) {
                Ok(Msg::UdResolve { qpn }) if fds.is_empty() => answer_resolve(dev, &c, qpn),
                _ => malformed(dev),
            }
        }
    }
}

fn on_listener(dev: &DevInner, l: &Arc<Listener>) {
    loop {
        match unix::accept(l.sock.as_raw_fd()) {
            Ok(Some(s)) => {
                let _ = unix::set_nonblocking(s.as_raw_fd(), true);
                let fd = s.as_raw_fd();
                lock(&dev.service.reg).items.insert(
                    fd,
                    Item::Pending(Arc::new(PendingSock {
                        sock: Mutex::new(Some(s)),
                        listener: Arc::downgrade(l),
                    })),
                );
            }
            _ => return,
        }
    }
}

fn on_pending(dev: &DevInner, fd: RawFd, ps: &PendingSock, buf: &mut [u8]) {
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
            // Hang-up or error before a request: forget the socket.
            guard.take();
            lock(&dev.service.reg).items.remove(&fd);
            return;
        }
    };
    lock(&dev.service.reg).items.remove(&fd);
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
        malformed(dev);
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
            malformed(dev);
            let mut out = Vec::new();
            Msg::Rej {
                pdata: PrivateData::EMPTY,
            }
            .encode(&mut out);
            let _ = unix::send(sock.as_raw_fd(), &out, &[]);
        }
    }
}

fn on_conn(dev: &DevInner, c: &Arc<Conn>, buf: &mut [u8]) {
    loop {
        let mut fds = Vec::new();
        let n = match unix::recv(c.sock.as_raw_fd(), buf, &mut fds) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => {
                hang_up(dev, c);
                return;
            }
        };
        let st = *lock(&c.state);
        let msg = match Msg::decode(&buf[..n]) {
            Ok(m) if m.fd_count() == fds.len() => m,
            _ => {
                malformed(dev);
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
                *lock(&c.state) = ConnState::Established;
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
            ) => on_mr_add(dev, c, seq, &region, fds),
            (_, Msg::MrAck { seq }) => {
                c.got_ack(seq);
                true
            }
            _ => false,
        };
        if !ok {
            malformed(dev);
            drop_conn(c, st);
            return;
        }
    }
}

fn on_rep(
    dev: &DevInner,
    c: &Arc<Conn>,
    ep: &super::msg::EndpointInfo,
    fds: Vec<OwnedFd>,
    pdata: PrivateData,
) -> bool {
    let Some(q) = c.qp.upgrade() else {
        return true;
    };
    let Ok(peer) = map_peer(dev, ep, fds) else {
        return false;
    };
    let _ = q.peer.set(peer);
    q.set_state(QpState::Rts);
    *lock(&c.state) = ConnState::Established;
    // If the RTU cannot be sent the peer has already gone: the connection was established
    // and the hang-up (read next) reports the disconnect.
    let _ = c.send(&Msg::Rtu, &[]);
    if let Some(ch) = c.channel.upgrade() {
        ch.push(CmEvent::Established {
            conn: c.id,
            private_data: pdata,
        });
    }
    true
}

fn on_mr_add(
    dev: &DevInner,
    c: &Arc<Conn>,
    seq: u64,
    region: &super::msg::RegionDesc,
    mut fds: Vec<OwnedFd>,
) -> bool {
    let (Some(fd), true) = (fds.pop(), fds.is_empty()) else {
        return false;
    };
    let Some(q) = c.qp.upgrade() else {
        return true;
    };
    match q.peer.get() {
        Some(p) => {
            if p.rpd.add_region(dev, region, fd).is_err() {
                return false;
            }
        }
        // Connecting: the REP will list this region again; nothing to map yet.
        None => drop(fd),
    }
    c.send(&Msg::MrAck { seq }, &[]).is_ok()
}

fn hang_up(dev: &DevInner, c: &Arc<Conn>) {
    let st = *lock(&c.state);
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
        ConnState::Closed => c.finish(false),
    }
}

fn drop_conn(c: &Arc<Conn>, st: ConnState) {
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
