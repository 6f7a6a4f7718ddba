//! The `dp-perf` command line.
//!
//! ```text
//! dp-perf [--json] [--quick] [--cpus A,B] <COMMAND> [command options]
//! ```
//!
//! `--json`, `--quick` and `--cpus` are global: they may appear before or after the command.
//!
//! # Adding a command
//!
//! 1. Put the measurement in its own module with an argument struct (`#[derive(clap::Args)]`)
//!    and a `run`/`measure` function returning a type that implements [`Report`].
//! 2. Add a variant to [`Command`] and one arm to [`Command::run`].
//!
//! Printing, `--json` and exit codes are handled here for every command.
//!
//! # Exit status
//!
//! 0 on success, 2 with a one-line message on stderr for a bad argument (unknown option,
//! malformed value, CPU outside the allowed set, ...), 1 with a one-line message when a
//! measurement fails.

use std::ffi::OsString;
use std::io::{self, Write};

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};
use mempool::ring::SyncType;

use crate::blk::BlkArgs;
pub use crate::common::Common;
use crate::fabric::{FabricArgs, Test};
use crate::figures::PlotArgs;
use crate::lcore_perf::{self, LcoreConfig};
use crate::limit::{self, LimitConfig};
use crate::pool_perf::{self, MempoolConfig};
use crate::rds::check::CheckArgs;
use crate::rds::echo::EchoArgs;
use crate::rds::ping::PingArgs;
use crate::rds::stress::StressArgs;
use crate::ring_perf::{self, RingConfig};
use crate::rstream::RstreamArgs;
use crate::rtrs::RtrsArgs;
use crate::{PerfError, Report};

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "dp-perf",
    version,
    about = "dataplane perf lab: rings, pools, lcores, fabric and rsockets, DPDK- and perftest-comparable",
    long_about = "dataplane perf lab: measures mempool rings and pools, the lcore poll loop and \
                  the host's physical limits on two pinned cores, on the same grids as DPDK's \
                  ring_perf_autotest and mempool_perf_autotest; the fabric providers as \
                  perftest does (ib_write_lat, ib_write_bw, ...); and rsockets as librdmacm's \
                  rstream does, next to kernel TCP. The two CPUs must be otherwise idle: every \
                  measurement busy-polls."
)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub common: Common,
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// The measurements.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ring enqueue/dequeue cost on DPDK's ring_perf_autotest grid (SP/SC and MP/MC; single,
    /// burst and bulk; one and two cores).
    Ring(RingArgs),
    /// Object-pool get/put rate on DPDK's mempool_perf_autotest grid (cache 0 and 512; bulk
    /// 1, 4, 32; keep 128; one and two cores).
    Mempool(MempoolArgs),
    /// Poll-loop iteration cost and inter-lcore message latency and rate.
    Lcore(LcoreArgs),
    /// Host limits: one-way cache-line hand-off between the two CPUs and single-core memcpy
    /// bandwidth.
    Limit(LimitArgs),
    /// RDMA WRITE latency, ping-pong as `ib_write_lat` (one way = half the round trip).
    WriteLat(FabricArgs),
    /// RDMA WRITE bandwidth as `ib_write_bw`.
    WriteBw(FabricArgs),
    /// SEND latency, ping-pong as `ib_send_lat` (one way = half the round trip).
    SendLat(FabricArgs),
    /// SEND bandwidth as `ib_send_bw`.
    SendBw(FabricArgs),
    /// RDMA READ latency as `ib_read_lat` (a READ is a round trip).
    ReadLat(FabricArgs),
    /// RDMA READ bandwidth as `ib_read_bw`.
    ReadBw(FabricArgs),
    /// librdmacm's `rstream` over rsockets (or kernel TCP with --tcp / -T s), same table.
    Rstream(RstreamArgs),
    /// fio-style block IO (--rw, --bs, --iodepth, --numjobs, --runtime, --size, --verify)
    /// against a file or block device through io_uring; fio's summary and JSON.
    Blk(BlkArgs),
    /// RTRS block IO (the RNBD transport) as fio drives it: IOPS, Gb/s and latency of
    /// --iodepth requests of --bs bytes over --paths paths; --kill-path-after tests failover.
    Rtrs(RtrsArgs),
    /// rds-tools' rds-stress over this RDS (fabric transport on shm): requests and acks
    /// between two nodes, per-second columns; --pair runs both ends here.
    RdsStress(StressArgs),
    /// rds-tools' rds-ping over this RDS: 0-byte pings to port 0 and their pongs; --pair
    /// runs both ends here.
    RdsPing(PingArgs),
    /// Every message once, in order, byte-exact: a run of 0 B..1 MiB messages from
    /// --send to --recv, checked; a stalled receiver (--stall-after) tests congestion.
    RdsCheck(CheckArgs),
    /// A byte-exact exchange with an echoing RDS peer (another RDS, such as the kernel's):
    /// messages of --sizes (0 to 1 MiB), each checked by the peer and again when it comes
    /// back, in order and once.
    RdsEcho(EchoArgs),
    /// Draw figure files that earlier runs wrote with `--plot FILE.json` into one chart
    /// (`--plot OUT.svg`): an rsocket run next to its `--tcp` twin, write against send.
    Plot(PlotArgs),
}

