//! The server's fabric driver: [`ServerDriver`] implements [`ServerIo`] over any provider
//! and runs a [`Server`] with [`ServerDriver::poll`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dp_fabric::types::inc_rkey;
use dp_fabric::{
    Access, CmChannel, ConnId, ConnRequest, Device, ListenId, MemoryRegion, MemoryWindow,
    PostError, PrivateData, ProtectionDomain, Provider, SendOp, Sge,
};
use mempool::memory::{Region, RegionConfig};

use super::PathKill;
use super::client::DriverStats;
use super::qp::{
    ConnTable, LocalMem, PathConns, QpRes, alloc_windows, errno_of, gone, poll_conn, write_bind,
};
use crate::srv::{CmToken, Server, ServerIo, SessId};
use crate::timer::Instant;
use crate::wire::SgDesc;
use crate::work::{CmEvent, Conn, OutOfBounds, PathId, QpSizes, RecvBuf, SrcRef, Wr};

/// A session's chunks: `queue_depth` chunks of `chunk_size` bytes in one region, shared by
/// every path of the session.
struct SSess {
    id: SessId,
    mem: Arc<Region>,
    chunk_size: u32,
    queue_depth: u16,
}

/// A path's registrations of its session's chunks, in a protection domain of its own: a
/// client's connections reach this session's chunks and nothing else.
///
/// With `always_invalidate` (`per_chunk`) the chunks are one region registered for local
/// access and window binding only (its own key grants a peer nothing), and each chunk is
/// reached through a type-2 memory window of its own, bound over the chunk alone:
/// `Wr::LocalInv` of its key when a request lands, `Wr::RegChunk` (a bind under
/// `inc_rkey` of it) in the response. The table [`map_chunks`](ServerIo::map_chunks)
/// gives the state machine holds each window's first key, `inc_rkey(mw.rkey())`, bound
/// by [`ServerDriver::post_chain`] before the path's first send (see there).
pub(super) struct SPath<P: Provider> {
    id: PathId,
    pd: P::Pd,
    /// Regions of `per` chunks each, in chunk order (`always_invalidate`: one region).
    regions: Vec<P::Mr>,
    per: u32,
    chunk_size: u32,
    /// `always_invalidate`: a memory window per chunk, in chunk order (else empty).
    /// Declared before the connections: dropped first (see `close_path`).
    windows: Vec<P::Mw>,
    /// The windows' first binds are still to be posted (before the path's first send).
    unbound: bool,
    conns: Vec<Option<QpRes<P>>>,
    /// The device (channel) it lives on.
    chan: usize,
    /// The handler's sources, registered in this path's domain for local access only (a
    /// client's key never names them), by source number.
    sources: Vec<P::Mr>,
    /// (ours, the client's) of the path's first accepted connection: sysfs `src_addr`,
    /// `dst_addr`.
    addrs: Option<(SocketAddr, SocketAddr)>,
}

/// A path's chunk registrations as a post needs them, borrowed beside its connections.
struct Chunks<'a, P: Provider> {
    regions: &'a [P::Mr],
    per: u32,
    chunk_size: u32,
    windows: &'a [P::Mw],
    sources: &'a [P::Mr],
}

