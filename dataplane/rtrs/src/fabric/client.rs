//! The client's fabric driver: [`ClientDriver`] implements [`ClientIo`] over any provider
//! and runs a [`ClientSession`] with [`ClientDriver::poll`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use dp_fabric::types::inc_rkey;
use dp_fabric::{
    Access, CmChannel, ConnId, Device, MemoryRegion, MemoryWindow, PostError, ProtectionDomain,
    Provider, SendOp, Sge,
};
use mempool::memory::{Region, RegionConfig};

use super::PathKill;
use super::qp::{
    ConnTable, LocalMem, PathConns, QpRes, alloc_windows, errno_of, gone, poll_conn, write_bind,
};
use crate::clt::{ClientIo, ClientSession, DataRef, Mapped};
use crate::timer::Instant;
use crate::work::{CmEvent, Conn, Dir, OutOfBounds, PathId, QpSizes, RecvBuf, RegToken, Wr};

/// What the client driver is built with.
#[derive(Clone, Copy, Debug)]
pub struct ClientDriverConfig {
    /// Permits the header buffers are made for: at least the server's queue depth (a
    /// request through a permit above it fails with `MsgSize`).
    pub max_queue_depth: u16,
    /// Bytes of header buffer per permit: user message plus the RTRS header (at most the
    /// server's `max_hdr_size`).
    pub hdr_bytes: u32,
}

impl Default for ClientDriverConfig {
    /// 512 permits (Linux's default queue depth) of 512 bytes.
    fn default() -> Self {
        Self {
            max_queue_depth: 512,
            hdr_bytes: 512,
        }
    }
}

/// A path's registrations: its protection domain (so the server reaches only what was
/// registered for this path), the header buffers and the data regions in it.
struct PathMem<P: Provider> {
    pd: P::Pd,
    iu: P::Mr,
    iu_slot: u32,
    /// Per-IO registration: a memory window per permit slot, its current key, and the
    /// bind `map_data` prepared for the slot's request (posted at the head of its chain).
    windows: Vec<Window<P>>,
    data: Vec<P::Mr>,
}

/// One permit slot's memory window (per-IO registration).
struct Window<P: Provider> {
    /// Held: dropping the window invalidates its key.
    _mw: P::Mw,
    key: u32,
    bind: Option<SendOp>,
}

impl<P: Provider> LocalMem for PathMem<P> {
    fn iu_sge(&self, slot: u16, len: u32) -> Option<Sge> {
        let at = u64::from(slot) * u64::from(self.iu_slot);
        if len > self.iu_slot || at + u64::from(len) > self.iu.len() as u64 {
            return None;
        }
        Some(Sge {
            addr: self.iu.addr() + at,
            length: len,
            lkey: self.iu.lkey(),
        })
    }

    fn chunk_sge(&self, _chunk: u16, _len: u32) -> Option<Sge> {
        None
    }

    fn bind_of(&self, w: &Wr<'_>) -> Option<SendOp> {
        match *w {
            Wr::Register { token, .. } => self.windows.get(usize::try_from(token).ok()?)?.bind,
            _ => None,
        }
    }
}

/// A path of the client: its CM channel, its registrations (once connected) and its
/// connections by cid.
pub(super) struct CPath<P: Provider> {
    id: PathId,
    addr: SocketAddr,
    dev: Arc<P::Device>,
    cm: P::Cm,
    mem: Option<PathMem<P>>,
    conns: Vec<Option<QpRes<P>>>,
}

impl<P: Provider> CPath<P> {
    fn conn_of(&self, id: ConnId) -> Option<Conn> {
        self.conns
            .iter()
            .flatten()
            .find(|q| q.conn_id == id)
            .map(|q| q.conn)
    }
}

/// Counters of the driver itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Connection-manager events handed to the state machine.
    pub cm_events: u64,
    /// Completions handed to the state machine.
    pub completions: u64,
    /// Connection-manager events of connections already closed (ignored).
    pub stale_cm_events: u64,
}

/// The client's driver over provider `P` (see the module doc).
pub struct ClientDriver<P: Provider> {
    dev: Arc<P::Device>,
    /// Server addresses of the paths to come, each with the device it goes out on.
    routes: VecDeque<(SocketAddr, Arc<P::Device>)>,
    paths: Vec<Option<CPath<P>>>,
    iu: Arc<Region>,
    iu_slot: u32,
    /// Permit slots (windows per path with per-IO registration).
    slots: u16,
    /// Paths set up from now on register each READ's buffer per IO (a memory window).
    per_io: bool,
    regions: Vec<Arc<Region>>,
    scratch: Vec<u8>,
    stats: DriverStats,
    turn: u32,
    #[cfg(feature = "testing")]
    tamper_imm: Option<fn(u32) -> u32>,
}

