//! The rsocket stream state machine over the deterministic simulated fabric: credits,
//! buffer wrap, every shutdown variant, receiver-not-ready, peer death, error completions,
//! keepalive, iomap, protocol violations, and random send/receive sizes.

use std::time::Duration;

use dp_fabric::{Completion, WcOpcode, WcStatus};
use dp_rsocket::RsError;
use dp_rsocket::conn::{Buf, RS_SNDLOWAT, RsIo, Shutdown, StreamConfig, Violation, WR_RECV};
use dp_rsocket::sim::{SimPair, SimSide};
use dp_rsocket::wire::{BadConnData, ConnDataRepr, RsMsg, RsOp};
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
fn test_credit_exhaustion_buffers_in_the_send_ring_then_flushes_in_order() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // b never reads: a posts exactly rq_size (32) messages, then takes bytes into its send
    // ring until the ring is full, and only then would block.
    let mut sent = Vec::new();
    loop {
        let b = [pattern(sent.len())];
        match p.a.with(|c, io| c.send(&b, io)) {
            Ok(1) => sent.push(b[0]),
            Err(RsError::WouldBlock) => break,
            r => panic!("unexpected {r:?}"),
        }
        p.drive();
        assert!(sent.len() <= 17 << 10, "accepted beyond the send buffer");
    }
    assert_eq!(
        p.a.conn.stats().data_msgs_sent,
        32,
        "one message per credit granted, never more"
    );
    assert!(
        sent.len() >= 16 << 10,
        "the send buffer took bytes while out of credits: {}",
        sent.len()
    );
    assert!(
        !p.a.with(|c, io| c.readiness(io)).writable,
        "POLLOUT with a full send buffer"
    );
    // b reads everything: credits return, a writes the buffered bytes coalesced, and b
    // gets every byte in order.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut steps = 0;
    while got.len() < sent.len() {
        if let Ok(n) = p.b.with(|c, io| c.recv(&mut buf, false, io)) {
            got.extend_from_slice(&buf[..n]);
        }
        p.step();
        steps += 1;
        assert!(steps < 1_000_000, "stuck at {}/{}", got.len(), sent.len());
    }
    assert_eq!(got, sent);
    let msgs = p.a.conn.stats().data_msgs_sent;
    assert!(
        msgs < 32 + 16,
        "buffered bytes go out coalesced, not one message each: {msgs} messages"
    );
    assert_eq!(p.b.conn.stats().protocol_errors, 0);
    assert!(
        p.a.with(|c, io| c.readiness(io)).writable,
        "POLLOUT again once the buffer drained"
    );
}

#[test]
fn test_both_sides_writing_small_messages_before_reading_complete() {
    // Each side writes 1000 messages of 16 bytes before reading any: 31x the credits, but
    // less than its send buffer holds. TCP's buffering absorbs this; with message credits
    // alone both sides would wait for each other for good.
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    let msg = |side: u8, i: usize| -> [u8; 16] { [side ^ pattern(i); 16] };
    let n = 1000;
    let (mut a_sent, mut b_sent) = (0usize, 0usize);
    let mut steps = 0;
    while a_sent < n || b_sent < n {
        for (from_a, count) in [(true, &mut a_sent), (false, &mut b_sent)] {
            if *count < n {
                let m = msg(u8::from(from_a), *count);
                match side(&mut p, from_a).with(|c, io| c.send(&m, io)) {
                    Ok(16) => *count += 1,
                    Ok(k) => panic!("partial send {k}"),
                    Err(RsError::WouldBlock) => {}
                    Err(e) => panic!("send failed: {e}"),
                }
            }
        }
        p.step();
        steps += 1;
        assert!(
            steps < 1_000_000,
            "both sides stuck writing: a {a_sent}/{n}, b {b_sent}/{n}"
        );
    }
    for from_a in [true, false] {
        let want: Vec<u8> = (0..n).flat_map(|i| msg(u8::from(from_a), i)).collect();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < want.len() {
            if let Ok(k) = side(&mut p, !from_a).with(|c, io| c.recv(&mut buf, false, io)) {
                got.extend_from_slice(&buf[..k]);
            }
            p.step();
            steps += 1;
            assert!(steps < 2_000_000, "reading stuck at {}", got.len());
        }
        assert_eq!(got, want);
    }
}

