//! The instruction cost of one RNBD READ over RTRS over the shm provider, for callgrind:
//! both sides of `dp-perf blk --pair --rw randread --bs BS --iodepth DEPTH` (an
//! [`RnbdClient`] with `dp-perf blk`'s driver and session configuration, and an
//! [`RnbdServer`] exporting a null device) driven from one thread on a virtual clock, so two
//! runs of the same count execute the same instructions. The RNBD twin of
//! `rtrs_qd1_cost.rs`: the difference between the two at the same block size and depth is
//! what RNBD adds per IO on top of RTRS (its request header and answer, the device and
//! request tables, the backend's submission and completion).
//!
//! ```text
//! cargo build --release -p dataplane --example rnbd_cost
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*steady*' \
//!     target/release/examples/rnbd_cost 20000 [BS [DEPTH]]
//! ```
//!
//! Only the measured run is collected (`steady`: `COUNT` READs after a warm-up of 2,000
//! that follows the session's opening and the device's mapping), so its total over `COUNT`
//! is the cost of one IO on both sides. The client keeps `DEPTH` READs of `BS` bytes (4096
//! and 1 by default) in flight, each into its own buffer, at sectors that walk the device,
//! resubmitting at each completion; a turn is one poll of the server (fabric, RTRS,
//! backend) and one of the client. `--fair-sched=yes`: the shm CM's thread must get to run
//! while the loop spins, or the session never comes up.
//!
//! Measured on branch w-rtrsiops (both sides, instructions per IO at bs 4096; every row
//! this driver built against that commit's libraries):
//!
//! ```text
//!                                                   depth 1    depth 32   depth 128
//! main (caef63e)                                      8,749       7,033       6,948
//! RTRS: send_rsp in place, cid 0 polled on
//!   may_have_work, reposts as one list                8,626       6,965       6,879
//! RNBD server: sessions by slot, not SipHash          8,221       6,566       6,480
//! RNBD: user message and answer buffers kept
//!   (no 512-byte memset per IO on each side)          8,126       6,470       6,384  (-8%)
//! ```
//!
//! RTRS alone (`rtrs_qd1_cost 20000 4096 128`, `copy` handler) is 5,877 at depth 128.
//!
//! (The null backend writes no data: RTRS's row includes the handler's 4 KiB copy into
//! the chunk, about 700 instructions, which RNBD's null device does not pay.)
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rnbd::backend::NullBackend;
use dataplane::rnbd::client::{Buf, ClientEvent, DevId};
use dataplane::rnbd::export::{Exports, SearchPath};
use dataplane::rnbd::rtrs::{RnbdClient, RnbdServer};
use dataplane::rnbd::wire::AccessMode;
use dataplane::rtrs::clt::{ClientConfig, ClientSession};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig, ServerDriver};
use dataplane::rtrs::srv::{Server, ServerConfig};
use dataplane::rtrs::wire::{DEFAULT_MAX_HDR_SIZE, MIN_CHUNK_SIZE};
use mempool::memory::{Region, RegionConfig};

#[path = "common/clock.rs"]
mod clock;
use clock::VirtualClock;

/// The device's size (`dp-perf blk`'s default null device: 1 GiB).
const DEV_BYTES: u64 = 1 << 30;
/// IOs before the measured run.
const WARMUP: u64 = 2_000;
/// The exported device's name.
const DEV: &[u8] = b"null0";

fn main() {
    let mut args = std::env::args().skip(1);
    let count: u64 = args
        .next()
        .map_or(20_000, |s| s.parse().expect("an IO count"));
    let bs: u32 = args
        .next()
        .map_or(4096, |s| s.parse().expect("a block size in bytes"));
    let depth: u16 = args.next().map_or(1, |s| s.parse().expect("a queue depth"));
    assert!(
        bs >= 512 && bs.is_multiple_of(512),
        "a block size of whole sectors"
    );
    let dir = std::env::temp_dir().join(format!("dp-rnbd-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("rendezvous directory");
    let dev = || {
        Arc::new(
            ShmDevice::open(ShmConfig {
                dir: Some(dir.clone()),
                ..ShmConfig::default()
            })
            .expect("shm device"),
        )
    };
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 83, 0, 2)), 18601);

    // The server as `dp-perf blk`'s: a queue depth one above the client's, chunks for `bs`.
    let sdrv = ServerDriver::<Shm>::new(dev(), &[addr]).expect("listen");
    let srv = Server::new(ServerConfig {
        queue_depth: depth + 1,
        chunk_size: (bs + DEFAULT_MAX_HDR_SIZE)
            .next_power_of_two()
            .max(MIN_CHUNK_SIZE),
        always_invalidate: false,
        ..ServerConfig::default()
    })
    .expect("server configuration");
    let mut exports = Exports::new(SearchPath::default());
    let path = exports
        .search_path()
        .resolve("", DEV)
        .expect("the device path");
    exports.add(path, NullBackend::new(DEV_BYTES, usize::from(depth) + 1));
    let server = RnbdServer::new(sdrv, srv, exports);

    // The client as `dp-perf blk`'s (its driver's default depth, RTRS's defaults).
    let mut cdrv =
        ClientDriver::<Shm>::new(dev(), ClientDriverConfig::default()).expect("client driver");
    cdrv.add_route(addr);
    let bufs = Region::new(
        &RegionConfig::new("rnbd-cost", usize::from(depth) * bs as usize)
            .shareable(true)
            .quiet(),
    )
    .expect("IO buffers");
    let region = cdrv.add_region(Arc::new(bufs)).expect("buffers registered");
    let mut cfg = ClientConfig::new(b"rnbd-cost", [9; 16]).expect("RTRS configuration");
    cfg.reconnect_delay = Duration::from_millis(100);
    let sess = ClientSession::new(cfg).expect("RTRS session");
    let depth_max = ClientDriverConfig::default().max_queue_depth;
    let client = RnbdClient::new(cdrv, sess, depth_max, bs).expect("RNBD client");

    let mut rig = Rig {
        client,
        server,
        dev: None,
        region,
        bs,
        depth,
        done: 0,
        clock: VirtualClock::new(1_000_000),
    };
    rig.open();
    rig.run(WARMUP);
    rig.clock.warm = false;
    let turns0 = rig.clock.turns;
    steady(&mut rig, WARMUP + count);
    println!(
        "{count} READs of {bs} bytes at depth {depth} in {} turns after a warm-up of {WARMUP}",
        rig.clock.turns - turns0
    );
    drop(rig);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both sides and the loop's counters and virtual clock.
