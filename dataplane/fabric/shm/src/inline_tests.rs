//! Payloads that ride in the inbound slot: WRITEs with immediate that the sender lets the
//! responder place at poll time
//! ([`SendFlags::PLACE_ON_POLL`]): up to [`SLOT_INLINE`] bytes travel in the inbound slot
//! and reach their destination when the responder polls the completion, not before; longer
//! ones, and requests without the flag, are placed at once as before; and SENDs of up to
//! [`SLOT_INLINE`] bytes, which always ride in the slot. Also the completion queue's cheap
//! look ([`CompletionQueue::may_have_work`]) that spinning
//! callers take before a poll.

use dp_fabric::{
    Completion, CompletionQueue, MemoryRegion, Payload, RcQueuePair, RecvWr, SendFlags, SendOp,
    SendWr, WcOpcode, WcStatus,
};

use crate::hostile_tests::pair;
use crate::qpseg::SLOT_INLINE;

/// Posts one WRITE with immediate of `len` pattern bytes to offset `off` of the passive
/// side's buffer, inline bytes or a gather entry, and waits for its send completion.
fn write_imm(
    p: &mut dp_fabric::conformance::Pair<crate::Shm>,
    off: usize,
    len: usize,
    sgl: bool,
    flags: SendFlags,
) {
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ 0xA5).collect();
    p.a.fill(0, len, |i| (i as u8) ^ 0xA5);
    let sge = [p.a.mr.sge(0, len as u32)];
    let payload = if sgl {
        Payload::Sgl(&sge)
    } else {
        Payload::Inline(&bytes)
    };
    p.a.qp
        .post_send(&[SendWr {
            wr_id: off as u64,
            op: SendOp::WriteImm(p.b.remote(off), len as u32),
            payload,
            flags: SendFlags::SIGNALED | flags,
        }])
        .expect("post_send");
    let mut out = [Completion::default(); 4];
    for _ in 0..1_000_000 {
        let n = p.a.cq.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| c.wr_id == off as u64) {
            assert!(c.is_ok(), "{c:?}");
            return;
        }
    }
    panic!("the send never completed");
}

/// True if the passive side's buffer holds the pattern of `len` bytes at `off`.
fn placed(p: &dp_fabric::conformance::Pair<crate::Shm>, off: usize, len: usize) -> bool {
    (0..len).all(|i| p.b.byte(off + i) == (i as u8) ^ 0xA5)
}

/// Polls the passive side until its receive completes; returns the completion.
fn recv_one(p: &mut dp_fabric::conformance::Pair<crate::Shm>) -> Completion {
    let mut out = [Completion::default(); 4];
    for _ in 0..1_000_000 {
        if p.b.cq.poll(&mut out[..1]) == 1 {
            return out[0];
        }
    }
    panic!("the receive never completed");
}

