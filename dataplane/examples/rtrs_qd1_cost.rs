//! The instruction cost of one queue-depth-1 RTRS READ round trip over the shm provider,
//! for callgrind: both sides of `dp-perf rtrs --pair --rw read --iodepth 1` (the same
//! driver and server configuration, and the same RAM-disk handler) driven from one thread
//! on a virtual clock, so two runs of the same count execute the same instructions.
//!
//! ```text
//! cargo build --release -p dataplane --example rtrs_qd1_cost
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*steady*' \
//!     target/release/examples/rtrs_qd1_cost 20000 [BS [DEPTH [copy|source [registered|invalidate]]]]
//! ```
//!
//! Only the measured run is collected (`steady`: 20,000 round trips after a warm-up of
//! 2,000 that brings the session up), so its total over 20,000 is the cost of one round
//! trip on both sides. A round trip is what `dp-perf rtrs` does at queue depth 1: the
//! client takes a permit and submits a READ of `BS` bytes (64 by default); then turns (the
//! server's driver polls and the handler answers each request from its RAM disk with
//! `resp_rdma`, the client's driver polls and the completion returns the permit) until it
//! completed. With `DEPTH` above 1 (`--iodepth`) the client keeps that many READs in
//! flight, resubmitting at each completion, and the total over 20,000 is the cost of one
//! IO at that depth. The handler copies the block into the request's chunk and answers
//! with `resp_rdma` (`copy`, the default, as the rows below were measured, and as
//! `dp-perf rtrs --server-copy` serves), or answers from the disk registered as a source
//! with `resp_rdma_from` (`source`: zero copy, `dp-perf rtrs`'s default). The server keeps
//! its chunks registered once (`registered`, the default) or runs `always_invalidate`
//! (`invalidate`: each chunk's window invalidated when its request lands and bound again
//! under a new key for the answer, as `dp-perf rtrs --always-invalidate`).
//! `--fair-sched=yes`: the shm CM's thread must get to run while the driver spins, or the
//! session never comes up.
//!
//! Measured on branch w-rtrscost (both sides, instructions per round trip at depth 1 and
//! per IO at depth 128; every row this driver built against that commit's libraries):
//!
//! ```text
//!                                                   depth 1           depth 128
//!                                                   bs 64  bs 4096    bs 64  bs 4096
//! main (3d6de36)                                    7,567   8,367     5,734   6,534
//! the server posts on a borrowed connection         6,906   7,706     5,073   5,873
//! the test kit's lies off the posting path          6,827   7,627     4,994   5,794
//! a READ's answer is one WRITE with immediate       6,676   7,476     4,843   5,643
//! requests and answers PLACE_ON_POLL (*)            6,846   7,555     5,013   5,722
//! client IO connections signal every cap/2-th       6,695   7,404     5,029   5,738
//! slots carry the sender's credits (*)              6,759   7,478     5,046   5,765
//! one-request chains translated alone               6,565   7,284     4,852   5,571
//! one path / connection / region: no division       6,489   7,208     4,776   5,495
//! drain_recv: "more" only when out is full          6,404   7,119     4,773   5,488  (-15%)
//! ```
//!
//! Measured on branch w-rtrsiops (same driver and rows, `copy` handler; main had moved
//! since the table above, so its first row is main's at caef63e):
//!
//! ```text
//!                                                   depth 1           depth 128
//!                                                   bs 64  bs 4096    bs 64  bs 4096
//! main (caef63e)                                    6,569   7,718     4,891   6,040
//! send_rsp's chain built in place, cid 0 polled
//!   only when may_have_work()                       6,284   7,433     4,802   5,951
//! a batch's reposts as one post_recv list           6,303   7,452     4,728   5,877
//! the same, `source` handler (dp-perf's default)    6,268   6,793     4,693   5,218
//! ```
//!
//! (*) More instructions, fewer cache-line transfers: each moves a line between the two
//! cores off the critical path of a round trip. Lines one side writes and the other then
//! reads, per depth-1 round trip at bs 64, main -> now: the request's header line in the
//! chunk and its slot line, the server's `rq_posted` (every request: the server keeps one
//! receive posted and reposts it just before it answers), the answer's data line and its
//! slot line, and the client's `rq_posted` (every other answer): 5.5 lines, 4.5 of them
//! one after another -> the request's slot and the answer's slot, two lines each fetched
//! together (a small payload rides in the slot, the credits in its spare word): 4 lines, 2
//! transfer latencies, a round trip's floor. At bs 4096 the answer's 64 data lines still
//! go to the client's buffer (read when the application reads them). The doorbells (in
//! scan mode their words stay in the ringer's cache), the peer's `state`, our `fault`
//! and `sleepers` lines are read every message but written only on errors or sleeps.
//!
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rtrs::clt::{ClientConfig, ClientEvent, ClientSession, DataRef, Request};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig, ServerDriver};
use dataplane::rtrs::permit::{ConType, Permit, Wait};
use dataplane::rtrs::srv::{Server, ServerConfig, ServerEvent, ServerIo};
use dataplane::rtrs::wire::{DEFAULT_MAX_HDR_SIZE, MIN_CHUNK_SIZE};
use dataplane::rtrs::work::Dir;
use dataplane::rtrs::work::SrcRef;
use lcore::time::Instant;
use mempool::memory::{Region, RegionConfig};

