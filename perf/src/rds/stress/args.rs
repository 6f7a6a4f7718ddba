//! The options of `dp-perf rds-stress` (rds-stress's names) and their checks, and the
//! report a run starts from.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::report::StressReport;
use crate::PerfError;
use crate::rds::{RdsFabric, RdsTransport};

/// Largest RDS message.
pub(super) const MAX_MSG: usize = 1 << 20;
/// Bytes of the request header: sequence number and send time.
pub(super) const REQ_HDR: usize = 16;
/// Unmeasured time after connecting.
pub(super) const WARMUP: Duration = Duration::from_millis(300);

/// `dp-perf rds-stress` options (rds-stress's names).
#[derive(Debug, Clone, Args)]
pub struct StressArgs {
    /// Run both sides here: two nodes over shm, one per CPU of --cpus.
    #[arg(long)]
    pub pair: bool,
    /// This side's address (rds-stress -r). --pair: 10.80.0.1 (active), 10.80.0.2 (passive).
    #[arg(short = 'r', value_name = "ADDR")]
    pub local: Option<IpAddr>,
    /// The passive side's address; makes this the active side (rds-stress -s).
    #[arg(short = 's', value_name = "ADDR")]
    pub peer: Option<IpAddr>,
    /// Base RDS port: sockets bind port+1, port+2, ...
    #[arg(short = 'p', default_value_t = 4000)]
    pub port: u16,
    /// Request size in bytes (K, M suffixes), at most 1M.
    #[arg(short = 'q', default_value = "1024", value_parser = parse_size)]
    pub req: usize,
    /// Ack size in bytes (at least 16: the request's sequence number and time come back).
    #[arg(short = 'a', default_value = "60", value_parser = parse_size)]
    pub ack: usize,
    /// Tasks: each keeps -d requests outstanding.
    #[arg(short = 't', default_value_t = 1)]
    pub tasks: u32,
    /// Requests each task keeps outstanding.
    #[arg(short = 'd', default_value_t = 1)]
    pub depth: u32,
    /// Seconds to measure (after a short warm-up); --quick makes it 1.
    #[arg(short = 'T', default_value_t = 5)]
    pub seconds: u64,
    /// One way: requests only, no acks; the rate is what the passive side received.
    #[arg(short = 'o')]
    pub one_way: bool,
    /// RDMA mode (rds-stress -D): each request's -q payload moves by RDMA WRITE into a
    /// region the passive side registered for the socket (its cookie comes back in an
    /// RDS_CMSG_RDMA_DEST answer to a hello), and the request message, 16 bytes, carries
    /// the notification. gbps counts the RDMA payload. One way (-o), -d bounds the
    /// operations in flight (each is notified, RDS_RDMA_NOTIFY_ME). The fabric transport
    /// only (RDS-TCP has no RDMA).
    #[arg(long)]
    pub rdma: bool,
    /// Sockets per side on the one lcore the load is spread over (default: --tasks).
    #[arg(long)]
    pub sockets: Option<u32>,
    /// shm rendezvous directory (both processes of a two-process run must give the same).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Run the same load on the kernel's own RDS sockets (AF_RDS, SO_RDS_TRANSPORT
    /// --kernel-transport) instead of this RDS: the reference for ratios. Needs a kernel
    /// with rds_tcp (rds_rdma); --pair then measures the kernel's loopback transport (one
    /// namespace), two processes in two namespaces measure its RDS-TCP, two addresses of
    /// an RDMA device (initial namespace) its RDS-IB.
    #[arg(long)]
    pub kernel: bool,
    /// --kernel: the kernel sockets' SO_RDS_TRANSPORT: tcp (rds_tcp) or ib (rds_rdma).
    #[arg(long, value_enum, default_value_t = RdsTransport::Tcp)]
    pub kernel_transport: RdsTransport,
    /// The provider.
    #[command(flatten)]
    pub fabric: RdsFabric,
}

/// `4096`, `4K`, `1M`: bytes.
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1024),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (bytes, or with a K, M or G suffix)"))
}

impl StressArgs {
    pub(super) fn check(&self) -> Result<u32, PerfError> {
        let usage = |m: String| Err(PerfError::Usage(m));
        if self.req > MAX_MSG || self.ack > MAX_MSG {
            return usage(format!(
                "-q {} / -a {}: RDS messages are at most 1M bytes (EMSGSIZE)",
                self.req, self.ack
            ));
        }
        if !self.one_way && self.ack < REQ_HDR {
            return usage(format!(
                "-a {}: acks carry the request's sequence number and time: at least {REQ_HDR}",
                self.ack
            ));
        }
        if self.tasks == 0 || self.depth == 0 {
            return usage("-t and -d must be at least 1".into());
        }
        let sockets = self.sockets.unwrap_or(self.tasks);
        if sockets == 0 || sockets > 16384 {
            return usage(format!("--sockets {sockets}: 1..=16384"));
        }
        if u32::from(self.port) + sockets > 65535 {
            return usage(format!(
                "-p {} with {sockets} sockets runs past port 65535",
                self.port
            ));
        }
        if self.rdma && (self.kernel || self.fabric.transport == RdsTransport::Tcp) {
            return usage(
                "--rdma needs the fabric transport (RDS-TCP has no RDMA, as in Linux)".into(),
            );
        }
        if self.rdma && self.req == 0 {
            return usage("--rdma moves -q bytes per request: give -q of at least 1".into());
        }
        if self.seconds == 0 {
            return usage(
                "-T 0 (run forever) is not supported: give the seconds to measure".into(),
            );
        }
        self.fabric.check(self.pair)?;
        if !self.pair && self.local.is_none() {
            return usage("give -r ADDR (this side's address), or --pair".into());
        }
        Ok(sockets)
    }

    /// A report of `rate` requests/s over `sockets` with this run's parameters and nothing
    /// else measured (the callers add what they measured).
    pub(super) fn report(&self, sockets: u32, rate: f64) -> StressReport {
        StressReport {
            msgs_per_sec: rate,
            gbps: rate * self.req as f64 * 8.0 / 1e9,
            tasks: self.tasks,
            req_size: self.req,
            sockets,
            depth: self.depth,
            one_way: self.one_way,
            rows: Vec::new(),
            rtt: None,
            served: None,
            waits: [0; 3],
            counters: Vec::new(),
            iterations: [0; 2],
        }
    }
}
