//! A hostile peer: every malformed frame is counted under its own name and costs only the
//! connection it arrived on (reset, then reconnect), never a panic, another connection's
//! data, or memory (the store is whole again afterwards).

mod common;

use std::time::Duration;

use common::*;
use dp_rds::path::{ConnState, PathId};
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::wire::{ExtHeader, ExtWriter, Flags, HeaderRepr};
use dp_rds::{SendFlags, Stats, TransportSpec};
use proptest::prelude::*;

const P0: PathId = PathId { conn: 0, index: 0 };

/// A, B and C; A talks to B (the connection under attack) and to C (a bystander).
fn setup(
    t: TransportSpec,
) -> (
    SimNet,
    dp_rds::RdsSocket,
    dp_rds::RdsSocket,
    dp_rds::RdsSocket,
) {
    let mut net = SimNet::new(SimConfig::default());
    net.add_node(engine_cfg("rds-h-a", 1, t), &[ip(A)]);
    net.add_node(engine_cfg("rds-h-b", 2, t), &[ip(B)]);
    net.add_node(engine_cfg("rds-h-c", 3, t), &[ip(C)]);
    let (sa_, _) = net.socket(0, sa(A, 4000));
    let (sb, _) = net.socket(1, sa(B, 4001));
    let (sc, _) = net.socket(2, sa(C, 4001));
    net.send_blocking(0, sa_, sa(B, 4001), b"hello", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(1, sb).is_some());
    (net, sa_, sb, sc)
}

fn hdr(seq: u64, len: u32, flags: Flags) -> HeaderRepr {
    HeaderRepr {
        sequence: seq,
        ack: 0,
        len,
        sport: 4000,
        dport: 4001,
        flags,
        credit: 0,
        ext: [0; 16],
    }
}

/// Injects frames at B's end of the A-B connection (as if A sent them).
fn inject(net: &mut SimNet, frames: &[(Vec<u8>, Vec<u8>)]) {
    for (h, p) in frames {
        let now = net.now;
        let _ = net.engine(1).handle_frame(now, P0, h, p);
    }
}

/// After an attack: B's path was reset, A-B works again after reconnecting, A-C was never
/// disturbed, and no message memory leaked.
fn check_recovery(
    mut net: SimNet,
    a: dp_rds::RdsSocket,
    b: dp_rds::RdsSocket,
    c: dp_rds::RdsSocket,
) -> Stats {
    let stats = net.engine(1).stats().clone();
    net.send_blocking(0, a, sa(C, 4001), b"bystander", 100_000)
        .unwrap();
    net.run_until(100_000, |net| net.recv(2, c).is_some());
    net.send_blocking(0, a, sa(B, 4001), b"again", 1_000_000)
        .unwrap();
    // Messages the attack got delivered before it was caught may come first.
    net.run_until(1_000_000, |net| {
        while let Some((m, _)) = net.recv(1, b) {
            if m == b"again" {
                return true;
            }
        }
        false
    });
    assert_eq!(
        net.engine(2).stats().conn_violation,
        0,
        "the bystander saw nothing"
    );
    net.run_for(Duration::from_millis(20));
    let f = net.engine(1).frags();
    assert_eq!(f.available(), f.count(), "no fragment leaked");
    stats
}

fn attack(frames: Vec<(Vec<u8>, Vec<u8>)>) -> Stats {
    let (mut net, a, b, c) = setup(ib());
    inject(&mut net, &frames);
    assert_ne!(
        net.engine(1).path_state(P0),
        Some(ConnState::Up),
        "the path was dropped"
    );
    check_recovery(net, a, b, c)
}

fn frame(h: HeaderRepr, payload: usize) -> (Vec<u8>, Vec<u8>) {
    (h.to_bytes(true).to_vec(), vec![0x5a; payload])
}

#[test]
fn test_hostile_truncated_header() {
    let s = attack(vec![(vec![0u8; 47], vec![])]);
    assert_eq!(s.recv_drop_truncated, 1);
    assert_eq!(s.conn_violation, 1);
}

#[test]
fn test_hostile_bad_checksum() {
    let (mut h, p) = frame(hdr(2, 10, Flags::empty()), 10);
    h[5] ^= 0x40;
    let s = attack(vec![(h, p)]);
    assert_eq!(s.recv_drop_bad_checksum, 1);
}

#[test]
fn test_hostile_h_len_above_1mib() {
    let s = attack(vec![frame(hdr(2, (1 << 20) + 1, Flags::empty()), 4096)]);
    assert_eq!(s.recv_drop_bad_len, 1);
}