impl<P: Provider> LocalMem for Chunks<'_, P> {
    fn iu_sge(&self, _slot: u16, _len: u32) -> Option<Sge> {
        None
    }

    fn chunk_sge(&self, chunk: u16, len: u32) -> Option<Sge> {
        if len > self.chunk_size {
            return None;
        }
        // One region (a session below 4 GiB of chunks): no division on every answer.
        let c = u32::from(chunk);
        let (r, k) = if self.regions.len() == 1 && c < self.per {
            (0, c)
        } else {
            (c / self.per, c % self.per)
        };
        let mr = self.regions.get(r as usize)?;
        let off = u64::from(k) * u64::from(self.chunk_size);
        Some(Sge {
            addr: mr.addr() + off,
            length: len,
            lkey: mr.lkey(),
        })
    }

    /// `always_invalidate`: chunk `chunk`'s window bound over the chunk under `key`, which
    /// must name that window (its upper 24 bits); the window was invalidated first (the
    /// state machine's `LOCAL_INV` when the request landed, or never bound).
    fn bind_of(&self, w: &Wr<'_>) -> Option<SendOp> {
        let Wr::RegChunk { chunk, key, .. } = *w else {
            return None;
        };
        let mw = self.windows.get(usize::from(chunk))?;
        if key & !0xFF != mw.rkey() & !0xFF {
            return None;
        }
        let sge = self.chunk_sge(chunk, self.chunk_size)?;
        Some(write_bind(
            key,
            sge.lkey,
            sge.addr,
            u64::from(self.chunk_size),
        ))
    }

    fn source_sge(&self, src: SrcRef, len: u32) -> Option<Sge> {
        let mr = self.sources.get(src.id as usize)?;
        let end = src.offset.checked_add(u64::from(len))?;
        if end > mr.len() as u64 {
            return None;
        }
        Some(Sge {
            addr: mr.addr() + src.offset,
            length: len,
            lkey: mr.lkey(),
        })
    }
}

/// Test kit (feature `testing`): how a hostile server lies, to show that a client pays
/// for a lying server with that session only. Never in shipped code.
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tamper {
    /// Rewrites the chunk table of every `info_rsp` as it is sent (after the server
    /// checked its own table).
    pub table: Option<fn(&mut Vec<SgDesc>)>,
    /// Rewrites the immediate of every WRITE with immediate the server posts (IO
    /// responses and heartbeats).
    pub imm: Option<fn(u32) -> u32>,
}

/// Sources a driver takes (each is registered on every path).
pub const MAX_SOURCES: usize = 64;

/// A device the server listens on: its connection-manager channel and listeners.
struct Chan<P: Provider> {
    dev: Arc<P::Device>,
    cm: P::Cm,
    listeners: Vec<ListenId>,
}

/// The server's driver over provider `P` (see the module doc).
pub struct ServerDriver<P: Provider> {
    #[cfg(feature = "testing")]
    tamper: Tamper,
    /// One connection-manager channel per device, with its listeners.
    chans: Vec<Chan<P>>,
    /// The connect request being answered, and the channel it came on.
    pending: Option<(CmToken, P::ConnRequest, usize)>,
    next_token: CmToken,
    sessions: Vec<Option<SSess>>,
    paths: Vec<Option<SPath<P>>>,
    /// Handler memory READs may be answered from (`add_source`), by source number.
    sources: Vec<Arc<Region>>,
    scratch: Vec<u8>,
    stats: DriverStats,
    turn: u32,
}

impl<P: Provider> core::fmt::Debug for ServerDriver<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ServerDriver")
            .field("provider", &P::NAME)
            .field("devices", &self.chans.len())
            .field(
                "listeners",
                &self.chans.iter().map(|c| c.listeners.len()).sum::<usize>(),
            )
            .field("sessions", &self.sessions.iter().flatten().count())
            .field("paths", &self.paths.iter().flatten().count())
            .finish()
    }
}

/// What identifies a path's addresses for the server's duplicate check: the listener's
/// address and port (one per path) and the client's address (not its port, which
/// differs per connection).
fn path_addr(local: SocketAddr, peer: SocketAddr) -> u128 {
    let ip = |a: IpAddr| match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v) as u64 as u128 ^ (u128::from(v) >> 64),
    };
    (ip(local.ip()) << 80) ^ (u128::from(local.port()) << 64) ^ ip(peer.ip())
}

impl<P: Provider> ServerDriver<P> {
    /// A driver on `dev` listening on every address of `listen` (one per path the clients
    /// use: over shm, distinct ports).
    ///
    /// # Errors
    /// Creating the CM channel or a listener failed.
    pub fn new(dev: Arc<P::Device>, listen: &[SocketAddr]) -> Result<Self, dp_fabric::FabricError> {
        Self::with_devices(&[(dev, listen)])
    }

