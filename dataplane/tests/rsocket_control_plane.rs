//! A context's control plane must not stall its data path.
//!
//! Connection management and memory registration block: the verbs provider resolves
//! addresses and routes inside `connect_prepared`, and the shm provider announces a newly
//! exported region to every connected peer of the protection domain and waits (up to 2 s
//! each) for their acknowledgement. These tests make the shm case happen on purpose: the
//! context connects to a helper process, which is then stopped (`SIGSTOP`) so it never
//! acknowledges; another thread of the same context then registers a fresh region with
//! remote rights (a connect whose buffers need a new arena region, or an `iomap`), which
//! blocks for the whole acknowledgement timeout. Meanwhile the main thread ping-pongs on
//! an established socket to a live echo peer, and every round trip must stay far below
//! the block.
//!
//! The bound is deliberately loose ([`MAX_RTT`], a quarter of the block): a stall shows up
//! as the whole block, while scheduling noise on a loaded two-core host stays well below
//! it. Latency goals live in `perf/`, not here.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{RsConfig, RsContext, RsListener, RsStream, SockOpt};
use mempool::memory::{Region, RegionConfig};

/// How long the shm provider waits for a peer's acknowledgement of a region announcement.
const BLOCK: Duration = Duration::from_secs(2);
/// Largest round trip tolerated on the live socket while the control plane is blocked.
const MAX_RTT: Duration = Duration::from_millis(500);
/// The blocked operation must take at least this long, or the scenario did not block and
/// the test proves nothing.
const MIN_BLOCK: Duration = Duration::from_millis(1500);
/// Bytes per ping.
const PING: usize = 64;

const ROLE: &str = "DP_RS_CP_CHILD";
const PORT: &str = "DP_RS_CP_PORT";

fn dir() -> PathBuf {
    std::env::var_os("DP_SHM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dp-rs-cp-{}", std::process::id())))
}

fn ctx() -> RsContext<Shm> {
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir()),
        bounce_bytes: 4096,
        ..ShmConfig::default()
    })
    .expect("shm device");
    RsContext::with_config(dev, RsConfig::default()).expect("context")
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 8, 1)), port)
}

/// In the helper process: listen on `$DP_RS_CP_PORT` (exposing iomap slots), accept one
/// connection and hold it until killed. Returns false in the test process itself.
fn run_as_stall_peer() -> bool {
    if std::env::var(ROLE).as_deref() != Ok("stall-peer") {
        return false;
    }
    let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
    let c = ctx();
    let l = RsListener::bind_with(&c, addr(port), &[SockOpt::IomapSize(4)]).unwrap();
    let (_s, _) = l.accept().unwrap();
    std::thread::sleep(Duration::from_secs(120));
    true
}

/// The helper process, killed (and reaped) on drop, even when the test fails.
struct StallPeer {
    child: Child,
}

impl StallPeer {
    /// Starts the helper for test `name`, listening on `port`.
    fn spawn(name: &str, port: u16) -> Self {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(ROLE, "stall-peer")
            .env(PORT, port.to_string())
            .env("DP_SHM_TEST_DIR", dir())
            .spawn()
            .unwrap();
        Self { child }
    }

    /// Stops the helper and waits until it is stopped: from now on it acknowledges nothing.
    fn stop(&self) {
        let pid = self.child.id() as libc::pid_t;
        let mut status = 0;
        #[allow(unsafe_code)]
        // SAFETY: kill and waitpid on our own child, with a valid status pointer.
        let stopped = unsafe {
            libc::kill(pid, libc::SIGSTOP) == 0
                && libc::waitpid(pid, &raw mut status, libc::WUNTRACED) == pid
        };
        assert!(
            stopped && libc::WIFSTOPPED(status),
            "stopping the helper process"
        );
    }
}

impl Drop for StallPeer {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to a helper that is still starting (refused until it listens).
fn connect_retrying(c: &RsContext<Shm>, to: SocketAddr) -> RsStream<Shm> {
    let t0 = Instant::now();
    loop {
        match RsStream::connect(c, to) {
            Ok(s) => return s,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "helper never listened"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connecting to the helper: {e}"),
        }
    }
}

/// An echo peer in its own context (so its lock is not the one under test).
fn echo_peer(port: u16) -> std::thread::JoinHandle<()> {
    let ec = ctx();
    let l = RsListener::bind(&ec, addr(port)).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; PING];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                return;
            }
        }
    })
}

