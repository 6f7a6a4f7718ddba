//! The protocol over the simulator: exchange and fragmentation on both transport flavours,
//! acks (piggybacked, ACK-only, one in flight, delayed), credits, sequence numbers,
//! ping/pong, the multipath handshake, reconnect and retransmission.

mod common;

use std::time::Duration;

use common::*;
use dp_rds::path::{PathConfig, PathId};
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::wire::{HeaderRepr, MAX_MSG_SIZE};
use dp_rds::{RdsError, Received, RecvFlags, SendFlags, TransportSpec};

const P0: PathId = PathId { conn: 0, index: 0 };

fn exchange_sizes(t: TransportSpec) {
    let mut net = pair(t, SimConfig::default());
    let (sa_, _) = net.socket(0, sa(A, 4000));
    let (sb, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(0).set_sndbuf(now, sa_, 2 << 20).unwrap();
    net.engine(1).set_rcvbuf(now, sb, 4 << 20).unwrap();
    let sizes = [0usize, 1, 19, 4095, 4096, 4097, 10240, 65536, MAX_MSG_SIZE];
    for (i, &n) in sizes.iter().enumerate() {
        let data = payload(1, i as u64, n);
        assert_eq!(
            net.send_blocking(0, sa_, sa(B, 4001), &data, 100_000),
            Ok(n)
        );
        let mut got = None;
        net.run_until(200_000, |net| {
            got = net.recv(1, sb);
            got.is_some()
        });
        let (bytes, from) = got.unwrap();
        assert_eq!(bytes.len(), n, "size {n}");
        assert!(bytes == data, "payload of {n} bytes intact");
        assert_eq!(from, sa(A, 4000));
    }
    // Everything acked in the end: the send buffer is empty again.
    net.run_until(100_000, |net| {
        net.engine(0).queued_bytes(sa_).unwrap().0 == 0
    });
    let s = net.engine(1).stats().clone();
    assert_eq!(s.recv_delivered, sizes.len() as u64);
    assert_eq!(s.conn_violation, 0);
}

#[test]
fn test_established_exchange_all_sizes_message_flavour() {
    exchange_sizes(ib());
}

#[test]
fn test_established_exchange_all_sizes_without_credits() {
    exchange_sizes(ib_no_credits());
}

#[test]
fn test_established_exchange_all_sizes_stream_flavour() {
    exchange_sizes(tcp());
}

#[test]
fn test_fragmentation_wire_frames_are_4k_with_repeated_headers() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    net.trace = Some(Vec::new());
    let data = payload(2, 0, 10240);
    net.send_blocking(0, s, sa(B, 4001), &data, 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(1, r).is_some());
    let trace = net.trace.take().unwrap();
    let frames: Vec<_> = trace
        .iter()
        .filter(|(n, ..)| *n == 0)
        .map(|(_, _, h, p)| (HeaderRepr::parse_bytes(h).unwrap(), p.len()))
        .filter(|(h, _)| h.dport == 4001)
        .collect();
    assert_eq!(
        frames.len(),
        3,
        "10240 bytes = 3 fragments, as RDS-IB sends them"
    );
    for (h, _) in &frames {
        assert_eq!(
            (h.sequence, h.len, h.sport, h.dport),
            (1, 10240, 4000, 4001),
            "same header fields in every fragment"
        );
    }
    let lens: Vec<usize> = frames.iter().map(|(_, n)| *n).collect();
    assert_eq!(lens, vec![4096, 4096, 2048]);
    assert!(
        trace
            .iter()
            .all(|(_, _, h, _)| dp_rds::wire::Header::new_unchecked(&h[..]).verify_checksum())
    );
    assert!(
        trace
            .iter()
            .all(|(_, _, h, _)| u16::from_be_bytes([h[30], h[31]]) != 0),
        "every header checksummed"
    );
    // The congestion map went first on the fresh connection: 2 fragments of 4096.
    let cong: Vec<_> = trace
        .iter()
        .filter(|(n, _, h, _)| *n == 0 && HeaderRepr::parse_bytes(h).unwrap().flags.is_cong_map())
        .collect();
    assert_eq!(cong.len(), 2);
}

#[test]
fn test_sequence_numbers_start_at_one_and_first_message_requires_ack() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..10 {
        net.send_blocking(0, s, sa(B, 4001), &payload(3, i, 100), 100_000)
            .unwrap();
    }
    net.run_until(100_000, |net| {
        net.engine(1).queued_bytes(r).unwrap().1 == 1000
    });
    let p = net.engine(0).path(P0).unwrap();
    assert_eq!(p.next_tx_seq(), 11, "ten messages took 1..=10");
    assert_eq!(net.engine(1).path(P0).unwrap().next_rx_seq(), 11);
    let st = net.engine(0).stats();
    // ACK_REQUIRED: the first message, then every 8th (max_unacked_packets).
    assert_eq!(st.send_ack_required, 2, "messages 1 and 10");
    assert!(net.engine(1).stats().recv_ack_required >= 2);
}

