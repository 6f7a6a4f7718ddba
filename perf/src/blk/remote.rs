//! A job's target on an RNBD server over RTRS over a fabric provider (`--pair`, `--client`),
//! and that server (`--server`): a null or memory device exported as `null0` or `mem0`.
//!
//! The client side is one [`RnbdClient`] per job, polled from the job's thread by
//! [`Target::poll`]; the server is one [`RnbdServer`] polled from its own thread (busy, or
//! hybrid when the two sides share cores) until its last session is gone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rnbd::backend::{Backend, MemBackend, NullBackend};
use dataplane::rnbd::client::{Buf, ClientEvent, DevId, WriteFlags};
use dataplane::rnbd::export::{Exports, SearchPath};
use dataplane::rnbd::rtrs::{RnbdClient, RnbdServer};
use dataplane::rnbd::wire::AccessMode;
use dataplane::rtrs::clt::{ClientConfig, ClientSession};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig, ServerDriver};
use dataplane::rtrs::srv::{Server, ServerConfig};
use dataplane::rtrs::wire::{DEFAULT_MAX_HDR_SIZE, MIN_CHUNK_SIZE};
use lcore::time::{Clock, RealClock};
use mempool::memory::{Region, RegionConfig};

use super::engine::{Busy, Done, Op, Target, TargetGeometry};
use crate::PerfError;
use crate::harness::Idle;

/// How long a side waits for its peer before it gives up.
const PATIENCE: Duration = Duration::from_secs(30);

fn fail(what: &str, e: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(format!("{what}: {e}"))
}

/// The server's device (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Completes every IO at once without moving data: the transport alone.
    Null,
    /// A RAM disk (for --verify).
    Mem,
}

impl BackendKind {
    /// The name the device is exported (and mapped) as.
    pub fn dev_name(self) -> &'static str {
        match self {
            Self::Null => "null0",
            Self::Mem => "mem0",
        }
    }
}

/// What the server side needs.
#[derive(Debug, Clone)]
pub struct ServePlan {
    /// One listener per path.
    pub addrs: Vec<SocketAddr>,
    /// The device.
    pub backend: BackendKind,
    /// Its size in bytes.
    pub dev_bytes: u64,
    /// Largest IO (sizes the chunks).
    pub bs: u32,
    /// RTRS queue depth (permits, chunks).
    pub queue_depth: u16,
    /// Spin always instead of napping when idle.
    pub busy: bool,
}

/// The RTRS chunk for IOs of `bs` bytes: data plus header room, a power of two of at
/// least RTRS's minimum.
fn chunk_size(bs: u32) -> u32 {
    (bs + DEFAULT_MAX_HDR_SIZE)
        .next_power_of_two()
        .max(MIN_CHUNK_SIZE)
}

/// Serves the device until a client has come and every session is gone again.
///
/// # Errors
/// Listening, making the device, or no client within 30 s.
pub fn serve<P: Provider>(dev: Arc<P::Device>, plan: &ServePlan) -> Result<(), PerfError> {
    let depth = usize::from(plan.queue_depth);
    let mut exports = Exports::new(SearchPath::default());
    let name = plan.backend.dev_name().as_bytes();
    let path = exports
        .search_path()
        .resolve("", name)
        .map_err(|e| fail("the device path", format!("{e:?}")))?;
    match plan.backend {
        BackendKind::Null => {
            exports.add(path, NullBackend::new(plan.dev_bytes, depth));
            serve_with::<P, NullBackend>(dev, plan, exports)
        }
        BackendKind::Mem => {
            let b = MemBackend::new("dp-perf-blk-mem", plan.dev_bytes, depth)
                .map_err(|e| fail("the memory device", e))?;
            let mut exports2 = Exports::new(SearchPath::default());
            let path = exports2
                .search_path()
                .resolve("", name)
                .map_err(|e| fail("the device path", format!("{e:?}")))?;
            exports2.add(path, b);
            serve_with::<P, MemBackend>(dev, plan, exports2)
        }
    }
}