#[test]
fn test_hostile_fragment_header_mismatch() {
    let s = attack(vec![
        frame(hdr(2, 8192, Flags::empty()), 4096),
        frame(hdr(3, 8192, Flags::empty()), 4096),
    ]);
    assert_eq!(s.recv_drop_frag_mismatch, 1);
}

#[test]
fn test_hostile_short_middle_fragment() {
    let s = attack(vec![frame(hdr(2, 8192, Flags::empty()), 100)]);
    assert_eq!(
        s.recv_drop_bad_frag_len, 1,
        "the kernel does not catch this one"
    );
}

#[test]
fn test_hostile_long_last_fragment() {
    let s = attack(vec![
        frame(hdr(2, 5000, Flags::empty()), 4096),
        frame(hdr(2, 5000, Flags::empty()), 1000),
    ]);
    assert_eq!(s.recv_drop_bad_frag_len, 1);
}

#[test]
fn test_hostile_sequence_zero_and_max() {
    assert_eq!(
        attack(vec![frame(hdr(0, 1, Flags::empty()), 1)]).recv_drop_bad_seq,
        1
    );
    assert_eq!(
        attack(vec![frame(hdr(u64::MAX, 1, Flags::empty()), 1)]).recv_drop_bad_seq,
        1
    );
}

#[test]
fn test_established_sequence_back_without_retransmitted_rewinds() {
    // As the kernel: taken (a restarted peer starts over), counted, not a violation.
    let (mut net, _a, b, _c) = setup(ib());
    inject(
        &mut net,
        &[
            frame(hdr(10, 1, Flags::empty()), 1),
            frame(hdr(5, 1, Flags::empty()), 1),
        ],
    );
    assert_eq!(net.engine(1).path_state(P0), Some(ConnState::Up));
    let s = net.engine(1).stats();
    assert_eq!((s.recv_seq_rewind, s.conn_violation), (1, 0));
    assert_eq!(net.engine(1).path(P0).unwrap().next_rx_seq(), 6);
    assert!(net.recv(1, b).is_some() && net.recv(1, b).is_some());
}

#[test]
fn test_established_old_retransmitted_dropped_and_acked() {
    let (mut net, _a, b, _c) = setup(ib());
    inject(
        &mut net,
        &[frame(
            hdr(1, 3, Flags::RETRANSMITTED.union(Flags::ACK_REQUIRED)),
            3,
        )],
    );
    let s = net.engine(1).stats().clone();
    assert_eq!(s.recv_drop_old_seq, 1, "sequence 1 already arrived");
    assert!(net.recv(1, b).is_none());
    assert!(
        net.engine(1).path(P0).unwrap().ack_state().requested,
        "a dropped duplicate is still acked"
    );
    // Gaps forward are legal (cancelled messages leave holes).
    inject(&mut net, &[frame(hdr(100, 3, Flags::empty()), 3)]);
    assert!(net.recv(1, b).is_some());
    assert_eq!(net.engine(1).stats().conn_violation, 0);
}

#[test]
fn test_hostile_credit_overflow() {
    let mut h = hdr(0, 0, Flags::empty());
    h.sport = 0;
    h.dport = 0;
    h.credit = 255;
    let frames = (0..70).map(|_| frame(h, 0)).collect();
    let s = attack(frames);
    assert_eq!(s.recv_drop_bad_credit, 1);
}

#[test]
fn test_hostile_cong_bitmap_with_other_flags() {
    let mut h = hdr(0, 8192, Flags::CONG_BITMAP.union(Flags::ACK_REQUIRED));
    h.sport = 0;
    h.dport = 0;
    let s = attack(vec![frame(h, 4096), frame(h, 4096)]);
    assert_eq!(s.recv_drop_bad_cong, 1);
}

#[test]
fn test_established_cong_map_wrong_length_ignored() {
    let (mut net, ..) = setup(ib());
    let mut h = hdr(0, 100, Flags::CONG_BITMAP);
    h.sport = 0;
    h.dport = 0;
    inject(&mut net, &[frame(h, 100)]);
    assert_eq!(
        net.engine(1).stats().recv_cong_bad_len,
        1,
        "ignored, as rds_ib_cong_recv does"
    );
    assert_eq!(net.engine(1).path_state(P0), Some(ConnState::Up));
}

#[test]
fn test_established_unknown_flags_and_exthdrs_counted_not_fatal() {
    let (mut net, _a, b, _c) = setup(ib());
    let mut h = hdr(2, 4, Flags(0x08 | 0x40));
    let mut area = [0u8; 16];
    area[0] = 9; // unknown, zero-length
    area[1] = 2; // RDMA, 4 bytes
    area[6] = 200; // >= 16: stop
    h.ext = area;
    inject(&mut net, &[frame(h, 4)]);
    assert_eq!(net.engine(1).stats().recv_unknown_flags, 1);
    assert!(net.recv(1, b).is_some(), "still delivered");
    assert_eq!(net.engine(1).path_state(P0), Some(ConnState::Up));
}

