//! [`TcpTransport`]: RDS over TCP, a [`Transport`] of kind [`TransportKind::Tcp`].

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use lcore::time::Instant;
use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use super::config::{TcpConfig, TcpStats};
use super::conn::TcpConn;
use crate::addr::Addr;
use crate::engine::{
    Accept, ConnKey, Incoming, RdsEngine, TransportCmd, TransportKind, TransportSpec,
};
use crate::path::{ConnState, PathId, TxFrame};
use crate::transport::Transport;
use crate::wire::MPATH_WORKERS;

/// First and last port of the range SPORT_IDX source ports are taken from (Linux's default
/// `ip_local_port_range`).
const SPORT_LOW: u16 = 32768;
const SPORT_HIGH: u16 = 60999;

/// How long an accepted connection waits for the live connection it replaces to end.
const PARK_LIMIT: Duration = Duration::from_secs(1);

/// An accepted connection waiting for its path's old connection to be read to its end.
#[derive(Debug)]
struct Parked {
    socket: Socket,
    laddr: IpAddr,
    faddr: IpAddr,
    index: u8,
    since: Instant,
}

impl Parked {
    /// True if this one waits for the same path as `laddr`/`faddr`/`index`.
    fn same_path(&self, laddr: IpAddr, faddr: IpAddr, index: u8) -> bool {
        self.laddr == laddr && self.faddr == faddr && self.index == index
    }
}

/// A dial in progress.
#[derive(Debug)]
struct Dialing {
    socket: Socket,
    laddr: IpAddr,
    faddr: IpAddr,
    deadline: Instant,
}

/// RDS over TCP with Linux's framing, connect rule and keepalive: one non-blocking kernel
/// TCP socket per path. See the [module documentation](super).
#[derive(Debug)]
pub struct TcpTransport {
    cfg: TcpConfig,
    listeners: Vec<(IpAddr, TcpListener)>,
    dialing: HashMap<PathId, Dialing>,
    conns: HashMap<PathId, TcpConn>,
    parked: Vec<Parked>,
    scratch: Box<[u8]>,
    next_sport: u16,
    stats: TcpStats,
}

impl TcpTransport {
    /// A transport with no listener yet: [`RdsNode::add_local_addr`](crate::node::RdsNode::add_local_addr)
    /// (or [`Transport::add_local_addr`]) makes one per local address.
    pub fn new(cfg: TcpConfig) -> Self {
        let seed = std::process::id() as u16;
        Self {
            cfg,
            listeners: Vec::new(),
            dialing: HashMap::new(),
            conns: HashMap::new(),
            parked: Vec::new(),
            scratch: vec![0u8; cfg.tx_buffer.max(4096)].into_boxed_slice(),
            next_sport: SPORT_LOW + (seed % (SPORT_HIGH - SPORT_LOW)),
            stats: TcpStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// Paths with a live connection.
    pub fn live_paths(&self) -> usize {
        self.conns.len()
    }

    /// Every live connection: its path, our socket address and the peer's.
    pub fn connections(&self) -> impl Iterator<Item = (PathId, SocketAddr, SocketAddr)> + '_ {
        self.conns.values().filter_map(|c| {
            let l = c.stream.local_addr().ok()?;
            let p = c.stream.peer_addr().ok()?;
            Some((c.path, l, p))
        })
    }

    /// Every live connection's path with the bytes written to and read from it since it
    /// was set up (which paths a multipath connection's traffic uses).
    pub fn path_bytes(&self) -> impl Iterator<Item = (PathId, u64, u64)> + '_ {
        self.conns.values().map(|c| {
            let (w, r) = c.bytes();
            (c.path, w, r)
        })
    }