#[test]
fn test_ack_only_frames_one_in_flight_and_piggyback() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..200 {
        net.send_blocking(0, s, sa(B, 4001), &payload(4, i, 64), 100_000)
            .unwrap();
    }
    net.run_until(200_000, |net| {
        while net.recv(1, r).is_some() {}
        net.engine(0).queued_bytes(s).unwrap().0 == 0
    });
    let b = net.engine(1).stats().clone();
    assert!(
        b.ib_ack_sent > 0,
        "one-way traffic is acked by ACK-only frames"
    );
    assert!(
        b.ib_ack_sent <= 200,
        "acks are batched, not one per message"
    );
    let a = net.engine(0).stats().clone();
    assert_eq!(a.ib_ack_received, b.ib_ack_sent);
    assert_eq!(a.send_drop_acked, 200);
    // Never more than one ACK-only frame in flight: postponements were counted instead.
    assert!(net.engine(1).path(P0).unwrap().frames_in_flight() <= 1);
}

#[test]
fn test_piggybacked_acks_on_two_way_traffic() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..100 {
        net.send_blocking(0, s, sa(B, 4001), &payload(5, i, 64), 100_000)
            .unwrap();
        net.send_blocking(1, r, sa(A, 4000), &payload(6, i, 64), 100_000)
            .unwrap();
    }
    net.run_until(200_000, |net| {
        while net.recv(1, r).is_some() {}
        while net.recv(0, s).is_some() {}
        net.engine(0).queued_bytes(s).unwrap().0 == 0
            && net.engine(1).queued_bytes(r).unwrap().0 == 0
    });
    assert!(
        net.engine(0).stats().ib_ack_send_piggybacked
            + net.engine(1).stats().ib_ack_send_piggybacked
            > 0
    );
}

