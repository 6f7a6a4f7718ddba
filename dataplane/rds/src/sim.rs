//! A deterministic simulator of RDS nodes (feature `testing`, a test kit, not shipped).
//!
//! [`SimNet`] holds N engines ([`SimNode`]), each with its addresses, joined by simulated
//! transports with virtual time: every connection is a link with a fixed `latency` per
//! direction, in order. A message transport link delivers frames one by one against a
//! ring of `recv_depth` posted receives (a frame that finds none waits, as RDMA's
//! receiver-not-ready retry does, and each frame taken is reposted, which is what makes
//! the credits flow); a frame the engine refuses (store full) waits too. A stream link
//! delivers bytes in random-sized chunks, and acknowledges them to the sender on arrival
//! (TCP's `snd_una`). Faults: [`SimNet::reset_link`] (a connection killed: both ends see a
//! transport error, everything in flight is lost), a per-frame `reset_prob` that does the
//! same, and [`SimNet::stall`] (a node stops polling its transports). One seeded generator
//! drives everything, so a run replays exactly from its seed.
//!
//! [`SimNet::step`] runs every engine's outputs, then advances virtual time to the next
//! event and delivers it; [`SimNet::run_for`] and [`SimNet::run_until`] loop it.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use lcore::time::Instant;

use crate::engine::{Accept, Incoming, RdsConfig, RdsEngine, TransportCmd};
use crate::engine::{RdsSocket, Received, RecvFlags, SendFlags};
use crate::error::RdsError;
use crate::path::{Flavor, PathId};
use crate::rng::Rng;
use crate::wire::HEADER_LEN;

/// Simulator settings.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// One-way latency of every link.
    pub latency: Duration,
    /// Probability that a frame kills its connection instead of arriving.
    pub reset_prob: f64,
    /// Receives posted per message-transport connection.
    pub recv_depth: u32,
    /// Largest chunk a stream link delivers at once.
    pub stream_chunk: usize,
    /// Seed of the simulator's generator.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(5),
            reset_prob: 0.0,
            recv_depth: 64,
            stream_chunk: 3000,
            seed: 1,
        }
    }
}

/// One simulated node.
#[derive(Debug)]
pub struct SimNode {
    /// The engine.
    pub engine: RdsEngine,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// While true the node does not poll its transports (a stalled process).
    pub stalled: bool,
}

#[derive(Debug)]
struct Wire {
    due: Instant,
    header: [u8; HEADER_LEN],
    payload: Vec<u8>,
    token: u64,
}

#[derive(Debug)]
struct Dir {
    q: VecDeque<Wire>,
    /// Stream links: bytes arrived and not yet taken by the receiver.
    pending: VecDeque<u8>,
    /// Stream links: bytes the receiver's transport holds (acked to the sender).
    delivered: u64,
    /// Message links: receives posted at the receiving end.
    posted: u32,
    /// Message links: receives consumed and not reposted yet (reposted on the receiving
    /// node's next poll, as a driver refills its ring after a completion batch).
    consumed: u32,
}

impl Dir {
    fn new(posted: u32) -> Self {
        Self {
            q: VecDeque::new(),
            pending: VecDeque::new(),
            delivered: 0,
            posted,
            consumed: 0,
        }
    }
}

/// A simulated connection between two path ends.
#[derive(Debug)]
struct Link {
    ends: [(usize, PathId); 2],
    flavor: Flavor,
    alive: bool,
    dirs: [Dir; 2],
}

#[derive(Debug)]
enum Ev {
    Connected {
        node: usize,
        path: PathId,
        reply: Vec<u8>,
    },
    ConnectFailed {
        node: usize,
        path: PathId,
    },
    Down {
        node: usize,
        path: PathId,
    },
}

/// A transmitted frame as [`SimNet::trace`] records it: node, path, header, payload.
pub type TracedFrame = (usize, PathId, [u8; HEADER_LEN], Vec<u8>);

/// A live link as [`SimNet::link_state`] reports it: its two ends, the receives posted at
/// each end, and the frames queued towards each end.
pub type LinkState = ([(usize, PathId); 2], [u32; 2], [usize; 2]);

/// Counters of the simulated transports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Frames handed to links.
    pub frames: u64,
    /// Frames delivered.
    pub delivered: u64,
    /// Connections made.
    pub connects: u64,
    /// Connections killed ([`SimNet::reset_link`] or `reset_prob`).
    pub resets: u64,
    /// Deliveries that waited for a posted receive.
    pub rnr_waits: u64,
    /// Deliveries the receiving engine refused (store full) and retried.
    pub refused: u64,
}

