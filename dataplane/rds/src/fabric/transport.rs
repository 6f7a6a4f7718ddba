//! [`FabricTransport`]: RDS-IB's transport over any dp-fabric provider. Connection
//! management (listen, connect, accept with RDS-IB's private data, events) and the
//! dispatch of the data path to each connection's [`Link`].

use crate::idmap::IdMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dp_fabric::Access;
use dp_fabric::{
    CmChannel, CmEvent, Completion, CompletionQueue, ConnId, ConnRequest, Device, FabricError,
    ListenId, ProtectionDomain, Provider,
};
use lcore::time::Instant;
use mempool::memory::Region;

use super::config::{FabricConfig, FabricStats, RECV_BUF};
use super::link::{INLINE_CAP, Link, LinkCx, LinkRes, LinkState};
use super::rdma::{MAX_WINDOW, WINDOW_EXT_LEN, WindowMemory, append_window, peer_window};
use crate::engine::{Accept, Incoming, RdsEngine, Reject, TransportCmd, TransportKind};
use crate::path::{PathId, TxFrame};
use crate::transport::Transport;
use crate::wire::ib::{IbConnPriv, IbConnPrivRepr, PRIV_LEN_V6, REJ_INCOMPAT};

/// RDS over a fabric provider: one RC queue pair per path, connected through the
/// provider's CM with RDS-IB's `rds_ib_connect_private` (protocol 3.1, the bytes the
/// kernel sends), a ring of header + 4 KiB receive buffers per connection whose count is
/// the peer's credit, frames posted as SENDs straight from the engine's fragment region
/// (registered once), and send completions reported cumulatively.
///
/// A connection that fails (CM disconnect, error completion, a peer's violation found by
/// the engine) is reported to the engine, which resets the path, retransmits what was
/// unacked on the next connection, and reconnects with RDS's backoff. Nothing a peer does
/// reaches another connection.
pub struct FabricTransport<P: Provider> {
    cfg: FabricConfig,
    /// Declared before the device: every queue pair is dropped before the channel and the
    /// protection domain it was made from.
    links: IdMap<PathId, Link<P>>,
    by_conn: IdMap<ConnId, PathId>,
    listeners: Vec<(ListenId, SocketAddr)>,
    frag_mr: P::Mr,
    /// The RDMA window and its registration for local access (the local side of RDMA
    /// operations), once exposed.
    window: Option<(Arc<Region>, P::Mr)>,
    cm: P::Cm,
    pd: P::Pd,
    dev: P::Device,
    send_depth: u32,
    /// The paths whose connections have a post list staged since the last
    /// [`Transport::flush_transmit`] (made once, a path at most once).
    staged: Vec<PathId>,
    next_cm: Instant,
    wcs: Vec<Completion>,
    scratch: Box<[u8; RECV_BUF]>,
    stats: FabricStats,
    name: String,
}

