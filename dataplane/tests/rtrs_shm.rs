//! RTRS on a real fabric: the client and server state machines run by their fabric drivers
//! (`dp_rtrs::fabric`) over the shm provider, each side on its own thread, polling in
//! hybrid mode (spin while busy, sleep briefly when idle) so both fit two cores. The server
//! runs as a poller of an lcore poll loop (`lcore::poll_loop`); the client drives its loop
//! by hand, so the tests can act between turns.
//!
//! The server is a RAM disk: READs are answered from its memory, WRITEs stored there, and
//! every byte is checked on the way (the client checks READ data, the server checks WRITE
//! data against the pattern the request names).

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use dataplane::fabric::RemoteAddr;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rtrs::clt::{ClientConfig, ClientEvent, ClientSession, DataRef, MpPolicy, Request};
use dataplane::rtrs::error::{PathError, Violation};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig, PathKill, ServerDriver, Tamper};
use dataplane::rtrs::permit::{ConType, Permit, Wait};
use dataplane::rtrs::srv::{Server, ServerConfig, ServerEvent, ServerIo};
use dataplane::rtrs::wire::{Geometry, Imm, ImmType, IoRsp};
use dataplane::rtrs::work::{Dir, PathId, SrcRef, inc_rkey};
use lcore::poll_loop::{Ctx, LoopBuilder, LoopConfig, PollMode};
use lcore::stop::StopToken;
use lcore::time::{Clock, Instant, RealClock};
use mempool::memory::{Region, RegionConfig};

const QD: u16 = 32;
const BS: usize = 4096;

fn dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dp-rtrs-{name}-{}", std::process::id()))
}

fn dev(dir: &Path) -> Arc<ShmDevice> {
    Arc::new(
        ShmDevice::open(ShmConfig {
            dir: Some(dir.to_path_buf()),
            ..ShmConfig::default()
        })
        .expect("shm device"),
    )
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 9, 1)), port)
}

/// The byte `i` of block `block`.
fn pattern(block: u64, i: usize) -> u8 {
    (block.wrapping_mul(0x9E37_79B9) as usize ^ i.wrapping_mul(131) ^ (i >> 7)) as u8
}

/// Hybrid polling: spin while there is work, sleep 20 us after 50 us of idleness.
struct Idle(Option<std::time::Instant>);

