//! RDS over the fabric transport on the shm provider: two nodes (engines with their own
//! addresses) in one process, each driven by a `BlockingNode` progress thread in hybrid
//! mode. What goes on the wire at connect time (RDS-IB's private data, byte for byte),
//! messages of every size both ways, reliability under connection resets, a stalled
//! receiver, a peer that dies and restarts, and hostile peers (garbage, impossible credits).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

use dataplane::fabric::shm::{Shm, ShmDevice};
use dataplane::fabric::{CmChannel, CmEvent, ConnRequest, Device};
use dataplane::rds::fabric::{FabricConfig, MIN_RECV_DEPTH};
use dataplane::rds::node::BlockingNode;
use dataplane::rds::{RdsError, RdsSocket, Received, TransportKind};

mod common;
use common::rds::{Lab, device, sock};

/// Names `rds-test`, addresses in 10.78.0.0/24.
const LAB: Lab = Lab::new("rds-test", 78);

/// Nodes A and B, a socket on each, and the sockets' addresses: `(a, b, a's socket, b's
/// socket, a's address, b's address)`.
type Two = (
    BlockingNode,
    BlockingNode,
    RdsSocket,
    RdsSocket,
    SocketAddr,
    SocketAddr,
);

/// [`Two`]: A at `LAB.ip(1)` port 4000 and B at `LAB.ip(2)` port 4001, meeting in `d`,
/// their engines seeded `seed_a` and `seed_b`.
fn two(d: &Path, seed_a: u64, seed_b: u64) -> Two {
    let a = LAB.node(d, LAB.ip(1), seed_a);
    let b = LAB.node(d, LAB.ip(2), seed_b);
    let (aa, ba) = (
        SocketAddr::new(LAB.ip(1), 4000),
        SocketAddr::new(LAB.ip(2), 4001),
    );
    let (sa, sb) = (sock(&a, aa), sock(&b, ba));
    (a, b, sa, sb, aa, ba)
}

fn recv(n: &BlockingNode, s: RdsSocket, buf: &mut [u8]) -> (usize, SocketAddr) {
    loop {
        match n.recv_from(s, buf, Some(Duration::from_secs(20))) {
            Ok(Received::Data { len, from, .. }) => return (len, from),
            Ok(_) => continue,
            Err(e) => panic!("recv_from: {e}"),
        }
    }
}

fn pattern(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seq) as u8)
        .collect();
    if len >= 8 {
        v[..8].copy_from_slice(&seq.to_le_bytes());
    }
    v
}