/// N engines over simulated transports.
#[derive(Debug)]
pub struct SimNet {
    /// Settings.
    pub cfg: SimConfig,
    /// Virtual time.
    pub now: Instant,
    /// The nodes.
    pub nodes: Vec<SimNode>,
    /// Transport counters.
    pub stats: SimStats,
    /// While `Some`, every transmitted frame is recorded: (node, path, header, payload).
    pub trace: Option<Vec<TracedFrame>>,
    rng: Rng,
    links: Vec<Link>,
    by_end: HashMap<(usize, PathId), usize>,
    events: VecDeque<(Instant, Ev)>,
}

impl SimNet {
    /// An empty network.
    pub fn new(cfg: SimConfig) -> Self {
        Self {
            rng: Rng::new(cfg.seed),
            cfg,
            now: Instant::from_millis(1),
            nodes: Vec::new(),
            stats: SimStats::default(),
            trace: None,
            links: Vec::new(),
            by_end: HashMap::new(),
            events: VecDeque::new(),
        }
    }

    /// Adds a node owning `addrs`; returns its index.
    ///
    /// # Panics
    ///
    /// If the engine cannot be made (a test bug).
    pub fn add_node(&mut self, cfg: RdsConfig, addrs: &[IpAddr]) -> usize {
        let mut engine = RdsEngine::new(cfg).expect("engine");
        for a in addrs {
            engine.add_local_addr(*a);
        }
        self.nodes.push(SimNode {
            engine,
            addrs: addrs.to_vec(),
            stalled: false,
        });
        self.nodes.len() - 1
    }

