//! RDS over TCP between two user-space nodes over loopback (this host's kernel has no
//! RDS): sizes 0 B..1 MiB, the connect rule, a connection killed under traffic, a stalled
//! receiver, and hostile byte streams. Every node listens on its own 127.0.x.y address,
//! on a port derived from the process id (tests of other checkouts may run at once).
//!
//! The nodes run single-path, except the multipath kill test, which always runs 8 paths;
//! `RDS_TCP_MP=1` runs every test with 8 paths (0 failures in 150 runs of the binary, and
//! 300 of the kill tests; see `dp_rds::tcp` for the rule they check: a connection is
//! closed only once read to its end). The 16-kill test passed 3,920 runs in a loop after
//! the two park rules its failures led to (see `dp_rds::tcp`).

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant as StdInstant};

use common::{engine_cfg, payload};
use dp_rds::node::{BlockingNode, RdsNode};
use dp_rds::tcp::{TcpConfig, TcpTransport};
use dp_rds::uapi::RDS_TRANS_TCP;
use dp_rds::{RdsEngine, RdsError, RdsSocket, Received, SendFlags, TransportKind, TransportSpec};
use lcore::PollMode;

const T: Option<Duration> = Some(Duration::from_secs(20));

fn port() -> u16 {
    20000 + (std::process::id() % 10000) as u16
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node(name: &str, seed: u64, addr: &str) -> BlockingNode {
    node_with(name, seed, addr, std::env::var("RDS_TCP_MP").is_ok())
}

fn node_with(name: &str, seed: u64, addr: &str, multipath: bool) -> BlockingNode {
    let spec = TransportSpec {
        multipath,
        ..TransportSpec::tcp()
    };
    node_spec(name, seed, addr, spec)
}

fn node_spec(name: &str, seed: u64, addr: &str, spec: TransportSpec) -> BlockingNode {
    let engine = RdsEngine::new(engine_cfg(name, seed, spec)).unwrap();
    let mut n = RdsNode::new(engine);
    n.add_transport(Box::new(TcpTransport::new(TcpConfig::with_port(port()))))
        .unwrap();
    n.add_local_addr(ip(addr)).unwrap();
    BlockingNode::spawn(n, PollMode::hybrid_default(), name).unwrap()
}

/// An RDS-TCP socket bound to `addr:rds_port`.
fn tcp_sock(e: &mut RdsEngine, now: lcore::time::Instant, addr: &str, rds_port: u16) -> RdsSocket {
    let s = e.socket().unwrap();
    e.set_transport(now, s, RDS_TRANS_TCP).unwrap();
    e.bind(s, SocketAddr::new(ip(addr), rds_port)).unwrap();
    s
}

fn sock(n: &BlockingNode, addr: &str, rds_port: u16, rcvbuf: u32) -> RdsSocket {
    n.with(|n, now| {
        let e = n.engine_mut();
        let s = tcp_sock(e, now, addr, rds_port);
        e.set_sndbuf(now, s, 4 << 20).unwrap();
        e.set_rcvbuf(now, s, rcvbuf).unwrap();
        s
    })
}

fn stat(n: &BlockingNode, name: &str) -> u64 {
    n.with(|n, _| n.engine().stats().get(name).unwrap())
}

/// Every counter of a node's TCP transport.
fn tcp_counters(n: &mut RdsNode) -> Vec<(&'static str, u64)> {
    let mut v = Vec::new();
    n.transport_mut(TransportKind::Tcp)
        .unwrap()
        .counters(&mut |k, x| v.push((k, x)));
    v
}

/// One counter of a node's TCP transport.
fn tcp_count(n: &mut RdsNode, name: &str) -> u64 {
    let v = tcp_counters(n);
    v.iter().find(|(k, _)| *k == name).unwrap().1
}

fn tcp_counter(n: &BlockingNode, name: &str) -> u64 {
    n.with(|n, _| tcp_count(n, name))
}

/// (our address, peer address) of every live TCP connection of a node.
fn conns(n: &BlockingNode) -> Vec<(SocketAddr, SocketAddr)> {
    n.with(|n, _| {
        let t = n.transport_mut(TransportKind::Tcp).unwrap();
        let t = t.as_any().unwrap().downcast_ref::<TcpTransport>().unwrap();
        t.connections().map(|(_, l, p)| (l, p)).collect()
    })
}

/// Receives `count` messages on `s`, checking order and bytes against `expect(i)`.
fn recv_all(n: &BlockingNode, s: RdsSocket, count: u64, expect: impl Fn(u64) -> Vec<u8>) {
    let mut buf = vec![0u8; (1 << 20) + 16];
    for i in 0..count {
        match n.recv_from(s, &mut buf, T) {
            Ok(Received::Data { len, .. }) => {
                let want = expect(i);
                if len != want.len() || buf[..len] != want[..] {
                    let mut v = n.with(|n, _| {
                        n.engine()
                            .stats()
                            .iter()
                            .filter(|s| s.1 != 0)
                            .collect::<Vec<_>>()
                    });
                    v.extend(n.with(|n, _| tcp_counters(n)));
                    let got =
                        (i.saturating_sub(500)..i + 500).find(|&j| expect(j)[..] == buf[..len]);
                    eprintln!("MISMATCH at {i}: got message {got:?}; {v:?}");
                }
                assert_eq!(len, want.len(), "message {i}: length");
                assert!(buf[..len] == want[..], "message {i}: bytes differ");
            }
            other => panic!(
                "message {i}: {other:?}; stats {:?}",
                n.with(|n, _| n
                    .engine()
                    .stats()
                    .iter()
                    .filter(|s| s.1 != 0)
                    .collect::<Vec<_>>())
            ),
        }
    }
    let r = n.with(|n, now| {
        n.engine_mut()
            .recv_from(now, s, &mut buf, dp_rds::RecvFlags::DONTWAIT)
    });
    assert!(
        matches!(r, Err(RdsError::WouldBlock) | Err(RdsError::Blocked(_))),
        "an extra message: {r:?}"
    );
}

const SIZES: [usize; 12] = [
    0,
    1,
    47,
    48,
    4095,
    4096,
    4097,
    8192,
    65536,
    65537,
    300_000,
    1 << 20,
];

fn size(i: u64) -> usize {
    SIZES[(i % SIZES.len() as u64) as usize]
}

#[test]
fn sizes_0_to_1mib_both_ways_with_both_sides_sending_first() {
    let (a_ip, b_ip) = ("127.0.41.1", "127.0.41.2");
    let a = node("tcp-sz-a", 1, a_ip);
    let b = node("tcp-sz-b", 2, b_ip);
    let sa = sock(&a, a_ip, 4000, 16 << 20);
    let sb = sock(&b, b_ip, 4001, 16 << 20);
    let count = 48u64;
    std::thread::scope(|sc| {
        // Both sides send at once: the larger side's dial is refused or dropped and
        // exactly one connection per path survives, from the smaller address.
        sc.spawn(|| {
            for i in 0..count {
                let p = payload(1, i, size(i));
                a.send_to(sa, SocketAddr::new(ip(b_ip), 4001), &p, T)
                    .unwrap();
            }
        });
        sc.spawn(|| {
            for i in 0..count {
                let p = payload(2, i, size(i));
                b.send_to(sb, SocketAddr::new(ip(a_ip), 4000), &p, T)
                    .unwrap();
            }
        });
        sc.spawn(|| recv_all(&b, sb, count, |i| payload(1, i, size(i))));
        recv_all(&a, sa, count, |i| payload(2, i, size(i)));
    });
    // The connect rule: every connection goes from A (smaller) to B's listening port.
    let ca = conns(&a);
    let cb = conns(&b);
    assert!(!ca.is_empty());
    assert_eq!(ca.len(), cb.len(), "one connection per path on both sides");
    for (l, p) in &ca {
        assert_eq!(l.ip(), ip(a_ip));
        assert_eq!(
            *p,
            SocketAddr::new(ip(b_ip), port()),
            "A dials B:{}",
            port()
        );
    }
    for (l, _) in &cb {
        assert_eq!(l.port(), port(), "B only accepts");
    }
    let npaths = a.with(|n, _| n.engine().connections().map(|c| c.2).max().unwrap());
    if std::env::var("RDS_TCP_MP").is_err() {
        assert_eq!(npaths, 1, "single path");
    }
    assert_eq!(
        ca.len(),
        usize::from(npaths),
        "one connection per negotiated path"
    );
    assert_eq!(stat(&a, "conn_violation") + stat(&b, "conn_violation"), 0);
}

#[test]
fn larger_address_sending_first_is_refused_and_smaller_dials_back() {
    let (a_ip, b_ip) = ("127.0.42.1", "127.0.42.2");
    let a = node("tcp-rule-a", 3, a_ip);
    let b = node("tcp-rule-b", 4, b_ip);
    let sa = sock(&a, a_ip, 4000, 1 << 20);
    let sb = sock(&b, b_ip, 4001, 1 << 20);
    b.send_to(sb, SocketAddr::new(ip(a_ip), 4000), b"from the larger", T)
        .unwrap();
    recv_all(&a, sa, 1, |_| b"from the larger".to_vec());
    assert!(
        tcp_counter(&a, "tcp_accept_from_larger") + tcp_counter(&b, "tcp_connect_dropped_larger")
            >= 1,
        "B's own dial did not carry the message"
    );
    for (l, _) in conns(&b) {
        assert_eq!(
            l.port(),
            port(),
            "B's surviving connections are all accepted ones"
        );
    }
}

/// Linux 6.1's multipath dialler binds random source ports and its probe has no
/// SPORT_IDX: our passive side (SPORT_IDX on, the default) must take its first connection
/// as path 0, not as path `sport % 8`, or its own messages wait on a path 0 that nobody
/// dials (found against the kernel in scripts/rds-kernel-lab.sh). A's dialler here is
/// 6.1-like (`sport_idx: false`); three fresh pairs, as a random port names path 0 one
/// time in 8.
#[test]
fn multipath_accept_from_a_random_port_dialler_takes_path_0() {
    let six_one = TransportSpec {
        sport_idx: false,
        ..TransportSpec::tcp()
    };
    for round in 0..3u8 {
        let a_ip = format!("127.0.43.{}", 2 * round + 1);
        let b_ip = format!("127.0.43.{}", 2 * round + 2);
        let a = node_spec("tcp-61-a", 31, &a_ip, six_one);
        let b = node_with("tcp-61-b", 32, &b_ip, true);
        let sa = sock(&a, &a_ip, 4000, 4 << 20);
        let sb: Vec<RdsSocket> = (0..8).map(|k| sock(&b, &b_ip, 4001 + k, 4 << 20)).collect();
        let t = Some(Duration::from_secs(5));
        a.send_to(sa, SocketAddr::new(ip(&b_ip), 4001), b"hello", t)
            .unwrap();
        let mut buf = [0u8; 256];
        let got = b.recv_from(sb[0], &mut buf, t);
        assert!(matches!(got, Ok(Received::Data { len: 5, .. })), "{got:?}");
        // B answers from 8 sockets, which hash over the paths once negotiated.
        for (k, &s) in sb.iter().enumerate() {
            b.send_to(s, SocketAddr::new(ip(&a_ip), 4000), &[k as u8; 100], t)
                .unwrap();
        }
        let mut seen = [false; 8];
        for _ in 0..8 {
            match a.recv_from(sa, &mut buf, t) {
                Ok(Received::Data { len: 100, from, .. }) => {
                    seen[usize::from(from.port() - 4001)] = true;
                }
                other => panic!(
                    "round {round}: B's answer did not reach the 6.1-like dialler: {other:?}; \
                     B's live connections {:?}",
                    conns(&b)
                ),
            }
        }
        assert_eq!(seen, [true; 8]);
        assert!(!peer_sport_idx(&b), "a 6.1-like probe taken for SPORT_IDX");
    }
    // Two SPORT_IDX nodes (the default): the probes say so, so every accepted connection
    // serves the path its source port names.
    let (a_ip, b_ip) = ("127.0.43.11", "127.0.43.12");
    let a = node_with("tcp-si-a", 33, a_ip, true);
    let b = node_with("tcp-si-b", 34, b_ip, true);
    let sa: Vec<RdsSocket> = (0..8).map(|k| sock(&a, a_ip, 4001 + k, 4 << 20)).collect();
    let sb = sock(&b, b_ip, 4000, 4 << 20);
    for (k, &s) in sa.iter().enumerate() {
        a.send_to(s, SocketAddr::new(ip(b_ip), 4000), &[k as u8; 100], T)
            .unwrap();
    }
    recv_any(&b, sb, 8);
    let by_path = || {
        b.with(|n, _| {
            let t = n.transport_mut(TransportKind::Tcp).unwrap();
            let t = t.as_any().unwrap().downcast_ref::<TcpTransport>().unwrap();
            t.connections()
                .map(|(p, _, peer)| (p.index, peer.port()))
                .collect::<Vec<_>>()
        })
    };
    // A dials paths 1..7 once the probe is answered.
    let t0 = StdInstant::now();
    while by_path().len() < 8 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let by_path = by_path();
    assert_eq!(by_path.len(), 8, "{by_path:?}");
    assert!(peer_sport_idx(&b), "A's probe did not offer SPORT_IDX");
    for (index, port) in by_path {
        assert_eq!(u16::from(index), port % 8, "accepted from port {port}");
    }
}

/// Whether the node's (only) connection's peer offered SPORT_IDX in its probe.
fn peer_sport_idx(n: &BlockingNode) -> bool {
    n.with(|n, _| {
        let e = n.engine();
        let (c, _, _) = e.connections().next().expect("a connection");
        e.conn_peer_sport_idx(c)
    })
}

/// Receives `count` messages of any content on `s`.
fn recv_any(n: &BlockingNode, s: RdsSocket, count: usize) {
    let mut buf = vec![0u8; 4096];
    for i in 0..count {
        let r = n.recv_from(s, &mut buf, T);
        assert!(matches!(r, Ok(Received::Data { .. })), "message {i}: {r:?}");
    }
}

#[test]
fn connection_killed_under_traffic_loses_and_duplicates_nothing() {
    let mp = std::env::var("RDS_TCP_MP").is_ok();
    kill_under_traffic(
        ["tcp-kill-a", "tcp-kill-b"],
        ("127.0.43.1", "127.0.43.2"),
        mp,
        LIGHT,
    );
}

/// The same with 8 paths whatever `RDS_TCP_MP` says: the kill hits a backlog on path 0
/// while the other paths make the receiver write (map updates, pongs) to killed sockets.
#[test]
fn connection_killed_under_traffic_multipath_loses_and_duplicates_nothing() {
    kill_under_traffic(
        ["tcp-kmp-a", "tcp-kmp-b"],
        ("127.0.46.1", "127.0.46.2"),
        true,
        LIGHT,
    );
}

/// 16 kills, 3 of 4 on the receiver, over 16,000 messages, with 8 paths. It failed about 1
/// run in 1,000 (a run of messages skipped or reordered, no connection closed unread) until
/// a path's parked connections were taken in arrival order and paths above 0 waited for a
/// parked path 0 (the two tests below); 0 failures in 3,920 runs since. To loop it:
/// `rds_tcp-<hash> --test-threads=2 killed_16`.
#[test]
fn connection_killed_16_times_under_traffic_multipath_loses_nothing() {
    kill_under_traffic(
        ["tcp-k16-a", "tcp-k16-b"],
        ("127.0.47.1", "127.0.47.2"),
        true,
        HEAVY,
    );
}

/// How hard [`kill_under_traffic`] kills: messages, kills, the pause between kills, and
/// which of every 4 kills hit B (true; the receiver, whose killed sockets hold the
/// backlog) or A.
struct Kills {
    count: u64,
    kills: usize,
    every: Duration,
    on_b: [bool; 4],
}

const LIGHT: Kills = Kills {
    count: 4000,
    kills: 4,
    every: Duration::from_millis(15),
    on_b: [true, false, true, false],
};

const HEAVY: Kills = Kills {
    count: 16_000,
    kills: 16,
    every: Duration::from_millis(10),
    on_b: [true, true, true, false],
};

/// A sends `count` messages to B while both sides' connections are killed (`reset_all`:
/// every socket shut both ways) in turn; B must receive each once, in order.
fn kill_under_traffic(
    [a_name, b_name]: [&str; 2],
    (a_ip, b_ip): (&str, &str),
    multipath: bool,
    k: Kills,
) {
    let a = node_with(a_name, 5, a_ip, multipath);
    let b = node_with(b_name, 6, b_ip, multipath);
    let sa = sock(&a, a_ip, 4000, 1 << 20);
    let sb = sock(&b, b_ip, 4001, 4 << 20);
    let count = k.count;
    let len = |i: u64| (i as usize * 37) % 3000;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..count {
                a.send_to(
                    sa,
                    SocketAddr::new(ip(b_ip), 4001),
                    &payload(7, i, len(i)),
                    T,
                )
                .unwrap();
            }
        });
        sc.spawn(|| {
            let start = StdInstant::now();
            let mut kills = 0;
            while kills < k.kills && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(k.every);
                let n = if k.on_b[kills % 4] {
                    b.with(|n, _| n.transport_mut(TransportKind::Tcp).unwrap().reset_all())
                } else {
                    a.with(|n, _| n.transport_mut(TransportKind::Tcp).unwrap().reset_all())
                };
                if n > 0 {
                    kills += 1;
                }
            }
            assert!(kills >= 1, "no connection was ever killed");
        });
        recv_all(&b, sb, count, |i| payload(7, i, len(i)));
    });
    assert!(tcp_counter(&a, "tcp_conn_lost") + tcp_counter(&b, "tcp_conn_lost") >= 1);
    // The rule behind "nothing lost": a connection is closed only once it has been read to
    // its end, since its unread bytes were acknowledged by our TCP and so released by the
    // peer. A close that breaks it loses those messages unless the peer had not taken the
    // ack yet (then it retransmits them), so the count catches the fault in runs where the
    // comparison above does not.
    for (n, name) in [(&a, "A"), (&b, "B")] {
        assert_eq!(
            tcp_counter(n, "tcp_closed_unread"),
            0,
            "{name} closed a connection that still held the peer's acknowledged bytes"
        );
    }
}