fn tail_release(delayed: Option<Duration>) -> u64 {
    let t = TransportSpec {
        path: PathConfig {
            delayed_ack: delayed,
            max_unacked_packets: 1000,
            ..PathConfig::message()
        },
        ..TransportSpec::ib()
    };
    let mut net = pair(t, SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    // The first message asks for an ack and gets it; the second (the tail) does not ask.
    net.send_blocking(0, s, sa(B, 4001), &payload(7, 0, 64), 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    net.send_blocking(0, s, sa(B, 4001), &payload(7, 1, 64), 100_000)
        .unwrap();
    net.run_for(Duration::from_millis(50));
    while net.recv(1, r).is_some() {}
    net.engine(0).queued_bytes(s).unwrap().0
}

#[test]
fn test_delayed_ack_releases_the_tail_of_a_one_way_burst() {
    assert_eq!(
        tail_release(Some(Duration::from_millis(1))),
        0,
        "the timer acks the tail"
    );
    assert_eq!(
        tail_release(None),
        64,
        "without the timer (the kernel's behaviour) the tail holds its send buffer"
    );
}

/// A delayed ack stopped by a piggyback and armed again later fires at its new deadline:
/// not at the stopped one (the engine's timer for the path may still be armed there),
/// and not never.
#[test]
fn test_delayed_ack_rearmed_later_fires_at_the_later_deadline() {
    let d = Duration::from_millis(1);
    let t = TransportSpec {
        path: PathConfig {
            delayed_ack: Some(d),
            max_unacked_packets: 1000,
            ..PathConfig::message()
        },
        ..TransportSpec::ib()
    };
    let mut net = pair(t, SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let queued = |net: &mut SimNet| net.engine(0).queued_bytes(s).unwrap().0;
    let fired = |net: &mut SimNet| net.engine(1).stats().delayed_ack_fired;
    // The first message asks for its ack and gets it at once.
    net.send_blocking(0, s, sa(B, 4001), &payload(9, 0, 64), 100_000)
        .unwrap();
    net.run_until(100_000, |net| queued(net) == 0 && net.recv(1, r).is_some());
    // A tail that asks for no ack: B arms its delayed ack; B's own message to A then
    // carries the ack (and stops the timer) well before it is due.
    net.send_blocking(0, s, sa(B, 4001), &payload(9, 1, 64), 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(1, r).is_some());
    net.send_blocking(1, r, sa(A, 4000), &payload(9, 2, 64), 100_000)
        .unwrap();
    net.run_until(100_000, |net| queued(net) == 0);
    while net.recv(0, s).is_some() {}
    assert_eq!(fired(&mut net), 0, "the piggyback took the ack");
    // Half the delay later, another tail: B's delayed ack is armed again, later than the
    // deadline that was stopped.
    net.now = net.now.saturating_add(d / 2);
    let t2 = net.now;
    net.send_blocking(0, s, sa(B, 4001), &payload(9, 3, 64), 100_000)
        .unwrap();
    net.run_until(100_000, |net| fired(net) > 0);
    assert!(
        net.now >= t2.saturating_add(d),
        "fired at {:?}, before the deadline {:?}",
        net.now,
        t2.saturating_add(d)
    );
    assert_eq!(queued(&mut net), 64, "the tail waited for the timer");
    net.run_until(100_000, |net| queued(net) == 0);
    assert_eq!(fired(&mut net), 1);
}

#[test]
fn test_credits_flow_and_bound_what_is_in_flight() {
    let mut net = pair(
        ib(),
        SimConfig {
            recv_depth: 8,
            ..SimConfig::default()
        },
    );
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(0).set_sndbuf(now, s, 1 << 20).unwrap();
    for i in 0..300 {
        net.send_blocking(0, s, sa(B, 4001), &payload(8, i, 4096), 100_000)
            .unwrap();
        while net.recv(1, r).is_some() {}
    }
    net.run_until(500_000, |net| {
        while net.recv(1, r).is_some() {}
        net.engine(0).queued_bytes(s).unwrap().0 == 0
    });
    let (on, _, _) = net.engine(0).path(P0).unwrap().credits();
    assert!(on, "both sides granted credits: flow control runs");
    assert_eq!(
        net.stats.rnr_waits, 0,
        "credits keep the sender within the posted receives"
    );
    assert!(
        net.engine(0).stats().ib_tx_throttle > 0,
        "the sender waited for credits"
    );
    assert!(net.engine(1).stats().ib_tx_credit_updates > 0);
}

#[test]
fn test_without_credits_receiver_not_ready_absorbs_overrun() {
    let mut net = pair(
        ib_no_credits(),
        SimConfig {
            recv_depth: 4,
            ..SimConfig::default()
        },
    );
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..50 {
        net.send_blocking(0, s, sa(B, 4001), &payload(9, i, 4096), 100_000)
            .unwrap();
    }
    let mut got = 0;
    net.run_until(500_000, |net| {
        while net.recv(1, r).is_some() {
            got += 1;
        }
        got == 50
    });
    assert!(net.stats.rnr_waits > 0, "RNR retry stands in for credits");
}

#[test]
fn test_ping_port_zero_answered_with_pong() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, local) = net.socket(0, sa(A, 0));
    assert!(local.port() >= 2, "port 0 picks a port, never 0 or 1");
    net.send_blocking(0, s, sa(B, 0), &[], 100_000).unwrap();
    let mut got = None;
    net.run_until(100_000, |net| {
        got = net.recv(0, s);
        got.is_some()
    });
    let (bytes, from) = got.unwrap();
    assert!(bytes.is_empty());
    assert_eq!(from, sa(B, 0), "the pong comes from port 0");
    assert_eq!(net.engine(1).stats().recv_ping, 1);
    assert_eq!(net.engine(1).stats().send_pong, 1);
}

#[test]
fn test_ping_to_own_address_is_answered_locally() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let now = net.now;
    net.engine(0)
        .send_to(now, s, Some(sa(A, 0)), &[], SendFlags::DONTWAIT)
        .unwrap();
    let (bytes, from) = net.recv(0, s).unwrap();
    assert!(bytes.is_empty());
    assert_eq!(from, sa(A, 0));
}