fn serve_with<P: Provider, B: Backend>(
    dev: Arc<P::Device>,
    plan: &ServePlan,
    exports: Exports<B>,
) -> Result<(), PerfError> {
    let clock = RealClock::new();
    let drv = ServerDriver::<P>::new(dev, &plan.addrs).map_err(|e| fail("listening", e))?;
    let srv = Server::new(ServerConfig {
        queue_depth: plan.queue_depth,
        chunk_size: chunk_size(plan.bs),
        always_invalidate: false,
        ..ServerConfig::default()
    })
    .map_err(|e| PerfError::Usage(format!("server configuration: {e}")))?;
    let mut s = RnbdServer::new(drv, srv, exports);
    let start = std::time::Instant::now();
    let mut seen = false;
    // Why paths closed, said once each on stderr (an interop run needs the reason).
    let mut reported: Vec<dataplane::rtrs::work::PathId> = Vec::new();
    let mut idle = Idle::new(plan.busy);
    loop {
        let work = s.poll(clock.now());
        // Path errors, the session count and the clock only on the idle turns `Idle` says:
        // each turn they lengthened was one a request that had just arrived waited for.
        if !idle.after(work) {
            continue;
        }
        for p in s.rtrs().paths() {
            if let Some(e) = s.rtrs().path_error(p)
                && !reported.contains(&p)
            {
                reported.push(p);
                eprintln!("dp-perf blk server: path {p:?} closing: {e:?}");
            }
        }
        let sessions = s.rtrs().sessions().count();
        if sessions > 0 {
            seen = true;
        } else if seen && s.in_flight() == 0 {
            return Ok(());
        } else if !seen && start.elapsed() > PATIENCE {
            return Err(PerfError::Fabric(format!(
                "no client came within {} s",
                PATIENCE.as_secs()
            )));
        }
    }
}

/// A remote device as a job's target.
pub struct RemoteTarget<P: Provider> {
    clock: RealClock,
    cl: RnbdClient<P>,
    dev: DevId,
    geo: TargetGeometry,
    bufs: Arc<Region>,
    region: u32,
    bs: u64,
    /// Submissions refused for a reason other than a busy queue, reported by the next poll.
    refused: Vec<Done>,
}

impl<P: Provider> RemoteTarget<P> {
    /// Connects to the server at `addrs` (one path each), maps `name` read-write, and makes
    /// `iodepth` buffers of `bs` bytes. With `per_io`, every READ's buffer is exposed to
    /// the server under a memory window of its own, invalidated before the READ completes
    /// ([`ClientDriver::set_per_io_registration`]), as Linux's client registers per IO.
    ///
    /// # Errors
    /// Connecting, mapping, allocating; each says which.
    pub fn connect(
        dev: Arc<P::Device>,
        addrs: &[SocketAddr],
        name: &str,
        bs: u32,
        iodepth: u32,
        per_io: bool,
    ) -> Result<Self, PerfError> {
        let clock = RealClock::new();
        let bytes = bs as usize * iodepth as usize;
        let bufs = Region::new(
            &RegionConfig::new("dp-perf-blk", bytes)
                .shareable(true)
                .quiet(),
        )
        .map_err(|_| PerfError::Alloc {
            what: "the IO buffers",
            bytes,
        })?;
        let bufs = Arc::new(bufs);
        let start = std::time::Instant::now();
        let wait = |cl: &mut RnbdClient<P>, what: &str| -> Result<ClientEvent, PerfError> {
            loop {
                cl.poll(clock.now());
                if let Some(ev) = cl.rnbd().poll_event() {
                    return Ok(ev);
                }
                if let Some(e) = cl.open_error() {
                    return Err(fail(what, e));
                }
                if start.elapsed() > PATIENCE {
                    return Err(PerfError::Fabric(format!(
                        "{what}: nothing within {} s",
                        PATIENCE.as_secs()
                    )));
                }
                std::hint::spin_loop();
            }
        };
        // A --pair server may still be setting up its device when the first connect goes
        // out, and a session whose opening path fails is closed: open a new one until one
        // opens or the patience runs out.
        let (mut cl, region, first) = loop {
            let (mut cl, region) = Self::open(Arc::clone(&dev), addrs, &bufs, bs, per_io, &clock)?;
            match wait(&mut cl, "the RNBD session") {
                Err(_) if cl.open_error().is_some() && start.elapsed() < PATIENCE => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
                Ok(ev) => break (cl, region, ev),
            }
        };
        match first {
            ClientEvent::SessionReady { .. } => {}
            ClientEvent::SessionFailed { errno } => {
                return Err(fail(
                    "the RNBD session",
                    std::io::Error::from_raw_os_error(errno),
                ));
            }
            other => return Err(fail("the RNBD session", format!("unexpected {other:?}"))),
        }
        let dev = {
            let (s, mut t) = cl.session(clock.now());
            s.map(name.as_bytes(), AccessMode::Rw, &mut t)
                .map_err(|e| fail("mapping the device", e))?
        };
        let g = match wait(&mut cl, "mapping the device")? {
            ClientEvent::Mapped { geometry, .. } => geometry,
            ClientEvent::MapFailed { errno, .. } => {
                return Err(fail(
                    &format!("mapping {name}"),
                    std::io::Error::from_raw_os_error(errno),
                ));
            }
            other => return Err(fail("mapping the device", format!("unexpected {other:?}"))),
        };
        Ok(Self {
            clock,
            cl,
            dev,
            geo: TargetGeometry {
                bytes: g.bytes(),
                block: g.logical_block,
                max_io: g.max_io,
            },
            bufs,
            region,
            bs: u64::from(bs),
            refused: Vec::with_capacity(iodepth as usize),
        })
    }

