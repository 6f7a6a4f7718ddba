//! The socket API with Linux's semantics and errors (rds.md section 4): bind, sendmsg's
//! checks in order, send-buffer accounting, readiness, options, cancel, close, loopback,
//! and many sockets on one engine.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use dp_rds::engine::sockaddr_bytes;
use dp_rds::sim::SimConfig;
use dp_rds::uapi::*;
use dp_rds::wire::MAX_MSG_SIZE;
use dp_rds::{Block, RdsEngine, RdsError, Received, RecvFlags, SendCmsg, SendFlags};
use lcore::time::Instant;

const T: Instant = Instant::from_millis(1);

fn engine() -> RdsEngine {
    let mut e = RdsEngine::new(engine_cfg("rds-sock", 5, ib())).unwrap();
    e.add_local_addr(ip(A));
    e
}

fn errno<T: core::fmt::Debug>(r: Result<T, RdsError>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn test_bind_errors() {
    let mut e = engine();
    let s = e.socket().unwrap();
    assert_eq!(
        errno(e.bind(s, sa("0.0.0.0", 1000))),
        22,
        "no wildcard bind"
    );
    assert_eq!(errno(e.bind(s, sa("255.255.255.255", 1000))), 22);
    assert_eq!(errno(e.bind(s, sa("224.0.0.1", 1000))), 22);
    assert_eq!(errno(e.bind(s, sa("ff02::1", 1000))), 22);
    assert_eq!(
        errno(e.bind(s, "[fe80::1]:1000".parse().unwrap())),
        22,
        "link-local needs a scope"
    );
    assert_eq!(errno(e.bind(s, sa(A, 1))), 22, "port 1 is the probe port");
    assert_eq!(
        errno(e.bind(s, sa(B, 1000))),
        99,
        "not our address: EADDRNOTAVAIL"
    );
    let got = e.bind(s, sa(A, 1000)).unwrap();
    assert_eq!(got, sa(A, 1000));
    assert_eq!(errno(e.bind(s, sa(A, 1001))), 22, "no re-bind");
    let t = e.socket().unwrap();
    assert_eq!(errno(e.bind(t, sa(A, 1000))), 98, "EADDRINUSE");
    // Port 0 picks a free port, never 0 or 1.
    for _ in 0..50 {
        let u = e.socket().unwrap();
        let p = e.bind(u, sa(A, 0)).unwrap().port();
        assert!(p >= 2 && p != 1000);
    }
    // SO_RDS_TRANSPORT before bind: a transport that does not serve the address.
    let v = e.socket().unwrap();
    e.set_transport(T, v, RDS_TRANS_IB).unwrap();
    assert_eq!(
        errno(e.bind(v, sa(B, 5))),
        92,
        "ENOPROTOOPT from the transport's address check"
    );
    assert_eq!(
        errno(e.socket_raw(1, 0)),
        94,
        "SOCK_STREAM: ESOCKTNOSUPPORT"
    );
    assert!(e.socket_raw(5, 0).is_ok());
}

#[test]
fn test_bind_port_zero_exhaustion() {
    let mut cfg = engine_cfg("rds-exh", 6, ib());
    cfg.max_sockets = 70_000;
    let mut e = RdsEngine::new(cfg).unwrap();
    e.add_local_addr(ip(A));
    for _ in 0..65534 {
        let s = e.socket().unwrap();
        e.bind(s, sa(A, 0)).unwrap();
    }
    let s = e.socket().unwrap();
    assert_eq!(
        errno(e.bind(s, sa(A, 0))),
        98,
        "every port from 2 to 65535 taken"
    );
}

#[test]
fn test_sendmsg_checks_in_linux_order() {
    let mut e = engine();
    let s = e.socket().unwrap();
    // Unknown flags first, even on an unbound socket.
    assert_eq!(
        errno(e.send_to(T, s, Some(sa(B, 1)), b"x", SendFlags(0x1))),
        95
    );
    // Bad destination before "unbound".
    assert_eq!(
        errno(e.send_to(T, s, Some(sa("0.0.0.0", 1)), b"x", SendFlags::DONTWAIT)),
        22
    );
    assert_eq!(
        errno(e.send_to(T, s, Some(sa("224.1.1.1", 1)), b"x", SendFlags::DONTWAIT)),
        22
    );
    assert_eq!(
        errno(e.send_to(T, s, Some(sa(B, 1)), b"x", SendFlags::DONTWAIT)),
        107,
        "unbound: ENOTCONN"
    );
    e.bind(s, sa(A, 4000)).unwrap();
    assert_eq!(
        errno(e.send_to(T, s, None, b"x", SendFlags::DONTWAIT)),
        107,
        "no destination"
    );
    assert_eq!(
        errno(e.send_to(
            T,
            s,
            Some("[2001:db8::2]:5".parse().unwrap()),
            b"x",
            SendFlags::DONTWAIT
        )),
        95,
        "v6 from a v4 socket"
    );
    let big = vec![0u8; MAX_MSG_SIZE + 1];
    let r = e.send_to(T, s, Some(sa(B, 1)), &big, SendFlags::DONTWAIT);
    assert!(matches!(r, Err(RdsError::MessageTooLong { limit, .. }) if limit == MAX_MSG_SIZE));
    let over_sndbuf = vec![0u8; e.sndbuf(s).unwrap() as usize + 1];
    let r = e.send_to(T, s, Some(sa(B, 1)), &over_sndbuf, SendFlags::DONTWAIT);
    assert!(matches!(r, Err(RdsError::MessageTooLong { what, .. }) if what.contains("SO_SNDBUF")));
    assert_eq!(
        errno(e.send_to(
            T,
            s,
            Some(sa(B, 1)),
            b"x",
            SendFlags::ZEROCOPY.with_dontwait()
        )),
        95,
        "zerocopy needs TCP"
    );
    // Control messages: unknown, mixed groups, RDMA without an RDMA transport.
    assert_eq!(
        errno(e.send_msg(
            T,
            s,
            Some(sa(B, 1)),
            b"x",
            &[SendCmsg::Other(42)],
            SendFlags::DONTWAIT
        )),
        22
    );
    assert_eq!(
        errno(e.send_msg(
            T,
            s,
            Some(sa(B, 1)),
            b"x",
            &[
                SendCmsg::RdmaDest(1),
                SendCmsg::Atomic(RDS_CMSG_ATOMIC_FADD)
            ],
            SendFlags::DONTWAIT
        )),
        22
    );
    assert_eq!(
        errno(e.send_msg(
            T,
            s,
            Some(sa(B, 1)),
            b"x",
            &[SendCmsg::RdmaDest(1)],
            SendFlags::DONTWAIT
        )),
        95
    );
    let rdma_big = SendCmsg::RdmaArgs {
        cookie: 1,
        remote_addr: 0,
        remote_bytes: 2 << 20,
        nr_local: 1,
        local_addr: 0,
        local_bytes: 1,
        flags: 0,
        user_token: 0,
    };
    assert_eq!(
        errno(e.send_msg(T, s, Some(sa(B, 1)), b"x", &[rdma_big], SendFlags::DONTWAIT)),
        90,
        "RDMA bytes count against 1 MiB"
    );
    // Zero-length messages are legal; connect() gives a default destination.
    assert_eq!(
        e.send_to(T, s, Some(sa(B, 1)), &[], SendFlags::DONTWAIT),
        Ok(0)
    );
    e.connect(s, sa(B, 2)).unwrap();
    assert_eq!(e.send_to(T, s, None, b"abc", SendFlags::DONTWAIT), Ok(3));
    assert_eq!(errno(e.connect(s, sa("0.0.0.0", 2))), 89, "EDESTADDRREQ");
}

trait Dontwait {
    fn with_dontwait(self) -> Self;
}
impl Dontwait for SendFlags {
    fn with_dontwait(self) -> Self {
        Self(self.0 | MSG_DONTWAIT)
    }
}

#[test]
fn test_send_buffer_admission_overshoot_and_release_on_ack() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(0).set_sndbuf(now, s, 10_000).unwrap();
    assert_eq!(
        net.engine(0).sndbuf(s).unwrap(),
        10_000,
        "RDS uses half of the doubled value"
    );
    let mut b = [0u8; 4];
    net.engine(0)
        .getsockopt_raw(s, SOL_SOCKET, SO_SNDBUF, &mut b)
        .unwrap();
    assert_eq!(
        i32::from_ne_bytes(b),
        20_000,
        "getsockopt reads the doubled value, as Linux"
    );
    // Admit while queued < sndbuf: the last one may overshoot.
    let e = net.engine(0);
    assert!(
        e.send_to(now, s, Some(sa(B, 4001)), &[1; 6000], SendFlags::DONTWAIT)
            .is_ok()
    );
    assert!(
        e.send_to(now, s, Some(sa(B, 4001)), &[2; 6000], SendFlags::DONTWAIT)
            .is_ok()
    );
    assert_eq!(e.queued_bytes(s).unwrap().0, 12_000);
    assert!(
        !e.readiness(s).writable(),
        "POLLOUT only while queued < sndbuf"
    );
    assert_eq!(
        e.send_to(now, s, Some(sa(B, 4001)), &[3; 10], SendFlags::DONTWAIT),
        Err(RdsError::WouldBlock)
    );
    assert_eq!(
        e.send_to(now, s, Some(sa(B, 4001)), &[3; 10], SendFlags::NONE),
        Err(RdsError::Blocked(Block::SendSpace))
    );
    assert!(e.stats().send_queue_full >= 2);
    // Acks release the space (not the receiver's reading).
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    assert!(net.engine(0).readiness(s).writable());
    assert!(net.engine(1).readiness(r).readable());
    assert!(net.engine(0).stats().send_queue_empty >= 1);
}

