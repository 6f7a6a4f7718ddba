//! What a visit of an idle rsocket costs a loop that serves many: `count` connected stream
//! pairs on shm (each side its own context and device, as the two processes of
//! `dp-perf rstream --pair --sockets N`), then non-blocking receives on the client sockets
//! in turn, none of which has anything queued, so each visit finds a connection that is
//! cold in the caches. For callgrind with its cache model:
//!
//! ```text
//! cargo build --release -p dataplane --example rsocket_idle_visit_cost
//! valgrind --tool=callgrind --cache-sim=yes --fair-sched=yes --toggle-collect='*visits*' \
//!     target/release/examples/rsocket_idle_visit_cost 256 20
//! ```
//!
//! Only the visits are collected (`visits`: `rounds` passes over the `count` sockets), so
//! the totals divided by `count * rounds` are the instructions and first-level data misses
//! (`D1mr + D1mw`) of one visit. `--fair-sched=yes`: the shm CM's thread must get to run
//! while connecting.
//!
//! On main (b8a9d25), 256 sockets, 20 rounds: 342 instructions and 21.8 first-level data
//! misses per visit (111,629 over 5,120), every one of them a read. The shm completion
//! queue's cheap look (`may_have_work`) takes 13.6 of them, one line each: the completion
//! queue's own struct (three lines), its attach/detach flag, the producer side of its
//! send-completion ring and of its attention ring, the scan list, the queue pair's entry
//! in the slot table (two lines), the queue pair, the fault word and the state word of
//! its segment (each on a line of its own) and the next inbound slot. The rsocket layers
//! take the rest: the socket table entry and the stream state (`StreamConn::recv`,
//! `is_settled`), about two lines each. This is what `dp-perf rstream --sockets N` pays
//! on each background visit (`perf/src/rstream/background.rs`).
//!
//! Since the completion queue's look was slimmed (the queue's own flags on one
//! hot line that the rings' producers set, the scan list keeping each queue pair's segment
//! and next message number, the segment's state and fault words on its first line):
//! **315 instructions and 12.9 misses per visit** (66,395 over 5,120). `may_have_work` now
//! reads about five lines: the queue's first line, its hot line, the scan list, the
//! segment's first line and the next inbound slot. The rsocket layers' seven are the rest.
//! With the idle visit's fields of `StreamConn` on its first two lines: **10.9 misses per
//! visit** (55,657 over 5,120), the rsocket layers' part down to five (the socket slot,
//! the stream's phase, those two lines, the handle).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use dataplane::fabric::shm::Shm;
use dataplane::rsocket::{RecvFlags, RsError, RsListener, RsStream, SockOpt};

#[path = "common/rsocket.rs"]
mod rsocket;

/// Send and receive buffer of each socket (`dp-perf rstream --sockets`' default `-B`).
const BUF: u32 = 16 * 1024;

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args
        .next()
        .map_or(256, |s| s.parse().expect("a socket count"));
    let rounds: u32 = args
        .next()
        .map_or(20, |s| s.parse().expect("a round count"));
    let dir = std::env::temp_dir().join(format!("dp-rs-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("rendezvous directory");
    let (cs, cc) = (rsocket::context(&dir), rsocket::context(&dir));
    let at = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 84, 0, 1)), 7471);
    let opts = [SockOpt::SndBuf(BUF), SockOpt::RcvBuf(BUF)];
    let l = RsListener::bind_with(&cs, at, &opts).expect("listen");
    let mut clients = Vec::with_capacity(count);
    let mut servers = Vec::with_capacity(count);
    for _ in 0..count {
        let c = RsStream::connect_with(&cc, at, &opts).expect("connect");
        let (s, _) = l.accept().expect("accept");
        c.set_nonblocking(true).expect("non-blocking");
        clients.push(c);
        servers.push(s);
    }
    // One pass first: every socket's first receive (and anything the connection set-up
    // left to do) is not a visit of an idle socket.
    let idle = visits(&clients, 1);
    assert_eq!(idle, count as u64, "a socket had something queued");
    let idle = visits(&clients, rounds);
    println!(
        "{} visits of {count} idle sockets ({rounds} rounds), {idle} found nothing",
        count as u64 * u64::from(rounds)
    );
    drop((clients, servers, l, cs, cc));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rounds` passes of non-blocking receives over `socks`; returns how many found nothing.
#[inline(never)]
fn visits(socks: &[RsStream<Shm>], rounds: u32) -> u64 {
    let flags = RecvFlags {
        dontwait: true,
        waitall: false,
        peek: false,
    };
    let mut buf = [0u8; 64];
    let mut idle = 0;
    for _ in 0..rounds {
        for s in socks {
            match s.recv(&mut buf, flags) {
                Err(RsError::WouldBlock) => idle += 1,
                Ok(n) => panic!("an idle socket had {n} bytes"),
                Err(e) => panic!("recv: {e}"),
            }
        }
    }
    idle
}