#[test]
fn connect_request_carries_rds_ib_private_data_as_the_kernel_sends_it() {
    let d = LAB.dir("priv");
    // A raw CM listener plays the peer at 10.78.0.2:18634 and records the request.
    let dev = device(&d);
    let mut cm = dev.create_cm_channel().unwrap();
    cm.listen(SocketAddr::new(LAB.ip(2), 18634), 8).unwrap();
    let a = LAB.node(&d, LAB.ip(1), 1);
    let s = sock(&a, SocketAddr::new(LAB.ip(1), 4000));
    let r = a.with(|n, now| {
        n.engine_mut().send_to(
            now,
            s,
            Some(SocketAddr::new(LAB.ip(2), 4001)),
            b"hello",
            dataplane::rds::SendFlags::DONTWAIT,
        )
    });
    assert_eq!(r, Ok(5));
    let ev = cm
        .wait_event(Some(Duration::from_secs(10)))
        .expect("a connect request");
    let CmEvent::ConnectRequest { request, .. } = ev else {
        panic!("expected a connect request, got {ev:?}");
    };
    let p = request.private_data().to_vec();
    assert_eq!(p.len(), 32, "rds_ib_connect_private for IPv4 is 32 bytes");
    // saddr, daddr, protocol 3.1, minor mask 3 (as the kernel's capture shows), tos 0.
    assert_eq!(
        &p[..12],
        &[10, 78, 0, 1, 10, 78, 0, 2, 3, 1, 0, 3],
        "request private data {p:02x?}"
    );
    assert_eq!(&p[12..16], &[0, 0, 0, 0], "tos and reserved");
    assert_eq!(
        u64::from_be_bytes(p[16..24].try_into().unwrap()),
        0,
        "ack_seq"
    );
    let credit = u32::from_be_bytes(p[24..28].try_into().unwrap());
    assert_eq!(
        credit,
        FabricConfig::default().recv_depth,
        "initial credits: every receive posted before connecting"
    );
    cm.reject(request, &[]).unwrap();
    a.stop();
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_node_listening_on_another_port_dials_the_peer_port() {
    // Beside a kernel rds_rdma, which holds 18634 on every address, a node listens on 18635
    // and dials the kernel's 18634 (FabricConfig::peer_port).
    let d = LAB.dir("peerport");
    let dev = device(&d);
    let mut cm = dev.create_cm_channel().unwrap();
    cm.listen(SocketAddr::new(LAB.ip(2), 18634), 8).unwrap();
    let fcfg = FabricConfig {
        port_v4: 18635,
        peer_port: Some(18634),
        ..FabricConfig::default()
    };
    let a = LAB.node_with(&d, LAB.ip(1), 1, fcfg);
    let s = sock(&a, SocketAddr::new(LAB.ip(1), 4000));
    let r = a.with(|n, now| {
        n.engine_mut().send_to(
            now,
            s,
            Some(SocketAddr::new(LAB.ip(2), 4001)),
            b"hello",
            dataplane::rds::SendFlags::DONTWAIT,
        )
    });
    assert_eq!(r, Ok(5));
    let ev = cm
        .wait_event(Some(Duration::from_secs(10)))
        .expect("a connect request at the peer port");
    let CmEvent::ConnectRequest { request, .. } = ev else {
        panic!("expected a connect request, got {ev:?}");
    };
    assert_eq!(&request.private_data()[..8], &[10, 78, 0, 1, 10, 78, 0, 2]);
    cm.reject(request, &[]).unwrap();
    a.stop();
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn messages_of_every_size_both_ways_arrive_intact_and_in_order() {
    let d = LAB.dir("sizes");
    let (a, b, sa, sb, aa, ba) = two(&d, 1, 2);
    let sizes = [0usize, 1, 64, 4048, 4096, 4097, 8192, 100_000, 1 << 20];
    let mut buf = vec![0u8; 1 << 20];
    for (k, &len) in sizes.iter().enumerate() {
        let msg = pattern(k as u64, len);
        assert_eq!(
            a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
            Ok(len)
        );
        let (n, from) = recv(&b, sb, &mut buf);
        assert_eq!((n, from), (len, aa), "message {k}");
        assert!(
            buf[..n] == msg[..],
            "payload of the {len}-byte message differs"
        );
        // And back.
        assert_eq!(
            b.send_to(sb, aa, &msg, Some(Duration::from_secs(20))),
            Ok(len)
        );
        let (n, from) = recv(&a, sa, &mut buf);
        assert_eq!((n, from), (len, ba));
        assert!(buf[..n] == msg[..]);
    }
    let resets =
        a.with(|n, _| n.engine().stats().conn_reset) + b.with(|n, _| n.engine().stats().conn_reset);
    assert_eq!(resets, 0, "no connection was reset");
    a.stop();
    b.stop();
    let _ = std::fs::remove_dir_all(d);
}

/// Small rings carry messages of every size both ways: the smallest `FabricConfig::check`
/// accepts (4 buffers; 1 is refused: the sender holds its last credit back for credit updates)
/// and 16, where the kernel's fixed update threshold of 16 posted credits is never reached
/// (the peer stops after 15 frames) and a 100 kB message stalled for good.
#[test]
fn small_receive_rings_carry_every_size_and_one_buffer_is_refused() {
    let one = FabricConfig {
        recv_depth: 1,
        ..FabricConfig::default()
    };
    assert!(
        one.check().is_err(),
        "a one-buffer ring never carries a frame"
    );
    for depth in [MIN_RECV_DEPTH, 16] {
        let d = LAB.dir(&format!("depth{depth}"));
        let fcfg = || FabricConfig {
            recv_depth: depth,
            ..FabricConfig::default()
        };
        let a = LAB.node_with(&d, LAB.ip(1), 1, fcfg());
        let b = LAB.node_with(&d, LAB.ip(2), 2, fcfg());
        let (aa, ba) = (
            SocketAddr::new(LAB.ip(1), 4000),
            SocketAddr::new(LAB.ip(2), 4001),
        );
        let (sa, sb) = (sock(&a, aa), sock(&b, ba));
        let mut buf = vec![0u8; 1 << 20];
        for (k, &len) in [0usize, 64, 4097, 100_000, 1 << 20].iter().enumerate() {
            let msg = pattern(k as u64, len);
            let t = Some(Duration::from_secs(20));
            assert_eq!(a.send_to(sa, ba, &msg, t), Ok(len), "depth {depth}");
            let (n, from) = recv(&b, sb, &mut buf);
            assert_eq!((n, from), (len, aa), "depth {depth}, message {k}");
            assert!(
                buf[..n] == msg[..],
                "depth {depth}: {len}-byte message differs"
            );
            assert_eq!(b.send_to(sb, aa, &msg, t), Ok(len), "depth {depth}");
            let (n, from) = recv(&a, sa, &mut buf);
            assert_eq!((n, from), (len, ba), "depth {depth}, reply {k}");
            assert!(
                buf[..n] == msg[..],
                "depth {depth}: {len}-byte reply differs"
            );
        }
        a.stop();
        b.stop();
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Kills a reset loop must see, however fast the machine sends.
const MIN_KILLS: u64 = 6;

/// What a node's paths and counters look like, for a test that failed waiting on it.
fn describe(name: &str, n: &BlockingNode) -> String {
    use std::fmt::Write;
    n.with(|n, now| {
        let mut out = String::new();
        let e = n.engine();
        for (c, k, np) in e.connections() {
            for index in 0..np.max(1) {
                let id = dataplane::rds::PathId { conn: c, index };
                let Some(p) = e.path(id) else { continue };
                let _ = writeln!(
                    out,
                    "{name} at {now:?}: path {c}/{index} {} -> {}: {:?}, send queue {}, \
                     retransmit queue {}, backoff {:?}, next timer {:?}",
                    k.laddr.ip(),
                    k.faddr.ip(),
                    p.state(),
                    p.send_queue_len(),
                    p.retrans_queue_len(),
                    p.backoff_window(),
                    p.poll_timeout()
                );
            }
        }
        let _ = write!(out, "{name} counters:");
        if let Some(t) = n.transport_mut(TransportKind::Ib) {
            t.counters(&mut |k, v| {
                if v != 0 {
                    let _ = write!(out, " {k}={v}");
                }
            });
        }
        for (k, v) in n.engine().stats().iter().filter(|(_, v)| *v != 0) {
            let _ = write!(out, " {k}={v}");
        }
        out
    })
}

/// Sends at least `count` sequence-numbered messages from one socket (more if needed, until
/// the connections have been killed at least [`MIN_KILLS`] times) while another thread kills
/// every connection every `every`; checks that each arrives exactly once, in order.
fn reset_loop(tag: &str, count: u64, every: Duration) -> (u64, u64) {
    let d = LAB.dir(tag);
    let (a, b, sa, sb, aa, ba) = two(&d, 11, 12);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicU64::new(0));
    // The number of messages, once the sender has decided (u64::MAX until then): published
    // before the last message is sent, so the receiver knows it when that one arrives.
    let total = Arc::new(AtomicU64::new(u64::MAX));
    let killer = {
        let (a, b, stop, killed) = (a.clone(), b.clone(), stop.clone(), killed.clone());
        std::thread::spawn(move || {
            let mut kills = 0u64;
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                let n = if k.is_multiple_of(2) { &a } else { &b };
                k += 1;
                kills += n.with(|n, _| {
                    n.transport_mut(TransportKind::Ib)
                        .map_or(0, |t| t.reset_all()) as u64
                });
                killed.store(kills, Ordering::Relaxed);
            }
            kills
        })
    };
    let sender = {
        let (a, killed, total) = (a.clone(), killed.clone(), total.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            loop {
                let last = seq + 1 >= count && killed.load(Ordering::Relaxed) >= MIN_KILLS;
                if last {
                    total.store(seq + 1, Ordering::Release);
                }
                let msg = pattern(seq, 8 + (seq % 300) as usize);
                let r = a.send_to(sa, ba, &msg, Some(Duration::from_secs(30)));
                assert_eq!(r, Ok(msg.len()), "send of message {seq}");
                if last {
                    break;
                }
                seq += 1;
            }
        })
    };
    let mut buf = vec![0u8; 4096];
    let mut seq = 0u64;
    while seq < total.load(Ordering::Acquire) {
        let (n, from) = loop {
            match b.recv_from(sb, &mut buf, Some(Duration::from_secs(20))) {
                Ok(Received::Data { len, from, .. }) => break (len, from),
                Ok(_) => continue,
                Err(e) => panic!(
                    "recv_from of message {seq}: {e}\n{}\n{}",
                    describe("A", &a),
                    describe("B", &b)
                ),
            }
        };
        assert_eq!(from, aa);
        let got = u64::from_le_bytes(buf[..8].try_into().unwrap());
        assert_eq!(got, seq, "message {seq} lost or duplicated (got {got})");
        assert!(buf[..n] == pattern(seq, n)[..], "payload of message {seq}");
        seq += 1;
    }
    sender.join().expect("sender");
    stop.store(true, Ordering::Relaxed);
    let kills = killer.join().expect("killer");
    // Nothing more may arrive: a duplicate would show up here.
    assert!(matches!(
        b.with(|n, now| n.engine_mut().recv_from(
            now,
            sb,
            &mut buf,
            dataplane::rds::RecvFlags::DONTWAIT
        )),
        Err(RdsError::WouldBlock)
    ));
    let resets = a.with(|n, _| n.engine().stats().conn_reset);
    let timeouts = [&a, &b].map(|n| n.with(|n, _| n.engine().stats().conn_connect_timeout));
    eprintln!("connections given up for not being established in time (a, b): {timeouts:?}");
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(d);
    (kills, resets)
}

#[test]
fn connection_resets_in_a_loop_lose_and_duplicate_nothing() {
    let (kills, resets) = reset_loop("reset", 20_000, Duration::from_millis(15));
    eprintln!(
        "at least 20000 messages, {kills} connections killed, {resets} path resets on the sender"
    );
    assert!(kills >= 3, "the connection was killed only {kills} times");
    assert!(resets >= 3, "the sender saw {resets} resets");
}

#[test]
#[ignore = "long: a million messages under resets every 5 ms"]
fn connection_resets_in_a_loop_long() {
    let (kills, resets) = reset_loop("reset-long", 1_000_000, Duration::from_millis(5));
    eprintln!("1000000 messages, {kills} connections killed, {resets} path resets");
    assert!(kills >= 100);
}

#[test]
fn a_stalled_receiver_stops_senders_with_enobufs_and_drops_nothing() {
    let d = LAB.dir("stall");
    let (a, b, sa, sb, _, ba) = two(&d, 21, 22);
    b.with(|n, now| n.engine_mut().set_rcvbuf(now, sb, 64 * 1024).unwrap());
    // The receiver reads nothing: the sender goes until congestion stops it.
    let mut sent = 0u64;
    let mut congested = 0u64;
    let t0 = StdInstant::now();
    while t0.elapsed() < Duration::from_secs(20) && congested < 100 {
        let msg = pattern(sent, 1000);
        let r = a.with(|n, now| {
            n.engine_mut()
                .send_to(now, sa, Some(ba), &msg, dataplane::rds::SendFlags::DONTWAIT)
        });
        match r {
            Ok(_) => sent += 1,
            Err(RdsError::Congested { .. }) => {
                congested += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(RdsError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(
        congested >= 100,
        "the sender was never told ENOBUFS ({sent} sent)"
    );
    assert_eq!(RdsError::Congested { port: 4001 }.errno(), libc::ENOBUFS);
    // Stalled for a while longer: still nothing dropped anywhere.
    std::thread::sleep(Duration::from_millis(300));
    // Now the receiver drains everything, in order, and traffic resumes.
    let mut buf = vec![0u8; 4096];
    for seq in 0..sent {
        let (n, _) = recv(&b, sb, &mut buf);
        assert_eq!(n, 1000);
        assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), seq);
    }
    for seq in sent..sent + 100 {
        let msg = pattern(seq, 1000);
        assert_eq!(
            a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
            Ok(1000)
        );
        let (_, _) = recv(&b, sb, &mut buf);
        assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), seq);
    }
    let drops = b.with(|n, _| n.engine().stats().recv_drop_no_sock);
    assert_eq!(drops, 0);
    a.stop();
    b.stop();
    let _ = std::fs::remove_dir_all(d);
}

/// A raw fabric client that claims 10.78.0.9 and connects to 10.78.0.2 with valid RDS-IB
/// private data granting `credit` initial credits; it posts no receives.
fn hostile_connect(
    d: &Path,
    credit: u32,
) -> (
    ShmDevice,
    <Shm as dataplane::fabric::Provider>::Cm,
    <Shm as dataplane::fabric::Provider>::Qp,
) {
    let dev = device(d);
    let pd = dev.alloc_pd().unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    let cq_s = dev.create_cq(256).unwrap();
    let cq_r = dev.create_cq(64).unwrap();
    let private = dataplane::rds::wire::ib::IbConnPrivRepr {
        saddr: LAB.ip(9),
        daddr: LAB.ip(2),
        version: dataplane::rds::wire::ib::IbVersion::V3_1,
        minor_mask: 3,
        tos: 0,
        ack_seq: 0,
        credit,
    };
    let (pb, pn) = private.to_bytes();
    let init = dataplane::fabric::QpInit::<Shm> {
        pd: &pd,
        send_cq: &cq_s,
        recv_cq: &cq_r,
        caps: dataplane::fabric::QpCaps {
            max_send_wr: 256,
            max_inline_data: 256,
            ..dataplane::fabric::QpCaps::default()
        },
    };
    let (_conn, qp) = cm
        .connect(SocketAddr::new(LAB.ip(2), 18634), &init, &pb[..pn])
        .unwrap();
    let ev = cm
        .wait_event(Some(Duration::from_secs(10)))
        .expect("an answer");
    assert!(
        matches!(ev, CmEvent::Established { .. }),
        "the hostile peer's valid request was accepted: {ev:?}"
    );
    (dev, cm, qp)
}

#[test]
fn a_peer_granting_impossible_credits_costs_only_its_connection() {
    let d = LAB.dir("credits");
    let (a, b, sa, sb, _, ba) = two(&d, 41, 42);
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        a.send_to(sa, ba, b"first", Some(Duration::from_secs(20))),
        Ok(5)
    );
    assert_eq!(recv(&b, sb, &mut buf).0, 5);
    // Flow control on (we grant 16), then ACK-only frames, correctly checksummed, each
    // granting 255 credits: past 16383 the grant is impossible.
    let (_dev, mut cm, mut qp) = hostile_connect(&d, 16);
    let hdr = dataplane::rds::wire::HeaderRepr {
        credit: 255,
        ..Default::default()
    }
    .to_bytes(true);
    use dataplane::fabric::RcQueuePair;
    for i in 0..70u64 {
        qp.post_send(&[dataplane::fabric::SendWr::inline(
            i,
            dataplane::fabric::SendOp::Send,
            &hdr,
        )])
        .unwrap();
    }
    let ev = cm
        .wait_event(Some(Duration::from_secs(10)))
        .expect("a disconnect");
    assert!(matches!(ev, CmEvent::Disconnected { .. }), "got {ev:?}");
    let st = b.with(|n, _| n.engine().stats().clone());
    assert_eq!(
        st.recv_drop_bad_credit, 1,
        "the impossible grant was counted once"
    );
    for seq in 0..1000u64 {
        let msg = pattern(seq, 64);
        assert_eq!(
            a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
            Ok(64)
        );
        let (n, _) = recv(&b, sb, &mut buf);
        assert!(buf[..n] == msg[..]);
    }
    assert_eq!(
        a.with(|n, _| n.engine().stats().conn_reset),
        0,
        "a's path was never reset"
    );
    a.stop();
    b.stop();
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_hostile_peer_costs_only_its_own_connection() {
    let d = LAB.dir("hostile");
    let (a, b, sa, sb, _, ba) = two(&d, 31, 32);
    let mut buf = vec![0u8; 4096];
    // The honest connection is up.
    assert_eq!(
        a.send_to(sa, ba, b"first", Some(Duration::from_secs(20))),
        Ok(5)
    );
    assert_eq!(recv(&b, sb, &mut buf).0, 5);
    // A hostile peer claims 10.78.0.9 and connects to b with valid private data, then
    // sends garbage: a header whose h_len is 2 MiB.
    let (_dev, mut cm, mut qp) = hostile_connect(&d, 0);
    let mut garbage = [0u8; 48 + 64];
    garbage[..8].copy_from_slice(&1u64.to_be_bytes());
    garbage[16..20].copy_from_slice(&(2u32 << 20).to_be_bytes()); // h_len 2 MiB
    use dataplane::fabric::RcQueuePair;
    qp.post_send(&[dataplane::fabric::SendWr::inline(
        1,
        dataplane::fabric::SendOp::Send,
        &garbage,
    )])
    .unwrap();
    // b resets that connection: the hostile peer sees it go.
    let ev = cm
        .wait_event(Some(Duration::from_secs(10)))
        .expect("a disconnect");
    assert!(matches!(ev, CmEvent::Disconnected { .. }), "got {ev:?}");
    let st = b.with(|n, _| n.engine().stats().clone());
    assert_eq!(st.recv_drop_bad_len, 1, "b counted the 2 MiB h_len once");
    // The honest connection never noticed.
    for seq in 0..1000u64 {
        let msg = pattern(seq, 64);
        assert_eq!(
            a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
            Ok(64)
        );
        let (n, _) = recv(&b, sb, &mut buf);
        assert!(buf[..n] == msg[..]);
    }
    assert_eq!(
        a.with(|n, _| n.engine().stats().conn_reset),
        0,
        "a's path was never reset"
    );
    a.stop();
    b.stop();
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_peer_that_dies_and_restarts_gets_an_in_order_suffix_without_duplicates() {
    let d = LAB.dir("restart");
    let a = LAB.node(&d, LAB.ip(1), 51);
    let (aa, ba) = (
        SocketAddr::new(LAB.ip(1), 4000),
        SocketAddr::new(LAB.ip(2), 4001),
    );
    let sa = sock(&a, aa);
    let mut buf = vec![0u8; 4096];
    {
        let b = LAB.node(&d, LAB.ip(2), 52);
        let sb = sock(&b, ba);
        for seq in 0..1000u64 {
            let msg = pattern(seq, 100);
            assert_eq!(
                a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
                Ok(100)
            );
        }
        for seq in 0..500u64 {
            recv(&b, sb, &mut buf);
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), seq);
        }
        // The process dies: its node, queue pairs and unread messages go with it.
    }
    let b = LAB.node(&d, LAB.ip(2), 53);
    let sb = sock(&b, ba);
    for seq in 1000..2000u64 {
        let msg = pattern(seq, 100);
        assert_eq!(
            a.send_to(sa, ba, &msg, Some(Duration::from_secs(20))),
            Ok(100)
        );
    }
    // What the new process gets: everything not acked to `a` before the death (resent,
    // in order), then the new messages; never a gap, never the same message twice.
    let (n, _) = recv(&b, sb, &mut buf);
    assert_eq!(n, 100);
    let first = u64::from_le_bytes(buf[..8].try_into().unwrap());
    // (Messages the dead process had queued and acked are gone with it, as in Linux; ones
    // it had not acked yet come again, even if its application had read them.)
    assert!(first <= 1000, "resumed at {first}: new messages were lost");
    for seq in first + 1..2000 {
        let (n, _) = recv(&b, sb, &mut buf);
        assert_eq!(n, 100);
        assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), seq);
    }
    assert!(matches!(
        b.with(|n, now| n.engine_mut().recv_from(
            now,
            sb,
            &mut buf,
            dataplane::rds::RecvFlags::DONTWAIT
        )),
        Err(RdsError::WouldBlock)
    ));
    let resets = a.with(|n, _| n.engine().stats().conn_reset);
    assert!(resets >= 1, "a saw its peer go");
    a.stop();
    b.stop();
    let _ = std::fs::remove_dir_all(d);
}