#[test]
fn test_socket_options_values_and_errors() {
    let mut e = engine();
    let s = e.socket().unwrap();
    assert_eq!(
        e.transport(s).unwrap(),
        RDS_TRANS_NONE,
        "unbound: RDS_TRANS_NONE"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, SO_RDS_TRANSPORT, &[0, 0])),
        22,
        "optlen must be 4"
    );
    assert_eq!(
        errno(e.set_transport(T, s, 3)),
        22,
        "RDS_TRANS_LOOP is internal"
    );
    assert_eq!(errno(e.set_transport(T, s, -1)), 22);
    assert_eq!(errno(e.set_transport(T, s, RDS_TRANS_GAP)), 92);
    assert_eq!(
        errno(e.set_transport(T, s, RDS_TRANS_TCP)),
        92,
        "this engine's driver has only IB"
    );
    e.set_transport(T, s, RDS_TRANS_IB).unwrap();
    assert_eq!(errno(e.set_transport(T, s, RDS_TRANS_IB)), 95, "only once");
    e.bind(s, sa(A, 7)).unwrap();
    assert_eq!(e.transport(s).unwrap(), RDS_TRANS_IB);
    let u = e.socket().unwrap();
    e.bind(u, sa(A, 8)).unwrap();
    assert_eq!(
        errno(e.set_transport(T, u, RDS_TRANS_IB)),
        95,
        "after bind: EOPNOTSUPP"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_RECVERR, &[1])),
        22,
        "bool options need an int"
    );
    e.set_recverr(T, s, true).unwrap();
    let mut b = [0u8; 4];
    e.getsockopt_raw(s, SOL_RDS, RDS_RECVERR, &mut b).unwrap();
    assert_eq!(i32::from_ne_bytes(b), 1);
    assert_eq!(
        errno(e.getsockopt_raw(s, SOL_RDS, RDS_RECVERR, &mut [0u8; 2])),
        22
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, SO_TIMESTAMP_OLD, &[0; 8])),
        14,
        "EFAULT unless 4 bytes"
    );
    assert_eq!(errno(e.setsockopt_raw(T, s, SOL_RDS, 999, &[0; 4])), 92);
    assert_eq!(
        errno(e.setsockopt_raw(T, s, 6, 1, &[0; 4])),
        92,
        "other levels: ENOPROTOOPT"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_GET_MR, &[0; 32])),
        95,
        "no RDMA transport yet"
    );
    let unbound = e.socket().unwrap();
    assert_eq!(
        errno(e.setsockopt_raw(T, unbound, SOL_RDS, RDS_GET_MR, &[0; 32])),
        107
    );
    assert_eq!(errno(e.cancel_sent_to(T, unbound, sa(B, 1))), 107);
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_CANCEL_SENT_TO, &[0; 8])),
        22
    );
    // SO_SNDBUF is capped at wmem_max and floored at the kernel minimum.
    e.set_sndbuf(T, s, u32::MAX).unwrap();
    assert_eq!(e.sndbuf(s).unwrap(), u64::from(e.config().wmem_max));
    e.set_sndbuf(T, s, 1).unwrap();
    assert_eq!(e.sndbuf(s).unwrap(), u64::from(SOCK_MIN_SNDBUF / 2));
    // TOS: once, before the first send.
    e.set_tos(s, 3).unwrap();
    assert_eq!(errno(e.set_tos(s, 4)), 22);
    e.close(T, s).unwrap();
    assert_eq!(
        errno(e.send_to(T, s, Some(sa(B, 1)), b"x", SendFlags::DONTWAIT)),
        9,
        "closed: EBADF"
    );
}