struct Rig {
    client: RnbdClient<Shm>,
    server: RnbdServer<Shm, NullBackend>,
    /// The mapped device.
    dev: Option<DevId>,
    region: u32,
    bs: u32,
    /// READs kept in flight (`--iodepth`).
    depth: u16,
    /// IOs done.
    done: u64,
    /// Virtual time, a turn at a time.
    clock: VirtualClock,
}

impl Rig {
    /// One turn: the server, then the client.
    fn turn(&mut self, real: std::time::Instant) {
        let now = self.clock.tick(real);
        self.server.poll(now);
        self.client.poll(now);
    }

    /// Turns until the client's next RNBD event.
    fn wait(&mut self, real: std::time::Instant, what: &str) -> ClientEvent {
        loop {
            self.turn(real);
            if let Some(ev) = self.client.rnbd().poll_event() {
                return ev;
            }
            if let Some(e) = self.client.open_error() {
                panic!("{what}: {e:?}");
            }
            assert!(
                real.elapsed() < Duration::from_secs(60),
                "{what}: nothing within 60 s"
            );
        }
    }

    /// Opens the session and maps the device read-write.
    fn open(&mut self) {
        let real = std::time::Instant::now();
        let now = self.clock.now();
        self.client.open(now, &[[10; 16]]).expect("open");
        match self.wait(real, "the RNBD session") {
            ClientEvent::SessionReady { .. } => {}
            other => panic!("the RNBD session: {other:?}"),
        }
        let now = self.clock.now();
        let dev = {
            let (s, mut t) = self.client.session(now);
            s.map(DEV, AccessMode::Rw, &mut t).expect("map")
        };
        match self.wait(real, "mapping the device") {
            ClientEvent::Mapped { .. } => {}
            other => panic!("mapping the device: {other:?}"),
        }
        self.dev = Some(dev);
    }

    /// IOs until `until` are done, `depth` of them in flight (one per buffer): turns of
    /// both sides, each completion's buffer reused for the next READ before the next turn.
    #[inline(never)]
    fn run(&mut self, until: u64) {
        let real = std::time::Instant::now();
        let dev = self.dev.expect("mapped");
        let sectors = DEV_BYTES / 512;
        let per = u64::from(self.bs / 512);
        let mut free: Vec<u16> = (0..self.depth).rev().collect();
        let mut submitted = self.done;
        let mut t0 = self.clock.t;
        while self.done < until {
            while submitted < until
                && let Some(slot) = free.pop()
            {
                let buf = Buf {
                    region: self.region,
                    offset: u64::from(slot) * u64::from(self.bs),
                    len: self.bs,
                };
                let sector = submitted.wrapping_mul(per * 7) % (sectors - per);
                let now = self.clock.now();
                let (s, mut t) = self.client.session(now);
                s.read(dev, sector, buf, u64::from(slot), &mut t)
                    .expect("READ submitted");
                submitted += 1;
            }
            self.turn(real);
            while let Some(ev) = self.client.rnbd().poll_event() {
                if let ClientEvent::IoDone { ctx, result, .. } = ev {
                    result.expect("the READ succeeded");
                    free.push(ctx as u16);
                    self.done += 1;
                    t0 = self.clock.t;
                }
            }
            assert!(
                self.clock.t - t0 < 10_000_000_000,
                "no completion after IO {} for {} ns",
                self.done,
                self.clock.t - t0
            );
        }
        // The measured run ends with nothing in flight: the next starts the same way.
        assert_eq!(free.len(), usize::from(self.depth), "every READ completed");
    }
}

/// The measured run: [`Rig::run`] to `until` IOs, in a function of its own so that
/// callgrind can collect it alone.
#[inline(never)]
fn steady(rig: &mut Rig, until: u64) {
    rig.run(until);
}
