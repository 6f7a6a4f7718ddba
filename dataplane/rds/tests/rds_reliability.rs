//! The reliability properties of issue 13 at the state-machine level, over the simulator:
//!
//! * connections reset in a loop while tasks send sequence-numbered messages: nothing that
//!   `send_to` accepted is lost or duplicated, per-sender order holds, and every reset
//!   retransmits from the unacked queue (the counts are printed);
//! * a receiver stalled: congestion stops its senders (`ENOBUFS` when non-blocking,
//!   waiting when blocking), nothing is dropped, and traffic resumes.
//!
//! Both run on the message flavour (with credits) and the stream flavour (multipath).

mod common;

use std::time::Duration;

use common::*;
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::{RdsError, SendFlags, TransportSpec};

const TASKS: usize = 4;

/// Message: [task, seq (8 bytes LE), filler].
fn msg(task: usize, seq: u64, len: usize) -> Vec<u8> {
    let mut m = payload(task as u32, seq, len.max(9));
    m[0] = task as u8;
    m[1..9].copy_from_slice(&seq.to_le_bytes());
    m
}

fn reset_loop(t: TransportSpec, per_task: u64, seed: u64) {
    // Connections die two ways: all of them every 40 steps (between deliveries), and any
    // one with a frame on the wire with probability 0.2 % (messages in flight are lost).
    let mut net = pair(
        t,
        SimConfig {
            seed,
            latency: Duration::from_micros(20),
            reset_prob: 0.002,
            ..SimConfig::default()
        },
    );
    let senders: Vec<_> = (0..TASKS)
        .map(|k| net.socket(0, sa(A, 6000 + k as u16)).0)
        .collect();
    let (r, _) = net.socket(1, sa(B, 7000));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4 << 20).unwrap();
    let mut next = [0u64; TASKS];
    let mut expect = [0u64; TASKS];
    let mut accepted = 0u64;
    let mut received = 0u64;
    let mut resets = 0u64;
    let mut step = 0u64;
    let total = per_task * TASKS as u64;
    while received < total {
        step += 1;
        assert!(step < 3_000_000, "stuck: {received}/{total} received");
        // Each task sends when it can (non-blocking, sizes across the fragment boundary).
        for k in 0..TASKS {
            if next[k] < per_task {
                let len = 9 + ((next[k] * 1237 + k as u64 * 97) % 9000) as usize;
                let now = net.now;
                match net.engine(0).send_to(
                    now,
                    senders[k],
                    Some(sa(B, 7000)),
                    &msg(k, next[k], len),
                    SendFlags::DONTWAIT,
                ) {
                    Ok(_) => {
                        next[k] += 1;
                        accepted += 1;
                    }
                    Err(RdsError::WouldBlock | RdsError::Congested { .. }) => {}
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
        // Every few hundred steps, kill every connection.
        if step.is_multiple_of(40) {
            resets += net.reset_all() as u64;
        }
        while let Some((m, _)) = net.recv(1, r) {
            let k = m[0] as usize;
            let seq = u64::from_le_bytes(m[1..9].try_into().unwrap());
            assert_eq!(
                seq, expect[k],
                "task {k}: message {seq} out of order, lost or duplicated"
            );
            let len = 9 + ((seq * 1237 + k as u64 * 97) % 9000) as usize;
            assert!(
                m == msg(k, seq, len),
                "task {k} message {seq}: payload intact"
            );
            expect[k] += 1;
            received += 1;
        }
        net.step();
    }
    // Nothing more arrives, and everything was acked (send buffers empty).
    net.run_for(Duration::from_millis(50));
    assert!(
        net.recv(1, r).is_none(),
        "no duplicate after the last message"
    );
    for &s in &senders {
        assert_eq!(net.engine(0).queued_bytes(s).unwrap().0, 0);
    }
    let a = net.engine(0).stats().clone();
    let b = net.engine(1).stats().clone();
    let resets = resets + net.stats.resets;
    assert_eq!(accepted, total);
    assert!(resets >= 3, "the loop reset connections ({resets})");
    assert!(
        a.send_retransmitted > 0,
        "resets retransmitted unacked messages: {a:?}"
    );
    assert_eq!(a.conn_violation + b.conn_violation, 0);
    println!(
        "reset loop ({}): {accepted} accepted, {received} delivered once in order, {resets} connections killed, \
         conn_reset {}/{}, retransmitted {}, duplicates dropped {}, acked {}",
        kind_name(&t),
        a.conn_reset,
        b.conn_reset,
        a.send_retransmitted,
        b.recv_drop_old_seq,
        a.send_drop_acked
    );
}

#[test]
fn test_reliability_reset_loop_message_flavour() {
    reset_loop(ib(), 400, 3);
}

#[test]
fn test_reliability_reset_loop_message_flavour_no_credits() {
    reset_loop(ib_no_credits(), 300, 4);
}

#[test]
fn test_reliability_reset_loop_stream_flavour() {
    reset_loop(tcp(), 400, 5);
}

#[test]
fn test_reliability_random_resets_on_frames() {
    // Every frame has a 1 % chance of killing its connection.
    let mut net = pair(
        ib(),
        SimConfig {
            reset_prob: 0.01,
            seed: 9,
            ..SimConfig::default()
        },
    );
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 4 << 20).unwrap();
    let n = 500u64;
    let mut got = 0u64;
    for i in 0..n {
        if let Err(e) = net.send_blocking(0, s, sa(B, 4001), &msg(0, i, 2000), 1_000_000) {
            for k in 0..2 {
                let p = net
                    .engine(k)
                    .path(dp_rds::PathId { conn: 0, index: 0 })
                    .unwrap();
                eprintln!(
                    "node {k}: {:?} sendq {} retrans {} inflight {} credits {:?} ack {:?}",
                    p.state(),
                    p.send_queue_len(),
                    p.retrans_queue_len(),
                    p.frames_in_flight(),
                    p.credits(),
                    p.ack_state()
                );
            }
            let q = net.engine(0).queued_bytes(s);
            eprintln!("{:?} {:?} {:?}", net.stats, net.link_state(), q);
            panic!("message {i}: {e}");
        }
        while let Some((m, _)) = net.recv(1, r) {
            assert_eq!(u64::from_le_bytes(m[1..9].try_into().unwrap()), got);
            got += 1;
        }
    }
    net.run_until(3_000_000, |net| {
        while let Some((m, _)) = net.recv(1, r) {
            assert_eq!(u64::from_le_bytes(m[1..9].try_into().unwrap()), got);
            got += 1;
        }
        got == n
    });
    assert!(net.stats.resets > 0);
    println!(
        "random resets: {} resets, {n} messages delivered once, in order",
        net.stats.resets
    );
}

fn stalled_receiver(t: TransportSpec) {
    let mut net = pair(t, SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (blocking, _) = net.socket(0, sa(A, 4002));
    let (r, _) = net.socket(1, sa(B, 4001));
    let now = net.now;
    net.engine(1).set_rcvbuf(now, r, 64 << 10).unwrap();
    net.engine(0).set_cong_monitor(now, s, true).unwrap();
    // The receiving application stops reading; its socket fills past SO_RCVBUF.
    let mut sent = 0u64;
    let mut enobufs = 0u64;
    for _ in 0..20_000 {
        let now = net.now;
        match net.engine(0).send_to(
            now,
            s,
            Some(sa(B, 4001)),
            &msg(0, sent, 1000),
            SendFlags::DONTWAIT,
        ) {
            Ok(_) => sent += 1,
            Err(RdsError::Congested { port: 4001 }) => {
                enobufs += 1;
                if enobufs > 50 {
                    break;
                }
            }
            Err(RdsError::WouldBlock) => {}
            Err(e) => panic!("send: {e}"),
        }
        net.step();
    }
    assert!(
        enobufs > 0,
        "the congested port refuses non-blocking sends with ENOBUFS"
    );
    let queued = net.engine(1).queued_bytes(r).unwrap().1;
    assert!(
        queued > 64 << 10,
        "the receive queue went past SO_RCVBUF (soft limit): {queued}"
    );
    // A blocking sender waits instead.
    let now = net.now;
    assert!(matches!(
        net.engine(0)
            .send_to(now, blocking, Some(sa(B, 4001)), b"x", SendFlags::NONE),
        Err(RdsError::Blocked(dp_rds::Block::Congestion { port: 4001 }))
    ));
    // Seconds pass: nothing is dropped, nothing moves.
    net.run_for(Duration::from_secs(2));
    assert_eq!(net.engine(1).stats().recv_drop_no_sock, 0);
    // The application reads again: the port clears (below half of SO_RCVBUF), the update
    // reaches the sender, whose monitor reports it, and sending resumes.
    let mut got = 0u64;
    net.run_until(1_000_000, |net| {
        while let Some((m, _)) = net.recv(1, r) {
            assert_eq!(u64::from_le_bytes(m[1..9].try_into().unwrap()), got);
            got += 1;
        }
        got == sent
    });
    net.run_until(100_000, |net| {
        !net.engine(0).readiness(s).wrband() && net.engine(0).readiness(s).readable()
    });
    let now = net.now;
    let mut buf = [0u8; 16];
    let note = net
        .engine(0)
        .recv_from(now, s, &mut buf, dp_rds::RecvFlags::DONTWAIT)
        .unwrap();
    assert!(
        matches!(note, dp_rds::Received::CongUpdate(mask) if mask & (1 << (4001 % 64)) != 0),
        "{note:?}"
    );
    for i in 0..100 {
        net.send_blocking(0, s, sa(B, 4001), &msg(0, sent + i, 1000), 100_000)
            .unwrap();
    }
    net.send_blocking(0, blocking, sa(B, 4001), b"after", 100_000)
        .unwrap();
    net.run_until(1_000_000, |net| {
        while net.recv(1, r).is_some() {
            got += 1;
        }
        got == sent + 101
    });
    let a = net.engine(0).stats().clone();
    let b = net.engine(1).stats().clone();
    assert!(
        b.cong_update_queued >= 2 && a.cong_update_received >= 2,
        "congested, then clear"
    );
    println!(
        "stalled receiver ({}): {sent} sent before the stall, {enobufs} ENOBUFS, {queued} bytes queued \
         (SO_RCVBUF 65536), {} map updates queued, 0 dropped, 101 delivered after resuming",
        kind_name(&t),
        b.cong_update_queued
    );
}

#[test]
fn test_reliability_stalled_receiver_congestion_message_flavour() {
    stalled_receiver(ib());
}

#[test]
fn test_reliability_stalled_receiver_congestion_stream_flavour() {
    stalled_receiver(tcp());
}

#[test]
fn test_stalled_process_does_not_stop_other_peers() {
    let mut net = SimNet::new(SimConfig::default());
    net.add_node(engine_cfg("rds-st-a", 1, ib()), &[ip(A)]);
    net.add_node(engine_cfg("rds-st-b", 2, ib()), &[ip(B)]);
    net.add_node(engine_cfg("rds-st-c", 3, ib()), &[ip(C)]);
    let (s, _) = net.socket(0, sa(A, 4000));
    net.socket(1, sa(B, 4001));
    let (rc, _) = net.socket(2, sa(C, 4001));
    net.stall(1, true);
    for i in 0..50 {
        let now = net.now;
        let _ = net.engine(0).send_to(
            now,
            s,
            Some(sa(B, 4001)),
            &msg(0, i, 100),
            SendFlags::DONTWAIT,
        );
        net.send_blocking(0, s, sa(C, 4001), &msg(1, i, 100), 100_000)
            .unwrap();
    }
    let mut got = 0;
    net.run_until(500_000, |net| {
        while net.recv(2, rc).is_some() {
            got += 1;
        }
        got == 50
    });
}

#[test]
fn test_peer_restart_generation_change_flushes_and_restarts_sequences() {
    use dp_rds::path::PathId;
    use dp_rds::wire::{ExtHeader, ExtWriter, HeaderRepr};
    const P0: PathId = PathId { conn: 0, index: 0 };
    let mut net = pair(tcp(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    net.send_blocking(0, s, sa(B, 4001), b"before", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(1, r).is_some());
    let old_gen = net.engine(1).gen_num();
    // B stops acking: A's next messages stay unacked on its retransmit queue.
    net.stall(1, true);
    let now = net.now;
    for i in 0..5 {
        net.engine(0)
            .send_to(
                now,
                s,
                Some(sa(B, 4001)),
                &msg(0, i, 100),
                SendFlags::DONTWAIT,
            )
            .unwrap();
    }
    net.run_for(Duration::from_millis(2));
    let unacked: u32 = (0..8)
        .map(|i| {
            net.engine(0)
                .path(PathId { conn: 0, index: i })
                .unwrap()
                .retrans_queue_len()
        })
        .sum();
    assert_eq!(
        unacked, 5,
        "on the socket's path (multipath: not necessarily path 0)"
    );
    // B's process restarts: its first probe pong carries a new generation (sequence 1).
    let new_gen = old_gen ^ 0x5a5a_5a5a;
    let mut w = ExtWriter::new();
    w.push(ExtHeader::NPaths(8)).unwrap();
    w.push(ExtHeader::GenNum(new_gen)).unwrap();
    let pong = HeaderRepr {
        sequence: 1,
        sport: 0,
        dport: 1,
        ext: w.finish(),
        ..HeaderRepr::default()
    };
    let now = net.now;
    assert_eq!(
        net.engine(0)
            .handle_stream_bytes(now, P0, &pong.to_bytes(false)),
        48
    );
    let p = net.engine(0).path(P0).unwrap();
    assert_eq!(
        (p.next_tx_seq(), p.next_rx_seq()),
        (1, 0),
        "sequences start over"
    );
    assert_eq!(net.engine(0).stats().peer_gen_changed, 1);
    net.stall(1, false);
    net.restart_node(1, engine_cfg("rds-sim-b2", 77, tcp()));
    let (r2, _) = net.socket(1, sa(B, 4001));
    net.send_blocking(0, s, sa(B, 4001), b"after", 1_000_000)
        .unwrap();
    let mut old = 0;
    net.run_until(2_000_000, |net| {
        while let Some((m, _)) = net.recv(1, r2) {
            if m == b"after" {
                return true;
            }
            old += 1;
        }
        false
    });
    assert_eq!(
        old, 0,
        "messages to the old incarnation are not resent to the new one"
    );
    let a = net.engine(0).stats().clone();
    assert_eq!(a.send_drop_flushed, 5, "flushed, not resent");
    net.run_until(100_000, |net| net.engine(0).queued_bytes(s).unwrap().0 == 0);
    println!(
        "peer restart: generation {old_gen:#x} -> {new_gen:#x}: {} unacked messages flushed, sequences restarted at 1",
        a.send_drop_flushed
    );
}