#[path = "common/clock.rs"]
mod clock;
use clock::VirtualClock;

/// Blocks of the RAM disk, as `dp-perf rtrs`'s server has.
const DISK_BLOCKS: u64 = 1024;
/// Bytes of the user message (`dp-perf rtrs`'s: the block number and a bye marker).
const USR_LEN: usize = 16;
/// Round trips before the measured run.
const WARMUP: u64 = 2_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let count: u64 = args
        .next()
        .map_or(20_000, |s| s.parse().expect("a round trip count"));
    let bs: u32 = args
        .next()
        .map_or(64, |s| s.parse().expect("a block size in bytes"));
    let depth: u16 = args.next().map_or(1, |s| s.parse().expect("a queue depth"));
    let zero_copy = match args.next().as_deref() {
        None | Some("copy") => false,
        Some("source") => true,
        Some(other) => panic!("{other}: the handler is `copy` or `source`"),
    };
    let always_invalidate = match args.next().as_deref() {
        None | Some("registered") => false,
        Some("invalidate") => true,
        Some(other) => panic!("{other}: the server is `registered` or `invalidate`"),
    };
    let dir = std::env::temp_dir().join(format!("dp-rtrs-qd1cost-{}", std::process::id()));
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
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 83, 0, 1)), 18600);
    let mut sdrv = ServerDriver::<Shm>::new(dev(), &[addr]).expect("listen");
    let srv = Server::new(ServerConfig {
        queue_depth: depth,
        chunk_size: (bs + DEFAULT_MAX_HDR_SIZE)
            .next_power_of_two()
            .max(MIN_CHUNK_SIZE),
        always_invalidate,
        ..ServerConfig::default()
    })
    .expect("server configuration");
    let mut cdrv = ClientDriver::<Shm>::new(
        dev(),
        ClientDriverConfig {
            max_queue_depth: depth,
            hdr_bytes: 256,
        },
    )
    .expect("client driver");
    cdrv.add_route(addr);
    let data = Region::new(
        &RegionConfig::new("rtrs-qd1-cost", usize::from(depth) * bs as usize)
            .shareable(true)
            .quiet(),
    )
    .expect("data buffers");
    let region = cdrv.add_region(Arc::new(data)).expect("data registered");
    let mut cfg = ClientConfig::new(b"rtrs-qd1-cost", [7; 16]).expect("client configuration");
    cfg.reconnect_delay = Duration::from_millis(100);
    let sess = ClientSession::new(cfg).expect("client session");
    let mut disk = vec![0u8; DISK_BLOCKS as usize * bs as usize];
    for (i, b) in disk.iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(0x9E37_79B9) as u8;
    }
    let source = zero_copy.then(|| {
        let mem = Region::new(
            &RegionConfig::new("rtrs-qd1-cost-disk", disk.len())
                .shareable(true)
                .quiet(),
        )
        .expect("disk region");
        mem.copy_in(0, &disk);
        sdrv.add_source(Arc::new(mem)).expect("disk registered")
    });
    let mut rig = Rig {
        cdrv,
        sess,
        sdrv,
        srv,
        region,
        bs,
        depth,
        slots: (0..depth).map(|_| None).collect(),
        disk,
        source,
        done: 0,
        clock: VirtualClock::new(1_000_000),
    };
    rig.open();
    rig.run(WARMUP);
    rig.clock.warm = false;
    let turns0 = rig.clock.turns;
    steady(&mut rig, WARMUP + count);
    println!(
        "{count} round trips of {bs} bytes at depth {depth} in {} turns after a warm-up of {WARMUP}",
        rig.clock.turns - turns0
    );
    drop(rig);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both sides and the driver's counters and virtual clock.