#[test]
fn stalled_receiver_congests_the_sender_and_nothing_is_dropped() {
    let (a_ip, b_ip) = ("127.0.44.1", "127.0.44.2");
    let a = node("tcp-cong-a", 7, a_ip);
    let b = node("tcp-cong-b", 8, b_ip);
    let sa = sock(&a, a_ip, 4000, 1 << 20);
    let sb = sock(&b, b_ip, 4001, 64 << 10);
    let dest = SocketAddr::new(ip(b_ip), 4001);
    // B does not read: its port congests after 64 KiB and the map reaches A.
    let mut sent = 0u64;
    let mut last = None;
    let start = StdInstant::now();
    loop {
        let r = a.with(|n, now| {
            n.engine_mut().send_to(
                now,
                sa,
                Some(dest),
                &payload(9, sent, 1000),
                SendFlags::DONTWAIT,
            )
        });
        match r {
            Ok(_) => sent += 1,
            Err(RdsError::Congested { port }) => {
                assert_eq!(port, 4001);
                break;
            }
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "A never saw the congestion after {sent} messages (last error {last:?}); A: {:?}; B: {:?}",
            a.with(|n, _| n
                .engine()
                .stats()
                .iter()
                .filter(|x| x.1 != 0)
                .collect::<Vec<_>>()),
            b.with(|n, _| n
                .engine()
                .stats()
                .iter()
                .filter(|x| x.1 != 0)
                .collect::<Vec<_>>()),
        );
    }
    assert!(sent >= 64, "congested after only {sent} messages");
    assert!(stat(&a, "cong_send_error") >= 1);
    // B reads everything: all of it arrived, in order.
    recv_all(&b, sb, sent, |i| payload(9, i, 1000));
}