    /// A client with its IO buffers registered, its RTRS session opening.
    fn open(
        dev: Arc<P::Device>,
        addrs: &[SocketAddr],
        bufs: &Arc<Region>,
        bs: u32,
        per_io: bool,
        clock: &RealClock,
    ) -> Result<(RnbdClient<P>, u32), PerfError> {
        let dcfg = ClientDriverConfig::default();
        let depth = dcfg.max_queue_depth;
        let mut drv = ClientDriver::<P>::new(dev, dcfg).map_err(|e| fail("the RTRS client", e))?;
        drv.set_per_io_registration(per_io);
        for a in addrs {
            drv.add_route(*a);
        }
        let region = drv
            .add_region(Arc::clone(bufs))
            .map_err(|e| fail("registering the IO buffers", e))?;
        let uuid: [u8; 16] =
            std::array::from_fn(|i| (std::process::id() >> (i % 4 * 8)) as u8 ^ i as u8);
        let cfg =
            ClientConfig::new(b"dp-perf-blk", uuid).map_err(|e| fail("RTRS configuration", e))?;
        let sess = ClientSession::new(cfg).map_err(|e| fail("RTRS configuration", e))?;
        let mut cl = RnbdClient::new(drv, sess, depth, bs).map_err(|e| fail("RNBD client", e))?;
        let paths: Vec<[u8; 16]> = (0..addrs.len())
            .map(|k| std::array::from_fn(|i| uuid[i] ^ (k as u8 + 1)))
            .collect();
        cl.open(clock.now(), &paths)
            .map_err(|e| fail("opening the RTRS session", e))?;
        Ok((cl, region))
    }

    /// Why each path that has failed did (for an error message), or nothing.
    pub fn path_errors(&self) -> String {
        let r = self.cl.rtrs();
        r.paths()
            .filter_map(|p| r.path_error(p).map(|e| format!(" [path {p:?}: {e:?}]")))
            .collect()
    }

    /// Unmaps the device and closes the session (the server then ends its run).
    pub fn close(mut self) {
        let now = self.clock.now();
        {
            let (s, mut t) = self.cl.session(now);
            let _ = s.unmap(self.dev, &mut t);
        }
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            self.cl.poll(self.clock.now());
            if let Some(ClientEvent::Unmapped { .. }) = self.cl.rnbd().poll_event() {
                break;
            }
        }
        let (sess, drv) = self.cl.rtrs_mut();
        sess.close(self.clock.now(), drv);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            self.cl.poll(self.clock.now());
        }
    }
}

impl<P: Provider> Target for RemoteTarget<P> {
    fn geometry(&self) -> TargetGeometry {
        self.geo
    }

    fn buffers(&self) -> &Region {
        &self.bufs
    }

    fn submit(&mut self, op: Op, offset: u64, len: u32, slot: u32, tag: u64) -> Result<(), Busy> {
        let buf = Buf {
            region: self.region,
            offset: u64::from(slot) * self.bs,
            len,
        };
        let sector = offset / 512;
        let (s, mut t) = self.cl.session(self.clock.now());
        let r = match op {
            Op::Read => s.read(self.dev, sector, buf, tag, &mut t),
            Op::Write => s.write(self.dev, sector, buf, WriteFlags::default(), tag, &mut t),
        };
        match r {
            Ok(()) => Ok(()),
            Err(dataplane::rnbd::client::BlkError::Busy) => Err(Busy),
            Err(e) => {
                self.refused.push(Done {
                    tag,
                    result: -e.errno(),
                });
                Ok(())
            }
        }
    }

    fn poll(&mut self, out: &mut [Done]) -> usize {
        let mut n = 0;
        while n < out.len()
            && let Some(d) = self.refused.pop()
        {
            out[n] = d;
            n += 1;
        }
        self.cl.poll(self.clock.now());
        while n < out.len() {
            match self.cl.rnbd().poll_event() {
                Some(ClientEvent::IoDone { ctx, result, .. }) => {
                    out[n] = Done {
                        tag: ctx,
                        result: result.map_or_else(|e| -e, |()| 0),
                    };
                    n += 1;
                }
                Some(_) => {}
                None => break,
            }
        }
        n
    }
}

impl<P: Provider> std::fmt::Debug for RemoteTarget<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTarget")
            .field("dev", &self.dev)
            .field("geo", &self.geo)
            .finish_non_exhaustive()
    }
}
