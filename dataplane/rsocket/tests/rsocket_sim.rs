//! The rsocket stream state machine over the deterministic simulated fabric: credits,
//! buffer wrap, every shutdown variant, receiver-not-ready, peer death, error completions,
//! keepalive, iomap, protocol violations, and random send/receive sizes.

use std::time::Duration;

use dp_fabric::{Completion, WcOpcode, WcStatus};
use dp_rsocket::RsError;
use dp_rsocket::conn::{RS_SNDLOWAT, Shutdown, StreamConfig, WR_RECV};
use dp_rsocket::sim::{SimPair, SimSide};
use dp_rsocket::wire::{RsMsg, RsOp};
use proptest::prelude::*;

fn cfg() -> StreamConfig {
    StreamConfig {
        sq_size: 64,
        rq_size: 32,
        sbuf_size: 16 << 10,
        rbuf_size: 16 << 10,
        sq_inline: 64,
        target_iomap_size: 4,
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

fn side(p: &mut SimPair, a: bool) -> &mut SimSide {
    if a { &mut p.a } else { &mut p.b }
}

/// Sends all of `data` from one side, stepping the simulation while blocked, and reading
/// on the other side into `sink` so the sender never stalls for good.
fn transfer(p: &mut SimPair, from_a: bool, data: &[u8], read_chunk: usize) -> Vec<u8> {
    let mut sent = 0;
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; read_chunk.max(1)];
    let mut steps = 0;
    while got.len() < data.len() {
        if sent < data.len() {
            match side(p, from_a).with(|c, io| c.send(&data[sent..], io)) {
                Ok(n) => sent += n,
                Err(RsError::WouldBlock) => {}
                Err(e) => panic!("send failed: {e}"),
            }
        }
        match side(p, !from_a).with(|c, io| c.recv(&mut buf, false, io)) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(RsError::WouldBlock) => {}
            Err(e) => panic!("recv failed: {e}"),
        }
        p.step();
        steps += 1;
        assert!(
            steps < 2_000_000,
            "transfer stuck at {}/{} sent {sent}",
            got.len(),
            data.len()
        );
    }
    got
}

#[test]
fn test_established_exchange_both_ways() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    assert_eq!(
        transfer(&mut p, true, b"hello, rsocket", 64),
        b"hello, rsocket"
    );
    assert_eq!(transfer(&mut p, false, b"and back", 3), b"and back");
    assert!(p.a.conn.is_connected() && p.b.conn.is_connected());
}

#[test]
fn test_credit_exhaustion_blocks_then_resumes() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // b never reads: a may send exactly rq_size (32) messages.
    let mut sent = 0;
    loop {
        match p.a.with(|c, io| c.send(&[1u8], io)) {
            Ok(1) => sent += 1,
            Err(RsError::WouldBlock) => break,
            r => panic!("unexpected {r:?}"),
        }
        p.drive();
        assert!(sent <= 32, "sent beyond the credits granted");
    }
    assert_eq!(sent, 32, "initial credits are the peer's rq_size");
    assert!(
        !p.a.with(|c, io| c.readiness(io)).writable,
        "POLLOUT while out of credits"
    );
    // b reads everything: credits return and a proceeds.
    let mut buf = [0u8; 64];
    let n = p.b.with(|c, io| c.recv(&mut buf, false, io)).unwrap();
    assert_eq!(n, 32);
    p.drive();
    assert_eq!(
        p.a.with(|c, io| c.send(&[2u8], io)),
        Ok(1),
        "credits came back"
    );
}

#[test]
fn test_receive_buffer_wrap_and_target_sgl_alternation() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(2));
    p.drive();
    // 10x the receive buffer, read in odd-sized pieces: the two target entries alternate
    // and the ring wraps many times.
    let data: Vec<u8> = (0..160 << 10).map(pattern).collect();
    let got = transfer(&mut p, true, &data, 3000);
    assert_eq!(got, data);
    assert!(p.b.conn.stats().credit_msgs_sent > 10);
}