#[test]
fn test_multipath_probe_negotiates_paths_and_fans_out_in_order() {
    let mut net = pair(tcp(), SimConfig::default());
    let mut socks = Vec::new();
    for p in 0..16u16 {
        socks.push(net.socket(0, sa(A, 5000 + p)).0);
    }
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4 << 20).unwrap();
    let mut last = [None::<u8>; 16];
    let mut got = 0;
    let rounds = 20u64;
    for round in 0..rounds {
        for (k, &s) in socks.iter().enumerate() {
            let mut m = payload(10, round, 32);
            m[0] = k as u8;
            m[1] = round as u8;
            net.send_blocking(0, s, sa(B, 4001), &m, 100_000).unwrap();
        }
        if round == 0 {
            // The first round goes on path 0 while the probe ping negotiates; the rest
            // fans out over the paths the lower address (A) connects.
            net.run_for(Duration::from_millis(20));
        }
        while let Some((m, _)) = net.recv(1, r) {
            let k = m[0] as usize;
            assert!(
                last[k].is_none_or(|l| m[1] == l + 1),
                "per-socket order kept across paths"
            );
            last[k] = Some(m[1]);
            got += 1;
        }
    }
    net.run_until(1_000_000, |net| {
        while let Some((m, _)) = net.recv(1, r) {
            let k = m[0] as usize;
            assert!(
                last[k].is_none_or(|l| m[1] == l + 1),
                "per-socket order kept across paths"
            );
            last[k] = Some(m[1]);
            got += 1;
        }
        got == 16 * rounds
    });
    let (_, key, npaths) = net.engine(0).connections().next().unwrap();
    assert_eq!(npaths, 8, "both sides support 8 paths");
    assert_eq!(key.transport, dp_rds::TransportKind::Tcp);
    let used = (0..8)
        .filter(|&i| {
            net.engine(0)
                .path(PathId { conn: 0, index: i })
                .unwrap()
                .next_tx_seq()
                > 1
        })
        .count();
    assert!(
        used > 2,
        "messages spread over the negotiated paths ({used} used)"
    );
    assert!(
        net.engine(1).stats().recv_ping >= 1,
        "a probe ping was answered"
    );
    assert!(net.engine(0).stats().recv_ping + net.engine(1).stats().recv_ping <= 2);
}

#[test]
fn test_reset_retransmits_unacked_with_retransmitted_flag_and_no_duplicates() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..20 {
        net.send_blocking(0, s, sa(B, 4001), &payload(11, i, 3000), 100_000)
            .unwrap();
    }
    // Let some frames fly, then kill the connection before the acks come back.
    net.run_until(100_000, |net| net.engine(1).stats().recv_queued >= 5);
    assert!(net.reset_link(0, P0));
    let mut got = Vec::new();
    net.run_until(1_000_000, |net| {
        while let Some((m, _)) = net.recv(1, r) {
            got.push(m);
        }
        got.len() == 20 && net.engine(0).queued_bytes(s).unwrap().0 == 0
    });
    for (i, m) in got.iter().enumerate() {
        assert!(
            *m == payload(11, i as u64, 3000),
            "message {i} once, in order"
        );
    }
    let a = net.engine(0).stats();
    assert!(a.send_retransmitted > 0, "unacked messages were resent");
    assert!(a.conn_reset >= 1);
    assert!(
        net.engine(1).stats().recv_drop_old_seq > 0,
        "resent messages already received were dropped"
    );
}

#[test]
fn test_reconnect_backoff_grows_while_the_peer_is_away() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    net.stall(1, true);
    let now = net.now;
    net.engine(0)
        .send_to(now, s, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT)
        .unwrap();
    net.run_for(Duration::from_millis(3000));
    let w = net.engine(0).path(P0).unwrap().backoff_window();
    assert_eq!(
        w,
        Duration::from_millis(1000),
        "the window doubles up to the 1 s cap"
    );
    net.stall(1, false);
    let (r, _) = net.socket(1, sa(B, 4001));
    net.run_until(1_000_000, |net| net.recv(1, r).is_some());
    assert_eq!(
        net.engine(0).path(P0).unwrap().backoff_window(),
        Duration::ZERO,
        "reset on success"
    );
}

#[test]
fn test_recv_trunc_and_peek() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    net.send_blocking(0, s, sa(B, 4001), b"0123456789", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.engine(1).readiness(r).readable());
    let now = net.now;
    let mut buf = [0u8; 4];
    let e = net.engine(1);
    let peek = e
        .recv_from(now, r, &mut buf, RecvFlags::PEEK.with(RecvFlags::DONTWAIT))
        .unwrap();
    assert!(matches!(
        peek,
        Received::Data {
            len: 4,
            msg_len: 10,
            truncated: true,
            ..
        }
    ));
    assert_eq!(&buf, b"0123");
    let t = e
        .recv_from(now, r, &mut buf, RecvFlags::TRUNC.with(RecvFlags::DONTWAIT))
        .unwrap();
    assert!(
        matches!(
            t,
            Received::Data {
                len: 10,
                truncated: true,
                ..
            }
        ),
        "MSG_TRUNC returns the full length"
    );
    assert_eq!(
        e.recv_from(now, r, &mut buf, RecvFlags::DONTWAIT),
        Err(RdsError::WouldBlock),
        "the rest was discarded"
    );
    assert!(matches!(
        e.recv_from(now, r, &mut buf, RecvFlags::NONE),
        Err(RdsError::Blocked(_))
    ));
}