#[test]
fn test_cancel_sent_to_drops_unacked_and_frees_space() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    net.stall(1, true);
    let now = net.now;
    for i in 0..5u8 {
        net.engine(0)
            .send_to(now, s, Some(sa(B, 4001)), &[i; 100], SendFlags::DONTWAIT)
            .unwrap();
        net.engine(0)
            .send_to(now, s, Some(sa(B, 4002)), &[i; 100], SendFlags::DONTWAIT)
            .unwrap();
    }
    net.run_for(Duration::from_millis(5));
    assert_eq!(net.engine(0).queued_bytes(s).unwrap().0, 1000);
    let now = net.now;
    net.engine(0).cancel_sent_to(now, s, sa(B, 4001)).unwrap();
    assert_eq!(
        net.engine(0).queued_bytes(s).unwrap().0,
        500,
        "only the messages to B:4001 went"
    );
    assert_eq!(net.engine(0).stats().send_drop_cancelled, 5);
    // The raw form with a sockaddr_in6 of a v4-mapped address means the same.
    let (bytes, n) = sockaddr_bytes(sa(B, 4002));
    net.engine(0)
        .setsockopt_raw(now, s, SOL_RDS, RDS_CANCEL_SENT_TO, &bytes[..n])
        .unwrap();
    assert_eq!(net.engine(0).queued_bytes(s).unwrap().0, 0);
    net.stall(1, false);
    net.run_for(Duration::from_millis(50));
    assert!(
        net.recv(1, r).is_none(),
        "cancelled messages are never delivered"
    );
    let f = net.engine(0).frags();
    assert_eq!(f.available(), f.count(), "their memory came back");
}