/// Sets up the scenario on ports `port` (the helper) and `port + 1` (the echo peer), runs
/// `block` on another thread of the same context, and returns how long `block` took and
/// the largest round trip on the echo socket meanwhile.
fn stalled_control_plane(
    name: &str,
    port: u16,
    block: impl FnOnce(&RsContext<Shm>, &RsStream<Shm>) + Send + 'static,
) -> (Duration, Duration, usize) {
    let helper = StallPeer::spawn(name, port);
    let echo = echo_peer(port + 1);
    let c = ctx();
    let mut live = RsStream::connect(&c, addr(port + 1)).unwrap();
    let stalled = Arc::new(connect_retrying(&c, addr(port)));
    helper.stop();

    // Warm up, so the first measured round trip is not a cold one.
    let mut b = [0u8; PING];
    for i in 0..100u8 {
        b.fill(i);
        live.write_all(&b).unwrap();
        live.read_exact(&mut b).unwrap();
    }

    let (c2, s2) = (c.clone(), stalled.clone());
    let blocker = std::thread::spawn(move || {
        let t0 = Instant::now();
        block(&c2, &s2);
        t0.elapsed()
    });
    let mut max_rtt = Duration::ZERO;
    let mut trips = 0usize;
    while !blocker.is_finished() {
        b.fill(trips as u8);
        let t0 = Instant::now();
        live.write_all(&b).unwrap();
        live.read_exact(&mut b).unwrap();
        max_rtt = max_rtt.max(t0.elapsed());
        assert!(b.iter().all(|&x| x == trips as u8), "echo corrupted");
        trips += 1;
    }
    let blocked = blocker.join().unwrap();
    // The helper goes first, so closing its socket sees a hang-up instead of waiting for a
    // stopped peer.
    drop(helper);
    drop(stalled);
    drop(live);
    echo.join().unwrap();
    println!("{name}: blocked {blocked:?}; {trips} round trips meanwhile, the longest {max_rtt:?}");
    (blocked, max_rtt, trips)
}

fn check(blocked: Duration, max_rtt: Duration) {
    assert!(
        blocked >= MIN_BLOCK,
        "the control-plane operation took {blocked:?}: it was meant to block about {BLOCK:?} \
         on the stopped peer's acknowledgement (if the shm provider no longer waits for one, \
         this scenario needs another way to block)"
    );
    assert!(
        max_rtt < MAX_RTT,
        "a round trip on an established socket took {max_rtt:?} while another thread of the \
         context was blocked in the control plane for {blocked:?}"
    );
}

/// A connect whose buffers need a fresh arena region (its send buffer is larger than an
/// arena chunk) registers them with remote rights. Every stream socket has a protection
/// domain of its own, so that registration is announced to no other connection's peer: it
/// neither waits for the stopped helper (it used to, 2 s, with the context locked) nor
/// stalls the other sockets. Nothing listens at the destination, so the connect then fails.
#[test]
fn connect_waits_for_no_other_connections_peer() {
    const NAME: &str = "connect_waits_for_no_other_connections_peer";
    if run_as_stall_peer() {
        return;
    }
    let (blocked, max_rtt, _) = stalled_control_plane(NAME, 5400, |c, _| {
        let r = RsStream::connect_with(c, addr(5409), &[SockOpt::SndBuf(40 << 20)]);
        assert_eq!(
            r.expect_err("nothing listens there").kind(),
            ErrorKind::ConnectionRefused
        );
    });
    assert!(
        blocked < MIN_BLOCK,
        "the connect took {blocked:?}: its registration waited for the stopped peer of \
         another connection (sockets no longer have protection domains of their own?)"
    );
    assert!(
        max_rtt < MAX_RTT,
        "a round trip on an established socket took {max_rtt:?} during the connect"
    );
}

/// `riomap` of a fresh region registers it with remote write, which announces it to the
/// stopped helper (and to the echo peer) and waits for each.
#[test]
fn iomap_blocked_in_registration_leaves_other_sockets_streaming() {
    const NAME: &str = "iomap_blocked_in_registration_leaves_other_sockets_streaming";
    if run_as_stall_peer() {
        return;
    }
    let (blocked, max_rtt, _) = stalled_control_plane(NAME, 5410, |_, stalled| {
        let mem = Arc::new(
            Region::new(
                &RegionConfig::new("stall-iomap", 1 << 16)
                    .shareable(true)
                    .no_huge()
                    .quiet(),
            )
            .unwrap(),
        );
        stalled.iomap(&mem, 0, 4096, None).unwrap();
    });
    check(blocked, max_rtt);
}