/// A peer acks our message and closes before we poll again: its ack completes in our
/// receive queue ahead of the flush errors, and must still release the message (before,
/// the transport failed the connection at the first flush error of the batch and dropped
/// the ack with it: the message went back to the send queue for a peer that is gone).
#[test]
fn acks_a_peer_sent_before_it_closed_still_release_the_messages() {
    use dataplane::rds::{PathId, RecvFlags, SendFlags};
    use lcore::time::{Clock, RealClock};
    let d = LAB.dir("last-acks");
    let clock = RealClock::new();
    let mut a = LAB.manual_node(&d, LAB.ip(1), 1);
    let mut b = LAB.manual_node(&d, LAB.ip(2), 2);
    let (aa, ba) = (
        SocketAddr::new(LAB.ip(1), 4000),
        SocketAddr::new(LAB.ip(2), 4001),
    );
    let sa = a.engine_mut().socket().unwrap();
    a.engine_mut().bind(sa, aa).unwrap();
    let sb = b.engine_mut().socket().unwrap();
    b.engine_mut().bind(sb, ba).unwrap();
    let r = a.engine_mut().send_to(
        clock.now(),
        sa,
        Some(ba),
        b"last words",
        SendFlags::DONTWAIT,
    );
    assert_eq!(r, Ok(10));
    // Both run until B has the message.
    let mut buf = [0u8; 64];
    let t0 = StdInstant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(10), "never delivered");
        a.poll(clock.now());
        b.poll(clock.now());
        let now = clock.now();
        if let Ok(Received::Data { len, .. }) =
            b.engine_mut()
                .recv_from(now, sb, &mut buf, RecvFlags::DONTWAIT)
        {
            assert_eq!(&buf[..len], b"last words");
            break;
        }
    }
    // Only B runs now, until its ack for it is on the wire and completed: the ack waits
    // in A's receive queue.
    let t0 = StdInstant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(10), "B never acked");
        b.poll(clock.now());
        let e = b.engine();
        let done = e.connections().all(|(conn, _, _)| {
            e.path(PathId { conn, index: 0 }).is_none_or(|p| {
                let k = p.ack_state();
                k.sent >= k.next && k.next > 0 && !k.in_flight && p.frames_in_flight() == 0
            })
        });
        if done {
            break;
        }
    }
    // B goes away (its connection closes); A hears of it before it polls again.
    drop(b);
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..10 {
        a.poll(clock.now());
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = a.engine();
    assert_eq!(
        e.queued_bytes(sa).unwrap().0,
        0,
        "the ack that arrived before the disconnect released the message (path {:?})",
        e.path_state(PathId { conn: 0, index: 0 })
    );
    assert_eq!(e.stats().send_drop_acked, 1);
    assert!(e.stats().conn_reset >= 1, "and A saw B go");
    drop(a);
    let _ = std::fs::remove_dir_all(d);
}
