//! The validated configuration: the types a file turns into, and the queries on them.
//!
//! Data only: reading a file (`parse.rs`) and checking it (`validate.rs`) build these types;
//! the runner and the stages consume them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lcore::{CoreList, PollMode};
use mempool::memory::HugePolicy;

use crate::msg::Pattern;

/// Largest burst of any stage.
pub const MAX_BURST: usize = 1024;
/// Largest number of pools (message descriptors name their pool in one byte).
pub const MAX_POOLS: usize = 64;

/// A validated pipeline configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file name used in messages.
    pub source: String,
    /// Lcores and poll mode.
    pub eal: Eal,
    /// Memory policy.
    pub memory: Memory,
    /// Object pools, in file order.
    pub pools: Vec<PoolDef>,
    /// The fabric provider, if any stage needs one.
    pub fabric: Option<Fabric>,
    /// Rings, in file order.
    pub rings: Vec<RingDef>,
    /// Stages, in file order.
    pub stages: Vec<StageDef>,
}

/// `[eal]`: the lcores.
#[derive(Debug, Clone, PartialEq)]
pub struct Eal {
    /// The CPUs to run lcores on (DPDK `-l`).
    pub cores: CoreList,
    /// Line of `cores`, for errors found when the list meets the machine.
    pub cores_line: usize,
    /// The main lcore's CPU (DPDK `--main-lcore`); default the first of `cores`.
    pub main: Option<usize>,
    /// What idle lcores do.
    pub mode: PollMode,
    /// Phase two of the stop: how long stages may take to drain after sources stop before
    /// the lcores are stopped regardless.
    pub drain_timeout: Duration,
}

/// `[memory]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Hugepage policy of every pool.
    pub hugepages: HugePolicy,
}

/// `[pool.NAME]`: an object pool for message payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDef {
    /// Its name.
    pub name: String,
    /// Line of the section header.
    pub line: usize,
    /// Bytes per object: the largest payload (message length minus the header).
    pub obj_size: usize,
    /// Number of objects.
    pub count: u32,
    /// Per-stage cache size; `None` uses the pool default (256, clamped).
    pub cache: Option<u32>,
}

/// `[fabric]`: the provider rsocket stages run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fabric {
    /// Which provider, with its options.
    pub provider: Provider,
    /// Line of the section header.
    pub line: usize,
}

/// A fabric provider and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// Software RDMA through shared memory, between processes of one host.
    Shm {
        /// Rendezvous directory; `None` is the provider default (`$DP_SHM_DIR`, ...).
        dir: Option<PathBuf>,
        /// Bounce buffer bytes per queue pair and direction.
        bounce_bytes: u32,
    },
    /// RDMA hardware (or Soft-RoCE) through rdma-core; needs the `verbs` feature.
    Verbs {
        /// Device name (as `ibv_devices` lists it); `None` takes the first.
        device: Option<String>,
    },
}

/// `[ring.NAME]`: a ring between stages. It is single-producer when one stage writes to it
/// and multi-producer otherwise; exactly one stage reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingDef {
    /// Its name.
    pub name: String,
    /// Line of the section header.
    pub line: usize,
    /// Slots (a power of two).
    pub capacity: usize,
    /// Names of the stages that write to it.
    pub producers: Vec<String>,
    /// Name of the stage that reads it.
    pub consumer: String,
}

/// `[stage.NAME]`: one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageDef {
    /// Its name (letters, digits, `_`, `-`).
    pub name: String,
    /// Line of the section header.
    pub line: usize,
    /// The CPU of the lcore that runs it (one of `[eal] cores`).
    pub lcore: usize,
    /// What it does.
    pub kind: StageKind,
}

/// What to do when an output ring is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Keep the messages and retry (back-pressure; lossless).
    Wait,
    /// Drop them and count the drops.
    Drop,
}

/// The built-in stages.
#[derive(Debug, Clone, PartialEq)]
pub enum StageKind {
    /// Produces messages at a fixed rate or as fast as possible.
    Generator(GeneratorDef),
    /// Moves messages from one ring to another.
    Forwarder(ForwarderDef),
    /// Copies every message to several rings.
    Fanout(FanoutDef),
    /// Consumes messages: counts them, checks sequence and payload, records latency.
    Sink(SinkDef),
    /// Accepts rsocket connections and echoes or consumes the messages sent on them.
    RsocketServer(ServerDef),
    /// Sends the messages of a ring over an rsocket connection.
    RsocketClient(ClientDef),
    /// Sends the messages of a ring as RDS datagrams to one RDS address:port.
    RdsSender(RdsSenderDef),
    /// Receives RDS datagrams on a bound address:port and puts them on a ring.
    RdsReceiver(RdsReceiverDef),
    /// Serves block devices to RNBD clients over RTRS.
    RnbdServer(RnbdServerDef),
}