#[test]
fn test_message_to_unbound_port_dropped_but_acked() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    net.send_blocking(0, s, sa(B, 9999), b"nobody", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    assert_eq!(net.engine(1).stats().recv_drop_no_sock, 1);
}

#[test]
fn test_simultaneous_connects_resolve_by_backoff() {
    let mut net = pair(
        ib(),
        SimConfig {
            latency: Duration::from_micros(200),
            ..SimConfig::default()
        },
    );
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(0)
        .send_to(now, s, Some(sa(B, 4001)), b"a", SendFlags::DONTWAIT)
        .unwrap();
    net.engine(1)
        .send_to(now, r, Some(sa(A, 4000)), b"b", SendFlags::DONTWAIT)
        .unwrap();
    let (mut ga, mut gb) = (false, false);
    net.run_until(2_000_000, |net| {
        ga |= net.recv(0, s).is_some();
        gb |= net.recv(1, r).is_some();
        ga && gb
    });
}

#[test]
fn test_three_nodes_one_connection_per_peer() {
    let mut net = SimNet::new(SimConfig::default());
    for (i, a) in [A, B, C].iter().enumerate() {
        net.add_node(
            engine_cfg(&format!("rds-3-{i}"), 100 + i as u64, ib()),
            &[ip(a)],
        );
    }
    let socks: Vec<_> = (0..3)
        .map(|n| net.socket(n, sa([A, B, C][n], 7000)).0)
        .collect();
    for (n, &s) in socks.iter().enumerate() {
        for m in 0..3 {
            if n != m {
                net.send_blocking(n, s, sa([A, B, C][m], 7000), &[n as u8, m as u8], 100_000)
                    .unwrap();
            }
        }
    }
    let mut got = 0;
    net.run_until(500_000, |net| {
        for (n, &s) in socks.iter().enumerate() {
            while let Some((m, from)) = net.recv(n, s) {
                assert_eq!(m[1] as usize, n);
                assert_eq!(from.ip(), ip([A, B, C][m[0] as usize]));
                got += 1;
            }
        }
        got == 6
    });
    for n in 0..3 {
        assert_eq!(
            net.engine(n).connections().count(),
            2,
            "one connection per peer, for every socket"
        );
    }
}

#[test]
fn test_stream_accept_over_a_live_path_resets_and_retransmits() {
    // RDS-TCP: the lower address dials again while the higher one still thinks the old
    // connection is up (its end never saw the failure): the accept replaces it
    // (Resetting), and what was unacked is resent on the new connection.
    let mut net = pair(tcp(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    net.send_blocking(1, r, sa(A, 4000), b"first", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(0, s).is_some());
    net.run_for(Duration::from_millis(20)); // every path up
    // B sends while A is stalled: unacked on B's path for that socket.
    net.stall(0, true);
    let now = net.now;
    net.engine(1)
        .send_to(now, r, Some(sa(A, 4000)), b"second", SendFlags::DONTWAIT)
        .unwrap();
    net.run_for(Duration::from_millis(1));
    let p = (0..8)
        .map(|i| PathId { conn: 0, index: i })
        .find(|&p| net.engine(1).path(p).unwrap().retrans_queue_len() == 1)
        .expect("the message is on one path, unacked");
    let now = net.now;
    let acc = net.engine(1).handle_incoming(
        now,
        dp_rds::Incoming {
            transport: dp_rds::TransportKind::Tcp,
            laddr: ip(B),
            faddr: ip(A),
            tos: 0,
            path_index: p.index,
            private: &[],
        },
    );
    assert!(matches!(acc, dp_rds::Accept::Yes { .. }));
    assert_eq!(
        net.engine(1).path_state(p),
        Some(dp_rds::path::ConnState::Resetting)
    );
    net.engine(1).handle_transport_error(now, p); // the old socket's error: ignored
    assert_eq!(
        net.engine(1).path_state(p),
        Some(dp_rds::path::ConnState::Resetting)
    );
    net.engine(1).handle_connected(now, p, &[]);
    assert_eq!(
        net.engine(1).path_state(p),
        Some(dp_rds::path::ConnState::Up)
    );
    assert!(
        net.engine(1).path(p).unwrap().send_queue_len()
            + net.engine(1).path(p).unwrap().retrans_queue_len()
            >= 1
    );
    assert!(
        net.engine(1).stats().send_retransmitted >= 1
            || net.engine(1).path(p).unwrap().send_queue_len() >= 1
    );
}
