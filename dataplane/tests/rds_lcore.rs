//! RDS nodes on lcore poll loops: thousands of sockets served by one run-to-completion
//! loop per node (the node is the loop's poller, the application a closure around it),
//! and, in a child process under a seccomp trap filter, proof that the RDS data path
//! (socket calls, the node's loop, the fabric transport over shm) makes no system call.

#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::RdsNode;
use dataplane::rds::{
    RdsConfig, RdsEngine, RdsError, RdsSocket, Received, RecvFlags, SendFlags, TransportSpec,
};
use lcore::seccomp;
use lcore::time::{Clock, RealClock};
use lcore::{LoopBuilder, LoopConfig, PollMode, StopToken};

fn ip(net: u8, last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 81, net, last))
}

fn node(dir: &Path, addr: IpAddr, seed: u64, sockets: u32) -> RdsNode {
    let mut cfg = RdsConfig {
        name: format!("rds-lcore-{addr}"),
        transports: vec![TransportSpec::ib()],
        seed,
        max_sockets: sockets + 16,
        ..RdsConfig::default()
    };
    cfg.frags.count = 8192;
    let mut e = RdsEngine::new(cfg).expect("engine");
    e.add_local_addr(addr);
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .expect("shm device");
    let t = FabricTransport::<Shm>::new(dev, &e, FabricConfig::default()).expect("transport");
    let mut n = RdsNode::new(e);
    n.add_transport(Box::new(t)).expect("transport added");
    n
}

/// One side's application: `socks[k]` sends `per` sequence-numbered messages to
/// `dests[k]` and receives as many from its peer socket, checking their order.
struct App {
    socks: Vec<RdsSocket>,
    /// Socket slot index -> position in `socks`.
    by_index: Vec<usize>,
    dests: Vec<SocketAddr>,
    sent: Vec<u32>,
    got: Vec<u32>,
    per: u32,
    next: usize,
    done_sending: usize,
    received: u64,
    errors: u64,
    buf: Box<[u8; 4096]>,
}

impl App {
    fn new(n: &mut RdsNode, me: IpAddr, peer: IpAddr, count: u32, per: u32) -> Self {
        let mut socks = Vec::new();
        let mut dests = Vec::new();
        for k in 0..count {
            let e = n.engine_mut();
            let s = e.socket().expect("socket");
            e.bind(s, SocketAddr::new(me, 10_000 + k as u16))
                .expect("bind");
            socks.push(s);
            dests.push(SocketAddr::new(peer, 10_000 + k as u16));
        }
        let mut by_index = vec![usize::MAX; n.engine().config().max_sockets as usize];
        for (k, s) in socks.iter().enumerate() {
            by_index[s.index() as usize] = k;
        }
        Self {
            by_index,
            sent: vec![0; count as usize],
            got: vec![0; count as usize],
            socks,
            dests,
            per,
            next: 0,
            done_sending: 0,
            received: 0,
            errors: 0,
            buf: Box::new([0; 4096]),
        }
    }

    fn total(&self) -> u64 {
        self.socks.len() as u64 * u64::from(self.per)
    }

    fn finished(&self) -> bool {
        self.done_sending == self.socks.len() && self.received == self.total()
    }