#[test]
fn test_send_buffer_wrap_uses_two_segments() {
    let c = StreamConfig {
        sbuf_size: 4096,
        sq_inline: 0,
        ..cfg()
    };
    let mut p = SimPair::connect(c, Duration::from_micros(1));
    p.drive();
    let data: Vec<u8> = (0..50_000).map(pattern).collect();
    assert_eq!(transfer(&mut p, true, &data, 1000), data);
}

#[test]
fn test_chunk_schedule_doubles_to_64k() {
    let c = StreamConfig {
        sbuf_size: 1 << 20,
        rbuf_size: 1 << 21,
        sq_inline: 0,
        ..cfg()
    };
    let mut p = SimPair::connect(c, Duration::from_micros(1));
    p.drive();
    let data = vec![7u8; 300_000];
    let n = p.a.with(|c, io| c.send(&data, io)).unwrap();
    // 2048, 4096, 8192, 16384, 32768, then 65536 per chunk, the last one the remainder
    // (the 1 MiB target half never clips here).
    assert_eq!(n, 300_000);
    let mut schedule = vec![];
    let (mut left, mut olen) = (300_000u32, 2048u32);
    while left > 0 {
        let x = if olen < left {
            let x = olen;
            if olen < 65536 {
                olen <<= 1;
            }
            x
        } else {
            left
        };
        schedule.push(x);
        left -= x;
    }
    assert_eq!(
        schedule,
        [2048, 4096, 8192, 16384, 32768, 65536, 65536, 65536, 39904]
    );
    assert_eq!(p.a.conn.stats().data_msgs_sent, schedule.len() as u64);
    let got = transfer(&mut p, true, &[], 1);
    assert!(got.is_empty());
}

#[test]
fn test_shutdown_write_is_half_close() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p.a.with(|c, io| c.send(b"last words", io)).unwrap();
    p.a.with(|c, io| c.shutdown(Shutdown::Write, io));
    p.drive();
    assert!(p.a.conn.shutdown_done());
    let mut buf = [0u8; 32];
    assert_eq!(p.b.with(|c, io| c.recv(&mut buf, false, io)), Ok(10));
    assert_eq!(&buf[..10], b"last words");
    assert_eq!(
        p.b.with(|c, io| c.recv(&mut buf, false, io)),
        Ok(0),
        "EOF after the data"
    );
    assert_eq!(p.a.with(|c, io| c.send(b"x", io)), Err(RsError::ConnReset));
    // The other direction still works.
    assert_eq!(transfer(&mut p, false, b"reply", 8), b"reply");
    // b shuts down too: a sees the connection closed.
    p.b.with(|c, io| c.shutdown(Shutdown::Write, io));
    p.drive();
    assert!(p.a.conn.is_disconnected() && p.b.conn.is_disconnected());
}

#[test]
fn test_shutdown_read_sends_nothing_while_writable() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p.a.with(|c, io| c.shutdown(Shutdown::Read, io));
    p.drive();
    let mut buf = [0u8; 8];
    assert_eq!(p.a.with(|c, io| c.recv(&mut buf, false, io)), Ok(0));
    // a can still send; b is unaffected.
    assert_eq!(transfer(&mut p, true, b"still", 8), b"still");
    assert!(p.b.conn.is_connected());
    // Shutting down writing as well now disconnects.
    p.a.with(|c, io| c.shutdown(Shutdown::Write, io));
    p.drive();
    assert!(p.a.conn.is_disconnected() && p.b.conn.is_disconnected());
}

#[test]
fn test_shutdown_both_disconnects_after_data() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p.a.with(|c, io| c.send(b"queued", io)).unwrap();
    p.a.with(|c, io| c.shutdown(Shutdown::Both, io));
    p.drive();
    assert!(p.a.conn.is_disconnected());
    assert!(p.b.with(|c, io| c.readiness(io)).hup);
    let mut buf = [0u8; 16];
    assert_eq!(
        p.b.with(|c, io| c.recv(&mut buf, false, io)),
        Ok(6),
        "data before the disconnect is delivered"
    );
    assert_eq!(p.b.with(|c, io| c.recv(&mut buf, false, io)), Ok(0));
    assert_eq!(p.b.with(|c, io| c.send(b"x", io)), Err(RsError::ConnReset));
}

