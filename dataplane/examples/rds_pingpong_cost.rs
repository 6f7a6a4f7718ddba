//! The instruction cost of one RDS ping/pong round trip over the fabric transport on shm,
//! for callgrind: both nodes of `dp-perf rds-ping --pair` (the same engine and fabric
//! configuration: eight sockets bound to port 0 ping the peer's port 0 round robin, and
//! the peer's engine answers each with a pong) driven from one thread on a virtual clock,
//! so two runs of the same count execute the same instructions.
//!
//! ```text
//! cargo build --release -p dataplane --example rds_pingpong_cost
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*steady*' \
//!     target/release/examples/rds_pingpong_cost 100000
//! ```
//!
//! Only the measured run is collected (`steady`: 100,000 round trips after a warm-up of
//! 2,000 that brings the connection up), so its total over 100,000 is the cost of one
//! round trip on both sides. A round trip is what `dp-perf rds-ping` does: the pinging
//! side sends a 0-byte message and flushes; then turns (the answering side polls, the
//! pinging side polls and tries to receive) until the pong is there. `--fair-sched=yes`:
//! the shm CM's thread must get to run while the driver spins, or the connection never
//! comes up.
//!
//! Measured on branch w-rdsrtt (both nodes, instructions per round trip; 2.15 frames
//! sent per round trip: ping, pong and 0.15 ACK-only or credit frames):
//!
//! ```text
//! main (f9151a1)                                       10,627
//! engine timer kept when the deadline moves out         10,222
//! repost below the credit threshold: no after_path      10,039
//! a pong's path touched once                             9,970   (-6.2%)
//! ```
//!
//! On branch w-rdscost (post lists, see `rds_oneway_cost`): main (caef63e) 10,093, the
//! branch 10,309 (+2.1%). A ping or pong is a list of one, posted from `transmit`; what
//! it pays is the staging checks and the `may_transmit` / `flush_transmit` plumbing.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsError, RdsSocket, Received, RecvFlags, SendFlags, TransportKind};
use lcore::time::Instant;

mod common;

/// Sockets of the pinging side (`dp-perf rds-ping`'s eight).
const SOCKETS: usize = 8;
/// `dp-perf rds-ping`'s message memory (`node(.., 4096, 64)`).
const FRAGS: u32 = 4096;

fn main() {
    let count: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a round trip count"));
    let dir = std::env::temp_dir().join(format!("dp-rds-ppcost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("rendezvous directory");
    let (ia, ib) = (
        IpAddr::V4(Ipv4Addr::new(10, 82, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 82, 0, 2)),
    );
    let mut a = common::node(&dir, ia, 1, FRAGS, 64);
    let mut b = common::node(&dir, ib, 2, FRAGS, 64);
    let t = 1_000_000u64;
    let now = Instant::from_nanos(t);
    let mut socks = Vec::with_capacity(SOCKETS);
    for _ in 0..SOCKETS {
        let e = a.engine_mut();
        let s = e.socket().expect("socket");
        e.set_transport(now, s, TransportKind::Ib.value())
            .expect("SO_RDS_TRANSPORT");
        e.bind(s, SocketAddr::new(ia, 0)).expect("bind");
        socks.push(s);
    }
    let mut st = State {
        done: 0,
        turns: 0,
        t,
        t0: t,
        warm: true,
    };
    let to = SocketAddr::new(ib, 0);
    drive(&mut a, &mut b, &socks, to, &mut st, WARMUP);
    st.warm = false;
    let turns0 = st.turns;
    steady(&mut a, &mut b, &socks, to, &mut st, WARMUP + count);
    println!(
        "{count} round trips in {} turns after a warm-up of {WARMUP}",
        st.turns - turns0
    );
    let resets = a.engine().stats().conn_reset + b.engine().stats().conn_reset;
    assert_eq!(resets, 0, "no connection was reset");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Round trips before the measured run.
const WARMUP: u64 = 2_000;

/// The driver's counters and virtual clock.
struct State {
    /// Round trips done.
    done: u64,
    /// Turns (one poll of each node) so far.
    turns: u64,
    t: u64,
    /// `t` when the warm-up started.
    t0: u64,
    /// Warming up (the clock keeps up with real time).
    warm: bool,
}

/// The measured run: [`drive`] to `until` round trips, in a function of its own so that
/// callgrind can collect it alone.
#[inline(never)]
fn steady(
    a: &mut RdsNode,
    b: &mut RdsNode,
    socks: &[RdsSocket],
    to: SocketAddr,
    st: &mut State,
    until: u64,
) {
    drive(a, b, socks, to, st, until);
}

/// Round trips until `until` are done: a pings from its next socket, then turns of both
/// nodes until the pong is back.
#[inline(never)]
fn drive(
    a: &mut RdsNode,
    b: &mut RdsNode,
    socks: &[RdsSocket],
    to: SocketAddr,
    st: &mut State,
    until: u64,
) {
    let warm = st.warm;
    let mut buf = [0u8; 64];
    let real = std::time::Instant::now();
    while st.done < until {
        let s = socks[st.done as usize % socks.len()];
        let t0 = st.t;
        let now = Instant::from_nanos(st.t);
        a.engine_mut()
            .send_to(now, s, Some(to), &[], SendFlags::DONTWAIT)
            .expect("ping sent");
        a.flush(now);
        loop {
            st.turns += 1;
            // 100 ns of virtual time per turn. While warming up the clock never runs
            // behind real time: the CM's handshake takes real time (more under
            // valgrind), and the connect timer must not fire before it had that.
            st.t += 100;
            if warm {
                st.t = st.t.max(st.t0 + real.elapsed().as_nanos() as u64);
            }
            let now = Instant::from_nanos(st.t);
            b.poll(now);
            while b.engine_mut().poll_event().is_some() {}
            a.poll(now);
            let got = match a
                .engine_mut()
                .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
            {
                Ok(Received::Data { from, len, .. }) => {
                    assert_eq!((from, len), (to, 0), "round trip {}: the pong", st.done);
                    true
                }
                Ok(_) | Err(RdsError::WouldBlock) => false,
                Err(e) => panic!("recv_from: {e}"),
            };
            while a.engine_mut().poll_event().is_some() {}
            if got {
                break;
            }
            assert!(
                st.t - t0 < 10_000_000_000,
                "no pong for round trip {} after {} ns",
                st.done,
                st.t - t0
            );
        }
        st.done += 1;
    }
}