    fn node_of(&self, ip: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addrs.contains(&ip))
    }

    /// The engine of node `n`.
    pub fn engine(&mut self, n: usize) -> &mut RdsEngine {
        &mut self.nodes[n].engine
    }

    /// Stalls (or resumes) node `n`: a stalled node neither polls its transports nor
    /// receives (its links' frames wait).
    pub fn stall(&mut self, n: usize, on: bool) {
        self.nodes[n].stalled = on;
    }

    /// Kills the live connection of node `n`'s path `path`: both ends see a transport
    /// error; what was in flight on it is lost. Returns false if there is none.
    pub fn reset_link(&mut self, n: usize, path: PathId) -> bool {
        match self.by_end.get(&(n, path)).copied() {
            Some(l) if self.links[l].alive => {
                self.kill(l);
                true
            }
            _ => false,
        }
    }

    /// Every live link.
    pub fn link_state(&self) -> Vec<LinkState> {
        self.links
            .iter()
            .filter(|l| l.alive)
            .map(|l| {
                (
                    l.ends,
                    [l.dirs[0].posted, l.dirs[1].posted],
                    [l.dirs[0].q.len(), l.dirs[1].q.len()],
                )
            })
            .collect()
    }

    /// Replaces node `n`'s engine with a fresh one (a process killed and restarted): its
    /// connections die with it, and its peers learn of the restart from the new engine's
    /// generation number on multipath transports.
    ///
    /// # Panics
    ///
    /// If the engine cannot be made (a test bug).
    pub fn restart_node(&mut self, n: usize, cfg: RdsConfig) {
        let live: Vec<usize> = (0..self.links.len())
            .filter(|&l| self.links[l].alive && self.links[l].ends.iter().any(|e| e.0 == n))
            .collect();
        for l in live {
            self.kill(l);
        }
        self.events.retain(|(_, ev)| match ev {
            Ev::Connected { node, .. } | Ev::ConnectFailed { node, .. } | Ev::Down { node, .. } => {
                *node != n
            }
        });
        let mut engine = RdsEngine::new(cfg).expect("engine");
        for a in &self.nodes[n].addrs {
            engine.add_local_addr(*a);
        }
        self.nodes[n].engine = engine;
    }

    /// Kills every live connection.
    pub fn reset_all(&mut self) -> usize {
        let live: Vec<usize> = (0..self.links.len())
            .filter(|&l| self.links[l].alive)
            .collect();
        for &l in &live {
            self.kill(l);
        }
        live.len()
    }

    fn kill(&mut self, l: usize) {
        let link = &mut self.links[l];
        link.alive = false;
        link.dirs = [Dir::new(0), Dir::new(0)];
        self.stats.resets += 1;
        let now = self.now;
        for (node, path) in link.ends {
            self.by_end.remove(&(node, path));
            self.nodes[node].engine.handle_transport_error(now, path);
        }
    }

    /// Reposts the receives each node consumed (its ring refill after a batch).
    fn refill(&mut self) {
        let now = self.now;
        for l in 0..self.links.len() {
            if !self.links[l].alive {
                continue;
            }
            for dir in 0..2 {
                let (to, tpath) = self.links[l].ends[1 - dir];
                let n = core::mem::take(&mut self.links[l].dirs[dir].consumed);
                if n > 0 && !self.nodes[to].stalled {
                    self.links[l].dirs[dir].posted += n;
                    self.nodes[to].engine.handle_recv_posted(now, tpath, n);
                } else {
                    self.links[l].dirs[dir].consumed += n;
                }
            }
        }
    }

    /// Runs every engine's outputs (commands, frames) until none has any.
    fn pump(&mut self) {
        self.refill();
        loop {
            let mut any = false;
            for n in 0..self.nodes.len() {
                if self.nodes[n].stalled {
                    continue;
                }
                while let Some(cmd) = self.nodes[n].engine.poll_transport() {
                    any = true;
                    self.command(n, cmd);
                }
                let now = self.now;
                while let Some((path, f)) = self.nodes[n].engine.poll_transmit(now) {
                    any = true;
                    let mut payload = vec![0u8; f.payload.len()];
                    f.payload
                        .copy_to(self.nodes[n].engine.frags(), &mut payload);
                    self.transmit(n, path, f.header, payload, f.token);
                }
            }
            if !any {
                break;
            }
        }
    }

    fn command(&mut self, n: usize, cmd: TransportCmd) {
        let due = self.now.saturating_add(self.cfg.latency);
        match cmd {
            TransportCmd::Disconnect { path } => {
                if let Some(l) = self.by_end.get(&(n, path)).copied()
                    && self.links[l].alive
                {
                    self.kill(l);
                }
                self.events.push_back((due, Ev::Down { node: n, path }));
            }
            TransportCmd::Connect {
                path,
                transport,
                laddr,
                faddr,
                tos,
            } => {
                let Some(m) = self.node_of(faddr).filter(|&m| !self.nodes[m].stalled) else {
                    self.events
                        .push_back((due, Ev::ConnectFailed { node: n, path }));
                    return;
                };
                let flavor = self.nodes[n]
                    .engine
                    .config()
                    .transports
                    .iter()
                    .find(|t| t.kind == transport)
                    .map_or(Flavor::Message, |t| t.path.flavor);
                let depth = self.cfg.recv_depth;
                let now = self.now;
                let private = if flavor == Flavor::Message {
                    self.nodes[n].engine.handle_recv_posted(now, path, depth);
                    self.nodes[n].engine.connect_private(path)
                } else {
                    None
                };
                let (pb, plen) = private.map_or(([0u8; 56], 0), |p| p.to_bytes());
                let req = Incoming {
                    transport,
                    laddr: faddr,
                    faddr: laddr,
                    tos,
                    path_index: path.index,
                    private: &pb[..plen],
                };
                match self.nodes[m].engine.handle_incoming(now, req) {
                    Accept::Yes {
                        path: peer,
                        version,
                    } => {
                        if let Some(old) = self.by_end.get(&(m, peer)).copied()
                            && self.links[old].alive
                        {
                            self.kill(old);
                        }
                        let mut reply = Vec::new();
                        if flavor == Flavor::Message {
                            self.nodes[m].engine.handle_recv_posted(now, peer, depth);
                            if let Some(r) = self.nodes[m].engine.accept_private(peer, version) {
                                let (b, k) = r.to_bytes();
                                reply = b[..k].to_vec();
                            }
                        }
                        let l = self.links.len();
                        self.links.push(Link {
                            ends: [(n, path), (m, peer)],
                            flavor,
                            alive: true,
                            dirs: [Dir::new(depth), Dir::new(depth)],
                        });
                        self.by_end.insert((n, path), l);
                        self.by_end.insert((m, peer), l);
                        self.stats.connects += 1;
                        self.events.push_back((
                            due,
                            Ev::Connected {
                                node: m,
                                path: peer,
                                reply: Vec::new(),
                            },
                        ));
                        self.events.push_back((
                            due.saturating_add(self.cfg.latency),
                            Ev::Connected {
                                node: n,
                                path,
                                reply,
                            },
                        ));
                    }
                    Accept::No(_) => {
                        self.events
                            .push_back((due, Ev::ConnectFailed { node: n, path }));
                    }
                }
            }
        }
    }

    fn transmit(
        &mut self,
        n: usize,
        path: PathId,
        header: [u8; HEADER_LEN],
        payload: Vec<u8>,
        token: u64,
    ) {
        self.stats.frames += 1;
        if let Some(t) = &mut self.trace {
            t.push((n, path, header, payload.clone()));
        }
        let Some(l) = self.by_end.get(&(n, path)).copied() else {
            // No connection: the frame is lost with it (the path will be reset).
            return;
        };
        if self.cfg.reset_prob > 0.0
            && (self.rng.below(1 << 30) as f64) < self.cfg.reset_prob * f64::from(1u32 << 30)
        {
            self.kill(l);
            return;
        }
        let dir = usize::from(self.links[l].ends[0] != (n, path));
        let due = self.now.saturating_add(self.cfg.latency);
        let flavor = self.links[l].flavor;
        self.links[l].dirs[dir].q.push_back(Wire {
            due,
            header,
            payload,
            token,
        });
        if flavor == Flavor::Stream {
            // Written into the socket: complete at once; acked when it arrives.
            let now = self.now;
            self.nodes[n].engine.handle_send_complete(now, path, token);
        }
    }

    /// Delivers what is due on every link; returns true if anything moved.
    fn deliver(&mut self) -> bool {
        let mut moved = false;
        for l in 0..self.links.len() {
            if !self.links[l].alive {
                continue;
            }
            for dir in 0..2 {
                let (from, fpath) = self.links[l].ends[dir];
                let (to, tpath) = self.links[l].ends[1 - dir];
                if self.nodes[to].stalled {
                    continue;
                }
                let flavor = self.links[l].flavor;
                loop {
                    if !self.links[l].alive {
                        break;
                    }
                    let now = self.now;
                    let d = &mut self.links[l].dirs[dir];
                    match flavor {
                        Flavor::Message => {
                            let Some(w) = d.q.front() else { break };
                            if w.due > now {
                                break;
                            }
                            if d.posted == 0 {
                                self.stats.rnr_waits += 1;
                                break;
                            }
                            let w = d.q.pop_front().expect("front");
                            let r = self.nodes[to]
                                .engine
                                .handle_frame(now, tpath, &w.header, &w.payload);
                            if r.is_err() {
                                self.stats.refused += 1;
                                self.links[l].dirs[dir].q.push_front(w);
                                break;
                            }
                            moved = true;
                            self.stats.delivered += 1;
                            let d = &mut self.links[l].dirs[dir];
                            d.posted -= 1;
                            d.consumed += 1;
                            self.nodes[from]
                                .engine
                                .handle_send_complete(now, fpath, w.token);
                        }
                        Flavor::Stream => {
                            while d.q.front().is_some_and(|w| w.due <= now) {
                                let w = d.q.pop_front().expect("front");
                                d.delivered += (w.header.len() + w.payload.len()) as u64;
                                d.pending.extend(w.header);
                                d.pending.extend(w.payload);
                                self.stats.delivered += 1;
                            }
                            let acked = d.delivered;
                            if d.pending.is_empty() {
                                self.nodes[from]
                                    .engine
                                    .handle_stream_acked(now, fpath, acked);
                                break;
                            }
                            let max = self.cfg.stream_chunk.max(1);
                            let n = (1 + self.rng.below(max as u64) as usize).min(d.pending.len());
                            let chunk: Vec<u8> = d.pending.iter().take(n).copied().collect();
                            let took = self.nodes[to]
                                .engine
                                .handle_stream_bytes(now, tpath, &chunk);
                            self.nodes[from]
                                .engine
                                .handle_stream_acked(now, fpath, acked);
                            if !self.links[l].alive {
                                break;
                            }
                            let d = &mut self.links[l].dirs[dir];
                            d.pending.drain(..took);
                            if took == 0 {
                                self.stats.refused += 1;
                                break;
                            }
                            moved = true;
                        }
                    }
                }
            }
        }
        moved
    }

    /// The next time something is due (a link head, an event, an engine timer).
    fn next_due(&mut self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut take = |x: Instant| t = Some(t.map_or(x, |y| y.min(x)));
        for l in &self.links {
            if !l.alive {
                continue;
            }
            for (dir, d) in l.dirs.iter().enumerate() {
                if self.nodes[l.ends[1 - dir].0].stalled {
                    continue;
                }
                if let Some(w) = d.q.front()
                    && (l.flavor == Flavor::Stream || d.posted > 0)
                {
                    take(w.due);
                }
            }
        }
        for (at, _) in &self.events {
            take(*at);
        }
        for n in &mut self.nodes {
            if let Some(at) = n.engine.poll_timeout() {
                take(at);
            }
        }
        t
    }

    /// One round: outputs, then time to the next event, then what is due. Returns false
    /// when nothing is scheduled at all.
    pub fn step(&mut self) -> bool {
        self.settle();
        let Some(at) = self.next_due() else {
            return false;
        };
        if at > self.now {
            self.now = at;
        }
        let now = self.now;
        let mut i = 0;
        while i < self.events.len() {
            if self.events[i].0 <= now {
                let (_, ev) = self.events.remove(i).expect("index");
                match ev {
                    Ev::Connected { node, path, reply } => {
                        if self
                            .by_end
                            .get(&(node, path))
                            .is_some_and(|&l| self.links[l].alive)
                        {
                            self.nodes[node].engine.handle_connected(now, path, &reply);
                        }
                    }
                    Ev::ConnectFailed { node, path } => {
                        self.nodes[node].engine.handle_connect_failed(now, path);
                    }
                    Ev::Down { node, path } => {
                        self.nodes[node].engine.handle_transport_down(now, path);
                    }
                }
            } else {
                i += 1;
            }
        }
        for n in &mut self.nodes {
            n.engine.handle_timeout(now);
        }
        self.settle();
        true
    }

    /// Outputs and deliveries due now, until nothing moves.
    fn settle(&mut self) {
        loop {
            self.pump();
            if !self.deliver() {
                self.pump();
                break;
            }
        }
    }

    /// Steps until virtual time passes `d` from now (or nothing is scheduled).
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now.saturating_add(d);
        while self.now < end {
            if !self.step() {
                self.now = end;
                break;
            }
        }
    }

    /// Steps until `done` holds; panics after `max_steps` (a livelock or a lost message).
    ///
    /// # Panics
    ///
    /// If `done` does not hold within `max_steps` steps.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..max_steps {
            if done(self) {
                return;
            }
            if !self.step() {
                assert!(done(self), "simulation idle before the condition held");
                return;
            }
        }
        panic!(
            "condition not reached in {max_steps} steps (now {:?})",
            self.now
        );
    }

    /// A socket on node `n` bound to `addr` (port 0 picks one).
    ///
    /// # Panics
    ///
    /// If it cannot be made (a test bug).
    pub fn socket(&mut self, n: usize, addr: SocketAddr) -> (RdsSocket, SocketAddr) {
        let e = &mut self.nodes[n].engine;
        let s = e.socket().expect("socket");
        let a = e.bind(s, addr).expect("bind");
        (s, a)
    }

    /// A blocking send: retries while the engine says the call must wait, stepping the
    /// network, up to `max_steps`.
    ///
    /// # Errors
    ///
    /// Any error other than [`RdsError::Blocked`]; [`RdsError::TimedOut`] after `max_steps`.
    pub fn send_blocking(
        &mut self,
        n: usize,
        sock: RdsSocket,
        dest: SocketAddr,
        data: &[u8],
        max_steps: u64,
    ) -> Result<usize, RdsError> {
        for _ in 0..max_steps {
            let now = self.now;
            match self.nodes[n]
                .engine
                .send_to(now, sock, Some(dest), data, SendFlags::NONE)
            {
                Err(RdsError::Blocked(_)) => {
                    if !self.step() {
                        return Err(RdsError::TimedOut);
                    }
                }
                r => return r,
            }
        }
        Err(RdsError::TimedOut)
    }

    /// Non-blocking receive of one data message into a fresh vector (notifications are
    /// skipped).
    pub fn recv(&mut self, n: usize, sock: RdsSocket) -> Option<(Vec<u8>, SocketAddr)> {
        let mut buf = vec![0u8; crate::wire::MAX_MSG_SIZE];
        loop {
            let now = self.now;
            match self.nodes[n]
                .engine
                .recv_from(now, sock, &mut buf, RecvFlags::DONTWAIT)
            {
                Ok(Received::Data { len, from, .. }) => {
                    buf.truncate(len);
                    return Some((buf, from));
                }
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}
