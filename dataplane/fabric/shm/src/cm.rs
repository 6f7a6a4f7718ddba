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
//! What happens when a message arrives is in the module `conn`, where the service
//! thread's handlers live.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{ChannelShared, Conn, Listener, ShmConnRequest, our_endpoint, send_with_fds};
use crate::core::DevCore;
use crate::link::ConnState;
use crate::msg::Msg;
use crate::qp::ShmQp;
use crate::util::lock;
use crate::{Shm, unix};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{
    CmChannel, CmEvent, ConnId, ListenId, PrepareQp, PrivateData, QpInit, UnreachableReason,
};
use dp_fabric::types::QpState;

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

/// A connection-manager event channel of the shm provider.
pub struct ShmCm {
    dev: Arc<DevCore>,
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
            self.dev.service.registry().remove(l.sock.as_raw_fd());
            l.close();
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
    pub(crate) fn new(dev: &Arc<DevCore>) -> Result<Self> {
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
        let l = Arc::new_cyclic(|me| Listener {
            id,
            addr,
            path,
            lock: Mutex::new(Some(lockf)),
            sock,
            channel: Arc::downgrade(&self.ch),
            dev: Arc::downgrade(&self.dev),
            me: me.clone(),
        });
        self.dev
            .service
            .registry()
            .add(l.sock.as_raw_fd(), l.clone());
        self.listeners.insert(id, l);
        Ok(id)
    }

    fn stop_listen(&mut self, id: ListenId) -> Result<()> {
        let l = self
            .listeners
            .remove(&id)
            .ok_or(FabricError::BadState("no such listener"))?;
        self.dev.service.registry().remove(l.sock.as_raw_fd());
        l.close();
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
            init.send_cq,
            init.recv_cq,
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
        let conn = Conn::new(
            &self.ch,
            &self.dev,
            sock,
            ConnState::Connecting,
            local,
            dst,
            &qp.core,
        );
        let (ep, fds) = our_endpoint(&qp.core, &conn)?;
        let msg = Msg::Req {
            src: local,
            dst,
            ep,
            pdata,
        };
        if send_with_fds(&conn, &msg, &fds).is_err() {
            qp.core.set_state(QpState::Error);
            conn.link.set_state(ConnState::Closed);
            self.ch.push(CmEvent::Unreachable {
                conn: conn_id,
                reason: UnreachableReason::NoListener,
            });
            return Ok((conn_id, qp));
        }
        qp.core.set_state(QpState::Rtr);
        conn.watch(&self.dev);
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
            init.send_cq,
            init.recv_cq,
            init.caps,
            conn_id,
        )?;
        // Receives go in before the reply: the peer may send the moment it has it. On an
        // error the request is dropped, which rejects it.
        prepare(&mut qp)?;
        let (Some(sock), Some(peer)) = (request.sock.take(), request.peer.take()) else {
            return Err(FabricError::BadState("connection request already answered"));
        };
        peer.install(&qp.core)?;
        let conn = Conn::new(
            &self.ch,
            &self.dev,
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
        conn.watch(&self.dev);
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