struct Rig {
    cdrv: ClientDriver<Shm>,
    sess: ClientSession,
    sdrv: ServerDriver<Shm>,
    srv: Server,
    region: u32,
    bs: u32,
    /// Requests kept in flight (`--iodepth`).
    depth: u16,
    /// The permits of the requests in flight, by id.
    slots: Vec<Option<Permit>>,
    disk: Vec<u8>,
    /// The disk's source number when READs are answered from it (`source`).
    source: Option<u32>,
    /// Round trips done.
    done: u64,
    /// Virtual time, a turn at a time.
    clock: VirtualClock,
}

impl Rig {
    /// Opens the session: turns until the client says it is open.
    fn open(&mut self) {
        let real = std::time::Instant::now();
        let now = self.clock.now();
        self.sess
            .open(now, &[[8; 16]], &mut self.cdrv)
            .expect("open");
        loop {
            let now = self.clock.tick(real);
            self.serve(now);
            self.cdrv.poll(now, &mut self.sess);
            while let Some(ev) = self.sess.poll_event() {
                match ev {
                    ClientEvent::Opened { queue_depth, .. } => {
                        assert!(queue_depth >= self.depth, "the server's queue depth");
                        return;
                    }
                    ClientEvent::OpenFailed { error, .. } => panic!("open failed: {error}"),
                    _ => {}
                }
            }
            assert!(
                real.elapsed() < Duration::from_secs(60),
                "the session did not open within 60 s"
            );
        }
    }

    /// [`drive`](Self::drive) at depth 1, [`drive_deep`](Self::drive_deep) above.
    fn run(&mut self, until: u64) {
        if self.depth == 1 {
            self.drive(until);
        } else {
            self.drive_deep(until);
        }
    }

    /// One turn of the server: its driver polls, and the handler answers every request
    /// as `dp-perf rtrs`'s RAM disk does.
    fn serve(&mut self, now: Instant) {
        self.sdrv.poll(now, &mut self.srv);
        let block = self.bs as usize;
        let mut usr = [0u8; USR_LEN];
        while let Some(ev) = self.srv.poll_event() {
            let ServerEvent::Request {
                op,
                sess,
                chunk,
                dir,
                data_len,
                usr_len,
                read_len,
            } = ev
            else {
                continue;
            };
            let mut status = 0;
            if usize::from(usr_len) != USR_LEN
                || self
                    .sdrv
                    .read_chunk(sess, chunk, data_len, &mut usr)
                    .is_err()
                || dir != Dir::Read
            {
                status = -libc::EINVAL;
            } else {
                let b = u64::from_le_bytes(usr[..8].try_into().expect("8 bytes"));
                let at = (b % DISK_BLOCKS) as usize * block;
                if let Some(id) = self.source
                    && read_len as usize <= block
                {
                    let src = SrcRef {
                        id,
                        offset: at as u64,
                    };
                    if self
                        .srv
                        .resp_rdma_from(now, op, src, &mut self.sdrv)
                        .is_ok()
                    {
                        continue;
                    }
                    status = -libc::EINVAL;
                }
                let n = (read_len as usize).min(block);
                if status == 0
                    && self
                        .sdrv
                        .write_chunk(sess, chunk, 0, &self.disk[at..at + n])
                        .is_err()
                {
                    status = -libc::EINVAL;
                }
            }
            let _ = self.srv.resp_rdma(now, op, status, &mut self.sdrv);
        }
    }