/// A raw TCP peer from `from` (a smaller address) to the node at `to`.
fn raw_peer(from: &str, to: &str) -> std::net::TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(ip(from), 0).into()).unwrap();
    s.connect(&SocketAddr::new(ip(to), port()).into()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.into()
}

/// Reads until the node closes the connection; returns true if it did.
fn closed_by_node(s: &mut std::net::TcpStream) -> bool {
    let mut b = [0u8; 65536];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn header(seq: u64, len: u32, sport: u16, dport: u16, flags: u8) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..8].copy_from_slice(&seq.to_be_bytes());
    h[16..20].copy_from_slice(&len.to_be_bytes());
    h[20..22].copy_from_slice(&sport.to_be_bytes());
    h[22..24].copy_from_slice(&dport.to_be_bytes());
    h[24] = flags;
    h
}

#[test]
fn hostile_streams_cost_only_their_connection() {
    let (bad_ip, good_ip, b_ip) = ("127.0.45.1", "127.0.45.2", "127.0.45.9");
    let b = node("tcp-host-b", 10, b_ip);
    let good = node("tcp-host-g", 11, good_ip);
    let sb = sock(&b, b_ip, 4001, 4 << 20);
    let sg = sock(&good, good_ip, 4000, 1 << 20);
    let dest = SocketAddr::new(ip(b_ip), 4001);
    let count = 300u64;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..count {
                good.send_to(sg, dest, &payload(3, i, 700), T).unwrap();
            }
        });
        // A huge h_len: the path is reset and the socket closed.
        let mut s = raw_peer(bad_ip, b_ip);
        s.write_all(&header(1, u32::MAX, 5000, 4001, 0)).unwrap();
        assert!(closed_by_node(&mut s), "huge h_len: connection not closed");
        // Garbage: sequence 0 and unknown flags.
        let mut s = raw_peer(bad_ip, b_ip);
        let mut g = [0xa5u8; 48];
        g[0..8].copy_from_slice(&0u64.to_be_bytes());
        g[16..20].copy_from_slice(&16u32.to_be_bytes());
        s.write_all(&g).unwrap();
        s.write_all(&[0x5a; 16]).unwrap();
        assert!(
            closed_by_node(&mut s),
            "garbage header: connection not closed"
        );
        // Truncated: half a header, then the end of the stream.
        let mut s = raw_peer(bad_ip, b_ip);
        s.write_all(&header(1, 100, 5000, 4001, 0)[..20]).unwrap();
        drop(s);
        // A congestion map of the wrong length.
        let mut s = raw_peer(bad_ip, b_ip);
        s.write_all(&header(0, 100, 0, 0, 1)).unwrap();
        s.write_all(&[0u8; 100]).unwrap();
        assert!(
            closed_by_node(&mut s),
            "short congestion map: connection not closed"
        );
        recv_all(&b, sb, count, |i| payload(3, i, 700));
    });
    assert!(stat(&b, "conn_violation") >= 2, "violations counted");
    assert_eq!(stat(&good, "conn_violation"), 0);
}