impl Command {
    /// Checks the CPUs and runs the command.
    ///
    /// # Errors
    ///
    /// Whatever the command's measurement returns.
    pub fn run(&self, common: &Common) -> Result<Box<dyn Report>, PerfError> {
        common.cpus.check()?;
        Ok(match self {
            Self::Ring(a) => Box::new(a.run(common)?),
            Self::Mempool(a) => Box::new(a.run(common)?),
            Self::Lcore(a) => Box::new(a.run(common)?),
            Self::Limit(a) => Box::new(a.run(common)?),
            Self::WriteLat(a) => Box::new(a.run(Test::WriteLat, common)?),
            Self::WriteBw(a) => Box::new(a.run(Test::WriteBw, common)?),
            Self::SendLat(a) => Box::new(a.run(Test::SendLat, common)?),
            Self::SendBw(a) => Box::new(a.run(Test::SendBw, common)?),
            Self::ReadLat(a) => Box::new(a.run(Test::ReadLat, common)?),
            Self::ReadBw(a) => Box::new(a.run(Test::ReadBw, common)?),
            Self::Rstream(a) => Box::new(a.run(common)?),
            Self::Blk(a) => Box::new(a.run(common)?),
            Self::Rtrs(a) => Box::new(a.run(common)?),
            Self::RdsStress(a) => Box::new(a.run(common)?),
            Self::RdsPing(a) => Box::new(a.run(common)?),
            Self::RdsCheck(a) => Box::new(a.run(common)?),
            Self::RdsEcho(a) => Box::new(a.run(common)?),
            Self::Plot(a) => Box::new(a.run()?),
        })
    }