#[test]
fn test_shutdown_write_follows_buffered_bytes() {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    // 40 one-byte sends on 32 credits: 8 bytes wait in a's send ring.
    for i in 0..40u8 {
        assert_eq!(p.a.with(|c, io| c.send(&[i], io)), Ok(1));
        p.drive();
    }
    p.a.with(|c, io| c.shutdown(Shutdown::Write, io));
    p.drive();
    assert!(
        !p.a.conn.shutdown_done(),
        "the shutdown waits for the buffered bytes"
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    let mut steps = 0;
    loop {
        match p.b.with(|c, io| c.recv(&mut buf, false, io)) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(RsError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        p.step();
        steps += 1;
        assert!(
            steps < 100_000,
            "no end of stream after {} bytes",
            got.len()
        );
    }
    assert_eq!(
        got,
        (0..40u8).collect::<Vec<_>>(),
        "every byte before the end"
    );
    p.drive();
    assert!(p.a.conn.shutdown_done());
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
    // iomap publications do not consume stream credits (librdmacm leaks one each): a
    // still posts 32 messages (the rest of what it sends waits in its send buffer).
    let before = p.a.conn.stats().data_msgs_sent;
    while let Ok(1) = p.a.with(|c, io| c.send(&[0u8], io)) {
        p.drive();
    }
    assert_eq!(p.a.conn.stats().data_msgs_sent - before, 32);
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
            invalidated: None,
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
        invalidated: None,
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

// -----------------------------------------------------------------------------------------
// Hostile peers: every value a peer supplies is checked against what this side granted.
// A violation is counted, fails the connection (ECONNRESET to the application) and never
// makes the state machine touch memory outside its own buffers.
// -----------------------------------------------------------------------------------------

/// A connected pair with the initial credit updates exchanged: each side has granted both
/// halves of its receive buffer (16 KiB) and 32 message credits.
fn fresh() -> SimPair {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    p.drive();
    p
}

/// Delivers `op | data` to side `s` as if its peer had sent it, with `byte_len` bytes
/// written, and processes it.
fn hostile(s: &mut SimSide, op: u32, data: u32, byte_len: u32) {
    s.inject(RsMsg::new(op, data).0, byte_len);
    s.progress();
}

const DATA: u32 = 0;
const RSVD_DATA_MORE: u32 = 1;
const WRITE: u32 = 2;
const RSVD_DRA_MORE: u32 = 3;
const SGL: u32 = 4;
const RSVD: u32 = 5;
const IOMAP_SGL: u32 = 6;
const CTRL: u32 = 7;

/// Side `s` accepted everything so far.
fn assert_healthy(s: &SimSide, what: &str) {
    assert_eq!(s.conn.stats().protocol_errors, 0, "{what}: rejected");
    assert!(s.conn.is_connected(), "{what}: connection failed");
    assert_eq!(
        s.st.bounds_faults(),
        0,
        "{what}: access outside a buffer: {:?}",
        s.st.last_bounds_fault()
    );
}

/// Side `s` saw a protocol error, for breaking `rule`: counted, the connection reset (`ECONNRESET` once the
/// data validated before it is read), and no access outside its own buffers on the way.
fn assert_protocol_error(s: &mut SimSide, rule: Violation, what: &str) {
    let rbuf = s.conn.config().rbuf_size as usize;
    let mut buf = vec![0u8; 1 << 16];
    let mut last = Ok(0);
    for _ in 0..64 {
        last = s.with(|c, io| c.recv(&mut buf, false, io));
        match last {
            Ok(n) if n > 0 => assert!(
                n <= rbuf,
                "{what}: recv returned {n} bytes, more than the {rbuf}-byte receive buffer \
                 ({} accesses outside a buffer, the last (buffer, offset, length): {:?})",
                s.st.bounds_faults(),
                s.st.last_bounds_fault()
            ),
            _ => break,
        }
    }
    assert_eq!(
        s.st.bounds_faults(),
        0,
        "{what}: access outside a buffer (buffer, offset, length): {:?}",
        s.st.last_bounds_fault()
    );
    assert!(
        s.conn.stats().protocol_errors >= 1,
        "{what}: no protocol error counted"
    );
    assert_eq!(
        s.conn.stats().last_violation,
        Some(rule),
        "{what}: another rule"
    );
    assert!(!s.conn.is_connected(), "{what}: connection still up");
    assert_eq!(last, Err(RsError::ConnReset), "{what}: not a reset");
    assert_eq!(
        s.conn.take_so_error(),
        Some(RsError::Io),
        "{what}: SO_ERROR"
    );
}

#[test]
fn test_sim_memory_refuses_accesses_outside_a_buffer() {
    // The detector the tests below rely on: an access past the end of a buffer is refused
    // and recorded, not wrapped, not a panic.
    let mut p = fresh();
    let rbuf = cfg().rbuf_size;
    let mut two = [0u8; 2];
    p.b.with(|_, io| {
        let _ = io.read(Buf::Rbuf, rbuf - 1, &mut two);
    });
    assert_eq!(p.b.st.bounds_faults(), 1);
    assert_eq!(p.b.st.last_bounds_fault(), Some((Buf::Rbuf, rbuf - 1, 2)));
    p.b.with(|_, io| {
        let _ = io.write(Buf::Target, cfg().target_len(), &[1]);
    });
    assert_eq!(p.b.st.bounds_faults(), 2);
}

#[test]
fn test_data_longer_than_granted_is_a_protocol_error() {
    // The security review's case: a 29-bit length far beyond the receive buffer. recv
    // must not return more than the buffer holds, nor read past it.
    let mut p = fresh();
    hostile(&mut p.b, DATA, 0x1FFF_FFFF, 0x1FFF_FFFF);
    assert_protocol_error(&mut p.b, Violation::DataBeyondGrant, "length 0x1FFF_FFFF");
    // Nothing the peer sends after a violation is looked at.
    hostile(&mut p.b, DATA, 1, 1);
    assert_eq!(p.b.conn.readable_bytes(), 0);
    assert_eq!(p.b.conn.stats().protocol_errors, 1);
    // Just over what was granted: both halves (16 KiB) plus one byte.
    let mut p = fresh();
    let granted = cfg().rbuf_size;
    hostile(&mut p.b, DATA, granted + 1, granted + 1);
    assert_protocol_error(&mut p.b, Violation::DataBeyondGrant, "granted + 1");
    // Before the first credit update only the first half is granted (both messages are
    // processed in one batch, before b's first credit update).
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    let half = cfg().rbuf_size / 2;
    p.b.inject(RsMsg::new(DATA, half).0, half);
    p.b.inject(RsMsg::new(DATA, 1).0, 1);
    p.b.progress();
    assert_protocol_error(
        &mut p.b,
        Violation::DataBeyondGrant,
        "beyond the half in the connection data",
    );
}

#[test]
fn test_data_crossing_the_end_of_its_half_is_a_protocol_error() {
    // Both halves are granted, so 8193 bytes are within the grant, but a librdmacm sender
    // clips every chunk to its target entry: no message crosses from one half into the
    // next.
    let mut p = fresh();
    let half = cfg().rbuf_size / 2;
    hostile(&mut p.b, DATA, 100, 100);
    assert_healthy(&p.b, "100 bytes");
    hostile(&mut p.b, DATA, half - 99, half - 99);
    assert_protocol_error(
        &mut p.b,
        Violation::DataCrossesHalf,
        "crossing from the first half into the second",
    );
}

#[test]
fn test_data_crossing_the_end_of_rbuf_is_a_protocol_error() {
    let mut p = fresh();
    let half = cfg().rbuf_size / 2;
    // The first half, filled and read: it is granted again (after the second).
    hostile(&mut p.b, DATA, half, half);
    let mut buf = vec![0u8; half as usize];
    assert_eq!(
        p.b.with(|c, io| c.recv(&mut buf, false, io)),
        Ok(half as usize)
    );
    p.b.progress();
    // Most of the second half.
    hostile(&mut p.b, DATA, half - 192, half - 192);
    assert_healthy(&p.b, "honest pattern");
    // 400 bytes are granted (192 at the end, a whole half after the wrap), but they would
    // run past the end of the receive buffer.
    hostile(&mut p.b, DATA, 400, 400);
    assert_protocol_error(
        &mut p.b,
        Violation::DataCrossesHalf,
        "crossing the end of rbuf",
    );
}

#[test]
fn test_data_filling_every_grant_exactly_is_accepted() {
    // The honest pattern at its limits: each half filled to its last byte in chunks that
    // end exactly at the half's end, read, granted again, for several laps.
    let mut p = fresh();
    let half = cfg().rbuf_size / 2;
    let mut buf = vec![0u8; cfg().rbuf_size as usize];
    for lap in 0..6 {
        hostile(&mut p.b, DATA, half - 1000, half - 1000);
        hostile(&mut p.b, DATA, 1000, 1000);
        assert_healthy(&p.b, "a half in two chunks");
        assert_eq!(
            p.b.with(|c, io| c.recv(&mut buf, false, io)),
            Ok(half as usize),
            "lap {lap}"
        );
        p.b.progress();
    }
}

#[test]
fn test_empty_data_is_a_protocol_error() {
    let mut p = fresh();
    hostile(&mut p.b, DATA, 0, 0);
    assert_protocol_error(&mut p.b, Violation::EmptyData, "zero-length data");
}

#[test]
fn test_data_byte_len_differing_from_its_immediate_is_a_protocol_error() {
    // The immediate claims more than the write carried: recv would return stale bytes.
    let mut p = fresh();
    hostile(&mut p.b, DATA, 100, 4);
    assert_protocol_error(
        &mut p.b,
        Violation::DataLenMismatch,
        "immediate longer than the write",
    );
    // Or less: the rest landed unannounced.
    let mut p = fresh();
    hostile(&mut p.b, DATA, 100, 200);
    assert_protocol_error(
        &mut p.b,
        Violation::DataLenMismatch,
        "immediate shorter than the write",
    );
}

#[test]
fn test_data_beyond_message_credits_is_a_protocol_error() {
    // Exactly rq_size (32) messages are granted; the 33rd is one too many.
    let mut p = fresh();
    for _ in 0..32 {
        hostile(&mut p.b, DATA, 1, 1);
    }
    assert_healthy(&p.b, "32 messages on 32 credits");
    hostile(&mut p.b, DATA, 1, 1);
    assert_protocol_error(
        &mut p.b,
        Violation::DataBeyondCredits,
        "33 messages on 32 credits",
    );
    // Credits are what was granted, not the room in the queue: after the application read
    // 10 messages (no credit update yet: fewer than rq_size/2 consumed), the limit is
    // still 32 messages in all.
    let mut p = fresh();
    for _ in 0..32 {
        hostile(&mut p.b, DATA, 1, 1);
    }
    let mut ten = [0u8; 10];
    assert_eq!(p.b.with(|c, io| c.recv(&mut ten, false, io)), Ok(10));
    p.b.progress();
    assert_eq!(
        p.b.conn.stats().credit_msgs_sent,
        1,
        "no new credits granted"
    );
    hostile(&mut p.b, DATA, 1, 1);
    assert_protocol_error(
        &mut p.b,
        Violation::DataBeyondCredits,
        "33 messages on 32 credits, 10 of them read",
    );
}

#[test]
fn test_message_credits_are_exact_across_u16_wrap() {
    // Honest traffic until the 16-bit sequence numbers are about to wrap, then the exact
    // limit straddling the wrap.
    let mut p = fresh();
    let mut buf = [0u8; 64];
    let mut delivered = 0u32;
    let rounds = |n: u32, p: &mut SimPair, buf: &mut [u8], delivered: &mut u32| {
        for _ in 0..n {
            let mut k = 0;
            while k < 32 {
                match p.a.with(|c, io| c.send(&[k as u8], io)) {
                    Ok(1) => k += 1,
                    Err(RsError::WouldBlock) => {
                        p.drive();
                    }
                    r => panic!("send: {r:?}"),
                };
            }
            p.drive();
            let n = p.b.with(|c, io| c.recv(buf, false, io)).unwrap();
            *delivered += n as u32;
            p.b.progress();
            p.drive();
        }
    };
    // 2047 rounds of 32 one-byte messages: 65504 messages.
    rounds(2047, &mut p, &mut buf, &mut delivered);
    assert_eq!(delivered, 65504);
    // 20 more: consumed 65524, and b grants 65524 + 32 = 65556, i.e. 20 after the wrap.
    for k in 0..20u8 {
        p.a.with(|c, io| c.send(&[k], io)).unwrap();
        p.drive();
    }
    assert_eq!(p.b.with(|c, io| c.recv(&mut buf, false, io)), Ok(20));
    p.b.progress();
    p.drive();
    assert_healthy(&p.a, "a after 65524 messages");
    assert_healthy(&p.b, "b after 65524 messages");
    // The peer may now send exactly 32 more (65525 ..= 65556): accepted across the wrap.
    for _ in 0..32 {
        hostile(&mut p.b, DATA, 1, 1);
    }
    assert_healthy(&p.b, "32 messages across the wrap");
    hostile(&mut p.b, DATA, 1, 1);
    assert_protocol_error(
        &mut p.b,
        Violation::DataBeyondCredits,
        "the 33rd message across the wrap",
    );
}

#[test]
fn test_credit_update_moving_the_limit_backwards_is_a_protocol_error() {
    let mut p = fresh();
    // b granted 0 + 32 in its first credit update. a sends 5.
    for _ in 0..5 {
        p.a.with(|c, io| c.send(b"x", io)).unwrap();
    }
    p.drive();
    // The same limit again is fine (a credit update that only returns buffer space).
    hostile(&mut p.a, SGL, 32, 16);
    assert_healthy(&p.a, "the same limit again");
    hostile(&mut p.a, SGL, 31, 0);
    assert_protocol_error(&mut p.a, Violation::CreditBackwards, "limit 32 -> 31");
}

#[test]
fn test_credit_update_beyond_the_peers_receive_queue_is_a_protocol_error() {
    // librdmacm grants rseq_no + rq_size: never more than rq_size (the credits in the
    // connection data) beyond what we sent.
    let mut p = fresh();
    for _ in 0..5 {
        p.a.with(|c, io| c.send(b"x", io)).unwrap();
    }
    p.drive();
    // At most 5 consumed: 37 is the largest honest limit (rseq_no 5 + rq_size 32).
    hostile(&mut p.a, SGL, 37, 0);
    assert_healthy(&p.a, "limit sseq_no + rq_size");
    hostile(&mut p.a, SGL, 38, 0);
    assert_protocol_error(
        &mut p.a,
        Violation::CreditBeyondPeerQueue,
        "limit sseq_no + rq_size + 1",
    );
    // The 29-bit field carries rseq_no + rq_size untruncated (at most 0xFFFF + 0xFFFE);
    // its low 16 bits are the limit. 0x2_0020 truncates to an honest 32, but no peer can
    // send it.
    let mut p = fresh();
    hostile(&mut p.a, SGL, 0x2_0020, 0);
    assert_protocol_error(&mut p.a, Violation::CreditBeyondPeerQueue, "limit 0x2_0020");
    let mut p = fresh();
    hostile(&mut p.a, SGL, 0x1FFF_FFFF, 0);
    assert_protocol_error(
        &mut p.a,
        Violation::CreditBeyondPeerQueue,
        "limit 0x1FFF_FFFF",
    );
}

#[test]
fn test_credit_update_before_establish_is_checked_against_the_connection_data() {
    // The passive side's first credit update can overtake the connection event on the
    // active side: honest, it grants exactly the credits of the connection data.
    let mut p = SimPair::unestablished(cfg(), cfg(), Duration::from_micros(1));
    hostile(&mut p.a, SGL, 32, 16);
    let (ra, rb) = p.establish_with(|_, _| {});
    assert_eq!((ra, rb), (Ok(()), Ok(())));
    p.drive();
    assert_healthy(&p.a, "early honest credit update");
    // More than the peer's receive queue allows.
    let mut p = SimPair::unestablished(cfg(), cfg(), Duration::from_micros(1));
    hostile(&mut p.a, SGL, 33, 16);
    let (ra, _) = p.establish_with(|_, _| {});
    assert_eq!(ra, Err(RsError::Invalid), "early limit 33 on 32 credits");
    assert_eq!(p.a.conn.stats().protocol_errors, 1);
    assert_eq!(
        p.a.conn.stats().last_violation,
        Some(Violation::CreditBeyondPeerQueue)
    );
    assert!(!p.a.conn.is_connected());
    // Or a second early update behind the first.
    let mut p = SimPair::unestablished(cfg(), cfg(), Duration::from_micros(1));
    hostile(&mut p.a, SGL, 32, 16);
    hostile(&mut p.a, SGL, 31, 0);
    assert_eq!(
        p.a.conn.stats().last_violation,
        Some(Violation::CreditBackwards)
    );
    let (ra, _) = p.establish_with(|_, _| {});
    assert!(ra.is_err(), "established after a violation");
}

#[test]
fn test_iomap_index_beyond_the_advertised_size_is_a_protocol_error() {
    // b advertised 4 iomap entries.
    let mut p = fresh();
    hostile(&mut p.b, IOMAP_SGL, 3, 24);
    assert_healthy(&p.b, "index 3 of 4");
    hostile(&mut p.b, IOMAP_SGL, 4, 24);
    assert_protocol_error(&mut p.b, Violation::IomapIndex, "index 4 of 4");
    let c = StreamConfig {
        target_iomap_size: 0,
        ..cfg()
    };
    let mut p = SimPair::connect(c, Duration::from_micros(1));
    p.drive();
    hostile(&mut p.b, IOMAP_SGL, 0, 24);
    assert_protocol_error(
        &mut p.b,
        Violation::IomapIndex,
        "index 0 with no iomap table",
    );
}

#[test]
fn test_write_op_in_an_immediate_is_a_protocol_error() {
    // riowrite is a plain RDMA WRITE: Write is a local tag, never an immediate.
    let mut p = fresh();
    hostile(&mut p.b, WRITE, 100, 100);
    assert_protocol_error(&mut p.b, Violation::WriteImm, "Write in an immediate");
}

#[test]
fn test_reserved_ops_are_protocol_errors() {
    for op in [RSVD_DATA_MORE, RSVD_DRA_MORE, RSVD] {
        let mut p = fresh();
        hostile(&mut p.b, op, 1, 0);
        assert_protocol_error(
            &mut p.b,
            Violation::ReservedOp,
            &format!("reserved op {op}"),
        );
    }
}

#[test]
fn test_unknown_control_values_are_protocol_errors() {
    // Keepalive (1) is a local tag: keepalives are writes without immediate.
    for code in [1, 3, 0x1FFF_FFFF] {
        let mut p = fresh();
        hostile(&mut p.b, CTRL, code, 0);
        assert_protocol_error(
            &mut p.b,
            Violation::UnknownCtrl,
            &format!("control code {code:#x}"),
        );
    }
}

#[test]
fn test_control_messages_with_a_payload_of_the_wrong_size_are_protocol_errors() {
    // Credit updates carry one 16-byte SGE or nothing; iomap updates one 24-byte entry;
    // control messages nothing.
    let mut p = fresh();
    hostile(&mut p.a, SGL, 32, 17);
    assert_protocol_error(
        &mut p.a,
        Violation::CreditLen,
        "credit update with 17 bytes",
    );
    let mut p = fresh();
    hostile(&mut p.b, IOMAP_SGL, 0, 16);
    assert_protocol_error(&mut p.b, Violation::IomapLen, "iomap update with 16 bytes");
    let mut p = fresh();
    hostile(&mut p.b, CTRL, 2, 8);
    assert_protocol_error(&mut p.b, Violation::CtrlLen, "shutdown with 8 bytes");
}

#[test]
fn test_conn_data_out_of_bounds_is_rejected() {
    type Tamper = fn(&mut ConnDataRepr);
    let cases: [(&str, Tamper, BadConnData); 8] = [
        ("no credits", |d| d.credits = 0, BadConnData::NoCredits),
        (
            "credits beyond RS_QP_MAX_SIZE",
            |d| d.credits = 0xFFFF,
            BadConnData::TooManyCredits,
        ),
        (
            "empty receive half",
            |d| d.data_buf.length = 0,
            BadConnData::EmptyReceiveBuffer,
        ),
        (
            "receive half beyond 2^30",
            |d| d.data_buf.length = (1 << 30) + 1,
            BadConnData::ReceiveBufferTooLarge,
        ),
        (
            "receive half ending past 2^64",
            |d| d.data_buf.addr = u64::MAX - 100,
            BadConnData::ReceiveBufferWraps,
        ),
        (
            "target list ending past 2^64",
            |d| d.target_sgl.addr = u64::MAX - 20,
            BadConnData::TargetListWraps,
        ),
        (
            "3 target entries",
            |d| d.target_sgl.length = 3,
            BadConnData::TargetSglEntries,
        ),
        (
            "iomap table beyond 32512 entries",
            |d| d.iomap_size = 40_000,
            BadConnData::IomapTooLarge,
        ),
    ];
    for (what, tamper, why) in cases {
        let mut p = SimPair::unestablished(cfg(), cfg(), Duration::from_micros(1));
        let (ra, rb) = p.establish_with(|_, db| tamper(db));
        assert!(ra.is_err(), "{what}: accepted");
        assert_eq!(rb, Ok(()), "{what}: the honest side");
        assert!(p.a.conn.stats().protocol_errors >= 1, "{what}: not counted");
        assert_eq!(
            p.a.conn.stats().last_violation,
            Some(Violation::ConnData(why)),
            "{what}"
        );
        assert!(!p.a.conn.is_connected(), "{what}: connected");
    }
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

/// Streams `msgs` 64-byte messages from a to b, the sender filling every credit at once
/// and the receiver reading all it has; b's progress passes and reads use `after_data`
/// (the socket layer's latency path) if `lazy`, else `after_completions`. Returns a's
/// receiver-not-ready waits.
fn stream_small(msgs: usize, lazy: bool) -> u64 {
    let mut p = SimPair::connect(cfg(), Duration::from_micros(1));
    let data: Vec<u8> = (0..msgs * 64).map(pattern).collect();
    let (mut sent, mut got, mut buf) = (0, Vec::with_capacity(data.len()), [0u8; 64]);
    let mut steps = 0;
    while got.len() < data.len() {
        while sent < data.len() {
            match p.a.with(|c, io| c.send(&data[sent..sent + 64], io)) {
                Ok(n) => sent += n,
                Err(RsError::WouldBlock) => break,
                Err(e) => panic!("send failed: {e}"),
            }
        }
        p.a.progress();
        if lazy {
            p.b.progress_data();
        } else {
            p.b.progress();
        }
        loop {
            let r = p.b.with(|c, io| {
                let r = c.recv(&mut buf, false, io);
                if matches!(r, Ok(n) if n > 0) {
                    if lazy {
                        c.after_data(io);
                    } else {
                        c.after_completions(io);
                    }
                }
                r
            });
            match r {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(RsError::WouldBlock) => break,
                Err(e) => panic!("recv failed: {e}"),
            }
        }
        p.deliver_due(true);
        p.deliver_due(false);
        p.tick(Duration::from_micros(1));
        steps += 1;
        assert!(
            steps < 200_000,
            "lazy {lazy}: stuck at {} of {} bytes",
            got.len(),
            data.len()
        );
    }
    assert!(got == data, "lazy {lazy}: the stream arrived altered");
    let errors = p.a.conn.stats().protocol_errors + p.b.conn.stats().protocol_errors;
    assert_eq!(errors, 0, "lazy {lazy}");
    p.a.st.rnr_waits
}

/// The socket layer's latency path lets re-posts of consumed receives wait
/// (`StreamConn::after_data`). A receiver that only ever takes that path still gets every
/// byte of a long stream of small messages, in order (re-posts and credits keep flowing
/// without a pass of `after_completions`), and its sender meets a missing receive no more
/// often than with prompt re-posts (credit updates go out with every consumed receive
/// re-posted).
#[test]
fn test_lazy_reposts_keep_the_stream_flowing() {
    let msgs = 20 * cfg().rq_size as usize;
    let prompt = stream_small(msgs, false);
    let lazy = stream_small(msgs, true);
    assert!(
        lazy <= prompt,
        "receiver-not-ready waits: {lazy} lazy, {prompt} prompt"
    );
}
