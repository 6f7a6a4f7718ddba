//! The instruction cost of one 64-byte rsocket stream round trip on shm, for callgrind: the
//! exchange of `dp-perf rstream --pair -S 64 -C 1` (each side writes 64 bytes and reads the
//! peer's 64), both sides driven from one thread with non-blocking calls, so two runs of the
//! same count execute the same instructions.
//!
//! ```text
//! cargo build --release -p dataplane --example rsocket_pingpong_cost
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='*steady*' \
//!     target/release/examples/rsocket_pingpong_cost 100000
//! ```
//!
//! Only the measured run is collected (`steady`: the count's round trips after a warm-up of
//! 2,000), so its total divided by the count is the cost of one round trip, both sides, with
//! every receive attempt that found nothing (one thread: each side's first attempt after the
//! peer's send finds the message, since shm does the send's work when it is posted). Each
//! side has its own context and device, as the two processes of `dp-perf rstream --pair`,
//! with its options: 512 KiB buffers both ways, `TCP_NODELAY`, the library's inline size.
//! `--fair-sched=yes`: the shm CM's thread must get to run while connecting.
//!
//! On main (b03cd9f), 20,000 round trips: 3,944 instructions per round trip, every attempt
//! finding its message. Per round trip (two sends, two receives): the shm `post_send`s 1,014
//! (its `exec` 475, the completion `report` 173, key lookup `remote` 170), the completion
//! queue polls 861 (of which `drain_recv` 527), the rsocket layers above them the rest, and
//! the receive reposts 223. With every attempt finding its message, the reposts run in
//! batches (`REPOST_BATCH`) on the data path; in `dp-perf rstream` they run while a side
//! waits for the answer, off the path a reply waits for.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use dataplane::fabric::shm::Shm;
use dataplane::rsocket::{RecvFlags, RsError, RsListener, RsStream, SendFlagsRs, SockOpt};

#[path = "common/rsocket.rs"]
mod rsocket;

/// Round trips before the measured run.
const WARMUP: u64 = 2_000;
/// Bytes each way per round trip.
const SIZE: usize = 64;
/// Send and receive buffer of each socket (`dp-perf rstream`'s default `-B`).
const BUF: u32 = 512 * 1024;

fn main() {
    let count: u64 = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().expect("a round trip count"));
    let dir = std::env::temp_dir().join(format!("dp-rs-ppcost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("rendezvous directory");
    let (cs, cc) = (rsocket::context(&dir), rsocket::context(&dir));
    let at = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 83, 0, 1)), 7471);
    let opts = [
        SockOpt::SndBuf(BUF),
        SockOpt::RcvBuf(BUF),
        SockOpt::NoDelay(true),
    ];
    let l = RsListener::bind_with(&cs, at, &opts[..2]).expect("listen");
    let client = RsStream::connect_with(&cc, at, &opts).expect("connect");
    let (server, _) = l.accept().expect("accept");
    server
        .set_option(SockOpt::NoDelay(true))
        .expect("TCP_NODELAY");
    client.set_nonblocking(true).expect("non-blocking");
    server.set_nonblocking(true).expect("non-blocking");
    let mut st = State::default();
    drive(&client, &server, &mut st, WARMUP);
    let misses0 = st.misses;
    steady(&client, &server, &mut st, WARMUP + count);
    println!(
        "{count} round trips of {SIZE} bytes after a warm-up of {WARMUP}; {} receive attempts \
         found nothing",
        st.misses - misses0
    );
    drop((client, server, l, cs, cc));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The driver's counters.
#[derive(Default)]
struct State {
    /// Round trips done.
    done: u64,
    /// Receive attempts that found nothing.
    misses: u64,
}

/// The measured run: [`drive`] to `until` round trips, in a function of its own so that
/// callgrind can collect it alone.
#[inline(never)]
fn steady(c: &RsStream<Shm>, s: &RsStream<Shm>, st: &mut State, until: u64) {
    drive(c, s, st, until);
}

/// Round trips until `until` are done: the client writes, the server reads it all and
/// writes back, the client reads it all. Every byte is checked.
#[inline(never)]
fn drive(c: &RsStream<Shm>, s: &RsStream<Shm>, st: &mut State, until: u64) {
    let mut out = [0u8; SIZE];
    let mut got = [0u8; SIZE];
    while st.done < until {
        out[0] = st.done as u8;
        out[SIZE - 1] = !(st.done as u8);
        send(c, &out);
        recv(s, &mut got, st);
        assert_eq!(
            got, out,
            "round trip {}: the server read other bytes",
            st.done
        );
        send(s, &got);
        recv(c, &mut got, st);
        assert_eq!(
            got, out,
            "round trip {}: the client read other bytes",
            st.done
        );
        st.done += 1;
    }
}

fn send(sock: &RsStream<Shm>, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        match sock.send(&data[off..], SendFlagsRs { dontwait: true }) {
            Ok(n) => off += n,
            Err(RsError::WouldBlock) => {}
            Err(e) => panic!("send: {e}"),
        }
    }
}

fn recv(sock: &RsStream<Shm>, buf: &mut [u8], st: &mut State) {
    let flags = RecvFlags {
        dontwait: true,
        waitall: false,
        peek: false,
    };
    let mut off = 0;
    while off < buf.len() {
        match sock.recv(&mut buf[off..], flags) {
            Ok(0) => panic!("end of stream"),
            Ok(n) => off += n,
            Err(RsError::WouldBlock) => st.misses += 1,
            Err(e) => panic!("recv: {e}"),
        }
    }
}
