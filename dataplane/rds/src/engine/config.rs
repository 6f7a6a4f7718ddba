//! What an engine is made with.

use crate::path::PathConfig;
use crate::store::FragConfig;
use crate::uapi::{RDS_TRANS_IB, RDS_TRANS_TCP, SOCK_BUF_DEFAULT};

/// The transport types of `SO_RDS_TRANSPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// `RDS_TRANS_IB` (0): the message transport (RDS-IB; here the fabric transport over
    /// shm or verbs).
    Ib,
    /// `RDS_TRANS_TCP` (2): the stream transport.
    Tcp,
    /// The loopback transport (`RDS_TRANS_LOOP`, internal): sockets bound to 127.0.0.0/8
    /// or `::1`, and every message between two addresses of one engine.
    Loop,
}

impl TransportKind {
    /// The `SO_RDS_TRANSPORT` value (`RDS_TRANS_LOOP` is 3).
    pub const fn value(self) -> i32 {
        match self {
            Self::Ib => RDS_TRANS_IB,
            Self::Tcp => RDS_TRANS_TCP,
            Self::Loop => 3,
        }
    }

    /// The transport's name as `rds-info` prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ib => "infiniband",
            Self::Tcp => "tcp",
            Self::Loop => "loopback",
        }
    }
}

/// A transport the engine's driver provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportSpec {
    /// Which `SO_RDS_TRANSPORT` value it answers to.
    pub kind: TransportKind,
    /// How its paths run.
    pub path: PathConfig,
    /// Multipath (`t_mp_capable`): up to 8 paths per connection, negotiated with probe
    /// pings. Linux makes only TCP multipath.
    pub multipath: bool,
    /// It can carry RDMA operations: set by [`RdsEngine::set_rdma_memory`](crate::RdsEngine::set_rdma_memory)
    /// (the fabric transport's window). Without, RDMA control messages fail with
    /// `EOPNOTSUPP`, as on RDS-TCP.
    pub rdma: bool,
    /// Multipath over TCP with SPORT_IDX (`RDS_EXTHDR_SPORT_IDX`, Linux 2025): our probes
    /// say so, our dialler binds the source port of path `i` to a port `p` with
    /// `p % 8 == i`, and a connection accepted from a peer whose probe said so is mapped to
    /// path `sport % 8` (the same path across reconnects). A peer whose probe does not say
    /// so (Linux 6.1 dials from random ports) gets 6.1's rule whatever this says: path 0
    /// until negotiated, then the first path that is down. On by default for TCP.
    pub sport_idx: bool,
}

impl TransportSpec {
    /// The message transport with RDS-IB's rules (one path, credits, checksums).
    pub const fn ib() -> Self {
        Self {
            kind: TransportKind::Ib,
            path: PathConfig::message(),
            multipath: false,
            rdma: false,
            sport_idx: false,
        }
    }

    /// The stream transport with RDS-TCP's rules (multipath, lower address dials).
    pub const fn tcp() -> Self {
        Self {
            kind: TransportKind::Tcp,
            path: PathConfig::stream(),
            multipath: true,
            rdma: false,
            sport_idx: true,
        }
    }
}

/// Engine configuration. Every table is sized here and never grows afterwards (except the
/// connection table, which grows up to [`RdsConfig::max_conns`] on first contact with a
/// peer: a control-path allocation, as in the kernel).
#[derive(Clone, Debug)]
pub struct RdsConfig {
    /// Name of the engine's memory region (in notices and `/proc/<pid>/maps`).
    pub name: String,
    /// The transports a driver provides, in preference order for sockets that do not
    /// choose (Linux tries IB before TCP).
    pub transports: Vec<TransportSpec>,
    /// Message payload memory: the fragment pool.
    pub frags: FragConfig,
    /// Message records (queued, in flight or unread, sends and receives together).
    pub msgs: u32,
    /// Most sockets open at once.
    pub max_sockets: u32,
    /// Most connections (peer, transport, TOS) the engine keeps.
    pub max_conns: u32,
    /// Seed of the engine's random generator (ports, generation number, path hash,
    /// backoff). Two engines must not share one if they talk to each other over multipath.
    pub seed: u64,
    /// `net.rds.ping_enable`: answer pings on port 0.
    pub ping_enable: bool,
    /// `net.core.wmem_default`: a new socket's `SO_SNDBUF` value (RDS uses half).
    pub wmem_default: u32,
    /// `net.core.wmem_max`: the largest `SO_SNDBUF` a socket may set.
    pub wmem_max: u32,
    /// `net.core.rmem_default`.
    pub rmem_default: u32,
    /// `net.core.rmem_max`.
    pub rmem_max: u32,
}

impl Default for RdsConfig {
    fn default() -> Self {
        Self {
            name: "rds".into(),
            transports: vec![TransportSpec::ib(), TransportSpec::tcp()],
            frags: FragConfig::default(),
            msgs: 64 * 1024,
            max_sockets: 16 * 1024,
            max_conns: 4096,
            seed: 0x5eed_0000_0000_0001,
            ping_enable: true,
            wmem_default: SOCK_BUF_DEFAULT,
            wmem_max: SOCK_BUF_DEFAULT,
            rmem_default: SOCK_BUF_DEFAULT,
            rmem_max: SOCK_BUF_DEFAULT,
        }
    }
}