#[test]
fn test_small_write_imm_is_placed_when_polled() {
    let (mut p, dir) = pair(22_200);
    for i in 0..8 {
        p.b.qp
            .post_recv(&[RecvWr { wr_id: i, sgl: &[] }])
            .expect("post_recv");
    }
    let cases = [
        // (offset, length, gather entry, flags, deferred)
        (0, 64, false, SendFlags::PLACE_ON_POLL, true),
        (4096, SLOT_INLINE, true, SendFlags::PLACE_ON_POLL, true),
        (8192, 1, false, SendFlags::PLACE_ON_POLL, true),
        (
            12288,
            SLOT_INLINE + 1,
            true,
            SendFlags::PLACE_ON_POLL,
            false,
        ),
        (16384, 64, false, SendFlags::NONE, false),
    ];
    for (k, &(off, len, sgl, flags, deferred)) in cases.iter().enumerate() {
        write_imm(&mut p, off, len, sgl, flags);
        assert_eq!(
            placed(&p, off, len),
            !deferred,
            "case {k}: {len} bytes placed {} the responder polled",
            if deferred { "before" } else { "only after" }
        );
        let c = recv_one(&mut p);
        assert!(c.is_ok(), "case {k}: {c:?}");
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm, "case {k}");
        assert_eq!(
            (c.byte_len, c.imm),
            (len as u32, Some(len as u32)),
            "case {k}"
        );
        assert!(
            placed(&p, off, len),
            "case {k}: data not visible at completion"
        );
    }
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// A SEND_WITH_INV of a key that names no window of the receiver's (shm has remote
/// invalidation of memory windows, module `mw_tests`) reaches the peer as a SEND and fails
/// the receive it consumes with a remote invalid request error.
#[test]
fn test_send_with_invalidate_of_an_unknown_key_fails_the_receive() {
    let (mut p, dir) = pair(22_207);
    p.b.qp
        .post_recv(&[RecvWr { wr_id: 7, sgl: &[] }])
        .expect("post_recv");
    p.a.qp
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::SendInv(0x1234),
            payload: Payload::Sgl(&[]),
            flags: SendFlags::SIGNALED,
        }])
        .expect("post SEND_WITH_INV");
    let c = recv_one(&mut p);
    assert_eq!(
        (c.wr_id, c.status, c.invalidated),
        (7, WcStatus::RemInvReqErr, None),
        "{c:?}"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// Polls `cq` until it yields nothing three times in a row.
fn drain(cq: &mut crate::ShmCq) {
    let mut out = [Completion::default(); 8];
    let mut empty = 0;
    while empty < 3 {
        if cq.poll(&mut out) == 0 {
            empty += 1;
        } else {
            empty = 0;
        }
    }
}

/// The cheap look says "nothing" only when a poll finds nothing: it sees a published
/// inbound message, a send completion waiting in the local ring, a fault the peer flagged
/// and the error state, and says nothing once they are polled.
#[test]
fn test_may_have_work_sees_what_poll_would_find() {
    let (mut p, dir) = pair(22_230);
    p.b.qp
        .post_recv(&[RecvWr { wr_id: 1, sgl: &[] }])
        .expect("post_recv");
    drain(&mut p.a.cq);
    drain(&mut p.b.cq);
    assert!(!p.a.cq.may_have_work(), "idle sender");
    assert!(!p.b.cq.may_have_work(), "idle receiver");

    let bytes = [0x5Au8; 64];
    p.a.qp
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::WriteImm(p.b.remote(0), 64),
            payload: Payload::Inline(&bytes),
            flags: SendFlags::SIGNALED | SendFlags::PLACE_ON_POLL,
        }])
        .expect("post_send");
    assert!(p.b.cq.may_have_work(), "an inbound message is published");
    assert!(p.a.cq.may_have_work(), "a send completion waits");
    let c = recv_one(&mut p);
    assert_eq!((c.wr_id, c.byte_len), (1, 64), "{c:?}");
    drain(&mut p.a.cq);
    assert!(!p.b.cq.may_have_work(), "the message was polled");
    assert!(!p.a.cq.may_have_work(), "the completion was polled");

    // What the peer may write into our segment to fail the queue pair: a fault.
    // Release: as the peer's store (pairs with the Acquire in RecvWatch::pending/drain_recv).
    p.b.qp.core.view.header().fault.store(
        WcStatus::RemAccessErr.to_raw(),
        core::sync::atomic::Ordering::Release,
    );
    assert!(p.b.cq.may_have_work(), "a fault flagged by the peer");
    drain(&mut p.b.cq);
    assert_eq!(p.b.qp.state(), dp_fabric::QpState::Error);
    assert!(
        p.b.cq.may_have_work(),
        "the error state (receives to flush)"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// Send completions are announced on the completion queue's hot line (`cq_shared`): a
/// poll whose output fills before the ring is empty leaves the flag up, so the cheap look
/// and the next polls find the rest, and no completion is lost or reported twice.
#[test]
fn test_a_poll_that_fills_its_output_leaves_the_rest_announced() {
    let (mut p, dir) = pair(22_235);
    drain(&mut p.a.cq);
    assert!(!p.a.cq.may_have_work(), "idle sender");
    let bytes = [0x3Cu8; 16];
    let wrs: Vec<SendWr<'_>> = (0..5u64)
        .map(|i| SendWr {
            wr_id: 100 + i,
            op: SendOp::Write(p.b.remote(64 * i as usize)),
            payload: Payload::Inline(&bytes),
            flags: SendFlags::SIGNALED,
        })
        .collect();
    p.a.qp.post_send(&wrs).expect("post_send");
    let mut out = [Completion::default(); 2];
    let mut got = Vec::new();
    for _ in 0..3 {
        assert!(p.a.cq.may_have_work(), "after {} of 5", got.len());
        let n = p.a.cq.poll(&mut out);
        assert!(n > 0, "a poll found nothing after {} of 5", got.len());
        got.extend(out[..n].iter().map(|c| c.wr_id));
    }
    assert_eq!(got, [100, 101, 102, 103, 104], "each once, in order");
    assert!(!p.a.cq.may_have_work(), "every completion was polled");
    assert_eq!(p.a.cq.poll(&mut out), 0);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// SENDs of up to [`SLOT_INLINE`] bytes ride in the inbound slot, longer ones in the bounce
/// buffer; either way the receive gets the bytes, length and immediate, and only the long
/// ones move the bounce buffer's counters.
#[test]
fn test_send_payloads_land_from_the_slot_or_the_bounce_buffer() {
    let (mut p, dir) = pair(22_240);
    let cases = [0, 1, 48, 64, SLOT_INLINE, SLOT_INLINE + 1, 4096];
    for (k, &len) in cases.iter().enumerate() {
        let off = k * 8192;
        let sge = [p.b.mr.sge(off, 8192)];
        p.b.qp
            .post_recv(&[RecvWr {
                wr_id: k as u64,
                sgl: &sge,
            }])
            .expect("post_recv");
        let pat = |i: usize| (i as u8).wrapping_mul(7) ^ k as u8;
        p.a.fill(off, len, pat);
        let src = [p.a.mr.sge(off, len as u32)];
        let op = if k % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendImm(0xC0DE_0000 | k as u32)
        };
        p.a.qp
            .post_send(&[SendWr {
                wr_id: 100 + k as u64,
                op,
                payload: Payload::Sgl(&src),
                flags: SendFlags::SIGNALED,
            }])
            .expect("post_send");
        let c = recv_one(&mut p);
        assert!(c.is_ok(), "{len} bytes: {c:?}");
        assert_eq!(c.opcode, WcOpcode::Recv, "{len} bytes");
        assert_eq!(c.byte_len, len as u32, "{len} bytes");
        let imm = (k % 2 == 1).then_some(0xC0DE_0000 | k as u32);
        assert_eq!(c.imm, imm, "{len} bytes");
        let bad = (0..len).find(|&i| p.b.byte(off + i) != pat(i));
        assert_eq!(bad, None, "{len} bytes: first wrong byte");
        drain(&mut p.a.cq);
        // Relaxed: read after the completion, on the thread that polled it.
        let released =
            p.b.qp
                .core
                .view
                .header()
                .bounce_tail
                .load(core::sync::atomic::Ordering::Relaxed);
        let long: u64 = cases[..=k]
            .iter()
            .filter(|&&l| l > SLOT_INLINE)
            .map(|&l| l as u64)
            .sum();
        assert_eq!(released, long, "after {len} bytes: bounce bytes released");
    }
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