/// A node polled by the test itself, so that it can place a connection in the listen
/// backlog between two polls.
struct Manual {
    node: RdsNode,
    clock: lcore::time::RealClock,
}

impl Manual {
    fn new(name: &str, seed: u64, addr: &str, multipath: bool) -> Self {
        let spec = TransportSpec {
            multipath,
            ..TransportSpec::tcp()
        };
        let engine = RdsEngine::new(engine_cfg(name, seed, spec)).unwrap();
        let mut node = RdsNode::new(engine);
        node.add_transport(Box::new(TcpTransport::new(TcpConfig::with_port(port()))))
            .unwrap();
        node.add_local_addr(ip(addr)).unwrap();
        Self {
            node,
            clock: lcore::time::RealClock::new(),
        }
    }

    /// A socket bound to `addr:4001` on RDS-TCP.
    fn socket(&mut self, addr: &str) -> RdsSocket {
        use lcore::time::Clock;
        let now = self.clock.now();
        tcp_sock(self.node.engine_mut(), now, addr, 4001)
    }

    fn poll(&mut self) {
        use lcore::time::Clock;
        self.node.poll(self.clock.now());
    }

    fn tcp(&mut self, name: &str) -> u64 {
        tcp_count(&mut self.node, name)
    }

    /// Polls until `name` reaches `n` (at most 10 s), and not once more.
    fn poll_until(&mut self, name: &str, n: u64) {
        let start = StdInstant::now();
        while self.tcp(name) < n {
            if start.elapsed() > Duration::from_secs(10) {
                panic!(
                    "{name} stayed below {n}: {:?}",
                    tcp_counters(&mut self.node)
                );
            }
            self.poll();
        }
    }

