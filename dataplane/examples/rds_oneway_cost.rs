//! The instruction cost of one-way RDS messages over the fabric transport on shm, for
//! callgrind: both nodes of `dp-perf rds-stress --pair -q 64 -o -d 256` (the same engine
//! and fabric configuration) driven from one thread on a virtual clock, so two runs of
//! the same count execute the same instructions.
//!
//! ```text
//! cargo build --release -p dataplane --example rds_oneway_cost
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*steady*' \
//!     target/release/examples/rds_oneway_cost 100000 [BURST]
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*idle*' \
//!     target/release/examples/rds_oneway_cost 100000
//! ```
//!
//! The first collects only the measured run (`steady`: 100,000 messages after a warm-up
//! of 20,000 that brings the connection up), so its total over 100,000 is the cost per
//! message of both sides; the second only the 10,000 idle turns after it (both nodes
//! polling empty queues), the cost of a turn that finds nothing. `BURST` caps the sends
//! per turn of the measured run (a receiver that keeps up sees a few frames per turn). `--fair-sched=yes`: the
//! shm CM's thread must get to run while the driver spins, or the connection never comes
//! up. Each turn of the measured run is one turn of each side: the sender polls, sends
//! until the socket pushes back and flushes; the receiver polls, receives everything and
//! flushes.
//!
//! Measured on branch w-rds64 (both nodes, instructions per message / per idle turn):
//!
//! ```text
//!                       main (af72038)   w-rds64
//! unlimited burst            5,800        4,888   (-15.7%)
//! burst 4                    6,549        5,513   (-15.8%)
//! idle turn                  1,438          656   (-54%)
//! ```
//!
//! Measured on branch w-rdscost (post lists: the frames of a turn in one `post_send`, one
//! doorbell ring and one or two signalled completions per list):
//!
//! ```text
//!                       main (caef63e)   w-rdscost
//! unlimited burst            4,964        4,762   (-4.1%; 391 turns, not 3,125)
//! burst 32                   4,940        4,902   (-0.8%)
//! burst 4                    5,541        5,614   (+1.3%)
//! idle turn                    692          699
//! ```
//!
//! With an unlimited burst the sender now fills its socket (256 messages a turn, where
//! main stopped at 32), so part of that cut is fixed per-turn costs spread wider. What
//! the lists save is mostly not instructions: per 32 frames, one locked RMW on the
//! peer's doorbell line instead of 32, and 2 send completions instead of 32.
//!
//! The same code built with the bench profile (fat LTO, one codegen unit) runs 4,320
//! per message at 4,937 for the release profile: cross-crate inlining is worth ~12%.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsError, RdsSocket, Received, RecvFlags, SendFlags};
use lcore::time::Instant;

mod common;

/// Message size (`-q 64`).
const REQ: usize = 64;
/// `-d 256`, one task: the socket buffers rds-stress sizes, tasks x depth x (req + ack) x 2.
const BUF_BYTES: u32 = 256 * (64 + 60) * 2;
/// `frags_for(64, 256)` of dp-perf.
const FRAGS: u32 = 256 * 4 + 8192;