impl StageKind {
    /// The kind as written in files.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Generator(_) => "generator",
            Self::Forwarder(_) => "forwarder",
            Self::Fanout(_) => "fanout",
            Self::Sink(_) => "sink",
            Self::RsocketServer(_) => "rsocket_server",
            Self::RsocketClient(_) => "rsocket_client",
            Self::RdsSender(_) => "rds_sender",
            Self::RdsReceiver(_) => "rds_receiver",
            Self::RnbdServer(_) => "rnbd_server",
        }
    }

    /// The rings the stage reads.
    pub fn inputs(&self) -> Vec<&str> {
        match self {
            Self::Generator(_)
            | Self::RsocketServer(_)
            | Self::RdsReceiver(_)
            | Self::RnbdServer(_) => vec![],
            Self::Forwarder(f) => vec![&f.input],
            Self::Fanout(f) => vec![&f.input],
            Self::Sink(s) => vec![&s.input],
            Self::RsocketClient(c) => vec![&c.input],
            Self::RdsSender(r) => vec![&r.input],
        }
    }

    /// The rings the stage writes.
    pub fn outputs(&self) -> Vec<&str> {
        match self {
            Self::Generator(g) => vec![&g.output],
            Self::Forwarder(f) => vec![&f.output],
            Self::Fanout(f) => f.outputs.iter().map(String::as_str).collect(),
            Self::Sink(_) | Self::RdsSender(_) | Self::RnbdServer(_) => vec![],
            Self::RsocketServer(s) => s.output.iter().map(String::as_str).collect(),
            Self::RsocketClient(c) => c.output.iter().map(String::as_str).collect(),
            Self::RdsReceiver(r) => vec![&r.output],
        }
    }
}

/// `kind = "generator"`.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorDef {
    /// The ring it writes.
    pub output: String,
    /// Messages per second; `None` is as fast as possible.
    pub rate: Option<u64>,
    /// Message sizes (header included), used in turn.
    pub sizes: Vec<u32>,
    /// Payload pattern.
    pub pattern: Pattern,
    /// Number of instruments for `pattern = "ticks"`.
    pub symbols: u32,
    /// Pool the payloads live in; `None` sends descriptors only (payload synthesized by
    /// rsocket stages from the pattern).
    pub pool: Option<String>,
    /// Messages per enqueue.
    pub burst: usize,
    /// Stop after this many messages (the stage then ends its stream).
    pub count: Option<u64>,
    /// Full output ring policy.
    pub on_full: OnFull,
}

/// `kind = "forwarder"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwarderDef {
    /// The ring it reads.
    pub input: String,
    /// The ring it writes.
    pub output: String,
    /// Messages per dequeue.
    pub burst: usize,
}

/// `kind = "fanout"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutDef {
    /// The ring it reads.
    pub input: String,
    /// The rings every message is copied to (payloads in pools are copied into new objects
    /// of the same pool).
    pub outputs: Vec<String>,
    /// Messages per dequeue.
    pub burst: usize,
    /// Full output ring policy.
    pub on_full: OnFull,
}

/// `kind = "sink"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkDef {
    /// The ring it reads.
    pub input: String,
    /// Messages per dequeue.
    pub burst: usize,
    /// Check payload bytes against the pattern (messages with pool payloads).
    pub verify: bool,
}

/// What an rsocket server does with what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerMode {
    /// Sends every byte back.
    Echo,
    /// Consumes the messages (forwarding them to `output` when set).
    Sink,
}

/// `kind = "rsocket_server"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerDef {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Echo or sink.
    pub mode: ServerMode,
    /// In sink mode, the ring received messages are forwarded to; without one the server
    /// is the end of the pipeline and records latency itself.
    pub output: Option<String>,
    /// Pool to copy received payloads into when forwarding.
    pub pool: Option<String>,
    /// End after this many connections have closed (`None`: run until stopped).
    pub connections: Option<u32>,
    /// Check payload bytes against the pattern.
    pub verify: bool,
    /// Messages per enqueue when forwarding.
    pub burst: usize,
}

/// `kind = "rsocket_client"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientDef {
    /// The ring it reads.
    pub input: String,
    /// The server's address.
    pub connect: SocketAddr,
    /// The server echoes: read the echo, check it and record round-trip latency.
    pub echo: bool,
    /// With `echo`, the ring echoed messages are forwarded to.
    pub output: Option<String>,
    /// Check echoed payload bytes against the pattern.
    pub verify: bool,
    /// Messages per dequeue.
    pub burst: usize,
    /// How long to retry a refused connection (the server may start later).
    pub connect_timeout: Duration,
}