    /// The next message of `s` within 10 s of polling, or None if none comes in 200 ms.
    fn recv(&mut self, s: RdsSocket) -> Option<Vec<u8>> {
        use lcore::time::Clock;
        let mut buf = [0u8; 64];
        let start = StdInstant::now();
        while start.elapsed() < Duration::from_millis(200) {
            self.poll();
            let now = self.clock.now();
            match self
                .node
                .engine_mut()
                .recv_from(now, s, &mut buf, dp_rds::RecvFlags::DONTWAIT)
            {
                Ok(Received::Data { len, .. }) => return Some(buf[..len].to_vec()),
                Ok(other) => panic!("unexpected {other:?}"),
                Err(RdsError::WouldBlock | RdsError::Blocked(_)) => {}
                Err(e) => panic!("recv: {e:?}"),
            }
        }
        None
    }
}

/// One RDS-TCP message from the raw peer's port 5000 to port 4001.
fn raw_msg(seq: u64, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut m = header(seq, body.len() as u32, 5000, 4001, flags).to_vec();
    m.extend_from_slice(body);
    m
}

/// The rule behind the rare skip of the 16-kill stress test: a peer's connections of one
/// path are read in the order they arrived. B parked the peer's C2 behind the live C1; the
/// peer's TCP saw C2's messages acknowledged (B's kernel buffered them), so the peer released
/// them, then lost C2 and dialled C3, which carries only what came after. C3 reaches B's
/// listen backlog after C1 ended but before B took C2 from the park. Taking C3 first
/// delivered message 4 before 2 and 3, and later took 2 and 3 as a peer starting over (or
/// never, if C3 lived on): the skip. Run in the stress loop, 1 run in about 400 reached it.
#[test]
fn a_paths_parked_connections_are_taken_in_arrival_order() {
    let (a_ip, b_ip) = ("127.0.48.1", "127.0.48.2");
    let mut b = Manual::new("tcp-park-b", 12, b_ip, false);
    let s = b.socket(b_ip);
    let mut c1 = raw_peer(a_ip, b_ip);
    c1.write_all(&raw_msg(1, 0, b"m1")).unwrap();
    assert_eq!(b.recv(s).as_deref(), Some(&b"m1"[..]));
    // C2, behind the live C1: B parks it. The peer gives it up after writing 2 and 3.
    let mut c2 = raw_peer(a_ip, b_ip);
    c2.write_all(&raw_msg(2, 0, b"m2")).unwrap();
    c2.write_all(&raw_msg(3, 0, b"m3")).unwrap();
    c2.shutdown(std::net::Shutdown::Write).unwrap();
    b.poll_until("tcp_accept_parked", 1);
    // C1 ends: in the poll that reads its end B's path goes down, and C2 is still parked
    // (the park is looked at before the path's Disconnect goes out).
    drop(c1);
    b.poll_until("tcp_conn_lost", 1);
    // C3 is in the backlog before B's next poll.
    let mut c3 = raw_peer(a_ip, b_ip);
    c3.write_all(&raw_msg(4, 0, b"m4")).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(b.recv(s));
    }
    // C3 ends too: whatever is left parked is taken now.
    c3.shutdown(std::net::Shutdown::Write).unwrap();
    got.push(b.recv(s));
    let got: Vec<_> = got
        .iter()
        .map(|m| m.as_deref().map(String::from_utf8_lossy))
        .collect();
    assert_eq!(
        got,
        [
            Some("m2".into()),
            Some("m3".into()),
            Some("m4".into()),
            None
        ],
        "B must read C2 (parked first) before C3"
    );
    assert_eq!(b.tcp("tcp_closed_unread"), 0);
    drop((c2, c3));
}