#[test]
fn test_close_frees_port_queues_and_congestion() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4096).unwrap();
    for i in 0..10 {
        net.send_blocking(0, s, sa(B, 4001), &payload(1, i, 1000), 100_000)
            .unwrap();
    }
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    let now = net.now;
    assert!(matches!(
        net.engine(0)
            .send_to(now, s, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT),
        Err(RdsError::Congested { port: 4001 })
    ));
    net.engine(1).close(now, r).unwrap();
    net.run_for(Duration::from_millis(5));
    let now = net.now;
    assert!(
        net.engine(0)
            .send_to(now, s, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT)
            .is_ok(),
        "close cleared the port's congestion"
    );
    let again = net.engine(1).socket().unwrap();
    net.engine(1).bind(again, sa(B, 4001)).unwrap();
    let f = net.engine(1).frags();
    assert!(
        f.available() >= f.count() - 8,
        "the unread messages were freed"
    );
}

#[test]
fn test_cong_monitor_mask_and_poll_without_monitor() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (plain, _) = net.socket(0, sa(A, 4005));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4096).unwrap();
    net.engine(0).set_cong_monitor(now, s, true).unwrap();
    for i in 0..10 {
        net.send_blocking(0, s, sa(B, 4001), &payload(1, i, 1000), 100_000)
            .unwrap();
    }
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    let now = net.now;
    assert!(matches!(
        net.engine(0)
            .send_to(now, s, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT),
        Err(RdsError::Congested { .. })
    ));
    assert!(matches!(
        net.engine(0)
            .send_to(now, plain, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT),
        Err(RdsError::Congested { .. })
    ));
    let p0 = net.engine(0).poll(plain);
    let _ = p0;
    while net.recv(1, r).is_some() {}
    net.run_for(Duration::from_millis(5));
    // The monitoring socket gets RDS_CMSG_CONG_UPDATE with the port's bit, before data.
    let now = net.now;
    let mut buf = [0u8; 8];
    let got = net
        .engine(0)
        .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
        .unwrap();
    assert_eq!(got, Received::CongUpdate(1 << (4001 % 64)));
    assert_eq!(
        net.engine(0)
            .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT),
        Err(RdsError::WouldBlock),
        "reported once"
    );
    // The other socket sees POLLIN | POLLWRBAND once for the map change ("historical").
    let p = net.engine(0).poll(plain);
    assert!(p.readable() && p.wrband(), "{p:?}");
    assert!(!net.engine(0).poll(plain).wrband(), "consumed by the poll");
}