impl<P: Provider> core::fmt::Debug for ClientDriver<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ClientDriver")
            .field("provider", &P::NAME)
            .field("paths", &self.paths.iter().flatten().count())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<P: Provider> ClientDriver<P> {
    /// A driver on `dev`, with header buffers for `cfg.max_queue_depth` permits.
    ///
    /// # Errors
    /// The header buffers cannot be allocated.
    pub fn new(
        dev: Arc<P::Device>,
        cfg: ClientDriverConfig,
    ) -> Result<Self, mempool::memory::MemError> {
        let iu_slot = cfg.hdr_bytes.max(64);
        let len =
            (usize::from(cfg.max_queue_depth.max(1)) * iu_slot as usize).next_multiple_of(4096);
        let iu = Arc::new(Region::new(&RegionConfig::new("rtrs-iu", len).quiet())?);
        Ok(Self {
            dev,
            routes: VecDeque::new(),
            paths: Vec::new(),
            iu,
            iu_slot,
            slots: cfg.max_queue_depth.max(1),
            per_io: false,
            regions: Vec::new(),
            scratch: Vec::with_capacity(64),
            stats: DriverStats::default(),
            turn: 0,
            #[cfg(feature = "testing")]
            tamper_imm: None,
        })
    }

    /// Queues the server address of the next path the session connects: paths take the
    /// queued addresses in the order they first connect ([`ClientSession::open`] connects
    /// its paths in the order of its UUIDs, [`ClientSession::add_path`] one more). A path
    /// keeps its address across reconnects.
    pub fn add_route(&mut self, addr: SocketAddr) {
        let dev = Arc::clone(&self.dev);
        self.routes.push_back((addr, dev));
    }

    /// [`add_route`](Self::add_route) over device `dev` instead of the driver's: a
    /// multipath session with each path on its own HCA port (`rxe0`, `rxe1`), as Linux RTRS
    /// spreads paths over devices. The path's connection-manager channel, protection
    /// domain, registrations and queue pairs are all made on `dev`.
    pub fn add_route_via(&mut self, addr: SocketAddr, dev: Arc<P::Device>) {
        self.routes.push_back((addr, dev));
    }

    /// Per-IO registration, as Linux's client does it: every READ's buffer is exposed to
    /// the server under a key of its own, a type-2 memory window of the request's permit
    /// bound with a fresh consumer key ([`Wr::Register`] at the head of the request's
    /// chain), and the key is invalid before the request completes (the server answers with
    /// `SEND_WITH_INV`, asked by `NEED_INVAL`, or the client posts `LOCAL_INV`). The data
    /// regions are then registered for memory-window binding, never for remote write: a
    /// server reaches only the buffers of the READs in flight, not the whole region. For
    /// paths set up after the call (set it before the session opens); the provider must have
    /// memory windows (shm and verbs have them; a provider without fails those paths' set-up).
    pub fn set_per_io_registration(&mut self, on: bool) {
        self.per_io = on;
    }

    fn data_access(&self) -> Access {
        if self.per_io {
            Access::LOCAL_WRITE | Access::MW_BIND
        } else {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        }
    }

    /// Adds a data region (requests name it by the returned number in
    /// [`DataRef::region`]). It is registered on every path for local access and remote
    /// write (READ answers land in it), so it must be shareable with peers for providers
    /// that need that (`RegionConfig::shareable`).
    ///
    /// # Errors
    /// Registering it on a connected path failed (the provider's error).
    pub fn add_region(&mut self, region: Arc<Region>) -> Result<u32, dp_fabric::FabricError> {
        for p in self.paths.iter_mut().flatten() {
            if let Some(m) = p.mem.as_mut() {
                let access = if m.windows.is_empty() {
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE
                } else {
                    Access::LOCAL_WRITE | Access::MW_BIND
                };
                let mr = m.pd.reg_region(&region, 0, region.len(), access)?;
                m.data.push(mr);
            }
        }
        self.regions.push(region);
        Ok(self.regions.len() as u32 - 1)
    }

    /// A data region added with [`add_region`](Self::add_region).
    pub fn region(&self, id: u32) -> Option<&Arc<Region>> {
        self.regions.get(id as usize)
    }

    /// The driver's counters.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Test kit (feature `testing`): makes this client lie, rewriting the immediate of
    /// every IO request it posts with `f` (to show that a lying client costs only its own
    /// session on the server). Never in shipped code.
    #[cfg(feature = "testing")]
    pub fn set_tamper_imm(&mut self, f: Option<fn(u32) -> u32>) {
        self.tamper_imm = f;
    }

    /// Test kit (feature `testing`): posts an RDMA WRITE of the first `len` bytes of the
    /// header buffers to `remote` on connection `cid` of `path`, outside the protocol, as a
    /// peer may at any time: what a server's keys let through (a stale chunk key must not).
    /// Its success is only counted ([`debug_private_done`](Self::debug_private_done)); its
    /// failure fails the path, as any failed request does. Never in shipped code.
    ///
    /// # Errors
    /// No such connection, `len` beyond the header buffers, or the provider's refusal.
    #[cfg(feature = "testing")]
    pub fn debug_write(
        &mut self,
        path: PathId,
        cid: u16,
        remote: dp_fabric::RemoteAddr,
        len: u32,
    ) -> Result<(), PostError> {
        let p = self.path_mut(path).ok_or_else(gone)?;
        let CPath { conns, mem, .. } = p;
        let m = mem.as_ref().ok_or_else(gone)?;
        if len as usize > m.iu.len() {
            return Err(PostError {
                index: 0,
                kind: dp_fabric::PostErrorKind::MessageTooLong,
            });
        }
        let q = conns
            .get_mut(usize::from(cid))
            .and_then(Option::as_mut)
            .ok_or_else(gone)?;
        let sge = [m.iu.sge(0, len)];
        q.post_private(&[(SendOp::Write(remote), &sge[..])])
    }

    /// Test kit (feature `testing`): how many of the path's [`debug_write`](Self::debug_write)s
    /// completed successfully, on its live connections.
    #[cfg(feature = "testing")]
    pub fn debug_private_done(&self, path: PathId) -> u64 {
        self.path(path).map_or(0, |p| {
            p.conns.iter().flatten().map(|q| q.private_done).sum()
        })
    }

    /// The server address a path connects to.
    pub fn path_addr(&self, path: PathId) -> Option<SocketAddr> {
        self.path(path).map(|p| p.addr)
    }

    /// Tears a path down from below, as a failing link does: every connection of the path
    /// is disconnected through the connection manager (both sides see `DISCONNECTED`).
    /// The session then fails the path's requests over and reconnects it later. Returns
    /// the number of connections disconnected.
    pub fn kill_path(&mut self, path: PathId) -> usize {
        self.kill_path_by(path, PathKill::Disconnect)
    }

    /// Tears a path down from below as `how` says ([`PathKill`]). Returns the number of
    /// connections disconnected or moved to the error state.
    pub fn kill_path_by(&mut self, path: PathId, how: PathKill) -> usize {
        let Some(p) = self.path_mut(path) else {
            return 0;
        };
        match how {
            PathKill::Disconnect => {
                let ids: Vec<ConnId> = p.conns.iter().flatten().map(|q| q.conn_id).collect();
                ids.iter()
                    .filter(|&&id| p.cm.disconnect(id).is_ok())
                    .count()
            }
            PathKill::QpError => {
                let mut n = 0;
                for q in p.conns.iter_mut().flatten() {
                    q.move_to_error();
                    n += 1;
                }
                n
            }
        }
    }

    fn path(&self, id: PathId) -> Option<&CPath<P>> {
        self.paths
            .get(usize::from(id.idx))?
            .as_ref()
            .filter(|p| p.id == id)
    }

    fn path_mut(&mut self, id: PathId) -> Option<&mut CPath<P>> {
        self.paths
            .get_mut(usize::from(id.idx))?
            .as_mut()
            .filter(|p| p.id == id)
    }

    /// One turn of the loop of the crate doc for `sess`: connection-manager events,
    /// completions, due timers. Returns the number of events and completions handled (0:
    /// idle). The caller then drains `sess.poll_event()` and submits.
    pub fn poll(&mut self, now: Instant, sess: &mut ClientSession) -> usize {
        let mut work = 0;
        for p in 0..self.paths.len() {
            let cids = self.paths[p].as_ref().map_or(0, |x| x.conns.len());
            for cid in 0..cids {
                work += poll_conn(self, p, cid, |d, conn, wc, out| {
                    sess.handle_completion(now, conn, wc, out, d);
                });
            }
        }
        // The control path (CM events, timers) once every CTRL_EVERY turns: it stays off
        // the round trip of every request, busy or idle.
        self.turn = self.turn.wrapping_add(1);
        if self.turn.is_multiple_of(super::CTRL_EVERY) {
            work += self.poll_cm(now, sess);
            if sess.poll_timeout().is_some_and(|t| t <= now) {
                sess.handle_timeout(now, self);
            }
        }
        work
    }

    fn poll_cm(&mut self, now: Instant, sess: &mut ClientSession) -> usize {
        let mut work = 0;
        for p in 0..self.paths.len() {
            while let Some(ev) = self.paths[p].as_mut().and_then(|x| x.cm.poll_event()) {
                let path = self.paths[p].as_mut().expect("polled above");
                work += 1;
                use dp_fabric::CmEvent as F;
                let (id, data, kind) = match ev {
                    F::Established { conn, private_data } => (Some(conn), private_data, 0),
                    F::Rejected { conn, private_data } => (Some(conn), private_data, 1),
                    F::Unreachable { conn, .. } => (Some(conn), Default::default(), 2),
                    F::Disconnected { conn } => (Some(conn), Default::default(), 3),
                    F::DeviceRemoval => (None, Default::default(), 4),
                    F::ConnectRequest { request, .. } => {
                        // A client listens nowhere; refuse what arrives anyway.
                        let _ = path.cm.reject(request, &[]);
                        continue;
                    }
                };
                let conn = match id {
                    Some(id) => path.conn_of(id),
                    None => path.conns.iter().flatten().next().map(|q| q.conn),
                };
                let Some(conn) = conn else {
                    self.stats.stale_cm_events += 1;
                    continue;
                };
                let ev = match kind {
                    0 => CmEvent::Established {
                        private_data: data.as_bytes(),
                    },
                    1 => CmEvent::Rejected {
                        private_data: data.as_bytes(),
                    },
                    2 => CmEvent::Unreachable,
                    3 => CmEvent::Disconnected,
                    _ => CmEvent::DeviceRemoval,
                };
                self.stats.cm_events += 1;
                sess.handle_cm(now, conn, ev, self);
            }
        }
        work
    }

    /// The path of `conn` with its live connection (the epoch must match).
    fn split(&mut self, conn: Conn) -> Option<(&mut QpRes<P>, &PathMem<P>)> {
        let p = self.paths.get_mut(usize::from(conn.path.idx))?.as_mut()?;
        if p.id != conn.path {
            return None;
        }
        let CPath { conns, mem, .. } = p;
        let q = conns.get_mut(usize::from(conn.cid))?.as_mut()?;
        if q.conn != conn {
            return None;
        }
        Some((q, mem.as_ref()?))
    }

    /// Test kit: posts `chain` with every IO request's immediate rewritten by `f`.
    #[cfg(feature = "testing")]
    #[cold]
    fn post_lied(
        &mut self,
        conn: Conn,
        chain: &[Wr<'_>],
        f: fn(u32) -> u32,
    ) -> Result<(), PostError> {
        let mut lied = [Wr::LocalInv { wr_id: 0, key: 0 }; super::MAX_CHAIN];
        for (d, w) in lied.iter_mut().zip(chain) {
            *d = *w;
            if let Wr::IoRequest { imm, .. } = d {
                *imm = f(*imm);
            }
        }
        let (q, mem) = self.split(conn).ok_or_else(gone)?;
        q.post_send(&mem.pd, &lied[..chain.len()], mem)
    }

    fn ensure_path(&mut self, id: PathId) -> Result<&mut CPath<P>, i32> {
        let i = usize::from(id.idx);
        if self.paths.len() <= i {
            self.paths.resize_with(i + 1, || None);
        }
        if self.paths[i].as_ref().is_none_or(|p| p.id != id) {
            let (addr, dev) = self.routes.pop_front().ok_or(-libc::EHOSTUNREACH)?;
            let cm = dev.create_cm_channel().map_err(|e| errno_of(&e))?;
            self.paths[i] = Some(CPath {
                id,
                addr,
                dev,
                cm,
                mem: None,
                conns: Vec::new(),
            });
        }
        let access = self.data_access();
        let p = self.paths[i].as_mut().expect("made above");
        if p.mem.is_none() {
            let pd = p.dev.alloc_pd().map_err(|e| errno_of(&e))?;
            let iu = pd
                .reg_region(&self.iu, 0, self.iu.len(), Access::LOCAL_WRITE)
                .map_err(|e| errno_of(&e))?;
            let mut data = Vec::with_capacity(self.regions.len());
            for r in &self.regions {
                data.push(
                    pd.reg_region(r, 0, r.len(), access)
                        .map_err(|e| errno_of(&e))?,
                );
            }
            let n = if self.per_io { self.slots } else { 0 };
            let windows = alloc_windows::<P>(&pd, usize::from(n))?
                .into_iter()
                .map(|mw| Window {
                    key: mw.rkey(),
                    _mw: mw,
                    bind: None,
                })
                .collect();
            p.mem = Some(PathMem {
                pd,
                iu,
                iu_slot: self.iu_slot,
                windows,
                data,
            });
        }
        Ok(p)
    }
}

impl<P: Provider> PathConns<P> for CPath<P> {
    fn conns(&mut self) -> &mut [Option<QpRes<P>>] {
        &mut self.conns
    }
}

impl<P: Provider> ConnTable<P> for ClientDriver<P> {
    type Path = CPath<P>;

    fn parts(&mut self) -> (&mut [Option<CPath<P>>], &mut Vec<u8>, &mut u64) {
        (
            &mut self.paths,
            &mut self.scratch,
            &mut self.stats.completions,
        )
    }
}

impl<P: Provider> ClientIo for ClientDriver<P> {
    fn connect(&mut self, conn: Conn, sizes: QpSizes, private_data: &[u8; 56]) -> Result<(), i32> {
        let p = self.ensure_path(conn.path)?;
        let addr = p.addr;
        let CPath {
            cm,
            mem,
            conns,
            dev,
            ..
        } = p;
        let pd = &mem.as_ref().expect("ensure_path made it").pd;
        let q = QpRes::connect(&**dev, pd, cm, addr, conn, sizes, private_data)?;
        let cid = usize::from(conn.cid);
        if conns.len() <= cid {
            conns.resize_with(cid + 1, || None);
        }
        conns[cid] = Some(q);
        Ok(())
    }

    fn close_path(&mut self, path: PathId) {
        let Some(p) = self.path_mut(path) else {
            return;
        };
        for q in p.conns.iter().flatten() {
            let _ = p.cm.disconnect(q.conn_id);
        }
        // Memory windows first: a type-2 window bound through a queue pair holds that
        // queue pair until the window is invalidated or deallocated (rxe blocks
        // `ibv_destroy_qp` for 50 s, then warns), and the requests a dead path leaves
        // behind still have theirs bound. Deallocating a window kills its key, so this
        // only takes remote access away. Then queue pairs and completion queues, then the
        // registrations and the protection domain: nothing of the path can move data
        // once this returns.
        if let Some(m) = p.mem.as_mut() {
            m.windows.clear();
        }
        p.conns.clear();
        p.mem = None;
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        #[cfg(feature = "testing")]
        if let Some(f) = self.tamper_imm
            && chain.len() <= super::MAX_CHAIN
        {
            return self.post_lied(conn, chain, f);
        }
        let (q, mem) = self.split(conn).ok_or_else(gone)?;
        q.post_send(&mem.pd, chain, mem)
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        let (q, mem) = self.split(conn).ok_or_else(gone)?;
        q.post_recv(&mem.pd, wr_id, buf)
    }

    fn map_data(&mut self, conn: Conn, slot: u16, data: &DataRef, dir: Dir) -> Result<Mapped, i32> {
        let p = self
            .paths
            .get_mut(usize::from(conn.path.idx))
            .and_then(Option::as_mut)
            .filter(|p| p.id == conn.path)
            .ok_or(libc::ENOTCONN)?;
        let mem = p.mem.as_mut().ok_or(libc::ENOTCONN)?;
        let mr = mem.data.get(data.region as usize).ok_or(libc::EFAULT)?;
        let end = data
            .offset
            .checked_add(u64::from(data.len))
            .ok_or(libc::EFAULT)?;
        if end > mr.len() as u64 {
            return Err(libc::EFAULT);
        }
        let addr = mr.addr() + data.offset;
        let (lkey, mut rkey, mut register) = (mr.lkey(), mr.rkey(), None);
        // A READ's buffer under a key of its own (a WRITE's data is only gathered locally).
        if dir == Dir::Read && !mem.windows.is_empty() {
            let w = mem.windows.get_mut(usize::from(slot)).ok_or(libc::EINVAL)?;
            w.key = inc_rkey(w.key);
            w.bind = Some(write_bind(w.key, lkey, addr, u64::from(data.len)));
            rkey = w.key;
            register = Some(RegToken::from(slot));
        }
        Ok(Mapped {
            addr,
            lkey,
            rkey,
            register,
        })
    }

    fn write_iu(&mut self, slot: u16, off: u32, bytes: &[u8]) -> Result<(), OutOfBounds> {
        let end = (off as usize).checked_add(bytes.len()).ok_or(OutOfBounds)?;
        let at = usize::from(slot) * self.iu_slot as usize;
        if end > self.iu_slot as usize || at + end > self.iu.len() {
            return Err(OutOfBounds);
        }
        self.iu.copy_in(at + off as usize, bytes);
        Ok(())
    }
}
