//! `dp-perf blk`: fio-style block IO load against a local file or device (`--filename`,
//! through the RNBD server's `io_uring` backend) or a remote RNBD device.
//!
//! ```text
//! dp-perf blk --filename /dev/ram0 --rw randread --bs 4k --iodepth 32 --runtime 5
//! dp-perf blk --filename /tmp/f --rw randwrite --bs 4k --iodepth 8 --size 64m --verify
//! ```
//!
//! The options are fio's, with fio's meaning: `--rw read|write|randread|randwrite|randrw`,
//! `--bs`, `--iodepth`, `--numjobs`, `--runtime` (run that long, wrapping over `--size`,
//! as fio's `time_based`; without it one pass over `--size`), `--size` (default: the whole
//! device), `--rwmixread`, and `--verify`: every write carries a pattern naming its offset
//! and write, and every block read back is checked (verified read jobs write the range
//! first; write jobs read everything back at the end). The output is fio's summary, or with
//! `--json` fio's JSON (`jobs[].read.iops`, `.bw` in KiB/s, `.clat_ns.percentile."50.000000"`).
//!
//! Each job is one thread pinned to a CPU of `--cpus` that busy-polls its completions, as
//! an SPDK or fio `hipri` job does: two jobs fill this machine.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::PerfError;
use crate::common::Common;
#[cfg(feature = "verbs")]
use crate::harness::verbs_pair_ip;
use crate::harness::{
    Peer, ProviderKind, SHM_PAIR_IP, Server, open_err, open_verbs, parse_addr, run_on, shm_dir,
    start_role,
};
use dataplane::fabric::Provider;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};

pub mod engine;
mod local;
pub mod remote;
pub mod report;
pub mod spec;
pub mod verify;

use engine::{JobSpec, Target};
use local::LocalTarget;
use remote::{BackendKind, RemoteTarget, ServePlan};
pub use report::BlkReport;
use spec::{RwMode, parse_size};

/// Options of `dp-perf blk` (fio's names).
#[derive(Debug, Clone, Args)]
pub struct BlkArgs {
    /// The file or block device to load (through io_uring with a polling kernel thread).
    #[arg(long, value_name = "PATH")]
    pub filename: Option<PathBuf>,
    /// IO pattern: read, write, randread, randwrite or randrw.
    #[arg(long, default_value = "read", value_parser = |s: &str| s.parse::<RwMode>())]
    pub rw: RwMode,
    /// Block size (fio suffixes: 512, 4k, 128k, 1m).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// IOs in flight per job.
    #[arg(long, default_value_t = 1)]
    pub iodepth: u32,
    /// Jobs (threads), each with its own iodepth.
    #[arg(long, default_value_t = 1)]
    pub numjobs: u32,
    /// Run this long (seconds, or with a suffix: 500ms, 10s, 1m), wrapping over --size.
    #[arg(long, value_parser = parse_time_ns)]
    pub runtime: Option<u64>,
    /// Bytes of the device each job covers [default: all of it].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Percent of reads in randrw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub rwmixread: u32,
    /// Write a pattern and check every block read back.
    #[arg(long)]
    pub verify: bool,
    /// Bypass the page cache (O_DIRECT) for --filename: 1 or 0.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub direct: u8,
    /// The job's name in the output [default: the --rw pattern].
    #[arg(long)]
    pub name: Option<String>,
    /// Serve an RNBD device (--backend) over RTRS instead of running jobs.
    #[arg(long, conflicts_with_all = ["client", "pair", "filename"])]
    pub server: bool,
    /// Load the RNBD device of the server at ADDR (`ip` or `ip:port`) over RTRS. A
    /// comma-separated list (`10.78.0.2:1234,10.78.1.2:1234`) gives one path per address,
    /// as the kernel's `path=` arguments do; a single address takes --paths ports from it.
    #[arg(long, value_name = "ADDR[,ADDR...]", conflicts_with = "filename")]
    pub client: Option<String>,
    /// Run an RNBD server here too (a child process on the second --cpus CPU) and load its
    /// device over RTRS over --provider.
    #[arg(long, conflicts_with_all = ["client", "filename"])]
    pub pair: bool,
    /// The device the client maps, as the kernel's `device_path=` (for the kernel's
    /// rnbd-server: a path relative to its `dev_search_path`, e.g. `/dev/ram0`)
    /// [default: the --backend's export name, `null0` or `mem0`].
    #[arg(long, value_name = "NAME", conflicts_with = "server")]
    pub device_path: Option<String>,
    /// The server's device: null (the transport alone) or mem (a RAM disk, for --verify).
    #[arg(long, value_enum, default_value_t = BackendKind::Null)]
    pub backend: BackendKind,
    /// Size of the server's device.
    #[arg(long, default_value = "1g", value_parser = parse_size)]
    pub dev_size: u64,
    /// RTRS paths (connection sets to --port, --port + 1, ...).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub paths: u16,
    /// The server spins when idle instead of napping (dedicated cores).
    #[arg(long)]
    pub busy_poll: bool,
    /// Client: register each READ's buffer per IO (a memory window under a fresh key,
    /// invalidated before the READ completes: the server's SEND_WITH_INV, asked by
    /// NEED_INVAL, or our LOCAL_INV), as Linux's rnbd-client does, instead of exposing the
    /// whole buffer region to the server once.
    #[arg(long, conflicts_with = "server")]
    pub per_io_registration: bool,
    /// The jobs nap (about 20 µs) after 64 empty polls instead of spinning: for a job that
    /// shares its cores with other work (the server's, or a Soft-RoCE VM's kernel). It
    /// costs throughput where a sleep is coarse (a TCG VM: 241 against 639 IOPS spinning).
    #[arg(long, conflicts_with = "server")]
    pub nap: bool,
    /// The first path's port.
    #[arg(short = 'p', long, default_value_t = 18700)]
    pub port: u16,
    /// Address the server listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Fabric provider.
    #[arg(long, value_enum, default_value_t = ProviderKind::Shm)]
    pub provider: ProviderKind,
    /// shm rendezvous directory (default: the provider's; --pair makes a private one).
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// verbs device name (default: the first).
    #[arg(short = 'd', long, value_name = "NAME")]
    pub device: Option<String>,
    /// Pin this process to CPU N (used by --pair for the server child).
    #[arg(long, value_name = "N", hide = true)]
    pub pin: Option<usize>,
}