    /// Checks, before anything runs, that `--plot` has something to draw: the command has a
    /// picture, and this side of a pair measures.
    ///
    /// # Errors
    ///
    /// [`PerfError::Usage`] saying which commands draw, or that the client side draws.
    pub fn plots(&self, common: &Common) -> Result<(), PerfError> {
        let name = match self {
            Self::Ring(_) => "ring",
            Self::Mempool(_) => "mempool",
            Self::Lcore(_) => "lcore",
            Self::RdsCheck(_) => "rds-check",
            _ => "",
        };
        if common.plot.is_empty() {
            return match self {
                Self::Plot(_) => Err(PerfError::Usage(
                    "dp-perf plot: give --plot FILE (.svg, .png or .json) for the picture".into(),
                )),
                _ => Ok(()),
            };
        }
        if !name.is_empty() {
            return Err(PerfError::Usage(format!(
                "--plot: `dp-perf {name}` draws no plot; plots come from limit, write-lat, \
                 send-lat, read-lat, write-bw, send-bw, read-bw, rstream, blk, rtrs, rds-stress, rds-ping and plot"
            )));
        }
        let server = match self {
            Self::WriteLat(a)
            | Self::WriteBw(a)
            | Self::SendLat(a)
            | Self::SendBw(a)
            | Self::ReadLat(a)
            | Self::ReadBw(a) => a.server,
            Self::Rstream(a) => a.server,
            Self::Rtrs(a) => a.server,
            Self::Blk(a) => a.server,
            Self::RdsStress(a) => !a.pair && a.peer.is_none(),
            Self::RdsPing(a) => !a.pair && a.dest.is_none(),
            Self::RdsCheck(a) => a.recv,
            _ => false,
        };
        if server {
            return Err(PerfError::Usage(
                "--plot: the server side measures nothing; give --plot to the client (or use --pair)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Options of `dp-perf ring`.
#[derive(Debug, Clone, Args)]
pub struct RingArgs {
    /// Timed repetitions per one-core case (median reported) [default: 5; 1 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: Option<u32>,
    /// Timed repetitions per two-core case (median reported) [default: 3; 1 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub two_core_reps: Option<u32>,
    /// Elements per two-core pass [default: 2^26; 8192 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(128..=1 << 40))]
    pub two_core_elems: Option<u64>,
    /// Calls per side per two-core pass instead of a fixed element count: each pass moves
    /// N x batch elements, as DPDK's ring_perf_autotest (N = 32768 there; its passes last a
    /// few milliseconds, so host preemption shows less than in long passes).
    #[arg(long, value_name = "N", conflicts_with = "two_core_elems",
          value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    pub two_core_calls: Option<u64>,
    /// Ring modes, comma-separated, each on both sides: spsc, mpmc, rts, hts.
    #[arg(
        long,
        value_name = "MODE,..",
        value_delimiter = ',',
        default_value = "spsc,mpmc,rts,hts"
    )]
    pub mode: Vec<ring_perf::Mode>,
    /// Core counts, comma-separated: 1 (single/burst/bulk on one core), 2 (two-core bulk).
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "1,2",
          value_parser = clap::value_parser!(u32).range(1..=2))]
    pub cores: Vec<u32>,
}

impl RingArgs {
    fn run(&self, common: &Common) -> Result<ring_perf::RingReport, PerfError> {
        let mut cfg = if common.quick {
            RingConfig::quick(common.cpus)
        } else {
            RingConfig::full(common.cpus)
        };
        if let Some(r) = self.reps {
            cfg.reps = r as usize;
        }
        if let Some(r) = self.two_core_reps {
            cfg.two_core_reps = r as usize;
        }
        if let Some(n) = self.two_core_elems {
            cfg.two_core_elems = n;
        }
        cfg.two_core_calls = self.two_core_calls;
        cfg.modes = self.mode.clone();
        cfg.cores = self.cores.clone();
        ring_perf::measure(&cfg)
    }
}

/// Options of `dp-perf mempool`.
#[derive(Debug, Clone, Args)]
pub struct MempoolArgs {
    /// Seconds each core runs per case [default: 2; 0.01 with --quick].
    #[arg(long, value_name = "S", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub seconds: Option<f64>,
    /// Objects held before putting them back, comma-separated (DPDK: 32,128; newer also 512).
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "128",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub keep: Vec<u32>,
    /// Get/put chunk sizes, comma-separated; each must divide every keep.
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "1,4,32",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub bulk: Vec<u32>,
    /// Cache sizes, comma-separated (at most 512).
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "0,512",
          value_parser = clap::value_parser!(u32).range(0..=512))]
    pub cache: Vec<u32>,
    /// Core counts, comma-separated (1 and/or 2).
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_value = "1,2",
          value_parser = clap::value_parser!(u32).range(1..=2))]
    pub cores: Vec<u32>,
    /// Free-ring modes of the pools, comma-separated: multi (DPDK's ring_mp_mc), rts
    /// (ring_mt_rts), hts (ring_mt_hts).
    #[arg(long, value_name = "MODE,..", value_delimiter = ',', default_value = "multi",
          value_parser = parse_pool_ring)]
    pub ring_sync: Vec<SyncType>,
}

fn parse_pool_ring(s: &str) -> Result<SyncType, String> {
    match s.parse::<SyncType>() {
        Ok(SyncType::Single) => Err(
            "a pool's ring is shared by every core, so it cannot be single; use multi, rts or hts"
                .into(),
        ),
        Ok(t) => Ok(t),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("expected seconds in (0, 3600], got {s:?}")),
    }
}