#[test]
fn test_loopback_between_own_addresses() {
    let mut e = RdsEngine::new(engine_cfg("rds-loop", 7, ib())).unwrap();
    e.add_local_addr(ip(A));
    e.add_local_addr(ip(C));
    let s = e.socket().unwrap();
    e.bind(s, sa(A, 10)).unwrap();
    let r = e.socket().unwrap();
    e.bind(r, sa(C, 20)).unwrap();
    e.send_to(T, s, Some(sa(C, 20)), b"local", SendFlags::DONTWAIT)
        .unwrap();
    assert_eq!(e.queued_bytes(s).unwrap().0, 0, "acked at once");
    let mut buf = [0u8; 16];
    let got = e.recv_from(T, r, &mut buf, RecvFlags::DONTWAIT).unwrap();
    assert!(matches!(got, Received::Data { len: 5, from, .. } if from == sa(A, 10)));
    // 127.0.0.1 binds with the loopback transport.
    let l = e.socket().unwrap();
    e.bind(l, sa("127.0.0.1", 30)).unwrap();
    assert_eq!(e.transport(l).unwrap(), 3);
    assert_eq!(
        e.connections().count(),
        0,
        "no connection for local traffic"
    );
}

#[test]
fn test_thousands_of_sockets_on_one_engine() {
    let mut cfg = engine_cfg("rds-many-a", 8, ib());
    cfg.max_sockets = 4096;
    let mut net = dp_rds::sim::SimNet::new(SimConfig::default());
    net.add_node(cfg.clone(), &[ip(A)]);
    cfg.name = "rds-many-b".into();
    cfg.seed = 9;
    net.add_node(cfg, &[ip(B)]);
    let n = 2000u16;
    let senders: Vec<_> = (0..n).map(|i| net.socket(0, sa(A, 10_000 + i)).0).collect();
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4 << 20).unwrap();
    let (_, low_before) = net.engine(0).msgs_available();
    for (i, &s) in senders.iter().enumerate() {
        net.send_blocking(0, s, sa(B, 4001), &(i as u32).to_le_bytes(), 100_000)
            .unwrap();
    }
    let mut seen = vec![false; n as usize];
    let mut got = 0;
    net.run_until(1_000_000, |net| {
        while let Some((m, from)) = net.recv(1, r) {
            let i = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
            assert_eq!(from.port(), 10_000 + i as u16);
            assert!(!seen[i]);
            seen[i] = true;
            got += 1;
        }
        got == n
    });
    assert_eq!(
        net.engine(0).connections().count(),
        1,
        "2000 sockets, one connection"
    );
    assert!(low_before > 0);
    let e: &SocketAddr = &sa(B, 4001);
    let _ = e;
}