/// `5`, `5s`, `500ms`, `2m` in nanoseconds.
fn parse_time_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1_000_000_000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000_000_000)
    } else {
        (t, 1_000_000_000u64)
    };
    let v: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a time: use seconds, or a number with ms, s or m"))?;
    match v.checked_mul(mul) {
        Some(0) => Err("--runtime must be above 0".into()),
        Some(ns) => Ok(ns),
        None => Err(format!("'{s}' is too long")),
    }
}

impl BlkArgs {
    /// Checks the options that do not depend on the device.
    fn check(&self) -> Result<u32, PerfError> {
        let bs = u32::try_from(self.bs)
            .ok()
            .filter(|&b| b >= 512 && b.is_multiple_of(512))
            .ok_or_else(|| {
                PerfError::Usage(format!(
                    "--bs {} must be a multiple of 512 below 4 GiB",
                    self.bs
                ))
            })?;
        if self.iodepth == 0 || self.iodepth > 4096 {
            return Err(PerfError::Usage("--iodepth must be in 1..=4096".into()));
        }
        if self.numjobs == 0 || self.numjobs > 64 {
            return Err(PerfError::Usage("--numjobs must be in 1..=64".into()));
        }
        Ok(bs)
    }

    /// The jobs for a device of `bytes`: with `--verify` each job gets its own slice (two
    /// jobs checking the same blocks would see each other's writes); otherwise every job
    /// covers the same range, as fio's clones do.
    fn jobs(&self, bs: u32, bytes: u64, quick: bool) -> Result<Vec<JobSpec>, PerfError> {
        let want = self.size.unwrap_or(bytes);
        if want > bytes {
            return Err(PerfError::Usage(format!(
                "--size {want} is larger than the device ({bytes} bytes)"
            )));
        }
        let per = if self.verify {
            want / u64::from(self.numjobs)
        } else {
            want
        };
        let per = per - per % u64::from(bs);
        if per < u64::from(bs) {
            return Err(PerfError::Usage(format!(
                "--size {want} leaves each of the {} jobs less than one --bs block",
                self.numjobs
            )));
        }
        let runtime_ns = match (self.runtime, quick) {
            (Some(r), true) => Some(r.min(200_000_000)),
            (r, _) => r,
        };
        let base_name = self
            .name
            .clone()
            .unwrap_or_else(|| self.rw.name().to_owned());
        Ok((0..self.numjobs)
            .map(|i| JobSpec {
                name: if self.numjobs > 1 {
                    format!("{base_name}.{i}")
                } else {
                    base_name.clone()
                },
                rw: self.rw,
                bs,
                iodepth: self.iodepth,
                base: if self.verify { u64::from(i) * per } else { 0 },
                size: per,
                runtime_ns,
                rwmixread: self.rwmixread,
                verify: self.verify,
                nap: self.nap,
                seed: 0x5EED_0000 + u64::from(i),
            })
            .collect())
    }