/// A raw TCP peer from `from`, from a source port that names path `index` (`port % 8`,
/// as a SPORT_IDX dialler binds), to the node at `to`.
fn raw_peer_on_path(from: &str, to: &str, index: u16) -> std::net::TcpStream {
    let base = 30000 + (std::process::id() % 2000) as u16 * 8;
    for k in 0..200u16 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let at = SocketAddr::new(ip(from), base + k * 8 + index);
        if s.bind(&at.into()).is_err()
            || s.connect(&SocketAddr::new(ip(to), port()).into()).is_err()
        {
            continue;
        }
        return s.into();
    }
    panic!("no free source port for path {index}");
}

/// The multipath handshake probe of a SPORT_IDX peer (ports 1 to 0, NPATHS 8, a generation).
fn raw_probe(seq: u64) -> Vec<u8> {
    use dp_rds::wire::{ExtHeader, ExtWriter, HeaderRepr, PROBE_PORT};
    let mut w = ExtWriter::new();
    w.push(ExtHeader::NPaths(8)).unwrap();
    w.push(ExtHeader::GenNum(0x5eed)).unwrap();
    w.push(ExtHeader::SportIdx).unwrap();
    let h = HeaderRepr {
        sequence: seq,
        sport: PROBE_PORT,
        dport: 0,
        ext: w.finish(),
        ..HeaderRepr::default()
    };
    h.to_bytes(false).to_vec()
}