impl Idle {
    fn after(&mut self, work: usize) {
        if work > 0 {
            self.0 = None;
            return;
        }
        let t = *self.0.get_or_insert_with(std::time::Instant::now);
        if t.elapsed() > Duration::from_micros(50) {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// What the server thread saw.
#[derive(Debug, Default)]
struct Served {
    reads: u64,
    writes: u64,
    bad_writes: u64,
    /// Paths the server closed for a protocol violation.
    violation_closes: u64,
    /// Devices (bit per `with_devices` index) requests came in on.
    devices: u32,
}

/// A RAM-disk server on `addrs` (one per path) until `stop`.
fn server(
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
) -> (JoinHandle<Served>, mpsc::Receiver<()>) {
    lying_server(dir, addrs, stop, Tamper::default())
}

/// [`server`], lying as `tamper` says.
fn lying_server(
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    tamper: Tamper,
) -> (JoinHandle<Served>, mpsc::Receiver<()>) {
    any_server(dir, addrs, stop, tamper, None, Serve::default())
}

/// How a test server runs, beyond its tamper and pause.
#[derive(Clone, Copy, Debug, Default)]
struct Serve {
    /// READs answered from a source, not the chunk.
    zcopy: bool,
    /// Each listen address on a device of its own (and each client path on its own).
    device_per_path: bool,
    /// `always_invalidate`: each chunk's key invalidated while its request is handled and
    /// rotated for the answer.
    always_invalidate: bool,
    /// While set, requests are held (the handler answers them once it clears).
    hold: Option<&'static Hold>,
}

/// A server's handler holding its requests: while `on`, requests (and the server's other
/// events) wait unanswered, and `held` says how many requests.
#[derive(Debug)]
struct Hold {
    on: AtomicBool,
    held: AtomicU64,
}

impl Hold {
    const fn new() -> Self {
        Self {
            on: AtomicBool::new(false),
            held: AtomicU64::new(0),
        }
    }
}

/// A server that stops polling while `pause.0` is set, with heartbeats every `pause.1`;
/// with `serve.zcopy`, READs are answered from a source (one block per chunk) instead of
/// the chunk; with `serve.device_per_path`, each address is listened on by a device of its
/// own.
fn any_server(
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    tamper: Tamper,
    pause: Option<(Arc<AtomicBool>, Duration)>,
    serve: Serve,
) -> (JoinHandle<Served>, mpsc::Receiver<()>) {
    let zcopy = serve.zcopy;
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut drv = if serve.device_per_path {
            let devs: Vec<(Arc<ShmDevice>, &[SocketAddr])> = addrs
                .iter()
                .map(|a| (dev(&dir), core::slice::from_ref(a)))
                .collect();
            ServerDriver::<Shm>::with_devices(&devs).expect("listen")
        } else {
            ServerDriver::<Shm>::new(dev(&dir), &addrs).expect("listen")
        };
        drv.set_tamper(tamper);
        let mut cfg = ServerConfig {
            queue_depth: QD,
            chunk_size: 8192,
            always_invalidate: serve.always_invalidate,
            ..ServerConfig::default()
        };
        if let Some((_, hb)) = &pause {
            cfg.hb_interval = *hb;
        }
        let mut srv = Server::new(cfg).expect("server config");
        tx.send(()).unwrap();
        // The server runs as a poller of an lcore poll loop in hybrid mode.
        let served = Rc::new(RefCell::new(Served::default()));
        let out = Rc::clone(&served);
        let mut usr = [0u8; 8];
        let mut data = vec![0u8; BS];
        let mut source: Option<(Arc<Region>, u32)> = None;
        let mut held: Vec<ServerEvent> = Vec::new();
        let mut b = LoopBuilder::<(), _>::new(
            LoopConfig {
                mode: PollMode::hybrid_default(),
                ..LoopConfig::default()
            },
            RealClock::new(),
        );
        b.poller("rtrs-server", move |ctx: &mut Ctx<'_, ()>| {
            if stop.load(Ordering::Relaxed) {
                ctx.stop_local();
                return 0;
            }
            if pause.as_ref().is_some_and(|p| p.0.load(Ordering::Relaxed)) {
                return 0;
            }
            let now = ctx.now();
            let mut served = out.borrow_mut();
            let mut work = drv.poll(now, &mut srv);
            served.violation_closes = srv.stats().violation_closes;
            while let Some(ev) = srv.poll_event() {
                work += 1;
                held.push(ev);
            }
            if let Some(h) = serve.hold {
                let n = held
                    .iter()
                    .filter(|e| matches!(e, ServerEvent::Request { .. }))
                    .count();
                h.held.store(n as u64, Ordering::Relaxed);
                if h.on.load(Ordering::Relaxed) {
                    return work;
                }
            }
            for ev in held.drain(..) {
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
                served.devices |= drv.path_device(op.path).map_or(0, |k| 1 << k);
                if usr_len != 8 || drv.read_chunk(sess, chunk, data_len, &mut usr).is_err() {
                    status = -libc::EINVAL;
                } else {
                    let block = u64::from_le_bytes(usr);
                    match dir {
                        Dir::Read => {
                            served.reads += 1;
                            let n = (read_len as usize).min(BS);
                            for (i, b) in data[..n].iter_mut().enumerate() {
                                *b = pattern(block, i);
                            }
                            if zcopy {
                                let (mem, id) = source.get_or_insert_with(|| {
                                    let r = Arc::new(
                                        Region::new(
                                            &RegionConfig::new("zcopy", usize::from(QD) * BS)
                                                .quiet(),
                                        )
                                        .expect("source region"),
                                    );
                                    let id = drv.add_source(Arc::clone(&r)).expect("source");
                                    (r, id)
                                });
                                let at = usize::from(chunk) * BS;
                                mem.copy_in(at, &data[..n]);
                                let src = SrcRef {
                                    id: *id,
                                    offset: at as u64,
                                };
                                srv.resp_rdma_from(now, op, src, &mut drv)
                                    .expect("a READ with data, from a registered source");
                                continue;
                            }
                            drv.write_chunk(sess, chunk, 0, &data[..n]).unwrap();
                        }
                        Dir::Write => {
                            served.writes += 1;
                            let n = (data_len as usize).min(BS);
                            drv.read_chunk(sess, chunk, 0, &mut data[..n]).unwrap();
                            if data[..n]
                                .iter()
                                .enumerate()
                                .any(|(i, b)| *b != pattern(block, i))
                            {
                                served.bad_writes += 1;
                                status = -libc::EIO;
                            }
                        }
                    }
                }
                let _ = srv.resp_rdma(now, op, status, &mut drv);
            }
            work
        });
        let mut l = b.build().expect("loop config");
        l.run_detached(&StopToken::new());
        drop(l);
        Rc::try_unwrap(served)
            .expect("the loop is gone")
            .into_inner()
    });
    (h, rx)
}

/// A client session over the shm fabric, with a data region of one block per permit.
struct Client {
    clock: RealClock,
    drv: ClientDriver<Shm>,
    sess: ClientSession,
    data: Arc<Region>,
    region: u32,
    permits: Vec<Option<Permit>>,
    /// Block each permit's request names.
    blocks: Vec<u64>,
    dirs: Vec<Dir>,
    /// Lanes requests take in turn (one per IO connection).
    lanes: u16,
    idle: Idle,
    done: u64,
    failed: u64,
    bad_reads: u64,
    path_events: Vec<ClientEvent>,
}