    /// Round trips until `until` are done: the client submits a READ through permit 0,
    /// then turns of both sides until it completed.
    #[inline(never)]
    fn drive(&mut self, until: u64) {
        let real = std::time::Instant::now();
        let permits = Arc::clone(self.sess.permits().expect("open"));
        while self.done < until {
            let permit = permits
                .get(ConType::Io, 0, Wait::NoWait)
                .expect("a free permit");
            let mut usr = [0u8; USR_LEN];
            usr[..8].copy_from_slice(&self.done.to_le_bytes());
            let req = Request {
                dir: Dir::Read,
                usr: &usr,
                data: Some(DataRef {
                    region: self.region,
                    offset: u64::from(permit.id()) * u64::from(self.bs),
                    len: self.bs,
                }),
                ctx: self.done,
            };
            let t0 = self.clock.t;
            let now = self.clock.now();
            self.sess
                .request(now, &permit, req, &mut self.cdrv)
                .expect("request submitted");
            'rt: loop {
                let now = self.clock.tick(real);
                self.serve(now);
                self.cdrv.poll(now, &mut self.sess);
                while let Some(ev) = self.sess.poll_event() {
                    if let ClientEvent::Completed { result, ctx, .. } = ev {
                        assert_eq!(ctx, self.done, "the completion of round trip {ctx}");
                        result.expect("the READ succeeded");
                        break 'rt;
                    }
                }
                assert!(
                    self.clock.t - t0 < 10_000_000_000,
                    "no completion for round trip {} after {} ns",
                    self.done,
                    self.clock.t - t0
                );
            }
            permits.put(permit);
            self.done += 1;
        }
    }

    /// Requests until `until` are done, `depth` of them in flight (one per permit): turns
    /// of both sides, each completion's permit returned and the next request submitted
    /// before the next turn.
    #[inline(never)]
    fn drive_deep(&mut self, until: u64) {
        let real = std::time::Instant::now();
        let permits = Arc::clone(self.sess.permits().expect("open"));
        let mut inflight = 0u64;
        let mut submitted = self.done;
        let mut t0 = self.clock.t;
        while self.done < until {
            while inflight < u64::from(self.depth) && submitted < until {
                let permit = permits
                    .get(ConType::Io, 0, Wait::NoWait)
                    .expect("a free permit");
                let mut usr = [0u8; USR_LEN];
                usr[..8].copy_from_slice(&submitted.to_le_bytes());
                let req = Request {
                    dir: Dir::Read,
                    usr: &usr,
                    data: Some(DataRef {
                        region: self.region,
                        offset: u64::from(permit.id()) * u64::from(self.bs),
                        len: self.bs,
                    }),
                    ctx: submitted,
                };
                let now = self.clock.now();
                self.sess
                    .request(now, &permit, req, &mut self.cdrv)
                    .expect("request submitted");
                let id = usize::from(permit.id());
                self.slots[id] = Some(permit);
                submitted += 1;
                inflight += 1;
            }
            let now = self.clock.tick(real);
            self.serve(now);
            self.cdrv.poll(now, &mut self.sess);
            while let Some(ev) = self.sess.poll_event() {
                if let ClientEvent::Completed { id, result, ctx } = ev {
                    assert!(ctx < submitted, "the completion of request {ctx}");
                    result.expect("the READ succeeded");
                    let permit = self.slots[usize::from(id)].take().expect("in flight");
                    permits.put(permit);
                    inflight -= 1;
                    self.done += 1;
                    t0 = self.clock.t;
                }
            }
            assert!(
                self.clock.t - t0 < 10_000_000_000,
                "no completion after request {} for {} ns",
                self.done,
                self.clock.t - t0
            );
        }
    }
}

/// The measured run: [`Rig::drive`] to `until` round trips, in a function of its own so
/// that callgrind can collect it alone.
#[inline(never)]
fn steady(rig: &mut Rig, until: u64) {
    rig.run(until);
}