#[test]
fn test_receiver_not_ready_waits_and_delivers_in_order() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // For 1 ms b's re-posted receives are held back: once its 32 initial receives are
    // used, a's writes with immediate must wait (receiver not ready), never drop.
    p.b.st.withhold_until = Some(p.now().saturating_add(Duration::from_millis(1)));
    let data: Vec<u8> = (0..200 * 64).map(pattern).collect();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut steps = 0;
    for chunk in data.chunks(64) {
        loop {
            match p.a.with(|c, io| c.send(chunk, io)) {
                Ok(64) => break,
                Ok(n) => panic!("partial send {n}"),
                Err(RsError::WouldBlock) => {}
                Err(e) => panic!("{e}"),
            }
            if let Ok(n) = p.b.with(|c, io| c.recv(&mut buf, false, io)) {
                got.extend_from_slice(&buf[..n]);
            }
            p.step();
            steps += 1;
            assert!(steps < 1_000_000);
        }
    }
    while got.len() < data.len() {
        if let Ok(n) = p.b.with(|c, io| c.recv(&mut buf, false, io)) {
            got.extend_from_slice(&buf[..n]);
        }
        p.step();
        steps += 1;
        assert!(steps < 2_000_000);
    }
    assert_eq!(got, data);
    assert!(
        p.a.st.rnr_waits > 0,
        "the test did not exercise receiver-not-ready"
    );
}

#[test]
fn test_peer_death_is_reset() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    assert_eq!(transfer(&mut p, true, b"before", 8), b"before");
    p.b.with(|c, io| c.send(b"unread", io)).unwrap();
    p.drive();
    p.kill(false);
    let _ = p.a.with(|c, io| c.send(b"into the void", io));
    p.drive();
    assert!(p.errored(true));
    let mut buf = [0u8; 16];
    assert_eq!(
        p.a.with(|c, io| c.recv(&mut buf, false, io)),
        Ok(6),
        "queued data still readable"
    );
    assert_eq!(
        p.a.with(|c, io| c.recv(&mut buf, false, io)),
        Err(RsError::ConnReset)
    );
    assert_eq!(p.a.with(|c, io| c.send(b"x", io)), Err(RsError::ConnReset));
    assert_eq!(p.a.conn.take_so_error(), Some(RsError::Io));
    assert_eq!(p.a.conn.take_so_error(), None, "SO_ERROR clears on read");
    assert!(p.a.with(|c, io| c.readiness(io)).err);
}

#[test]
fn test_error_completion_fails_connection() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p.a.st.fail_next = Some((1, WcStatus::RemAccessErr));
    p.a.with(|c, io| c.send(b"doomed", io)).unwrap();
    p.drive();
    assert_eq!(p.a.with(|c, io| c.send(b"x", io)), Err(RsError::ConnReset));
    assert_eq!(p.a.conn.take_so_error(), Some(RsError::Io));
}

#[test]
fn test_keepalive_detects_dead_peer() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    let now = p.now();
    p.a.conn.set_keepalive(Some(Duration::from_secs(1)), now);
    p.advance(Duration::from_millis(3500));
    assert!(
        p.a.conn.is_connected(),
        "keepalives to a live peer are harmless"
    );
    p.kill(false);
    p.advance(Duration::from_secs(2));
    assert!(
        !p.a.conn.is_connected(),
        "a keepalive to a dead peer fails the connection"
    );
    assert_eq!(p.a.conn.take_so_error(), Some(RsError::Io));
}