    /// Runs the jobs.
    ///
    /// # Errors
    /// [`PerfError::Usage`] for bad options, [`PerfError::Unavailable`] when the target
    /// cannot be opened, [`PerfError::Verify`] when `--verify` found bad data or IOs failed.
    pub fn run(&self, common: &Common) -> Result<BlkReport, PerfError> {
        let bs = self.check()?;
        if self.server || self.pair || self.client.is_some() {
            return self.run_remote(common, bs);
        }
        let Some(path) = self.filename.clone() else {
            return Err(PerfError::Usage(
                "say what to load: --filename PATH (a file or block device), or an RNBD \
                 device over RTRS with --pair or --client ADDR"
                    .into(),
            ));
        };
        let direct = self.direct == 1;
        let read_only = !self.rw.writes() && !self.verify;
        let probe = LocalTarget::open(&path, bs, 1, direct, read_only)?;
        let jobs = self.jobs(bs, probe.geometry().bytes, common.quick)?;
        drop(probe);
        let cpus = common.cpus.as_array();
        let handles: Vec<_> = jobs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let path = path.clone();
                let cpu = cpus[i % 2];
                std::thread::spawn(move || {
                    run_on(cpu, move || {
                        let mut t =
                            LocalTarget::open(&path, spec.bs, spec.iodepth, direct, read_only)?;
                        engine::run(&spec, &mut t).map_err(PerfError::Fabric)
                    })?
                })
            })
            .collect();
        let mut results = Vec::new();
        for h in handles {
            results.push(h.join().map_err(|_| PerfError::Panicked("a blk job"))??);
        }
        let report = BlkReport {
            jobs: results,
            target: format!("file {}", path.display()),
        };
        report.check()?;
        Ok(report)
    }
}