impl Client {
    fn open(dir: &Path, addrs: &[SocketAddr], policy: MpPolicy) -> Self {
        match Self::try_open(dir, addrs, policy) {
            Ok(c) => c,
            Err(e) => panic!("open failed: {e:?}"),
        }
    }

    /// Opens a session; `Err` with the path error if the open fails.
    fn try_open(dir: &Path, addrs: &[SocketAddr], policy: MpPolicy) -> Result<Self, PathError> {
        Self::open_with(dir, addrs, policy, None, false, false, 1)
    }

    /// Opens a session with heartbeats every `hb` (default 5 s) and `io_connections` per
    /// path (requests spread over them by lane).
    fn open_with(
        dir: &Path,
        addrs: &[SocketAddr],
        policy: MpPolicy,
        hb: Option<Duration>,
        device_per_path: bool,
        per_io: bool,
        io_connections: u16,
    ) -> Result<Self, PathError> {
        let clock = RealClock::new();
        let mut drv = ClientDriver::<Shm>::new(
            dev(dir),
            ClientDriverConfig {
                max_queue_depth: QD,
                hdr_bytes: 512,
            },
        )
        .expect("driver");
        drv.set_per_io_registration(per_io);
        for a in addrs {
            if device_per_path {
                drv.add_route_via(*a, dev(dir));
            } else {
                drv.add_route(*a);
            }
        }
        let data = Arc::new(
            Region::new(
                &RegionConfig::new("rtrs-test-data", usize::from(QD) * BS)
                    .shareable(true)
                    .quiet(),
            )
            .expect("data region"),
        );
        let region = drv.add_region(Arc::clone(&data)).expect("register");
        // Every session of the process its own UUID and name (a server refuses a path name
        // another session uses).
        static SESSIONS: AtomicU64 = AtomicU64::new(1);
        let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
        let name = format!("rtrs-shm-test-{n}");
        let mut cfg = ClientConfig::new(name.as_bytes(), [n as u8; 16]).unwrap();
        cfg.policy = policy;
        cfg.io_connections = io_connections;
        cfg.reconnect_delay = Duration::from_millis(200);
        if let Some(hb) = hb {
            cfg.hb_interval = hb;
        }
        let mut sess = ClientSession::new(cfg).unwrap();
        let uuids: Vec<[u8; 16]> = (0..addrs.len())
            .map(|k| {
                let mut u = [n as u8; 16];
                u[0] = k as u8 + 1;
                u
            })
            .collect();
        sess.open(clock.now(), &uuids, &mut drv).expect("open");
        let mut c = Self {
            clock,
            drv,
            sess,
            data,
            region,
            permits: (0..QD).map(|_| None).collect(),
            blocks: vec![0; usize::from(QD)],
            dirs: vec![Dir::Read; usize::from(QD)],
            lanes: io_connections,
            idle: Idle(None),
            done: 0,
            failed: 0,
            bad_reads: 0,
            path_events: Vec::new(),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            assert!(std::time::Instant::now() < deadline, "session did not open");
            let now = c.clock.now();
            let w = c.drv.poll(now, &mut c.sess);
            let mut opened = false;
            while let Some(ev) = c.sess.poll_event() {
                match ev {
                    ClientEvent::Opened { queue_depth, .. } => {
                        assert_eq!(queue_depth, QD);
                        opened = true;
                    }
                    ClientEvent::OpenFailed { error, .. } => return Err(error),
                    e => c.path_events.push(e),
                }
            }
            if opened {
                return Ok(c);
            }
            c.idle.after(w);
        }
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Submits one request on a free permit, if any.
    fn submit(&mut self, dir: Dir, block: u64) -> bool {
        let Some(permits) = self.sess.permits().cloned() else {
            return false;
        };
        let lane = (block % u64::from(self.lanes)) as u16;
        let Some(p) = permits.get(ConType::Io, lane, Wait::NoWait) else {
            return false;
        };
        let id = p.id();
        let off = usize::from(id) * BS;
        if dir == Dir::Write {
            let buf: Vec<u8> = (0..BS).map(|i| pattern(block, i)).collect();
            self.data.copy_in(off, &buf);
        } else {
            self.data.copy_in(off, &[0u8; BS]);
        }
        let usr = block.to_le_bytes();
        let req = Request {
            dir,
            usr: &usr,
            data: Some(DataRef {
                region: self.region,
                offset: off as u64,
                len: BS as u32,
            }),
            ctx: block,
        };
        let now = self.now();
        match self.sess.request(now, &p, req, &mut self.drv) {
            Ok(()) => {
                self.blocks[usize::from(id)] = block;
                self.dirs[usize::from(id)] = dir;
                self.permits[usize::from(id)] = Some(p);
                true
            }
            Err(e) => {
                permits.put(p);
                panic!("request refused: {e:?}");
            }
        }
    }

    /// One poll turn; completions are checked and their permits put back.
    fn turn(&mut self) -> usize {
        let now = self.now();
        let mut w = self.drv.poll(now, &mut self.sess);
        while let Some(ev) = self.sess.poll_event() {
            w += 1;
            match ev {
                ClientEvent::Completed { id, ctx, result } => {
                    let i = usize::from(id);
                    assert_eq!(ctx, self.blocks[i], "completion for the wrong request");
                    match result {
                        Ok(()) => {
                            self.done += 1;
                            if self.dirs[i] == Dir::Read {
                                let mut got = vec![0u8; BS];
                                self.data.copy_out(i * BS, &mut got);
                                if got.iter().enumerate().any(|(k, b)| *b != pattern(ctx, k)) {
                                    self.bad_reads += 1;
                                }
                            }
                        }
                        Err(_) => self.failed += 1,
                    }
                    let p = self.permits[i].take().expect("a permit in flight");
                    self.sess.permits().unwrap().put(p);
                }
                e => self.path_events.push(e),
            }
        }
        self.idle.after(w);
        w
    }

    fn inflight(&self) -> usize {
        self.permits.iter().filter(|p| p.is_some()).count()
    }

    /// Keeps `depth` requests in flight until `n` completed (or `until` returns true).
    fn run(
        &mut self,
        n: u64,
        depth: usize,
        mut dir: impl FnMut(u64) -> Dir,
        mut hook: impl FnMut(&mut Self),
    ) {
        let start = self.done + self.failed;
        let mut block = 1000 * start;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.done + self.failed < start + n {
            assert!(
                std::time::Instant::now() < deadline,
                "IO stalled: {} done",
                self.done
            );
            while self.inflight() < depth
                && self.done + self.failed + (self.inflight() as u64) < start + n
            {
                block += 1;
                if !self.submit(dir(block), block) {
                    break;
                }
            }
            self.turn();
            hook(self);
        }
    }

    fn drain(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.inflight() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "requests never completed"
            );
            self.turn();
        }
    }

    fn close(mut self) {
        self.drain();
        let now = self.now();
        self.sess.close(now, &mut self.drv);
        while self.sess.poll_event().is_some() {}
    }

    /// Turns until `path` is up (a `PathUp` among the events since they were last cleared),
    /// at most `within`.
    fn wait_up(&mut self, path: PathId, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.path_up_count(path) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the path never came back: {:?}",
                self.path_events
            );
            self.turn();
        }
    }

    fn path_up_count(&self, path: PathId) -> usize {
        self.path_events
            .iter()
            .filter(|e| matches!(e, ClientEvent::PathUp { path: p } if *p == path))
            .count()
    }
}