#[test]
fn test_iomap_and_iowrite() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // b publishes two adjacent mappings at application offsets 0..100 and 100..200.
    let m0 = p.b.st.iomem_sge(1000, 100);
    let m1 = p.b.st.iomem_sge(5000, 100);
    p.b.conn.iomap(0, m0).unwrap();
    p.b.conn.iomap(100, m1).unwrap();
    // Publication rides on b's next send.
    assert_eq!(transfer(&mut p, false, b"!", 4), b"!");
    let data: Vec<u8> = (0..150).map(|i| i as u8).collect();
    let n = p.a.with(|c, io| c.iowrite(&data, 50, io)).unwrap();
    assert_eq!(
        n, 150,
        "a write crossing into the adjacent mapping continues there"
    );
    p.drive();
    assert_eq!(&p.b.st.iomem[1050..1100], &data[..50]);
    assert_eq!(&p.b.st.iomem[5000..5100], &data[50..]);
    assert_eq!(
        p.a.with(|c, io| c.iowrite(b"x", 200, io)),
        Err(RsError::Invalid)
    );
    // iomap publications do not consume stream credits (librdmacm leaks one each).
    let mut sent = 0;
    while let Ok(1) = p.a.with(|c, io| c.send(&[0u8], io)) {
        sent += 1;
        p.drive();
    }
    assert_eq!(sent, 32);
}

#[test]
fn test_peer_exceeding_credits_is_a_protocol_error() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // Inject 40 data messages on b without a's credits (a buggy or hostile peer).
    for i in 0..40u64 {
        let c = Completion {
            wr_id: WR_RECV | (1000 + i),
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 1,
            imm: Some(RsMsg::with(RsOp::Data, 1).0),
            qp_num: 2,
            src_qp: 0,
        };
        p.b.with(|conn, io| conn.handle_completion(&c, io));
    }
    assert!(p.b.conn.stats().protocol_errors >= 1);
    assert!(!p.b.conn.is_connected());
    // A receive without an immediate is also a protocol error.
    let mut q = SimPair::connect(cfg(), Duration::from_micros(1));
    q.drive();
    let c = Completion {
        wr_id: WR_RECV,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
        qp_num: 2,
        src_qp: 0,
    };
    q.a.with(|conn, io| conn.handle_completion(&c, io));
    assert_eq!(q.a.conn.stats().protocol_errors, 1);
    let _ = RS_SNDLOWAT;
}

#[test]
fn test_peek_leaves_data_queued() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p.a.with(|c, io| c.send(b"peekaboo", io)).unwrap();
    p.drive();
    let mut buf = [0u8; 4];
    assert_eq!(p.b.with(|c, io| c.recv(&mut buf, true, io)), Ok(4));
    assert_eq!(&buf, b"peek");
    let mut all = [0u8; 8];
    assert_eq!(p.b.with(|c, io| c.recv(&mut all, false, io)), Ok(8));
    assert_eq!(&all, b"peekaboo");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_send_and_receive_sizes_are_byte_exact(
        sends in proptest::collection::vec(1usize..20_000, 1..20),
        reads in proptest::collection::vec(1usize..9_000, 1..20),
        inline in prop_oneof![Just(0u32), Just(64), Just(400)],
        sbuf_kib in 4u32..64,
        rbuf_kib in 4u32..64,
    ) {
        let c = StreamConfig {
            sbuf_size: sbuf_kib << 10,
            rbuf_size: rbuf_kib << 10,
            sq_inline: inline,
            ..cfg()
        };
        let mut p = SimPair::connect(c, Duration::from_micros(1));
        p.drive();
        let total: usize = sends.iter().sum();
        let data: Vec<u8> = (0..total).map(pattern).collect();
        let mut sent = 0;
        let mut si = 0;
        let mut got = Vec::with_capacity(total);
        let mut ri = 0;
        let mut steps = 0;
        let mut buf = vec![0u8; 9_000];
        while got.len() < total {
            if si < sends.len() {
                let end = (sent + sends[si]).min(total);
                match p.a.with(|c, io| c.send(&data[sent..end], io)) {
                    Ok(n) => { sent += n; if sent == end { si += 1; } }
                    Err(RsError::WouldBlock) => {}
                    Err(e) => prop_assert!(false, "send: {e}"),
                }
            }
            let want = reads[ri % reads.len()];
            match p.b.with(|c, io| c.recv(&mut buf[..want], false, io)) {
                Ok(n) => { got.extend_from_slice(&buf[..n]); ri += 1; }
                Err(RsError::WouldBlock) => {}
                Err(e) => prop_assert!(false, "recv: {e}"),
            }
            p.step();
            steps += 1;
            prop_assert!(steps < 1_000_000, "stuck");
        }
        prop_assert_eq!(got, data);
    }
}