fn main() {
    let count: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a message count"));
    // At most this many sends per turn of the measured run (default: until the socket
    // pushes back): a small burst stands for a receiver that keeps up, so that each of
    // its turns finds a few frames and the turn's fixed costs count per message.
    let burst: u64 = std::env::args()
        .nth(2)
        .map_or(u64::MAX, |s| s.parse().expect("a burst size"));
    let dir = std::env::temp_dir().join(format!("dp-rds-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("rendezvous directory");
    let (ia, ib) = (
        IpAddr::V4(Ipv4Addr::new(10, 81, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 81, 0, 2)),
    );
    let mut a = common::node(&dir, ia, 1, FRAGS, 16);
    let mut b = common::node(&dir, ib, 2, FRAGS, 16);
    let t = 1_000_000u64;
    let now = Instant::from_nanos(t);
    let sa = a.engine_mut().socket().expect("socket");
    a.engine_mut()
        .bind(sa, SocketAddr::new(ia, 4001))
        .expect("bind");
    let to = SocketAddr::new(ib, 4001);
    let sb = b.engine_mut().socket().expect("socket");
    b.engine_mut().bind(sb, to).expect("bind");
    for (n, s) in [(&mut a, sa), (&mut b, sb)] {
        let e = n.engine_mut();
        e.set_sndbuf(now, s, BUF_BYTES).expect("sndbuf");
        e.set_rcvbuf(now, s, BUF_BYTES).expect("rcvbuf");
    }
    let mut st = State {
        sent: 0,
        got: 0,
        iters: 0,
        t,
        t0: t,
        burst: u64::MAX,
        warm: true,
    };
    // Warm-up: the connection comes up (its turns depend on the CM's timing) and the
    // rings fill; then the measured run, alone in `steady` (callgrind --toggle-collect).
    drive(&mut a, &mut b, sa, sb, to, &mut st, WARMUP);
    st.warm = false;
    let iters0 = st.iters;
    st.burst = burst;
    steady(&mut a, &mut b, sa, sb, to, &mut st, WARMUP + count);
    println!(
        "{count} messages in {} turns after a warm-up of {WARMUP}",
        st.iters - iters0
    );
    // Idle turns (nothing sent): what a node spinning on empty queues pays per turn
    // (callgrind --toggle-collect='*idle*').
    idle(&mut a, &mut b, &mut st, IDLE_TURNS);
    let resets = a.engine().stats().conn_reset + b.engine().stats().conn_reset;
    assert_eq!(resets, 0, "no connection was reset");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Turns of both nodes with nothing sent, after the measured run.
const IDLE_TURNS: u64 = 10_000;

/// Messages sent before the measured run.
const WARMUP: u64 = 20_000;

/// The driver's counters and virtual clock.
struct State {
    sent: u64,
    got: u64,
    iters: u64,
    t: u64,
    /// `t` when the warm-up started.
    t0: u64,
    /// Sends per turn at most.
    burst: u64,
    /// Warming up (the clock keeps up with real time).
    warm: bool,
}

/// The measured run: [`drive`] to `until` messages, in a function of its own so that
/// callgrind can collect it alone.
#[inline(never)]
fn steady(
    a: &mut RdsNode,
    b: &mut RdsNode,
    sa: RdsSocket,
    sb: RdsSocket,
    to: SocketAddr,
    st: &mut State,
    until: u64,
) {
    drive(a, b, sa, sb, to, st, until);
}

/// Turns of both nodes until `until` messages arrived.
#[inline(never)]
fn drive(
    a: &mut RdsNode,
    b: &mut RdsNode,
    sa: RdsSocket,
    sb: RdsSocket,
    to: SocketAddr,
    st: &mut State,
    until: u64,
) {
    let warm = st.warm;
    let msg = [0xa5u8; REQ];
    let mut buf = [0u8; 9000];
    let limit = st.iters + 100 * until + 1_000_000;
    let real = std::time::Instant::now();
    while st.got < until {
        st.iters += 1;
        // 100 ns of virtual time per turn: timers fire as they would at ~10 M turns/s.
        // While warming up the clock never runs behind real time: the CM's handshake
        // takes real time (more under valgrind), and the connect timer must not fire
        // before it had that.
        st.t += 100;
        if warm {
            st.t = st.t.max(st.t0 + real.elapsed().as_nanos() as u64);
        }
        let now = Instant::from_nanos(st.t);
        a.poll(now);
        while a.engine_mut().poll_event().is_some() {}
        let stop = st.sent.saturating_add(st.burst).min(until);
        while st.sent < stop {
            match a
                .engine_mut()
                .send_to(now, sa, Some(to), &msg, SendFlags::DONTWAIT)
            {
                Ok(_) => st.sent += 1,
                Err(RdsError::WouldBlock | RdsError::Congested { .. } | RdsError::NoMemory(_)) => {
                    break;
                }
                Err(e) => panic!("send_to: {e}"),
            }
        }
        a.flush(now);
        b.poll(now);
        while b.engine_mut().poll_event().is_some() {}
        loop {
            match b
                .engine_mut()
                .recv_from(now, sb, &mut buf, RecvFlags::DONTWAIT)
            {
                Ok(Received::Data { len, .. }) => {
                    assert_eq!(len, REQ, "message {}: length", st.got);
                    st.got += 1;
                }
                Ok(_) => {}
                Err(RdsError::WouldBlock) => break,
                Err(e) => panic!("recv_from: {e}"),
            }
        }
        b.flush(now);
        if !(st.iters < limit || (warm && real.elapsed().as_secs() < 30)) {
            for (name, n) in [("sender", &mut *a), ("receiver", &mut *b)] {
                let c: Vec<_> = n.engine().stats().iter().filter(|&(_, v)| v > 0).collect();
                eprintln!("{name}: {c:?}");
            }
        }
        assert!(
            st.iters < limit || (warm && real.elapsed().as_secs() < 30),
            "no progress: {} of {until} after {} turns",
            st.got,
            st.iters
        );
    }
}

/// `turns` turns of both nodes with nothing to send (each polls, finds nothing, flushes).
#[inline(never)]
fn idle(a: &mut RdsNode, b: &mut RdsNode, st: &mut State, turns: u64) {
    for _ in 0..turns {
        st.t += 100;
        let now = Instant::from_nanos(st.t);
        for n in [&mut *a, &mut *b] {
            n.poll(now);
            while n.engine_mut().poll_event().is_some() {}
            n.flush(now);
        }
    }
}