#[test]
fn test_congestion_hysteresis_congested_above_rcvbuf_clear_below_half() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4000).unwrap();
    let congested = |net: &mut dp_rds::sim::SimNet| {
        net.run_for(Duration::from_millis(5));
        let now = net.now;
        let probe = net.engine(0).socket().unwrap();
        net.engine(0).bind(probe, sa(A, 0)).unwrap();
        let r = net
            .engine(0)
            .send_to(now, probe, Some(sa(B, 4001)), &[], SendFlags::DONTWAIT);
        net.engine(0).close(now, probe).unwrap();
        matches!(r, Err(RdsError::Congested { port: 4001 }))
    };
    // 4 x 1000 bytes: not above 4000 yet.
    for i in 0..4 {
        net.send_blocking(0, s, sa(B, 4001), &payload(1, i, 1000), 100_000)
            .unwrap();
    }
    assert!(!congested(&mut net), "4000 queued is not above SO_RCVBUF");
    net.send_blocking(0, s, sa(B, 4001), &payload(1, 4, 1000), 100_000)
        .unwrap();
    assert!(congested(&mut net), "5000 queued > 4000: congested");
    // Read down to 3000, then 2000: still congested (clear only below half).
    net.recv(1, r).unwrap();
    net.recv(1, r).unwrap();
    assert!(congested(&mut net), "3000 queued: still congested");
    net.recv(1, r).unwrap();
    assert!(congested(&mut net), "2000 queued: not below half yet");
    net.recv(1, r).unwrap();
    assert!(!congested(&mut net), "1000 queued < 2000: clear");
    assert_eq!(
        net.engine(1).stats().cong_update_queued,
        2,
        "one update per change"
    );
}

#[test]
fn test_get_mr_on_tcp_is_eopnotsupp_lengths_first() {
    let mut cfg = engine_cfg("rds-mr-tcp", 6, ib());
    cfg.transports.push(dp_rds::TransportSpec::tcp());
    let mut e = RdsEngine::new(cfg).unwrap();
    e.add_local_addr(ip(A));
    let s = e.socket().unwrap();
    e.set_transport(T, s, RDS_TRANS_TCP).unwrap();
    e.bind(s, sa(A, 9)).unwrap();
    assert_eq!(
        errno(e.get_mr(s, 4096, 4096, RDS_RDMA_READWRITE)),
        95,
        "RDS-TCP has no RDMA"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_GET_MR, &[0; 32])),
        95
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_GET_MR, &[0; 31])),
        22,
        "the length is checked first, as in Linux"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_GET_MR_FOR_DEST, &[0; 32])),
        22,
        "GET_MR_FOR_DEST takes 160 bytes"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_FREE_MR, &[0; 16])),
        22,
        "cookie 0 on a transport without MRs: EINVAL"
    );
    assert_eq!(
        errno(e.setsockopt_raw(T, s, SOL_RDS, RDS_FREE_MR, &[0; 8])),
        22
    );
    assert_eq!(e.mr_count(), 0);
}