/// The fan-in rule with a parked path 0: a multipath sender moves a socket's traffic to
/// its hashed path once its path-0 bytes were acknowledged by our TCP, and those bytes
/// may sit in a path-0 connection that waits in the park (its predecessor not yet read
/// to its end). Bytes of the other paths wait for it: handing them over first delivered
/// a later message before earlier ones (1 run in about 550 of the 16-kill stress test,
/// at the first kill, as the paths came up).
#[test]
fn multipath_bytes_wait_for_a_parked_path_0() {
    let (a_ip, b_ip) = ("127.0.49.1", "127.0.49.2");
    let mut b = Manual::new("tcp-fanin-b", 13, b_ip, true);
    let s = b.socket(b_ip);
    // C1, path 0: the probe (8 paths, SPORT_IDX), then m1.
    let mut c1 = raw_peer_on_path(a_ip, b_ip, 0);
    c1.write_all(&raw_probe(1)).unwrap();
    c1.write_all(&raw_msg(2, 0, b"m1")).unwrap();
    assert_eq!(b.recv(s).as_deref(), Some(&b"m1"[..]));
    // C2, path 0 again, behind the live C1: parked. It carries m2 (path 0, sequence 3).
    let mut c2 = raw_peer_on_path(a_ip, b_ip, 0);
    c2.write_all(&raw_msg(3, 0, b"m2")).unwrap();
    b.poll_until("tcp_accept_parked", 1);
    // C1 ends; C2 waits in the park until the next poll.
    drop(c1);
    b.poll_until("tcp_conn_lost", 1);
    // C3, path 3 (its own sequence numbers): m3, sent after m2 was acknowledged.
    let mut c3 = raw_peer_on_path(a_ip, b_ip, 3);
    c3.write_all(&raw_msg(1, 0, b"m3")).unwrap();
    let got: Vec<_> = (0..3)
        .map(|_| b.recv(s).map(|m| String::from_utf8_lossy(&m).into_owned()))
        .collect();
    assert_eq!(
        got,
        [Some("m2".into()), Some("m3".into()), None],
        "path 3's message went ahead of the parked path 0's"
    );
    drop((c2, c3));
}