impl BlkArgs {
    /// `--server`, `--pair`, `--client`: RNBD over RTRS over a fabric provider.
    fn run_remote(&self, common: &Common, bs: u32) -> Result<BlkReport, PerfError> {
        start_role(self.server, self.client.as_deref(), self.pair, self.pin)?;
        // --backend names our server's device; a --device-path is someone else's (the
        // kernel's rnbd-server, a brd RAM disk), which keeps data.
        if self.verify && self.backend == BackendKind::Null && self.device_path.is_none() {
            return Err(PerfError::Usage(
                "--verify needs a device that keeps data: add --backend mem (the null \
                 device completes IOs without storing anything), or name a server's \
                 device with --device-path"
                    .into(),
            ));
        }
        if !self.server && self.numjobs != 1 {
            return Err(PerfError::Usage(
                "--numjobs must be 1 for a remote device (one RNBD session per run)".into(),
            ));
        }
        match self.provider {
            ProviderKind::Shm => {
                let dir = shm_dir(self.shm_dir.as_ref(), self.pair, "dp-blk");
                let dev = ShmDevice::open(ShmConfig {
                    dir: dir.clone(),
                    ..ShmConfig::default()
                })
                .map_err(open_err)?;
                self.remote_on::<Shm>(Arc::new(dev), common, bs, SHM_PAIR_IP, dir.as_ref())
            }
            #[cfg(feature = "verbs")]
            ProviderKind::Verbs => {
                let dev = open_verbs(self.device.as_deref())?;
                let ip = if self.pair {
                    verbs_pair_ip(&dev)?
                } else {
                    self.bind
                };
                self.remote_on::<dataplane::fabric::verbs::Verbs>(
                    Arc::new(dev),
                    common,
                    bs,
                    ip,
                    None,
                )
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => match open_verbs(self.device.as_deref())? {},
        }
    }

    fn addrs(&self, first: SocketAddr) -> Result<Vec<SocketAddr>, PerfError> {
        (0..self.paths)
            .map(|k| {
                first
                    .port()
                    .checked_add(k)
                    .map(|p| SocketAddr::new(first.ip(), p))
                    .ok_or_else(|| PerfError::Usage("--port + --paths passes 65535".into()))
            })
            .collect()
    }

    fn remote_on<P: Provider>(
        &self,
        dev: Arc<P::Device>,
        common: &Common,
        bs: u32,
        pair_ip: IpAddr,
        dir: Option<&PathBuf>,
    ) -> Result<BlkReport, PerfError> {
        // Permits for the IOs, plus one for the admin messages.
        let queue_depth = u16::try_from(self.iodepth + 1)
            .map_err(|_| PerfError::Usage("--iodepth must be below 65535".into()))?;
        if self.server {
            remote::serve::<P>(
                dev,
                &ServePlan {
                    addrs: self.addrs(SocketAddr::new(self.bind, self.port))?,
                    backend: self.backend,
                    dev_bytes: self.dev_size,
                    bs,
                    queue_depth,
                    busy: self.busy_poll,
                },
            )?;
            return Ok(BlkReport {
                jobs: Vec::new(),
                target: "server".into(),
            });
        }
        let mut extra: Vec<std::ffi::OsString> = [
            "--paths".to_string(),
            self.paths.to_string(),
            "--bs".into(),
            bs.to_string(),
            "--iodepth".into(),
            self.iodepth.to_string(),
            "--backend".into(),
            self.backend.dev_name().trim_end_matches('0').into(),
            "--dev-size".into(),
            self.dev_size.to_string(),
        ]
        .into_iter()
        .map(Into::into)
        .collect();
        if self.busy_poll {
            extra.push("--busy-poll".into());
        }
        let pair = self.pair.then(|| Server {
            command: "blk",
            ip: pair_ip,
            port: self.port,
            provider: self.provider,
            shm_dir: dir.map(PathBuf::as_path),
            device: self.device.as_deref(),
            extra,
        });
        let listed = self
            .client
            .as_deref()
            .map(|c| c.split(',').collect::<Vec<_>>());
        let first_client = listed.as_ref().and_then(|l| l.first().copied());
        let peer = Peer::start(pair, first_client, self.port, common.cpus)?;
        let first = peer.addr;
        let result = (|| {
            let addrs = match &listed {
                Some(l) if l.len() > 1 => {
                    if self.paths != 1 {
                        return Err(PerfError::Usage(
                            "--paths with a list of --client addresses: each address is a path, \
                             drop --paths"
                                .into(),
                        ));
                    }
                    l.iter()
                        .map(|a| parse_addr(a.trim(), self.port))
                        .collect::<Result<Vec<_>, _>>()?
                }
                _ => self.addrs(first)?,
            };
            let name = self
                .device_path
                .as_deref()
                .unwrap_or_else(|| self.backend.dev_name());
            let mut t = RemoteTarget::<P>::connect(
                dev,
                &addrs,
                name,
                bs,
                self.iodepth,
                self.per_io_registration,
            )?;
            let jobs = self.jobs(bs, t.geometry().bytes, common.quick)?;
            let mut results = Vec::new();
            for spec in &jobs {
                results.push(
                    engine::run(spec, &mut t)
                        .map_err(|e| PerfError::Fabric(format!("{e}{}", t.path_errors())))?,
                );
            }
            t.close();
            Ok(BlkReport {
                jobs: results,
                target: format!(
                    "rnbd {name} over rtrs over {}, {} path(s)",
                    P::NAME,
                    addrs.len()
                ),
            })
        })();
        let report = peer.finish(result)?;
        report.check()?;
        Ok(report)
    }
}

impl BlkReport {
    /// Fails a run whose IOs failed or whose data did not verify (after printing nothing:
    /// the error says what went wrong).
    ///
    /// # Errors
    /// [`PerfError::Verify`].
    pub fn check(&self) -> Result<(), PerfError> {
        for j in &self.jobs {
            if let Some(v) = &j.verify
                && let Some(m) = &v.first
            {
                return Err(PerfError::Verify(format!(
                    "job {}: {} of {} blocks read back wrong; first: {m}",
                    j.spec.name, v.mismatches, v.checked
                )));
            }
            for (dir, d) in [("reads", &j.read), ("writes", &j.write)] {
                if d.errors > 0 {
                    return Err(PerfError::Verify(format!(
                        "job {}: {} {dir} failed; first with errno {} ({})",
                        j.spec.name,
                        d.errors,
                        d.first_errno.unwrap_or(0),
                        std::io::Error::from_raw_os_error(d.first_errno.unwrap_or(0))
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse() {
        assert_eq!(parse_time_ns("5"), Ok(5_000_000_000));
        assert_eq!(parse_time_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_time_ns("2m"), Ok(120_000_000_000));
        assert!(parse_time_ns("0").is_err());
        assert!(parse_time_ns("x").is_err());
    }
}