    /// A driver listening on several devices, each on its addresses (a multipath server
    /// with a path per HCA port, `rxe0` and `rxe1`): a path lives on the device its first
    /// connection came in on (its protection domain, chunk registrations and queue pairs
    /// are made there), and a later connection of that path on another device is refused.
    ///
    /// # Errors
    /// No device given; creating a CM channel or a listener failed.
    pub fn with_devices(
        devices: &[(Arc<P::Device>, &[SocketAddr])],
    ) -> Result<Self, dp_fabric::FabricError> {
        if devices.is_empty() {
            return Err(dp_fabric::FabricError::InvalidArgument {
                what: "server devices",
                why: "give at least one device to listen on".into(),
            });
        }
        let mut chans = Vec::with_capacity(devices.len());
        for (dev, listen) in devices {
            let mut cm = dev.create_cm_channel()?;
            let mut listeners = Vec::with_capacity(listen.len());
            for a in *listen {
                listeners.push(cm.listen(*a, 128)?);
            }
            chans.push(Chan {
                dev: Arc::clone(dev),
                cm,
                listeners,
            });
        }
        Ok(Self {
            #[cfg(feature = "testing")]
            tamper: Tamper::default(),
            chans,
            pending: None,
            next_token: 1,
            sessions: Vec::new(),
            paths: Vec::new(),
            sources: Vec::new(),
            scratch: Vec::with_capacity(512),
            stats: DriverStats::default(),
            turn: 0,
        })
    }