/// A peer whose TCP accepts and whose RDS resets at once, as a kernel whose path is still
/// going down does (`rds_tcp_accept_one` answers with a reset while the path is not Down):
/// our dialler's backoff must keep growing, not close on each TCP connect. With the
/// backoff closed on every established connection, each redial went out at once: the
/// kernel lab counted 164 connections lost for 2 kills, and this test counted hundreds
/// of dials in its half second (341 in one run). With it open, about 10 dials fit in half a second (each
/// waits a random time below a window that doubles from 1 ms); a slower machine dials
/// less, never more.
#[test]
fn a_peer_that_resets_each_connection_gets_backed_off_dials() {
    let (a_ip, b_ip) = ("127.0.50.1", "127.0.50.2");
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip(b_ip), port())).unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resetter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut accepted = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        // Linger 0: close sends a reset, as the kernel's sock_no_linger.
                        socket2::SockRef::from(&s)
                            .set_linger(Some(Duration::ZERO))
                            .unwrap();
                        drop(s);
                        accepted += 1;
                    }
                    Err(_) => std::thread::sleep(Duration::from_micros(50)),
                }
            }
            accepted
        })
    };
    let mut a = Manual::new("tcp-reset-a", 13, a_ip, false);
    let s = a.socket(a_ip);
    {
        use lcore::time::Clock;
        let now = a.clock.now();
        a.node
            .engine_mut()
            .send_to(
                now,
                s,
                Some(SocketAddr::new(ip(b_ip), 4001)),
                b"x",
                SendFlags::DONTWAIT,
            )
            .unwrap();
    }
    let start = StdInstant::now();
    while start.elapsed() < Duration::from_millis(500) {
        a.poll();
    }
    let dials = a.tcp("tcp_connect");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let accepted = resetter.join().unwrap();
    assert!(
        accepted >= 2,
        "the peer reset {accepted} connections: the test did not run"
    );
    assert!(
        dials <= 30,
        "{dials} dials in 500 ms to a peer that resets every connection ({accepted} reset): \
         the backoff closed on each TCP connect"
    );
}