#[test]
fn read_and_write_data_integrity_over_shm() {
    let d = dir("rw");
    let addrs = vec![addr(7101)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = server(d.clone(), addrs.clone(), Arc::clone(&stop));
    ready.recv().unwrap();
    let mut c = Client::open(&d, &addrs, MpPolicy::MinInflight);
    c.run(
        4000,
        usize::from(QD),
        |b| if b % 3 == 0 { Dir::Write } else { Dir::Read },
        |_| {},
    );
    c.drain();
    let (done, failed, bad) = (c.done, c.failed, c.bad_reads);
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert_eq!(failed, 0, "no request may fail");
    assert_eq!(bad, 0, "every READ returns the server's bytes");
    assert_eq!(served.bad_writes, 0, "every WRITE lands intact");
    assert_eq!(done, 4000);
    assert!(served.reads > 2000 && served.writes > 1000, "{served:?}");
    let _ = std::fs::remove_dir_all(d);
}

/// Per-IO registration, as Linux's client: every READ's buffer is a memory window bound
/// under a fresh key and invalidated before the request completes (the server answers the
/// `NEED_INVAL` read with SEND_WITH_INV). The data region has no remote right of its own,
/// so a READ whose window failed could not land: every READ checked, none failed.
#[test]
fn per_io_registration_reads_land_through_windows() {
    let d = dir("perio");
    let addrs = vec![addr(7111), addr(7112)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = server(d.clone(), addrs.clone(), Arc::clone(&stop));
    ready.recv().unwrap();
    let mut c =
        Client::open_with(&d, &addrs, MpPolicy::RoundRobin, None, false, true, 1).expect("open");
    c.run(
        4000,
        usize::from(QD),
        |b| if b % 4 == 0 { Dir::Write } else { Dir::Read },
        |_| {},
    );
    c.drain();
    let (done, failed, bad) = (c.done, c.failed, c.bad_reads);
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert_eq!((done, failed, bad), (4000, 0, 0));
    assert_eq!(served.bad_writes, 0);
    assert!(served.reads > 2500, "{served:?}");
    let _ = std::fs::remove_dir_all(d);
}

/// A server on `addrs` run as `serve` says (no tamper, no pause); returns once it listens,
/// with the flag that stops it.
fn serve_on(d: &Path, addrs: &[SocketAddr], serve: Serve) -> (JoinHandle<Served>, Arc<AtomicBool>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = any_server(
        d.to_path_buf(),
        addrs.to_vec(),
        Arc::clone(&stop),
        Tamper::default(),
        None,
        serve,
    );
    ready.recv().unwrap();
    (h, stop)
}

/// `always_invalidate` (Linux's default): each chunk is a memory window of its own, its key
/// invalidated when a request lands and the window bound again under the next key for the
/// answer, which tells the client (`rkey_rsp`). The chunks' region has no remote right of
/// its own, so a request into a chunk whose window were not bound could not land. Two IO
/// connections (a chunk bound on one is written through the other; the first binds ran on
/// connection 0), every chunk rotated over 300 times (past the 8-bit consumer key's wrap),
/// every byte checked.
#[test]
fn always_invalidate_rotates_every_chunk_key_over_shm() {
    let d = dir("aiv");
    let addrs = vec![addr(7121)];
    let serve = Serve {
        always_invalidate: true,
        ..Serve::default()
    };
    let (h, stop) = serve_on(&d, &addrs, serve);
    let mut c =
        Client::open_with(&d, &addrs, MpPolicy::MinInflight, None, false, false, 2).expect("open");
    let path = c.sess.paths().next().unwrap();
    let keys = |c: &Client| -> Vec<u32> {
        (0..QD)
            .map(|k| c.sess.debug_rbuf(path, k).expect("a chunk").1)
            .collect()
    };
    let first = keys(&c);
    let mut windows: Vec<u32> = first.iter().map(|k| k >> 8).collect();
    windows.sort_unstable();
    windows.dedup();
    assert_eq!(
        windows.len(),
        usize::from(QD),
        "a key of its own per chunk: {first:x?}"
    );
    let rw = |b: u64| {
        if b.is_multiple_of(3) {
            Dir::Write
        } else {
            Dir::Read
        }
    };
    // QD requests in flight use every chunk; 1000 turn each about 31 times, below the wrap.
    c.run(1000, usize::from(QD), rw, |_| {});
    c.drain();
    let after = keys(&c);
    for (k, (a, b)) in first.iter().zip(&after).enumerate() {
        assert_ne!(a, b, "chunk {k}: the client got a new key");
        assert_eq!(a >> 8, b >> 8, "chunk {k}: the same window");
    }
    c.run(9000, usize::from(QD), rw, |_| {});
    c.drain();
    let (done, failed, bad) = (c.done, c.failed, c.bad_reads);
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert_eq!((done, failed, bad), (10_000, 0, 0));
    assert_eq!(served.bad_writes, 0, "every WRITE lands intact");
    assert!(served.reads > 6000 && served.writes > 3000, "{served:?}");
    assert_eq!(served.violation_closes, 0);
    let _ = std::fs::remove_dir_all(d);
}

/// Writes 8 bytes to `addr` of `path`'s server under `key`, outside the protocol (a raw RDMA
/// WRITE on the path's IO connection): true if it went through, false if it failed (the
/// path went down).
fn probe(c: &mut Client, path: PathId, addr: u64, key: u32) -> bool {
    c.path_events.clear();
    let before = c.drv.debug_private_done(path);
    c.drv
        .debug_write(path, 1, RemoteAddr { addr, rkey: key }, 8)
        .expect("posted");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never completed"
        );
        c.turn();
        if c.drv.debug_private_done(path) > before {
            return true;
        }
        if c.path_events
            .iter()
            .any(|e| matches!(e, ClientEvent::PathDown { path: p, .. } if *p == path))
        {
            return false;
        }
    }
}