    /// The addresses listened on (with the actual ports when 0 was asked).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.chans
            .iter()
            .flat_map(|c| c.listeners.iter().filter_map(|l| c.cm.listen_addr(*l)))
            .collect()
    }

    /// A path's addresses, (ours, the client's), as the kernel's sysfs `src_addr` and
    /// `dst_addr` of `/sys/class/rtrs-server/<sess>/paths/<path>/`; `None` before its
    /// first connection was accepted.
    pub fn path_addrs(&self, path: PathId) -> Option<(SocketAddr, SocketAddr)> {
        self.paths
            .get(usize::from(path.idx))?
            .as_ref()
            .filter(|p| p.id == path)?
            .addrs
    }

    /// The device a path lives on, as its index in [`with_devices`](Self::with_devices)
    /// (0 for [`new`](Self::new)): sysfs `hca_name`'s answer.
    pub fn path_device(&self, path: PathId) -> Option<usize> {
        self.paths
            .get(usize::from(path.idx))?
            .as_ref()
            .filter(|p| p.id == path)
            .map(|p| p.chan)
    }

    /// The driver's counters.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Test kit: makes this server lie as `t` says.
    #[cfg(feature = "testing")]
    pub fn set_tamper(&mut self, t: Tamper) {
        self.tamper = t;
    }

    /// Writes `bytes` at `off` of chunk `chunk` of `sess`: how a handler puts a READ's
    /// answer in place before `resp_rdma`.
    ///
    /// # Errors
    /// [`OutOfBounds`] outside the chunk or for an unknown session.
    pub fn write_chunk(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: u32,
        bytes: &[u8],
    ) -> Result<(), OutOfBounds> {
        let (s, at) = self.chunk_at(sess, chunk, off, bytes.len())?;
        s.mem.copy_in(at, bytes);
        Ok(())
    }

    /// Makes `region` a source READs may be answered from with
    /// [`Server::resp_rdma_from`](crate::srv::Server::resp_rdma_from) (zero copy: a RAM
    /// disk's blocks go to the client without a copy into the chunk). The region is
    /// registered for local access only, in every path's protection domain, now and for
    /// every path that comes later: no client can read or write it, the server's RDMA writes
    /// gather from it. Returns the source number for [`SrcRef`].
    ///
    /// # Errors
    /// Registering it on an existing path failed (nothing is kept then).
    pub fn add_source(&mut self, region: Arc<Region>) -> Result<u32, dp_fabric::FabricError> {
        if self.sources.len() >= MAX_SOURCES {
            return Err(dp_fabric::FabricError::Exhausted {
                what: "handler sources",
                limit: MAX_SOURCES as u64,
                hint: "register one large region and answer from offsets in it",
            });
        }
        let id = self.sources.len() as u32;
        let mut mrs = Vec::new();
        for p in self.paths.iter().flatten() {
            mrs.push(p.pd.reg_region(&region, 0, region.len(), Access::NONE)?);
        }
        for (p, mr) in self.paths.iter_mut().flatten().zip(mrs) {
            p.sources.push(mr);
        }
        self.sources.push(region);
        Ok(id)
    }

    /// Chunk `chunk` of `sess` as registered memory: the region, the chunk's offset in it
    /// and its length. For a handler whose backend reads or writes the chunk in place (zero
    /// copy): holding the `Arc` keeps the memory mapped even if the session closes before
    /// the backend finishes. The client may write the chunk at any time (it is remotely
    /// writable), so it is raw memory, never to be turned into a Rust reference.
    ///
    /// # Errors
    /// [`OutOfBounds`] for an unknown session or a chunk past its queue depth.
    pub fn chunk_mem(
        &self,
        sess: SessId,
        chunk: u16,
    ) -> Result<(Arc<Region>, usize, usize), OutOfBounds> {
        let (s, at) = self.chunk_at(sess, chunk, 0, 0)?;
        Ok((Arc::clone(&s.mem), at, s.chunk_size as usize))
    }

    fn chunk_at(
        &self,
        sess: SessId,
        chunk: u16,
        off: u32,
        len: usize,
    ) -> Result<(&SSess, usize), OutOfBounds> {
        let s = self
            .sessions
            .get(usize::from(sess.idx))
            .and_then(Option::as_ref)
            .filter(|s| s.id == sess)
            .ok_or(OutOfBounds)?;
        let end = (off as usize).checked_add(len).ok_or(OutOfBounds)?;
        if chunk >= s.queue_depth || end > s.chunk_size as usize {
            return Err(OutOfBounds);
        }
        Ok((s, usize::from(chunk) * s.chunk_size as usize + off as usize))
    }

    /// Tears a path down from below (every connection disconnected through the CM), as a
    /// failing link does. Returns the number of connections disconnected.
    pub fn kill_path(&mut self, path: PathId) -> usize {
        self.kill_path_by(path, PathKill::Disconnect)
    }

    /// Tears a path down from below as `how` says ([`PathKill`]). Returns the number of
    /// connections disconnected or moved to the error state.
    pub fn kill_path_by(&mut self, path: PathId, how: PathKill) -> usize {
        let Some(p) = self
            .paths
            .get_mut(usize::from(path.idx))
            .and_then(Option::as_mut)
            .filter(|p| p.id == path)
        else {
            return 0;
        };
        match how {
            PathKill::Disconnect => {
                let ids: Vec<ConnId> = p.conns.iter().flatten().map(|q| q.conn_id).collect();
                let cm = &mut self.chans[p.chan].cm;
                ids.iter().filter(|&&id| cm.disconnect(id).is_ok()).count()
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

    /// One turn of the loop of the crate doc for `srv`: connect requests and other
    /// connection-manager events, completions, due timers. Returns the number of events
    /// and completions handled. The caller then drains `srv.poll_event()` and answers.
    pub fn poll(&mut self, now: Instant, srv: &mut Server) -> usize {
        let mut work = 0;
        for p in 0..self.paths.len() {
            let cids = self.paths[p].as_ref().map_or(0, |x| x.conns.len());
            for cid in 0..cids {
                work += poll_conn(self, p, cid, |d, conn, wc, out| {
                    srv.handle_completion(now, conn, wc, out, d);
                });
            }
        }
        // The control path (CM events, timers) once every CTRL_EVERY turns: it stays off
        // the round trip of every request, busy or idle.
        self.turn = self.turn.wrapping_add(1);
        if self.turn.is_multiple_of(super::CTRL_EVERY) {
            work += self.poll_cm(now, srv);
            if srv.poll_timeout().is_some_and(|t| t <= now) {
                srv.handle_timeout(now, self);
            }
        }
        work
    }

    /// Posts `chain` on `conn` (the body of [`ServerIo::post_send`]): the connection and
    /// the path's chunk registrations borrowed side by side, nothing moved.
    ///
    /// `always_invalidate`: the first send of a path on connection 0 (the `info_rsp`; no
    /// connection sends before it) goes behind the first bind of every chunk's window,
    /// posted here in one list on the same queue pair. Binds run in order with the sends
    /// of their queue pair, so they have all run before the `info_rsp` leaves, and a client
    /// sends IO only once it has the `info_rsp`: no request meets an unbound window. (The
    /// window is reached through the client's IO connections, not connection 0: the
    /// provider must let every queue pair of the domain reach it, `mw_domain_wide`, which
    /// `map_chunks` checked.) Connection 0's send queue was made that much bigger
    /// (`accept`); the list's last bind is signalled, and `poll_conn` drops its
    /// completion; a failed bind fails the path. An error at post time is this chain's.
    fn post_chain(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        let SPath {
            pd,
            regions,
            per,
            chunk_size,
            windows,
            unbound,
            conns,
            sources,
            ..
        } = self.spath(conn.path).ok_or_else(gone)?;
        let q = conns
            .get_mut(usize::from(conn.cid))
            .and_then(Option::as_mut)
            .filter(|q| q.conn == conn)
            .ok_or_else(gone)?;
        let mem = Chunks::<P> {
            regions,
            per: *per,
            chunk_size: *chunk_size,
            windows,
            sources,
        };
        if *unbound && conn.cid == 0 {
            *unbound = false;
            // The RegChunk a response would post, under the key of the table.
            let binds = mem
                .windows
                .iter()
                .enumerate()
                .map(|(c, mw)| {
                    let first = Wr::RegChunk {
                        wr_id: 0,
                        chunk: c as u16,
                        key: inc_rkey(mw.rkey()),
                        signaled: false,
                    };
                    mem.bind_of(&first).map(|op| (op, &[][..]))
                })
                .collect::<Option<Vec<(SendOp, &[Sge])>>>()
                .ok_or_else(gone)?;
            q.post_private(&binds)?;
        }
        q.post_send(pd, chain, &mem)
    }

    /// Test kit: posts `chain` with the lies of [`Tamper`] told.
    #[cfg(feature = "testing")]
    #[cold]
    fn post_lied(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        let mut lied = [Wr::LocalInv { wr_id: 0, key: 0 }; super::MAX_CHAIN];
        let mut info = Vec::new();
        for (d, w) in lied.iter_mut().zip(chain) {
            *d = *w;
        }
        for w in lied.iter_mut().take(chain.len()) {
            match w {
                Wr::WriteImmEmpty { imm, .. } if self.tamper.imm.is_some() => {
                    *imm = (self.tamper.imm.expect("checked"))(*imm);
                }
                Wr::SendMsg { bytes, .. } if self.tamper.table.is_some() => {
                    if let Ok(rsp) = crate::wire::InfoRsp::new_checked(*bytes)
                        && rsp.msg_type() == crate::wire::MsgType::InfoRsp
                    {
                        let mut descs: Vec<SgDesc> = rsp.descs().collect();
                        (self.tamper.table.expect("checked"))(&mut descs);
                        info = vec![0; crate::wire::InfoRsp::<&[u8]>::len_for(descs.len())];
                        crate::wire::InfoRsp::new_unchecked(&mut info[..]).emit(&descs);
                    }
                }
                _ => {}
            }
        }
        if !info.is_empty() {
            for w in lied.iter_mut().take(chain.len()) {
                if let Wr::SendMsg { bytes, .. } = w {
                    *bytes = &info;
                }
            }
        }
        self.post_chain(conn, &lied[..chain.len()])
    }

    /// The connection channel `k` names `id` (ids are per device).
    fn conn_of(&self, k: usize, id: ConnId) -> Option<Conn> {
        self.paths
            .iter()
            .flatten()
            .filter(|p| p.chan == k)
            .flat_map(|p| p.conns.iter().flatten())
            .find(|q| q.conn_id == id)
            .map(|q| q.conn)
    }

    fn poll_cm(&mut self, now: Instant, srv: &mut Server) -> usize {
        let mut work = 0;
        for k in 0..self.chans.len() {
            work += self.poll_chan(k, now, srv);
        }
        work
    }

    fn poll_chan(&mut self, k: usize, now: Instant, srv: &mut Server) -> usize {
        let mut work = 0;
        while let Some(ev) = self.chans[k].cm.poll_event() {
            work += 1;
            use dp_fabric::CmEvent as F;
            let (id, kind) = match ev {
                F::ConnectRequest { request, .. } => {
                    let token = self.next_token;
                    self.next_token += 1;
                    let addr = path_addr(request.local_addr(), request.peer_addr());
                    let data = PrivateData::new(request.private_data()).unwrap_or_default();
                    self.pending = Some((token, request, k));
                    self.stats.cm_events += 1;
                    srv.handle_connect_request(now, token, addr, data.as_bytes(), self);
                    if let Some((_, request, k)) = self.pending.take() {
                        // The server answers every request; never leave a peer waiting.
                        let _ = self.chans[k].cm.reject(request, &[]);
                    }
                    continue;
                }
                F::Established { conn, .. } => (Some(conn), 0),
                F::Rejected { conn, .. }
                | F::Unreachable { conn, .. }
                | F::Disconnected { conn } => (Some(conn), 1),
                F::DeviceRemoval => (None, 2),
            };
            let conns: Vec<Conn> = match id {
                Some(id) => self.conn_of(k, id).into_iter().collect(),
                // Every path of the device: its first connection stands for the path.
                None => self
                    .paths
                    .iter()
                    .flatten()
                    .filter(|p| p.chan == k)
                    .filter_map(|p| p.conns.iter().flatten().next().map(|q| q.conn))
                    .collect(),
            };
            if conns.is_empty() {
                self.stats.stale_cm_events += 1;
            }
            for conn in conns {
                let ev = match kind {
                    0 => CmEvent::Established { private_data: &[] },
                    1 => CmEvent::Disconnected,
                    _ => CmEvent::DeviceRemoval,
                };
                self.stats.cm_events += 1;
                srv.handle_cm(now, conn, ev, self);
            }
        }
        work
    }

    fn spath(&mut self, id: PathId) -> Option<&mut SPath<P>> {
        self.paths
            .get_mut(usize::from(id.idx))?
            .as_mut()
            .filter(|p| p.id == id)
    }
}

impl<P: Provider> PathConns<P> for SPath<P> {
    fn conns(&mut self) -> &mut [Option<QpRes<P>>] {
        &mut self.conns
    }
}

impl<P: Provider> ConnTable<P> for ServerDriver<P> {
    type Path = SPath<P>;

    fn parts(&mut self) -> (&mut [Option<SPath<P>>], &mut Vec<u8>, &mut u64) {
        (
            &mut self.paths,
            &mut self.scratch,
            &mut self.stats.completions,
        )
    }
}

impl<P: Provider> ServerIo for ServerDriver<P> {
    fn accept(
        &mut self,
        req: CmToken,
        conn: Conn,
        sizes: QpSizes,
        private_data: &[u8; 56],
    ) -> Result<(), i32> {
        let (request, k) = match self.pending.take() {
            Some((t, r, k)) if t == req => (r, k),
            other => {
                self.pending = other;
                return Err(-libc::EINVAL);
            }
        };
        let Chan { dev, cm, .. } = &mut self.chans[k];
        let Some(p) = self
            .paths
            .get_mut(usize::from(conn.path.idx))
            .and_then(Option::as_mut)
            .filter(|p| p.id == conn.path)
        else {
            let _ = cm.reject(request, private_data);
            return Err(-libc::ENOENT);
        };
        if p.chan != k {
            // A connection of the path on another device than the path's first: its
            // registrations are not there.
            let _ = cm.reject(request, private_data);
            return Err(-libc::EINVAL);
        }
        let addrs = (request.local_addr(), request.peer_addr());
        let mut sizes = sizes;
        if conn.cid == 0 {
            // always_invalidate: room for the windows' first binds (`post_chain`).
            sizes.max_send_wr += p.windows.len() as u32;
        }
        let q = QpRes::accept(&**dev, &p.pd, cm, request, conn, sizes, private_data)?;
        p.addrs.get_or_insert(addrs);
        let cid = usize::from(conn.cid);
        if p.conns.len() <= cid {
            p.conns.resize_with(cid + 1, || None);
        }
        p.conns[cid] = Some(q);
        Ok(())
    }

    fn reject(&mut self, req: CmToken, private_data: &[u8; 56]) {
        match self.pending.take() {
            Some((t, r, k)) if t == req => {
                let _ = self.chans[k].cm.reject(r, private_data);
            }
            other => self.pending = other,
        }
    }

    fn close_path(&mut self, path: PathId) {
        let Some(slot) = self.paths.get_mut(usize::from(path.idx)) else {
            return;
        };
        if slot.as_ref().is_none_or(|p| p.id != path) {
            return;
        }
        let p = slot.take().expect("checked");
        let cm = &mut self.chans[p.chan].cm;
        for q in p.conns.iter().flatten() {
            let _ = cm.disconnect(q.conn_id);
        }
        // Memory windows first (always_invalidate): a type-2 window holds the queue pair
        // that bound it until it is invalidated or deallocated (rxe blocks `destroy_qp` on
        // bound windows; see the client's `close_path`), and dropping one only takes
        // remote access away. Then queue pairs, then registrations, then the protection
        // domain.
        let SPath {
            windows,
            conns,
            regions,
            pd,
            ..
        } = p;
        drop(windows);
        drop(conns);
        drop(regions);
        drop(pd);
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        #[cfg(feature = "testing")]
        if chain.len() <= super::MAX_CHAIN
            && (self.tamper.imm.is_some() || self.tamper.table.is_some())
        {
            return self.post_lied(conn, chain);
        }
        self.post_chain(conn, chain)
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        let p = self.spath(conn.path).ok_or_else(gone)?;
        let q = p
            .conns
            .get_mut(usize::from(conn.cid))
            .and_then(Option::as_mut)
            .filter(|q| q.conn == conn)
            .ok_or_else(gone)?;
        q.post_recv(&p.pd, wr_id, buf)
    }

    fn create_session(
        &mut self,
        sess: SessId,
        queue_depth: u16,
        chunk_size: u32,
    ) -> Result<(), i32> {
        let len = usize::from(queue_depth) * chunk_size as usize;
        let mem = Region::new(
            &RegionConfig::new("rtrs-chunks", len)
                .shareable(true)
                .quiet(),
        )
        .map_err(|_| -libc::ENOMEM)?;
        let i = usize::from(sess.idx);
        if self.sessions.len() <= i {
            self.sessions.resize_with(i + 1, || None);
        }
        self.sessions[i] = Some(SSess {
            id: sess,
            mem: Arc::new(mem),
            chunk_size,
            queue_depth,
        });
        Ok(())
    }

    fn free_session(&mut self, sess: SessId) {
        if let Some(s) = self.sessions.get_mut(usize::from(sess.idx))
            && s.as_ref().is_some_and(|s| s.id == sess)
        {
            *s = None;
        }
    }

    fn map_chunks(
        &mut self,
        sess: SessId,
        path: PathId,
        per_chunk: bool,
        table: &mut Vec<SgDesc>,
    ) -> Result<(), i32> {
        // The path lives on the device its first connection came in on.
        let k = self.pending.as_ref().map_or(0, |p| p.2);
        let dev = &self.chans[k].dev;
        if per_chunk && !dev.attr().mw_domain_wide {
            // always_invalidate with windows needs a window bound on one connection to be
            // reachable from all: a client picks the connection per request, and a chunk is
            // re-bound on the connection its last request came on. Type-2 windows on verbs
            // are reachable only through the queue pair that bound them, and Linux's
            // PD-wide fast-registration MRs do not exist in user verbs: run such a server
            // with `always_invalidate = false`.
            return Err(-libc::EOPNOTSUPP);
        }
        let s = self
            .sessions
            .get(usize::from(sess.idx))
            .and_then(Option::as_ref)
            .filter(|s| s.id == sess)
            .ok_or(-libc::ENOENT)?;
        let qd = u32::from(s.queue_depth);
        let cs = s.chunk_size;
        // As few regions as fit the 32-bit length of a table entry, their count dividing
        // the queue depth (always_invalidate: one, each chunk an entry of its own).
        let mut n = 1u32;
        while !per_chunk && u64::from(qd / n) * u64::from(cs) > u64::from(u32::MAX) {
            if !qd.is_multiple_of(n * 2) {
                return Err(-libc::ENOMEM);
            }
            n *= 2;
        }
        let per = qd / n;
        let len = per as usize * cs as usize;
        let pd = dev.alloc_pd().map_err(|e| errno_of(&e))?;
        let mut regions = Vec::with_capacity(n as usize);
        table.clear();
        // always_invalidate: the region's own key grants a peer nothing; each chunk is
        // reached through its window (see `SPath`), under the key of its first bind.
        let access = if per_chunk {
            Access::LOCAL_WRITE | Access::MW_BIND
        } else {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        };
        for r in 0..n as usize {
            let mr = pd
                .reg_region(&s.mem, r * len, len, access)
                .map_err(|e| errno_of(&e))?;
            if !per_chunk {
                table.push(SgDesc {
                    addr: mr.addr(),
                    key: mr.rkey(),
                    len: len as u32,
                });
            }
            regions.push(mr);
        }
        let windows = if per_chunk {
            alloc_windows::<P>(&pd, qd as usize)?
        } else {
            Vec::new()
        };
        for (c, mw) in windows.iter().enumerate() {
            table.push(SgDesc {
                addr: regions[0].addr() + c as u64 * u64::from(cs),
                key: inc_rkey(mw.rkey()),
                len: cs,
            });
        }

        let i = usize::from(path.idx);
        if self.paths.len() <= i {
            self.paths.resize_with(i + 1, || None);
        }
        let mut sources = Vec::with_capacity(self.sources.len());
        for r in &self.sources {
            sources.push(
                pd.reg_region(r, 0, r.len(), Access::NONE)
                    .map_err(|e| errno_of(&e))?,
            );
        }
        self.paths[i] = Some(SPath {
            id: path,
            pd,
            regions,
            per,
            chunk_size: cs,
            unbound: !windows.is_empty(),
            windows,
            conns: Vec::new(),
            chan: k,
            sources,
            addrs: None,
        });
        Ok(())
    }

    fn source_fits(&self, src: SrcRef, len: u32) -> bool {
        self.sources.get(src.id as usize).is_some_and(|r| {
            src.offset
                .checked_add(u64::from(len))
                .is_some_and(|e| e <= r.len() as u64)
        })
    }

    fn read_chunk(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: u32,
        out: &mut [u8],
    ) -> Result<(), OutOfBounds> {
        let (s, at) = self.chunk_at(sess, chunk, off, out.len())?;
        s.mem.copy_out(at, out);
        Ok(())
    }
}