    /// One iteration of the application on the node (after the node's own poll): drain
    /// the readable sockets the engine names, then send round robin until pushed back.
    fn step(&mut self, n: &mut RdsNode, now: lcore::time::Instant) -> usize {
        let mut work = 0;
        while let Some(ev) = n.engine_mut().poll_event() {
            if !ev.ready.readable() {
                continue;
            }
            let k = self.by_index[ev.sock.index() as usize];
            if k == usize::MAX {
                continue;
            }
            loop {
                match n.engine_mut().recv_from(
                    now,
                    self.socks[k],
                    &mut self.buf[..],
                    RecvFlags::DONTWAIT,
                ) {
                    Ok(Received::Data { len, .. }) => {
                        work += 1;
                        let seq = u32::from_le_bytes(self.buf[..4].try_into().expect("4"));
                        if len != 64 || seq != self.got[k] {
                            self.errors += 1;
                        }
                        self.got[k] = seq + 1;
                        self.received += 1;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        let mut msg = [0u8; 64];
        let mut tries = 0;
        while self.done_sending < self.socks.len() && tries < self.socks.len() {
            tries += 1;
            let k = self.next;
            self.next = (self.next + 1) % self.socks.len();
            if self.sent[k] == self.per {
                continue;
            }
            msg[..4].copy_from_slice(&self.sent[k].to_le_bytes());
            match n.engine_mut().send_to(
                now,
                self.socks[k],
                Some(self.dests[k]),
                &msg,
                SendFlags::DONTWAIT,
            ) {
                Ok(_) => {
                    work += 1;
                    self.sent[k] += 1;
                    if self.sent[k] == self.per {
                        self.done_sending += 1;
                    }
                }
                Err(RdsError::WouldBlock | RdsError::Congested { .. } | RdsError::NoMemory(_)) => {
                    break;
                }
                Err(_) => {
                    self.errors += 1;
                    break;
                }
            }
        }
        work + n.flush(now)
    }
}

#[test]
fn two_thousand_sockets_per_lcore_exchange_in_order() {
    const SOCKS: u32 = 2048;
    const PER: u32 = 20;
    let dir = std::env::temp_dir().join(format!("dp-rds-lcore-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stop = StopToken::new();
    let t0 = StdInstant::now();
    let run = |me: IpAddr, peer: IpAddr, seed: u64, dir: std::path::PathBuf, stop: StopToken| {
        std::thread::spawn(move || {
            let mut n = node(&dir, me, seed, SOCKS);
            let mut app = App::new(&mut n, me, peer, SOCKS, PER);
            let cfg = LoopConfig {
                name: format!("rds-{me}"),
                mode: PollMode::hybrid_default(),
                ..LoopConfig::default()
            };
            let mut b = LoopBuilder::<u64, RealClock>::new(cfg, RealClock::new());
            let deadline = StdInstant::now() + Duration::from_secs(60);
            let mut finished_at: Option<StdInstant> = None;
            b.poller("rds", move |ctx: &mut lcore::Ctx<'_, u64>| {
                let now = ctx.now();
                let work = lcore::Poller::<u64>::poll(&mut n, ctx) + app.step(&mut n, now);
                if app.finished() && finished_at.is_none() {
                    finished_at = Some(StdInstant::now());
                }
                // Keep serving the peer a little after finishing (its last acks).
                let linger = finished_at.is_some_and(|t| t.elapsed() > Duration::from_millis(300));
                if linger || StdInstant::now() > deadline {
                    RESULTS[usize::from(seed == 2)]
                        .store(app.received | (app.errors << 40), Ordering::Relaxed);
                    ctx.stop_local();
                }
                work
            });
            let mut lp = b.build().expect("loop");
            lp.run_detached(&stop)
        })
    };
    let a = run(ip(0, 1), ip(0, 2), 1, dir.clone(), stop.clone());
    let b = run(ip(0, 2), ip(0, 1), 2, dir.clone(), stop.clone());
    a.join().expect("lcore a");
    b.join().expect("lcore b");
    let _ = std::fs::remove_dir_all(&dir);
    for (side, r) in RESULTS.iter().enumerate() {
        let v = r.load(Ordering::Relaxed);
        let (received, errors) = (v & ((1 << 40) - 1), v >> 40);
        assert_eq!(
            errors, 0,
            "side {side}: messages out of order or failed sends"
        );
        assert_eq!(
            received,
            u64::from(SOCKS * PER),
            "side {side} received {received} of {} in {:?}",
            SOCKS * PER,
            t0.elapsed()
        );
    }
}

static RESULTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Messages each side sends (and receives) with the filter on.
const N: u32 = 50_000;

#[derive(Default)]
struct Shared {
    /// Per side: 1 warmed up, 2 finished (Release; the parent reads with Acquire).
    state: [AtomicU64; 2],
    received: [AtomicU64; 2],
    errors: [AtomicU64; 2],
    filter_failed: [AtomicU64; 2],
}

fn nosys_body() -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("dp-rds-nosys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sh = Arc::new(Shared::default());
    let mut handles = Vec::new();
    for me in 0..2usize {
        let sh = sh.clone();
        let dir = dir.clone();
        handles.push(std::thread::spawn(move || {
            let (mine, peer) = if me == 0 {
                (ip(1, 1), ip(1, 2))
            } else {
                (ip(1, 2), ip(1, 1))
            };
            let mut n = node(&dir, mine, me as u64 + 1, 64);
            let clock = RealClock::new();
            // Warm up unfiltered: connect, first touches, lazy initialisation.
            let mut app = App::new(&mut n, mine, peer, 4, 500);
            while !app.finished() {
                let now = clock.now();
                n.poll(now);
                app.step(&mut n, now);
            }
            sh.state[me].store(1, Ordering::Release);
            while sh.state[1 - me].load(Ordering::Acquire) < 1 {
                let now = clock.now();
                n.poll(now);
                app.step(&mut n, now);
            }
            // The measured run reuses the warmed sockets: N more messages each way.
            app.per += N / 4;
            app.done_sending = 0;
            if seccomp::install_trap_filter().is_err() {
                sh.filter_failed[me].store(1, Ordering::Relaxed);
            }
            while !app.finished() {
                let now = clock.now();
                n.poll(now);
                app.step(&mut n, now);
            }
            sh.received[me].store(app.received, Ordering::Relaxed);
            sh.errors[me].store(app.errors, Ordering::Relaxed);
            sh.state[me].store(2, Ordering::Release);
            // Keep serving the peer's last acks, never making a syscall again.
            loop {
                let now = clock.now();
                n.poll(now);
                app.step(&mut n, now);
                if sh.state[1 - me].load(Ordering::Acquire) >= 2 {
                    seccomp::park_forever();
                }
            }
        }));
    }
    let t0 = StdInstant::now();
    while (0..2).any(|i| sh.state[i].load(Ordering::Acquire) < 2) {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "timed out: states {} {}, received {} {}",
                sh.state[0].load(Ordering::Acquire),
                sh.state[1].load(Ordering::Acquire),
                sh.received[0].load(Ordering::Relaxed),
                sh.received[1].load(Ordering::Relaxed)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for me in 0..2 {
        if sh.filter_failed[me].load(Ordering::Relaxed) != 0 {
            return Err(format!("side {me}: installing the filter failed"));
        }
        if sh.errors[me].load(Ordering::Relaxed) != 0 {
            return Err(format!("side {me}: messages out of order or failed sends"));
        }
        let r = sh.received[me].load(Ordering::Relaxed);
        if r != u64::from(N + 2000) {
            return Err(format!("side {me} received {r} of {}", N + 2000));
        }
    }
    std::mem::forget(handles);
    Ok(format!(
        "{:.2}s; {N} messages each way under the filter",
        t0.elapsed().as_secs_f64()
    ))
}

#[test]
fn rds_data_path_makes_no_syscalls() {
    let report = seccomp::run_in_child("rds_data_path_makes_no_syscalls", nosys_body)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("child: {}", report.message);
    report.assert_ok_without_syscalls();
}