/// `always_invalidate`'s invalidation is real: a chunk's key works while the chunk is free
/// (the probe is sound), stops working once a request into the chunk has landed (the
/// server's LOCAL_INV, before the handler reads the chunk), and stays dead after the answer
/// (which rotated the key): a raw RDMA WRITE with it fails, and so does the path.
#[test]
fn always_invalidate_old_chunk_keys_stop_working() {
    static HOLD: Hold = Hold::new();
    let d = dir("aiv-stale");
    let addrs = vec![addr(7131)];
    let serve = Serve {
        always_invalidate: true,
        hold: Some(&HOLD),
        ..Serve::default()
    };
    let (h, stop) = serve_on(&d, &addrs, serve);
    let mut c = Client::open(&d, &addrs, MpPolicy::MinInflight);
    let path = c.sess.paths().next().unwrap();
    // One request at a time takes permit 0: chunk 0.
    let (at, k0) = c.sess.debug_rbuf(path, 0).unwrap();
    assert!(probe(&mut c, path, at, k0), "the key of a free chunk works");
    c.run(1, 1, |_| Dir::Read, |_| {});
    let (_, k1) = c.sess.debug_rbuf(path, 0).unwrap();
    assert_eq!(k1, inc_rkey(k0), "the answer brought the chunk's next key");
    assert!(probe(&mut c, path, at, k1), "the new key works");
    c.run(1, 1, |_| Dir::Write, |_| {});
    let (_, k2) = c.sess.debug_rbuf(path, 0).unwrap();
    assert_eq!(k2, inc_rkey(k1));
    assert!(
        !probe(&mut c, path, at, k1),
        "a chunk's key from before its last answer is dead"
    );
    // The path comes back with a table of its own; the same again, while the server holds
    // a request in the chunk.
    c.wait_up(path, Duration::from_secs(20));
    let (at, k0) = c.sess.debug_rbuf(path, 0).unwrap();
    assert!(probe(&mut c, path, at, k0), "the key of a free chunk works");
    HOLD.on.store(true, Ordering::Relaxed);
    assert!(c.submit(Dir::Read, 7));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while HOLD.held.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never landed"
        );
        c.turn();
    }
    assert!(
        !probe(&mut c, path, at, k0),
        "a chunk's key is dead while its request is handled"
    );
    HOLD.on.store(false, Ordering::Relaxed);
    c.drain();
    let failed = c.failed;
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert!(failed <= 1, "at most the held request fails: {failed}");
    assert_eq!(served.bad_writes, 0);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn two_paths_round_robin_share_the_load() {
    let d = dir("rr");
    let addrs = vec![addr(7201), addr(7202)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = server(d.clone(), addrs.clone(), Arc::clone(&stop));
    ready.recv().unwrap();
    let mut c = Client::open(&d, &addrs, MpPolicy::RoundRobin);
    c.run(2000, 16, |_| Dir::Read, |_| {});
    c.drain();
    let paths: Vec<PathId> = c.sess.paths().collect();
    assert_eq!(paths.len(), 2);
    let per: Vec<u64> = paths
        .iter()
        .map(|p| c.sess.path_stats(*p).unwrap().rdma.read_cnt)
        .collect();
    assert_eq!(c.failed + c.bad_reads, 0);
    c.close();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    assert!(
        per.iter().all(|&n| n > 500),
        "both paths carry requests: {per:?}"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn killed_path_fails_over_without_errors_and_reconnects() {
    fails_over_and_reconnects("kill", [7301, 7302], Serve::default(), PathKill::Disconnect);
}

/// The same kill made by moving the path's queue pairs to the error state (no CM event):
/// the flushed requests fail over, the path closes and reconnects.
#[test]
fn path_whose_queue_pairs_go_to_error_fails_over_and_reconnects() {
    fails_over_and_reconnects(
        "kill-qperr",
        [7321, 7322],
        Serve::default(),
        PathKill::QpError,
    );
}

/// Two paths, each on a device of its own on both sides (as over `rxe0` and `rxe1`): both
/// carry IO, and one fails over and reconnects on its device.
#[test]
fn paths_on_devices_of_their_own_fail_over_and_reconnect() {
    let serve = Serve {
        device_per_path: true,
        ..Serve::default()
    };
    fails_over_and_reconnects("kill-devs", [7331, 7332], serve, PathKill::QpError);
}

/// The same with READs answered from a source (zero copy): the source is registered on the
/// paths up at its first use and on the path that reconnects, and every byte is checked.
#[test]
fn reads_from_a_source_survive_a_path_kill_and_reconnect() {
    let zcopy = Serve {
        zcopy: true,
        ..Serve::default()
    };
    fails_over_and_reconnects("kill-zcopy", [7311, 7312], zcopy, PathKill::Disconnect);
}

fn fails_over_and_reconnects(name: &str, ports: [u16; 2], serve: Serve, how: PathKill) {
    let d = dir(name);
    let addrs = vec![addr(ports[0]), addr(ports[1])];
    let (h, stop) = serve_on(&d, &addrs, serve);
    let mut c = Client::open_with(
        &d,
        &addrs,
        MpPolicy::RoundRobin,
        None,
        serve.device_per_path,
        false,
        1,
    )
    .expect("open");
    let victim = c.sess.paths().next().unwrap();
    let killed = AtomicU64::new(0);
    c.run(
        3000,
        usize::from(QD),
        |_| Dir::Read,
        |c| {
            if c.done > 500 && killed.load(Ordering::Relaxed) == 0 {
                let n = c.drv.kill_path_by(victim, how);
                killed.store(n as u64, Ordering::Relaxed);
                // From here on, path events are the kill's.
                c.path_events.clear();
            }
        },
    );
    assert!(
        killed.load(Ordering::Relaxed) > 0,
        "the path was killed under load"
    );
    // The path reconnects (after the 200 ms delay and the 1 s backoff) and takes traffic.
    c.wait_up(victim, Duration::from_secs(10));
    let before = c.sess.path_stats(victim).unwrap().rdma.read_cnt;
    c.run(1000, usize::from(QD), |_| Dir::Read, |_| {});
    let after = c.sess.path_stats(victim).unwrap().rdma.read_cnt;
    c.drain();
    let (failed, bad, done) = (c.failed, c.bad_reads, c.done);
    let down = c
        .path_events
        .iter()
        .any(|e| matches!(e, ClientEvent::PathDown { path, .. } if *path == victim));
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert!(served.reads >= 4000, "every READ was answered: {served:?}");
    let devices = if serve.device_per_path { 0b11 } else { 0b1 };
    assert_eq!(served.devices, devices, "the devices the paths lived on");
    assert!(down, "the session saw the path go down");
    assert_eq!(failed, 0, "no request fails while another path lives");
    assert_eq!(bad, 0);
    assert_eq!(done, 4000);
    assert!(after > before, "the reconnected path takes traffic again");
    let _ = std::fs::remove_dir_all(d);
}

/// Halves every region of the chunk table: the chunks are no longer covered.
// The hook's signature lets a test add or drop entries too; this one only shortens them.
#[allow(clippy::ptr_arg)]
fn short_table(t: &mut Vec<dataplane::rtrs::wire::SgDesc>) {
    for d in t.iter_mut() {
        d.len /= 2;
    }
}

/// Points every IO response at a chunk far outside the queue depth.
fn stray_response(imm: u32) -> u32 {
    let i = Imm(imm);
    if i.ty() == ImmType::IoRsp {
        let r = IoRsp::decode(i.payload());
        IoRsp {
            msg_id: r.msg_id + 4 * u32::from(QD),
            errno: r.errno,
        }
        .imm(false)
        .0
    } else {
        imm
    }
}

#[test]
fn hostile_servers_cost_only_their_own_sessions() {
    let d = dir("hostile");
    let good = vec![addr(7401)];
    let bad_table = vec![addr(7402)];
    let bad_imm = vec![addr(7403)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h1, r1) = server(d.clone(), good.clone(), Arc::clone(&stop));
    let t = Tamper {
        table: Some(short_table),
        ..Tamper::default()
    };
    let (h2, r2) = lying_server(d.clone(), bad_table.clone(), Arc::clone(&stop), t);
    let t = Tamper {
        imm: Some(stray_response),
        ..Tamper::default()
    };
    let (h3, r3) = lying_server(d.clone(), bad_imm.clone(), Arc::clone(&stop), t);
    r1.recv().unwrap();
    r2.recv().unwrap();
    r3.recv().unwrap();

    let mut honest = Client::open(&d, &good, MpPolicy::MinInflight);
    honest.run(500, 8, |_| Dir::Read, |_| {});

    // A chunk table that does not cover the chunks: the open fails with a violation.
    match Client::try_open(&d, &bad_table, MpPolicy::MinInflight) {
        Err(PathError::Violation(v)) => eprintln!("bad chunk table refused: {v:?}"),
        Err(e) => panic!("bad chunk table: expected a violation, got {e:?}"),
        Ok(_) => panic!("a session opened over a chunk table that does not cover its chunks"),
    }

    // Responses naming chunks past the queue depth: the path is reset, its requests fail
    // (no other path), and nothing else is touched.
    let mut lied_to = Client::open(&d, &bad_imm, MpPolicy::MinInflight);
    let victim = lied_to.sess.paths().next().unwrap();
    for b in 1..=4 {
        assert!(lied_to.submit(Dir::Read, b));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lied_to.inflight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "requests never completed"
        );
        lied_to.turn();
        honest.turn();
    }
    let v = lied_to.sess.path_stats(victim).unwrap().last_violation;
    assert_eq!(
        v,
        Some(Violation::RspOutOfRange),
        "the path counted the stray response"
    );
    assert!(
        lied_to.path_events.iter().any(|e| matches!(
            e,
            ClientEvent::PathDown {
                error: PathError::Violation(_),
                ..
            }
        )),
        "the path went down for the violation: {:?}",
        lied_to.path_events
    );
    assert_eq!(lied_to.done, 0, "no stray response completes a request");

    // The honest session never noticed.
    honest.run(
        1500,
        usize::from(QD),
        |b| if b % 2 == 0 { Dir::Write } else { Dir::Read },
        |_| {},
    );
    honest.drain();
    assert_eq!(honest.failed, 0);
    assert_eq!(honest.bad_reads, 0);
    honest.close();
    lied_to.close();
    stop.store(true, Ordering::Relaxed);
    for h in [h1, h2, h3] {
        assert_eq!(h.join().unwrap().bad_writes, 0);
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn server_that_stops_polling_is_detected_by_heartbeats_then_path_reconnects() {
    let d = dir("hb");
    let addrs = vec![addr(7501)];
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicBool::new(false));
    let hb = Duration::from_millis(50);
    let (h, ready) = any_server(
        d.clone(),
        addrs.clone(),
        Arc::clone(&stop),
        Tamper::default(),
        Some((Arc::clone(&pause), hb)),
        Serve::default(),
    );
    ready.recv().unwrap();
    let mut c =
        Client::open_with(&d, &addrs, MpPolicy::MinInflight, Some(hb), false, false, 1).unwrap();
    c.run(200, 4, |_| Dir::Read, |_| {});
    c.drain();
    let path = c.sess.paths().next().unwrap();
    c.path_events.clear();
    pause.store(true, Ordering::Relaxed);
    let paused = std::time::Instant::now();
    // 5 missed heartbeats of 50 ms: the path is declared dead after 250 to 300 ms.
    let timed_out = |c: &Client| {
        c.path_events.iter().any(|e| {
            matches!(e, ClientEvent::PathDown { path: p, error: PathError::Heartbeat } if *p == path)
        })
    };
    while !timed_out(&c) {
        assert!(
            paused.elapsed() < Duration::from_secs(3),
            "a silent server was not detected: {:?}",
            c.path_events
        );
        c.turn();
    }
    let detected = paused.elapsed();
    assert!(
        detected >= Duration::from_millis(200),
        "declared dead too early: {detected:?}"
    );
    pause.store(false, Ordering::Relaxed);
    c.wait_up(path, Duration::from_secs(15));
    c.run(200, 4, |_| Dir::Read, |_| {});
    c.drain();
    assert_eq!(c.failed + c.bad_reads, 0);
    c.close();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = std::fs::remove_dir_all(d);
}

/// Long: both paths killed in turn, six times, each while the other carries the load.
#[test]
#[ignore = "long (about 10 s): run with --ignored"]
fn repeated_path_kills_under_load_lose_nothing() {
    let d = dir("kills");
    let addrs = vec![addr(7601), addr(7602)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = server(d.clone(), addrs.clone(), Arc::clone(&stop));
    ready.recv().unwrap();
    let mut c = Client::open(&d, &addrs, MpPolicy::MinInflight);
    let paths: Vec<PathId> = c.sess.paths().collect();
    for round in 0..6 {
        let victim = paths[round % 2];
        c.run(
            2000,
            usize::from(QD),
            |b| if b % 4 == 0 { Dir::Write } else { Dir::Read },
            |_| {},
        );
        c.path_events.clear();
        assert!(
            c.drv.kill_path(victim) > 0,
            "round {round}: the path was up"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while c.path_up_count(victim) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no reconnect"
            );
            c.run(64, usize::from(QD), |_| Dir::Read, |_| {});
        }
    }
    c.drain();
    let (failed, bad) = (c.failed, c.bad_reads);
    c.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert_eq!(failed, 0);
    assert_eq!(bad, 0);
    assert_eq!(served.bad_writes, 0);
    let _ = std::fs::remove_dir_all(d);
}

/// Points every IO request at a chunk past the queue depth.
fn stray_request(imm: u32) -> u32 {
    let i = Imm(imm);
    if i.ty() != ImmType::IoReq {
        return imm;
    }
    let g = Geometry::new(QD, 8192).unwrap();
    let off = i.payload() & ((1 << g.mem_bits()) - 1);
    Imm::io_req(((u32::from(QD) + 5) << g.mem_bits()) | off).0
}

#[test]
fn lying_client_costs_only_its_own_session() {
    let d = dir("liar");
    let addrs = vec![addr(7701)];
    let stop = Arc::new(AtomicBool::new(false));
    let (h, ready) = server(d.clone(), addrs.clone(), Arc::clone(&stop));
    ready.recv().unwrap();
    let mut honest = Client::open(&d, &addrs, MpPolicy::MinInflight);
    let mut liar = Client::open(&d, &addrs, MpPolicy::MinInflight);
    honest.run(300, 8, |_| Dir::Read, |_| {});
    liar.drv.set_tamper_imm(Some(stray_request));
    for b in 1..=4 {
        assert!(liar.submit(Dir::Write, b));
    }
    // The server closes the liar's path; the liar's requests fail (it has no other path).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while liar.inflight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the liar's requests never ended"
        );
        liar.turn();
        honest.turn();
    }
    assert_eq!(liar.done, 0, "no stray request was served");
    assert!(liar.failed > 0);
    honest.run(
        2000,
        usize::from(QD),
        |b| if b % 2 == 0 { Dir::Write } else { Dir::Read },
        |_| {},
    );
    honest.drain();
    assert_eq!(
        (honest.failed, honest.bad_reads),
        (0, 0),
        "the honest session never noticed"
    );
    honest.close();
    liar.close();
    stop.store(true, Ordering::Relaxed);
    let served = h.join().unwrap();
    assert!(
        served.violation_closes >= 1,
        "the server counted the violation: {served:?}"
    );
    assert_eq!(served.bad_writes, 0);
    let _ = std::fs::remove_dir_all(d);
}