    /// The address a listener is bound to (its port, when the configuration said 0).
    pub fn listen_addr(&self, ip: IpAddr) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(a, _)| *a == ip)
            .and_then(|(_, l)| l.local_addr().ok())
    }

    /// Options of every RDS-TCP socket: `TCP_NODELAY` and the kernel's keepalive.
    fn tune(&self, s: &Socket) -> io::Result<()> {
        s.set_tcp_nodelay(true)?;
        let ka = TcpKeepalive::new()
            .with_time(self.cfg.keepalive_idle)
            .with_interval(self.cfg.keepalive_interval)
            .with_retries(self.cfg.keepalive_count);
        s.set_tcp_keepalive(&ka)
    }

    /// A socket bound to `laddr` for the dial of path `index`: with SPORT_IDX, a port
    /// `p` with `p % 8 == index` (tried a few times, then any port).
    fn dial_socket(&mut self, laddr: IpAddr, index: u8, sport_idx: bool) -> io::Result<Socket> {
        let s = Socket::new(
            Domain::for_address(SocketAddr::new(laddr, 0)),
            Type::STREAM.nonblocking(),
            Some(Protocol::TCP),
        )?;
        s.set_reuse_address(true)?;
        self.tune(&s)?;
        if sport_idx {
            for _ in 0..16 {
                let base = self.next_sport & !(MPATH_WORKERS as u16 - 1);
                self.next_sport = self.next_sport.wrapping_add(MPATH_WORKERS as u16);
                if self.next_sport > SPORT_HIGH || self.next_sport < SPORT_LOW {
                    self.next_sport = SPORT_LOW;
                }
                let port = base + u16::from(index);
                if s.bind(&SockAddr::from(SocketAddr::new(laddr, port)))
                    .is_ok()
                {
                    return Ok(s);
                }
            }
        }
        s.bind(&SockAddr::from(SocketAddr::new(laddr, 0)))?;
        Ok(s)
    }

    fn connect(&mut self, engine: &mut RdsEngine, now: Instant, cmd: TransportCmd) {
        let TransportCmd::Connect {
            path, laddr, faddr, ..
        } = cmd
        else {
            return;
        };
        self.close(path);
        self.stats.tcp_connect += 1;
        let sport_idx = spec_of(engine).is_some_and(|t| t.multipath && t.sport_idx);
        let started = self
            .dial_socket(laddr, path.index, sport_idx)
            .and_then(|s| {
                match s.connect(&SockAddr::from(SocketAddr::new(faddr, self.cfg.peer_port))) {
                    Ok(()) => Ok(s),
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
                    Err(e) => Err(e),
                }
            });
        match started {
            Ok(socket) => {
                let deadline = now.saturating_add(self.cfg.connect_timeout);
                self.dialing.insert(
                    path,
                    Dialing {
                        socket,
                        laddr,
                        faddr,
                        deadline,
                    },
                );
            }
            Err(_) => {
                self.stats.tcp_connect_failed += 1;
                engine.handle_connect_failed(now, path);
            }
        }
    }

    /// Drops whatever this transport holds for `path` (socket closed, nothing reported).
    fn close(&mut self, path: PathId) {
        self.dialing.remove(&path);
        if let Some(c) = self.conns.remove(&path) {
            if c.holds_bytes() {
                self.stats.tcp_closed_unread += 1;
            }
            c.kill();
        }
    }

    /// A connection of `path` is up over `socket`.
    fn establish(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId, socket: Socket) {
        let depth = engine
            .path(path)
            .map_or(1, |p| p.config().send_depth as usize);
        let stream = TcpStream::from(socket);
        if let Some(old) = self
            .conns
            .insert(path, TcpConn::new(stream, path, self.cfg.rx_buffer, depth))
        {
            // The parked accept waited for the old one to be read to its end; past
            // PARK_LIMIT with nothing to read, bytes that arrived since are counted here.
            if old.holds_bytes() {
                self.stats.tcp_closed_unread += 1;
            }
            old.kill();
        }
        engine.handle_connected(now, path, &[]);
    }

    /// Completed, failed or timed-out dials.
    fn poll_dials(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut done: Vec<(PathId, bool)> = Vec::new();
        for (&path, d) in &self.dialing {
            match d.socket.take_error() {
                Ok(Some(_)) | Err(_) => done.push((path, false)),
                Ok(None) if d.socket.peer_addr().is_ok() => done.push((path, true)),
                Ok(None) if now >= d.deadline => done.push((path, false)),
                Ok(None) => {}
            }
        }
        let work = done.len();
        for (path, ok) in done {
            let Some(d) = self.dialing.remove(&path) else {
                continue;
            };
            if !ok {
                self.stats.tcp_connect_failed += 1;
                engine.handle_connect_failed(now, path);
            } else if Addr::new(d.laddr) >= Addr::new(d.faddr) {
                // rds_tcp_state_change: the larger address drops its own established
                // connection so that the smaller one dials (it has seen ours and does).
                self.stats.tcp_connect_dropped_larger += 1;
                let _ = d.socket.shutdown(std::net::Shutdown::Both);
                engine.handle_connect_failed(now, path);
            } else {
                self.establish(engine, now, path, d.socket);
            }
        }
        work
    }

    /// The path an accepted connection serves. Single-path transports: 0. Multipath:
    ///
    /// * before the connection's paths are negotiated, path 0 while it is down (every
    ///   dialler, ours, 6.1's or a SPORT_IDX kernel's, dials path 0 alone first); with
    ///   path 0 up, a SPORT_IDX transport takes `sport % 8` (our dialler is ahead of us:
    ///   this node restarted while the peer kept its paths);
    /// * negotiated to one path (a single-path peer): 0;
    /// * after, `sport % 8` if the peer's probe said SPORT_IDX and our spec has it (its
    ///   source ports name their paths, so a reconnecting path finds its own sequence
    ///   numbers); else 6.1's `rds_tcp_accept_one` rule: the first path that is down.
    ///
    /// Before the peer's probe was read, `sport % 8` had been taken from any dialler: a
    /// 6.1 dialler's path 0 from a random port then landed on a random path (7 times in
    /// 8), and the node's own messages to the peer waited on a path 0 nobody dialled.
    fn accept_index(&self, engine: &RdsEngine, key: &ConnKey, sport: u16) -> u8 {
        let Some(spec) = spec_of(engine).filter(|t| t.multipath) else {
            return 0;
        };
        let by_port = (sport % MPATH_WORKERS as u16) as u8;
        let Some(c) = engine.conn_id(key) else {
            return 0;
        };
        let down = |i: u8| {
            engine
                .path_state(PathId { conn: c, index: i })
                .is_none_or(|s| s == ConnState::Down)
        };
        let n = engine.conn_npaths(c).unwrap_or(0);
        match n {
            0 => {
                return if spec.sport_idx && !down(0) {
                    by_port
                } else {
                    0
                };
            }
            1 => return 0,
            _ => {}
        }
        if spec.sport_idx && engine.conn_peer_sport_idx(c) {
            return by_port;
        }
        (0..n).find(|&i| down(i)).unwrap_or(0)
    }

    /// New connections on the listeners.
    fn poll_accepts(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut work = 0;
        for li in 0..self.listeners.len() {
            loop {
                let (stream, peer) = match self.listeners[li].1.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                work += 1;
                let laddr = match stream.local_addr() {
                    Ok(a) => a.ip(),
                    Err(_) => continue,
                };
                self.accept_one(engine, now, stream, laddr, peer);
            }
        }
        work
    }

    fn accept_one(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        stream: TcpStream,
        laddr: IpAddr,
        peer: SocketAddr,
    ) {
        let faddr = canonical(peer.ip());
        let laddr = canonical(laddr);
        let mut req = Incoming {
            transport: TransportKind::Tcp,
            laddr,
            faddr,
            tos: 0,
            path_index: 0,
            private: &[],
        };
        if Addr::new(faddr) > Addr::new(laddr) {
            // Only the smaller address dials: close it and dial back.
            self.stats.tcp_accept_from_larger += 1;
            let _ = stream.shutdown(std::net::Shutdown::Both);
            engine.handle_knock(now, req);
            return;
        }
        let key = req.conn_key();
        req.path_index = self.accept_index(engine, &key, peer.port());
        let socket = Socket::from(stream);
        if socket.set_nonblocking(true).is_err() || self.tune(&socket).is_err() {
            self.stats.tcp_accept_refused += 1;
            return;
        }
        let old = engine.conn_id(&key).map(|conn| PathId {
            conn,
            index: req.path_index,
        });
        let behind = self
            .parked
            .iter()
            .any(|p| p.same_path(laddr, faddr, req.path_index));
        if behind || old.is_some_and(|p| self.conns.contains_key(&p)) {
            // A connection replacing a live one of the same path (the peer lost the old
            // one): the old one may still hold bytes the peer's TCP saw acknowledged, so
            // its RDS has released those messages. Read the old one to its end first.
            // The same holds for an earlier replacement still parked (the peer lost that
            // one too, after its TCP acknowledged what it carried): a path's connections
            // are taken in the order they arrived, never a later one first.
            self.stats.tcp_accept_parked += 1;
            self.parked.push(Parked {
                socket,
                laddr,
                faddr,
                index: req.path_index,
                since: now,
            });
            return;
        }
        self.finish_accept(engine, now, socket, req);
    }

    /// Hands an accepted connection to the engine.
    fn finish_accept(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        socket: Socket,
        req: Incoming<'_>,
    ) {
        let key = req.conn_key();
        // Still a live one (it did not end within PARK_LIMIT): take what it holds now,
        // as far as the store allows, before the engine resets the path.
        if let Some(c) = engine
            .conn_id(&key)
            .map(|conn| PathId {
                conn,
                index: req.path_index,
            })
            .and_then(|p| self.conns.get_mut(&p))
        {
            let _ = c.receive(engine, now, &mut self.stats);
        }
        match engine.handle_incoming(now, req) {
            Accept::Yes { path, .. } => {
                self.stats.tcp_accepted += 1;
                self.dialing.remove(&path);
                self.establish(engine, now, path, socket);
            }
            Accept::No(_) => {
                self.stats.tcp_accept_refused += 1;
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Parked connections whose predecessor has ended (or that waited long enough).
    fn poll_parked(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.parked.len() {
            let p = &self.parked[i];
            // An earlier connection of the same path goes first (see accept_one); the
            // wait of PARK_LIMIT counts from when this one is next.
            if self.parked[..i]
                .iter()
                .any(|q| q.same_path(p.laddr, p.faddr, p.index))
            {
                self.parked[i].since = now;
                i += 1;
                continue;
            }
            let key = tcp_key(p.laddr, p.faddr);
            // Wait while the old connection lives, and while the engine tears its path
            // down (its Disconnect goes out after this poll): it would refuse the new one.
            // Past PARK_LIMIT, still wait while the old one holds unread bytes: the peer
            // released those messages when its TCP saw them acknowledged, so dropping
            // them would lose them (a slow reader with a full store takes longer than
            // PARK_LIMIT to drain it). An old connection with nothing left to read and no
            // end of stream (a peer that vanished) is given up after PARK_LIMIT.
            let (live, holds) = engine.conn_id(&key).map_or((false, false), |conn| {
                let id = PathId {
                    conn,
                    index: p.index,
                };
                let old = self.conns.get(&id);
                let live = old.is_some()
                    || !matches!(
                        engine.path_state(id),
                        None | Some(ConnState::Down | ConnState::Up | ConnState::Connecting)
                    );
                (live, old.is_some_and(|c| c.holds_bytes()))
            });
            let waited = Duration::from_nanos(now.nanos_since(p.since));
            if live && (waited < PARK_LIMIT || holds) {
                i += 1;
                continue;
            }
            let p = self.parked.remove(i);
            work += 1;
            let req = Incoming {
                transport: TransportKind::Tcp,
                laddr: p.laddr,
                faddr: p.faddr,
                tos: 0,
                path_index: p.index,
                private: &[],
            };
            self.finish_accept(engine, now, p.socket, req);
        }
        work
    }

    /// Reads, writes and acks on every connection; a lost one is reported to the engine.
    /// Receives, sends and reports acks on every connection, in the order that keeps
    /// multipath ordering (see [`Self::receive_ordered`]).
    fn poll_conns(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let (mut work, lost) = self.receive_ordered(engine, now);
        if lost.is_none() {
            for c in self.conns.values_mut() {
                work += c.send(engine, now, &mut self.scratch, &mut self.stats);
                work += c.update_acked(engine, now, &mut self.stats);
            }
        }
        if let Some(path) = lost {
            // One per poll: the map cannot change under the loop; the rest go next time.
            self.stats.tcp_conn_lost += 1;
            self.close(path);
            engine.handle_transport_error(now, path);
            work += 1;
        }
        work
    }

    /// Receives in the order that keeps a multipath connection's messages in order at the
    /// fan-out from path 0.
    ///
    /// A sender fans out to paths above 0 only once everything it sent on path 0 before
    /// was acknowledged by our TCP, so those bytes are in one of path 0's sockets before a
    /// byte of the other paths is sent: the live one, a parked one, or one still in the
    /// listen backlog. Reading the sockets in any order could still hand the engine a
    /// later message of path 3 before the end of an earlier 1 MiB message of path 0. So:
    /// one read on each path above 0 first (kept, not handed over); then the backlog is
    /// accepted, since a path-0 connection that came before the kept bytes may have
    /// arrived since this poll's accept; then path 0 read to its end; then the kept bytes
    /// handed over, and no further read of those paths in this poll. A connection whose
    /// path 0 stopped early (the engine's store is full) or has a connection in the park
    /// (read after its predecessor ends, and holding bytes that go first) keeps its
    /// bytes for a later poll.
    fn receive_ordered(&mut self, engine: &mut RdsEngine, now: Instant) -> (usize, Option<PathId>) {
        let mut work = 0;
        let mut kept = false;
        for c in self.conns.values_mut().filter(|c| c.path.index != 0) {
            match c.read_once(&mut self.stats) {
                Ok(read) => work += usize::from(read),
                Err(_) => return (work, Some(c.path)),
            }
            kept |= c.rx_pending();
        }
        if kept && !self.listeners.is_empty() {
            work += self.poll_accepts(engine, now);
        }
        let mut held = Held::default();
        for p in self.parked.iter().filter(|p| p.index == 0) {
            if let Some(conn) = engine.conn_id(&tcp_key(p.laddr, p.faddr)) {
                held.add(conn);
            }
        }
        for c in self.conns.values_mut().filter(|c| c.path.index == 0) {
            match c.receive(engine, now, &mut self.stats) {
                Ok(w) => work += w,
                Err(_) => return (work, Some(c.path)),
            }
            if c.rx_pending() {
                held.add(c.path.conn);
            }
        }
        for c in self.conns.values_mut().filter(|c| c.path.index != 0) {
            if !held.has(c.path.conn) {
                work += c.hand_over(engine, now, &mut self.stats);
            }
        }
        (work, None)
    }
}

/// The connections whose paths above 0 wait this poll ([`TcpTransport::receive_ordered`]):
/// a small set, and past its capacity every connection waits.
#[derive(Debug, Default)]
struct Held {
    conns: [u32; 8],
    n: usize,
    all: bool,
}

impl Held {
    fn add(&mut self, conn: u32) {
        if self.has(conn) {
            return;
        }
        if self.n == self.conns.len() {
            self.all = true;
        } else {
            self.conns[self.n] = conn;
            self.n += 1;
        }
    }

    fn has(&self, conn: u32) -> bool {
        self.all || self.conns[..self.n].contains(&conn)
    }
}

/// The engine's key of an RDS-TCP connection between `laddr` and `faddr`.
fn tcp_key(laddr: IpAddr, faddr: IpAddr) -> ConnKey {
    ConnKey {
        laddr: Addr::new(laddr),
        faddr: Addr::new(faddr),
        transport: TransportKind::Tcp,
        tos: 0,
    }
}

/// The engine's spec of the TCP transport.
fn spec_of(engine: &RdsEngine) -> Option<TransportSpec> {
    engine
        .config()
        .transports
        .iter()
        .find(|t| t.kind == TransportKind::Tcp)
        .copied()
}

/// An IPv4-mapped IPv6 address as IPv4 (a dual-stack socket reports them so).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn add_local_addr(&mut self, ip: IpAddr) -> io::Result<()> {
        if self.listeners.iter().any(|(a, _)| *a == ip) {
            return Ok(());
        }
        let at = SocketAddr::new(ip, self.cfg.listen_port);
        let s = Socket::new(Domain::for_address(at), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.bind(&SockAddr::from(at)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "RDS-TCP: cannot listen on {at}: {e} (the kernel's rds_tcp holds port {} \
                     in every namespace where it is loaded; choose another TcpConfig::listen_port \
                     and redirect the peer's traffic to it)",
                    self.cfg.listen_port
                ),
            )
        })?;
        s.listen(self.cfg.backlog)?;
        s.set_nonblocking(true)?;
        self.listeners.push((ip, TcpListener::from(s)));
        Ok(())
    }

    fn poll(&mut self, engine: &mut RdsEngine, now: Instant) -> usize {
        let mut work = 0;
        if !self.listeners.is_empty() {
            work += self.poll_accepts(engine, now);
        }
        if !self.dialing.is_empty() {
            work += self.poll_dials(engine, now);
        }
        work += self.poll_conns(engine, now);
        if !self.parked.is_empty() {
            work += self.poll_parked(engine, now);
        }
        work
    }

    fn command(&mut self, engine: &mut RdsEngine, now: Instant, cmd: TransportCmd) {
        match cmd {
            TransportCmd::Connect { .. } => self.connect(engine, now, cmd),
            TransportCmd::Disconnect { path } => {
                self.close(path);
                engine.handle_transport_down(now, path);
            }
        }
    }

    fn transmit(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId, frame: TxFrame) {
        let Some(c) = self.conns.get_mut(&path) else {
            self.stats.tcp_tx_no_conn += 1;
            return;
        };
        c.push(frame);
        // The path hands over at most its send depth before completions: write then, so
        // small messages leave in batches; a shorter batch leaves on the next poll.
        let depth = engine
            .path(path)
            .map_or(1, |p| p.config().send_depth as usize);
        if c.queued() >= depth {
            // A failed write is reported by the read side, once the socket is read to
            // its end (see TcpConn::send).
            c.send(engine, now, &mut self.scratch, &mut self.stats);
        }
    }

    fn reset_all(&mut self) -> usize {
        for c in self.conns.values() {
            c.kill();
        }
        self.conns.len()
    }

    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        self.stats.each(f);
        f("tcp_live_conns", self.conns.len() as u64);
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