#[test]
fn test_established_ack_beyond_sent_ignored() {
    let (mut net, ..) = setup(ib());
    let mut h = hdr(0, 0, Flags::empty());
    h.sport = 0;
    h.dport = 0;
    h.ack = 1_000_000;
    inject(&mut net, &[frame(h, 0)]);
    let s = net.engine(1).stats();
    assert_eq!(s.recv_drop_bad_ack, 1);
    assert_eq!(
        s.conn_violation, 0,
        "ignored, not fatal: a restarted peer's stale ack looks like this"
    );
}

#[test]
fn test_hostile_probe_pong_with_bad_npaths() {
    // A multipath connection: probe pongs with NPATHS 0 or 255 are clamped, never trusted.
    let (mut net, a, _b, _c) = setup(tcp());
    for n in [0u16, 255, 3] {
        let mut w = ExtWriter::new();
        w.push(ExtHeader::NPaths(n)).unwrap();
        let mut h = hdr(50 + u64::from(n), 0, Flags::empty());
        h.sport = 0;
        h.dport = 1;
        h.ext = w.finish();
        let bytes = h.to_bytes(false);
        let now = net.now;
        // From B's side to A: A's end of the connection.
        let took = net.engine(0).handle_stream_bytes(now, P0, &bytes);
        assert_eq!(took, 48);
        let (_, _, np) = net.engine(0).connections().next().unwrap();
        assert!((1..=8).contains(&np) && np.is_power_of_two(), "npaths {np}");
    }
    let _ = a;
}

#[test]
fn test_hostile_stream_h_len_above_1mib() {
    let (mut net, a, b, c) = setup(tcp());
    let h = hdr(5, 2 << 20, Flags::empty()).to_bytes(false);
    let now = net.now;
    let took = net.engine(1).handle_stream_bytes(now, P0, &h);
    assert_eq!(took, 48);
    assert_eq!(
        net.engine(1).stats().recv_drop_bad_len,
        1,
        "the 2026 RDS-TCP fix, here from the start"
    );
    check_recovery(net, a, b, c);
}

#[test]
fn test_frames_on_a_down_path_ignored() {
    let (mut net, ..) = setup(ib());
    net.reset_link(1, P0);
    net.run_for(Duration::from_micros(1));
    let now = net.now;
    let state = net.engine(1).path_state(P0);
    if state != Some(ConnState::Up) && state != Some(ConnState::Connecting) {
        let _ =
            net.engine(1)
                .handle_frame(now, P0, &hdr(9, 1, Flags::empty()).to_bytes(true), &[1]);
        assert_eq!(net.engine(1).stats().recv_ignored_down, 1);
    }
}

fn any_frame() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    prop_oneof![
        // Raw garbage.
        (
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..5000)
        ),
        // Plausible headers with hostile fields, checksummed or not.
        (
            any::<u64>(),
            any::<u64>(),
            0u32..(2 << 20),
            any::<u16>(),
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
            any::<[u8; 16]>(),
            any::<bool>(),
            0usize..4200
        )
            .prop_map(|(seq, ack, len, sp, dp, fl, cr, ext, csum, n)| {
                let h = HeaderRepr {
                    sequence: seq % 64,
                    ack: ack % 64,
                    len: len % 20000,
                    sport: sp % 8,
                    dport: dp % 8 + 4000,
                    flags: Flags(fl),
                    credit: cr,
                    ext,
                };
                (h.to_bytes(csum).to_vec(), vec![0xa5; n])
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn test_hostile_random_frames_never_panic_or_leak(frames in prop::collection::vec(any_frame(), 1..40)) {
        let (mut net, a, b, c) = setup(ib());
        inject(&mut net, &frames);
        while net.recv(1, b).is_some() {}
        check_recovery(net, a, b, c);
    }

    #[test]
    fn test_hostile_random_stream_bytes_never_panic(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..20)) {
        let (mut net, a, b, c) = setup(tcp());
        for ch in &chunks {
            let now = net.now;
            let _ = net.engine(1).handle_stream_bytes(now, P0, ch);
        }
        while net.recv(1, b).is_some() {}
        let now = net.now;
        let _ = net.engine(0).send_to(now, a, Some(sa(B, 4001)), b"x", SendFlags::DONTWAIT);
        check_recovery(net, a, b, c);
    }
}