impl MempoolArgs {
    fn run(&self, common: &Common) -> Result<pool_perf::MempoolReport, PerfError> {
        let mut cfg = if common.quick {
            MempoolConfig::quick(common.cpus)
        } else {
            MempoolConfig::full(common.cpus)
        };
        if let Some(s) = self.seconds {
            cfg.seconds = s;
        }
        cfg.keeps = self.keep.iter().map(|&k| k as usize).collect();
        cfg.bulks = self.bulk.iter().map(|&b| b as usize).collect();
        cfg.caches = self.cache.clone();
        cfg.cores = self.cores.iter().map(|&c| c as usize).collect();
        cfg.rings = self.ring_sync.clone();
        pool_perf::measure(&cfg)
    }
}

/// Options of `dp-perf lcore`.
#[derive(Debug, Clone, Args)]
pub struct LcoreArgs {
    /// Pollers (none of which ever reports work) in the loop-overhead run.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub idle_pollers: u32,
}

impl LcoreArgs {
    fn run(&self, common: &Common) -> Result<lcore_perf::LcoreReport, PerfError> {
        lcore_perf::measure(&LcoreConfig {
            cpus: common.cpus,
            idle_pollers: self.idle_pollers as usize,
            quick: common.quick,
        })
    }
}

/// Options of `dp-perf limit`.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Size of each memcpy buffer in MiB [default: 64; 1 with --quick].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub memcpy_mib: Option<u32>,
}

impl LimitArgs {
    fn run(&self, common: &Common) -> Result<limit::LimitReport, PerfError> {
        let mut cfg = if common.quick {
            LimitConfig::quick(common.cpus)
        } else {
            LimitConfig::full(common.cpus)
        };
        if let Some(mib) = self.memcpy_mib {
            cfg.memcpy_bytes = (mib as usize) << 20;
        }
        limit::measure(&cfg)
    }
}

/// Parses `args` (including the program name), runs the command and prints its report to
/// `out` (or help/version text); errors go to `err` as one line. Returns the exit status.
pub fn main_with<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e, out, err),
    };
    if let Err(e) = cli.command.plots(&cli.common) {
        let _ = writeln!(err, "dp-perf: error: {e}");
        return e.exit_code();
    }
    let report = match cli.command.run(&cli.common) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "dp-perf: error: {e}");
            return e.exit_code();
        }
    };
    let printed = if cli.common.json {
        report.write_json(out)
    } else {
        report.write_table(out)
    };
    match printed.and_then(|()| out.flush()) {
        Ok(()) => draw(report.as_ref(), &cli.common.plot, err),
        // A closed pipe (`dp-perf ring | head`) is not worth a message.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            let _ = writeln!(err, "dp-perf: error: cannot write the report: {e}");
            1
        }
    }
}

/// Draws the report's figure into every `--plot` file; 1 with one line per failure.
fn draw(report: &dyn Report, files: &[std::path::PathBuf], err: &mut dyn Write) -> u8 {
    if files.is_empty() {
        return 0;
    }
    let Some(fig) = report.figure() else {
        // `Command::plots` refused this before the run.
        let _ = writeln!(err, "dp-perf: error: this run has nothing to plot");
        return 1;
    };
    let mut code = 0;
    for f in files {
        if let Err(e) = dp_plot::write(&fig, f) {
            let _ = writeln!(err, "dp-perf: error: --plot: {e}");
            code = 1;
        }
    }
    code
}

/// Help and version go to `out` with status 0; every other clap error becomes one line on
/// `err` with status 2.
fn clap_error(e: &clap::Error, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = write!(out, "{e}");
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            let names: Vec<String> = <Cli as clap::CommandFactory>::command()
                .get_subcommands()
                .filter(|c| c.get_name() != "help")
                .map(|c| c.get_name().to_owned())
                .collect();
            let _ = writeln!(
                err,
                "dp-perf: error: no command given; one of: {} (see dp-perf --help)",
                names.join(", ")
            );
            2
        }
        _ => {
            let text = e.to_string();
            let mut lines = text.lines().map(str::trim).skip_while(|l| l.is_empty());
            let first = lines.next().unwrap_or("invalid arguments");
            let mut first = first.strip_prefix("error: ").unwrap_or(first).to_owned();
            // "the following required arguments were not provided:" lists them below.
            if first.ends_with(':') {
                let listed: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
                first = format!("{} {}", first, listed.join(", "));
            }
            let _ = writeln!(err, "dp-perf: error: {first} (see dp-perf --help)");
            2
        }
    }
}