/// `kind = "rds_sender"`: an RDS node of its own (it owns the IP address of `bind`) whose
/// one socket sends every message of `input` as one datagram to `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdsSenderDef {
    /// The ring it reads.
    pub input: String,
    /// The node's address and the socket's port (`0`: any free port).
    pub bind: SocketAddr,
    /// Where every message goes.
    pub dest: SocketAddr,
    /// Messages per dequeue.
    pub burst: usize,
    /// `SO_SNDBUF` of the socket.
    pub sndbuf: u32,
}

/// `kind = "rds_receiver"`: an RDS node of its own (it owns the IP address of `bind`) whose
/// one socket, bound to `bind`, forwards every datagram to `output`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdsReceiverDef {
    /// The node's address and the socket's port.
    pub bind: SocketAddr,
    /// The ring received messages are forwarded to.
    pub output: String,
    /// Pool to copy received payloads into (`None`: descriptors only; payloads are
    /// re-synthesized from the pattern downstream).
    pub pool: Option<String>,
    /// End after this many senders have ended their streams (`None`: run until stopped).
    pub senders: Option<u32>,
    /// Check payload bytes against the pattern.
    pub verify: bool,
    /// Messages per enqueue.
    pub burst: usize,
    /// `SO_RCVBUF` of the socket.
    pub rcvbuf: u32,
}

/// `kind = "rnbd_server"`: an RNBD server (Linux `rnbd-server` compatible) on an RTRS
/// server, serving `exports` to every client session that connects to `listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RnbdServerDef {
    /// One listener per path: `listen`, then the next `paths - 1` ports.
    pub listen: Vec<SocketAddr>,
    /// The directory device names are resolved under (the kernel's `dev_search_path`).
    pub dev_search_path: String,
    /// RTRS `sess_queue_depth`: chunks (IOs in flight) per session.
    pub queue_depth: u16,
    /// Largest IO in bytes; the RTRS chunk is this plus the header room, rounded up to a
    /// power of two.
    pub max_io: u32,
    /// RTRS `always_invalidate`.
    pub always_invalidate: bool,
    /// The devices, in file order.
    pub exports: Vec<ExportDef>,
}

/// One `[[stage.NAME.export]]` of an `rnbd_server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDef {
    /// The name clients open (the kernel's `device_path=`), relative to `dev_search_path`.
    pub name: String,
    /// `dev_search_path` joined with `name`: the path the server matches opens against.
    pub path: PathBuf,
    /// Where the blocks live.
    pub backend: ExportBackend,
    /// The most a client may open it for.
    pub access: ExportAccess,
    /// Line of the export's `name`, for errors found when the device is made.
    pub line: usize,
}

/// Where an export's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportBackend {
    /// No storage: every IO completes at once (reads return what the buffer held). For
    /// measuring the transport.
    Null {
        /// Size in bytes.
        size: u64,
    },
    /// A RAM disk in a mempool region (hugepages when reserved).
    Mem {
        /// Size in bytes.
        size: u64,
    },
    /// A file or block device through `io_uring` (`O_DIRECT`, a kernel polling thread).
    File {
        /// The file or device.
        path: PathBuf,
    },
}

/// The modes an export may be opened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportAccess {
    /// Read-only opens only; writes are refused (`EPERM`).
    Ro,
    /// Read-only opens and one read-write open at a time.
    Rw,
    /// Also migration opens (two writers), the kernel's rule.
    Migration,
}

impl ExportAccess {
    /// As written in files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ro => "ro",
            Self::Rw => "rw",
            Self::Migration => "migration",
        }
    }
}

impl Config {
    /// The stages whose lcore is `cpu`, in file order.
    pub fn stages_on(&self, cpu: usize) -> impl Iterator<Item = &StageDef> {
        self.stages.iter().filter(move |s| s.lcore == cpu)
    }

    /// The index of a pool by name.
    pub fn pool_index(&self, name: &str) -> Option<usize> {
        self.pools.iter().position(|p| p.name == name)
    }

    /// Moves every lcore to `cpu` (used by the demo on machines with fewer CPUs than its
    /// files name, and by tests).
    pub fn place_all_on(&mut self, cpu: usize) {
        self.eal.cores = CoreList::Cpus(vec![cpu]);
        self.eal.main = None;
        for s in &mut self.stages {
            s.lcore = cpu;
        }
    }

    /// Replaces the rendezvous directory of the shm provider, if that is the provider.
    pub fn set_shm_dir(&mut self, dir: &Path) {
        if let Some(Fabric {
            provider: Provider::Shm { dir: d, .. },
            ..
        }) = &mut self.fabric
        {
            *d = Some(dir.to_path_buf());
        }
    }

    /// The CPUs that host at least one stage, ascending.
    pub fn used_cpus(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.stages.iter().map(|s| s.lcore).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}