impl<P: Provider> core::fmt::Debug for FabricTransport<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("provider", &P::NAME)
            .field("links", &self.links.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Why a fabric transport could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricTransportError {
    /// The settings are unusable.
    #[error("RDS fabric transport: {0}")]
    Config(&'static str),
    /// The engine lists no message transport (`TransportSpec::ib()`), so no path of it
    /// could ever be carried.
    #[error(
        "RDS fabric transport: the engine has no Ib transport; add TransportSpec::ib() to RdsConfig::transports"
    )]
    NoIbTransport,
    /// The provider failed.
    #[error("RDS fabric transport: {0}")]
    Fabric(#[from] FabricError),
}

impl<P: Provider> FabricTransport<P> {
    /// A transport on `dev` for `engine`: allocates the protection domain and the CM
    /// channel, registers the engine's fragment region once (the payload of every frame
    /// is sent from it), and listens on every local address the engine has now (add
    /// later ones with [`Transport::add_local_addr`]).
    ///
    /// # Errors
    ///
    /// Bad settings, an engine without an Ib transport, or the provider's failure.
    pub fn new(
        dev: P::Device,
        engine: &RdsEngine,
        mut cfg: FabricConfig,
    ) -> Result<Self, FabricTransportError> {
        cfg.check().map_err(FabricTransportError::Config)?;
        let spec = engine
            .config()
            .transports
            .iter()
            .find(|t| t.kind == TransportKind::Ib)
            .ok_or(FabricTransportError::NoIbTransport)?;
        cfg.inline_max = cfg
            .inline_max
            .min(INLINE_CAP as u32)
            .min(dev.attr().max_inline_data);
        let pd = dev.alloc_pd()?;
        let cm = dev.create_cm_channel()?;
        let region = engine.frags().region();
        let frag_mr = pd.reg_region(region, 0, region.len(), Access::NONE)?;
        let mut t = Self {
            send_depth: spec.path.send_depth,
            wcs: vec![Completion::default(); cfg.cq_batch],
            scratch: Box::new([0; RECV_BUF]),
            name: format!("{}-ring", engine.config().name),
            cfg,
            links: IdMap::default(),
            by_conn: IdMap::default(),
            listeners: Vec::new(),
            frag_mr,
            window: None,
            cm,
            pd,
            dev,
            staged: Vec::new(),
            next_cm: Instant::ZERO,
            stats: FabricStats::default(),
        };
        for ip in engine.local_addrs() {
            t.listen(ip)?;
        }
        Ok(t)
    }

    /// Gives the node an RDMA window: `RDS_GET_MR` on the engine's sockets registers
    /// ranges of `window` (and only of it) for peers, each range with its own key. Take
    /// RDMA buffers from this region (a `mempool` region: hugepages when reserved; for the
    /// shm provider any region works, its registration shares the pages). Replaces an
    /// earlier window, whose regions are freed. Control path.
    ///
    /// # Errors
    ///
    /// A window above 4 GiB (cookie offsets are 32 bits), or the provider's failure to
    /// register it for local access.
    pub fn expose_window(
        &mut self,
        engine: &mut RdsEngine,
        window: Arc<Region>,
    ) -> Result<(), FabricTransportError> {
        if window.len() > MAX_WINDOW {
            return Err(FabricTransportError::Config(
                "an RDMA window is at most 4 GiB (cookie offsets are 32 bits)",
            ));
        }
        let local = self
            .pd
            .reg_region(&window, 0, window.len(), Access::LOCAL_WRITE)?;
        engine
            .set_rdma_memory(
                TransportKind::Ib,
                Box::new(WindowMemory::<P>::new(self.pd.clone(), window.clone())),
            )
            .map_err(|_| FabricTransportError::NoIbTransport)?;
        self.window = Some((window, local));
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> &FabricStats {
        &self.stats
    }

    /// Live connections (any state).
    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// The settings in force (after clamping to the device).
    pub fn config(&self) -> &FabricConfig {
        &self.cfg
    }

    /// Disconnects the connection of `path` from our side, as a peer or the network
    /// would (the CM disconnect reaches both ends). For tests and tools that exercise
    /// reconnection; returns false if the path has no connection.
    pub fn disconnect(&mut self, path: PathId) -> bool {
        match self.links.get(&path) {
            Some(l) => self.cm.disconnect(l.conn).is_ok(),
            None => false,
        }
    }

    /// The paths that have a connection.
    pub fn paths(&self) -> impl Iterator<Item = PathId> + '_ {
        self.links.keys().copied()
    }

    fn port_for(&self, ip: IpAddr) -> u16 {
        if ip.is_ipv4() {
            self.cfg.port_v4
        } else {
            self.cfg.port_v6
        }
    }

    fn listen(&mut self, ip: IpAddr) -> Result<(), FabricError> {
        let addr = SocketAddr::new(ip, self.port_for(ip));
        if self.listeners.iter().any(|(_, a)| *a == addr) {
            return Ok(());
        }
        let id = self.cm.listen(addr, 128)?;
        self.listeners.push((id, addr));
        Ok(())
    }

    /// RDS-IB's private data, with our window's announcement appended when we have one
    /// and it fits.
    fn private_with_window(
        &self,
        (bytes, n): ([u8; PRIV_LEN_V6], usize),
    ) -> ([u8; PRIV_LEN_V6 + WINDOW_EXT_LEN], usize) {
        let mut out = [0u8; PRIV_LEN_V6 + WINDOW_EXT_LEN];
        out[..n].copy_from_slice(&bytes[..n]);
        let n = match &self.window {
            Some((w, _)) => append_window(&mut out, n, w.as_ptr() as u64),
            None => n,
        };
        (out, n)
    }

    fn new_res(&self) -> Result<LinkRes<P>, FabricError> {
        LinkRes::new(&self.dev, &self.pd, &self.cfg, self.send_depth, &self.name)
    }

    /// Drops a connection: disconnects it and destroys its queue pair, after which nothing
    /// posted on it can complete or touch memory.
    fn remove(&mut self, path: PathId) -> bool {
        let Some(link) = self.links.remove(&path) else {
            return false;
        };
        self.by_conn.remove(&link.conn);
        let _ = self.cm.disconnect(link.conn);
        drop(link);
        true
    }

    /// Dials the peer for `path` (`rds_ib_conn_path_connect`): receives are posted and
    /// reported first, so the request's private data grants them as initial credits.
    fn connect(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId, faddr: IpAddr) {
        self.remove(path);
        let Ok(res) = self.new_res() else {
            self.stats.connect_failures += 1;
            engine.handle_connect_failed(now, path);
            return;
        };
        engine.handle_recv_posted(now, path, res.recv_depth);
        let Some(private) = engine.connect_private(path) else {
            return;
        };
        let (bytes, n) = self.private_with_window(private.to_bytes());
        let dst = SocketAddr::new(faddr, self.cfg.peer_port.unwrap_or(self.port_for(faddr)));
        let init = res.init(&self.pd, &self.cfg);
        let r = self
            .cm
            .connect_prepared(dst, &init, &bytes[..n], &mut |qp| res.post_all_recvs(qp));
        match r {
            Ok((conn, qp)) => {
                self.stats.connects += 1;
                self.by_conn.insert(conn, path);
                let mut link = Link::new(qp, res, conn, LinkState::Connecting);
                link.v6 = faddr.is_ipv6();
                self.links.insert(path, link);
            }
            Err(_) => {
                self.stats.connect_failures += 1;
                engine.handle_connect_failed(now, path);
            }
        }
    }

    /// A peer dials us (`rds_ib_cm_handle_connect`). The private data names the
    /// connection: its destination must be the address the request reached.
    fn incoming(&mut self, engine: &mut RdsEngine, now: Instant, request: P::ConnRequest) {
        let local = request.local_addr();
        let v6 = local.is_ipv6();
        let parsed = IbConnPrivRepr::parse(request.private_data(), v6);
        let Ok(p) = parsed.map_err(|_| ()).and_then(|p| {
            if p.daddr == local.ip() {
                Ok(p)
            } else {
                Err(())
            }
        }) else {
            self.stats.bad_requests += 1;
            self.stats.rejects += 1;
            let _ = self.cm.reject(request, &[]);
            return;
        };
        let req = Incoming {
            transport: TransportKind::Ib,
            laddr: p.daddr,
            faddr: p.saddr,
            tos: p.tos,
            path_index: 0,
            private: request.private_data(),
        };
        let (path, version) = match engine.handle_incoming(now, req) {
            Accept::Yes { path, version } => (path, version),
            Accept::No(why) => {
                self.stats.rejects += 1;
                let code = REJ_INCOMPAT.to_ne_bytes();
                let data: &[u8] = match why {
                    Reject::Incompatible(_) => &code,
                    Reject::NotLocal | Reject::Busy | Reject::NoMemory => &[],
                };
                let _ = self.cm.reject(request, data);
                return;
            }
        };
        // The engine accepted: the path was down, so an old connection of it is stale.
        self.remove(path);
        let Ok(res) = self.new_res() else {
            self.stats.rejects += 1;
            let _ = self.cm.reject(request, &[]);
            engine.handle_transport_error(now, path);
            engine.handle_transport_down(now, path);
            return;
        };
        engine.handle_recv_posted(now, path, res.recv_depth);
        let Some(private) = engine.accept_private(path, version) else {
            return;
        };
        let (bytes, n) = self.private_with_window(private.to_bytes());
        let peer_base = peer_window(request.private_data(), IbConnPriv::<&[u8]>::size(v6));
        let init = res.init(&self.pd, &self.cfg);
        let r = self
            .cm
            .accept_prepared(request, &init, &bytes[..n], &mut |qp| {
                res.post_all_recvs(qp)
            });
        match r {
            Ok((conn, qp)) => {
                self.stats.accepts += 1;
                self.by_conn.insert(conn, path);
                let mut link = Link::new(qp, res, conn, LinkState::Accepting);
                link.v6 = v6;
                link.peer_base = peer_base;
                self.links.insert(path, link);
            }
            Err(_) => {
                self.stats.rejects += 1;
                engine.handle_transport_error(now, path);
                engine.handle_transport_down(now, path);
            }
        }
    }

    /// The provider refused a post on the connection of `path`: it fails, after the
    /// receives that completed before.
    #[cold]
    fn fail_posting(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId) {
        if let Some(link) = self.links.get_mut(&path) {
            link.fail_after_receives(&mut LinkCx {
                engine,
                now,
                path,
                wcs: &mut self.wcs,
                scratch: &mut self.scratch,
                stats: &mut self.stats,
            });
        }
    }

    /// Connection events.
    fn poll_cm(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut work = 0;
        while let Some(ev) = self.cm.poll_event() {
            work += 1;
            match ev {
                CmEvent::ConnectRequest { request, .. } => self.incoming(engine, now, request),
                CmEvent::Established { conn, private_data } => {
                    let Some(&path) = self.by_conn.get(&conn) else {
                        continue;
                    };
                    let Some(link) = self.links.get_mut(&path) else {
                        continue;
                    };
                    let reply: &[u8] = match link.state {
                        LinkState::Connecting => private_data.as_bytes(),
                        LinkState::Accepting => &[],
                        LinkState::Up | LinkState::Broken => continue,
                    };
                    if link.state == LinkState::Connecting {
                        link.peer_base = peer_window(reply, IbConnPriv::<&[u8]>::size(link.v6));
                    }
                    link.state = LinkState::Up;
                    self.stats.established += 1;
                    engine.handle_connected(now, path, reply);
                }
                CmEvent::Rejected { conn, .. } | CmEvent::Unreachable { conn, .. } => {
                    let Some(&path) = self.by_conn.get(&conn) else {
                        continue;
                    };
                    if self.links.get(&path).map(|l| l.state) == Some(LinkState::Connecting) {
                        self.remove(path);
                        self.stats.connect_failures += 1;
                        engine.handle_connect_failed(now, path);
                    }
                }
                CmEvent::Disconnected { conn } => {
                    let Some(&path) = self.by_conn.get(&conn) else {
                        continue;
                    };
                    if let Some(link) = self.links.get_mut(&path) {
                        let mut cx = LinkCx {
                            engine: &mut *engine,
                            now,
                            path,
                            wcs: &mut self.wcs,
                            scratch: &mut self.scratch,
                            stats: &mut self.stats,
                        };
                        // What completed before the disconnect still counts, as the
                        // successful completions ahead of the flush errors do on a verbs
                        // CQ: a peer that acked our last messages and then closed has
                        // acked them (dropping that ack would resend them to a peer that
                        // is gone, and its sender would wait for ever).
                        if link.state == LinkState::Up {
                            link.poll_send(&mut cx);
                        }
                        link.fail_after_receives(&mut cx);
                    }
                }
                CmEvent::DeviceRemoval => {
                    for (&path, link) in &mut self.links {
                        link.fail(engine, now, path, &mut self.stats);
                    }
                }
            }
        }
        work
    }
}

impl<P: Provider> Transport for FabricTransport<P> {
    fn kind(&self) -> TransportKind {
        TransportKind::Ib
    }

    fn add_local_addr(&mut self, ip: IpAddr) -> std::io::Result<()> {
        self.listen(ip).map_err(|e| {
            std::io::Error::other(format!(
                "RDS fabric transport: cannot listen on {ip} port {}: {e}; is another RDS node using this address?",
                self.port_for(ip)
            ))
        })
    }

    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        for (k, v) in self.stats.iter() {
            f(k, v);
        }
    }

    fn reset_all(&mut self) -> usize {
        let cm = &mut self.cm;
        self.links
            .values()
            .filter(|l| cm.disconnect(l.conn).is_ok())
            .count()
    }

    fn poll(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut work = 0;
        if now >= self.next_cm {
            self.next_cm = now.saturating_add(self.cfg.cm_interval);
            work += self.poll_cm(engine, now);
        }
        for (&path, link) in &mut self.links {
            // Frames of a connection count only once the engine knows it is up (a passive
            // side hears the peer's ready-to-use after the peer may have sent): until
            // then its completions wait in the queue.
            if link.state == LinkState::Connecting || link.state == LinkState::Accepting {
                continue;
            }
            let mut cx = LinkCx {
                engine: &mut *engine,
                now,
                path,
                wcs: &mut self.wcs,
                scratch: &mut self.scratch,
                stats: &mut self.stats,
            };
            // The queues' cheap looks first (loads only): a node spinning for the next
            // frame polls every queue of every connection per turn, and two fruitless
            // polls cost ~280 instructions per node and turn (rds_oneway_cost, idle).
            if link.res.scq.may_have_work() {
                work += link.poll_send(&mut cx);
            }
            if link.has_pending() || link.res.rcq.may_have_work() {
                work += link.poll_recv(&mut cx);
            }
        }
        work
    }

    fn command(&mut self, engine: &mut RdsEngine, now: Instant, cmd: TransportCmd) {
        match cmd {
            TransportCmd::Connect { path, faddr, .. } => self.connect(engine, now, path, faddr),
            TransportCmd::Disconnect { path } => {
                if self.remove(path) {
                    self.stats.teardowns += 1;
                }
                engine.handle_transport_down(now, path);
            }
        }
    }

    fn transmit(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId, frame: TxFrame) {
        let Some(link) = self.links.get_mut(&path) else {
            self.stats.tx_no_link += 1;
            return;
        };
        if link.state != LinkState::Up {
            self.stats.tx_no_link += 1;
            return;
        }
        let every = self.cfg.signal_every;
        let window = self.window.as_ref().map(|(_, mr)| mr);
        let listed = link.has_staged();
        // The turn's last frame (the engine has no more now) posts the list at once: no
        // flush_transmit lookup for it (a ping, a pong, the end of a burst).
        let last = !engine.may_transmit();
        let r = link.transmit(
            engine,
            &self.frag_mr,
            window,
            &frame,
            last,
            every,
            &mut self.stats,
        );
        let staged = link.has_staged();
        if r.is_err() {
            self.fail_posting(engine, now, path);
        } else if !listed && staged {
            self.staged.push(path);
        }
        if last && !self.staged.is_empty() {
            // The other connections' lists go too (the node does not call flush_transmit
            // after a last frame).
            self.flush_transmit(engine, now);
        }
    }

    fn flush_transmit(&mut self, engine: &mut RdsEngine, now: Instant) {
        let every = self.cfg.signal_every;
        while let Some(path) = self.staged.pop() {
            if let Some(link) = self.links.get_mut(&path)
                && link.post_staged(every).is_err()
            {
                self.fail_posting(engine, now, path);
            }
        }
    }
}
