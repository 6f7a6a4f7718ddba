//! Per-queue-pair request tracking: the hardware `wr_id` encoding, the tables that give the
//! caller's `wr_id` back, and send/receive queue accounting.
//!
//! Every request posted to the hardware carries, instead of the caller's `wr_id`,
//!
//! ```text
//!   bit 63      bits 40..56   bits 0..40
//!   receive?    queue-pair tag  sequence number (low 40 bits)
//! ```
//!
//! The sequence number indexes a slot that holds the caller's `wr_id`, the full sequence
//! number and (for sends) the operation. The completion queue decodes the `wr_id`, finds the
//! queue pair by number, checks the tag, restores the caller's `wr_id`, and retires every
//! request up to the one completed: on a send queue one signalled completion retires the
//! unsignalled requests before it, which is the verbs rule for reusing send-queue slots.
//!
//! Poster and poller may be different threads: the poster writes a slot before posting the
//! request, the poller reads it after the hardware completed the request. The slot's
//! sequence number is stored last with Release and loaded first with Acquire.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::conv::{opcode_code, opcode_from_code};
use dp_fabric::types::{QpState, WcOpcode};

const RECV_BIT: u64 = 1 << 63;
const TAG_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// Hands out queue-pair tags.
static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

/// The hardware `wr_id` of request `seq` of a queue pair with tag `tag`.
#[inline]
pub(crate) const fn encode(recv: bool, tag: u16, seq: u64) -> u64 {
    (if recv { RECV_BIT } else { 0 }) | ((tag as u64) << TAG_SHIFT) | (seq & SEQ_MASK)
}

/// Decodes [`encode`]: (receive?, tag, low sequence bits).
#[inline]
pub(crate) const fn decode(wr_id: u64) -> (bool, u16, u64) {
    (
        wr_id & RECV_BIT != 0,
        ((wr_id >> TAG_SHIFT) & 0xFFFF) as u16,
        wr_id & SEQ_MASK,
    )
}

struct SendSlot {
    seq: AtomicU64,
    wr_id: AtomicU64,
    opcode: AtomicU32,
}

struct RecvSlot {
    seq: AtomicU64,
    wr_id: AtomicU64,
}

/// What a completion names, after decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The caller's `wr_id`.
    pub wr_id: u64,
    /// True for a receive.
    pub recv: bool,
    /// The operation of a send (undefined for receives).
    pub opcode: WcOpcode,
}

/// The tracking state of one queue pair, shared by its owner (posting) and its completion
/// queues (polling).
pub(crate) struct Track {
    /// Queue pair number.
    pub qpn: u32,
    /// Tells this queue pair's completions from those of an earlier one with the same number.
    pub tag: u16,
    /// Datagram queue pair (completions report the source QPN).
    pub ud: bool,
    state: AtomicU32,
    sq: Box<[SendSlot]>,
    sq_mask: u64,
    /// Requests retired from the send queue, ever.
    sq_retired: AtomicU64,
    rq: Box<[RecvSlot]>,
    rq_mask: u64,
    /// Receives consumed, ever.
    rq_consumed: AtomicU64,
}

impl core::fmt::Debug for Track {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Track")
            .field("qpn", &self.qpn)
            .field("tag", &self.tag)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Track {
    /// Tracking for a queue pair with room for `send` and `recv` outstanding requests.
    pub(crate) fn new(qpn: u32, send: u32, recv: u32, ud: bool) -> Self {
        // Relaxed: tags only need to differ from recent ones; nothing is published.
        let tag = (NEXT_TAG.fetch_add(1, Ordering::Relaxed) & 0xFFFF) as u16;
        let sq_len = (send.max(1) as usize).next_power_of_two();
        let rq_len = (recv.max(1) as usize).next_power_of_two();
        Self {
            qpn,
            tag,
            ud,
            state: AtomicU32::new(QpState::Init.to_raw()),
            sq: (0..sq_len)
                .map(|_| SendSlot {
                    seq: AtomicU64::new(u64::MAX),
                    wr_id: AtomicU64::new(0),
                    opcode: AtomicU32::new(0),
                })
                .collect(),
            sq_mask: sq_len as u64 - 1,
            sq_retired: AtomicU64::new(0),
            rq: (0..rq_len)
                .map(|_| RecvSlot {
                    seq: AtomicU64::new(u64::MAX),
                    wr_id: AtomicU64::new(0),
                })
                .collect(),
            rq_mask: rq_len as u64 - 1,
            rq_consumed: AtomicU64::new(0),
        }
    }

    /// The cached queue-pair state.
    #[inline]
    pub(crate) fn state(&self) -> QpState {
        // Relaxed: the state is a hint for early checks in post_send; the hardware enforces
        // the real state, and no data is published through this word.
        QpState::from_raw(self.state.load(Ordering::Relaxed))
    }

    /// Sets the cached state. `Error` is final.
    pub(crate) fn set_state(&self, s: QpState) {
        // Relaxed: as in `state`. The update loop keeps Error sticky.
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                (cur != QpState::Error.to_raw()).then_some(s.to_raw())
            });
    }

    /// Requests retired from the send queue.
    #[inline]
    pub(crate) fn sq_retired(&self) -> u64 {
        // A2: Acquire, pairs with R2 in `complete`: the slots of retired requests are no
        // longer read by the poller once we see the count, so they may be rewritten.
        self.sq_retired.load(Ordering::Acquire)
    }

    /// Receives consumed.
    #[inline]
    pub(crate) fn rq_consumed(&self) -> u64 {
        // A3: Acquire, pairs with R3 in `complete` (as A2, for the receive slots).
        self.rq_consumed.load(Ordering::Acquire)
    }

    /// Records send request `seq` and returns its hardware `wr_id`.
    #[inline]
    pub(crate) fn stage_send(&self, seq: u64, wr_id: u64, opcode: WcOpcode) -> u64 {
        let s = &self.sq[(seq & self.sq_mask) as usize];
        // Relaxed: published by the Release store of `seq` below.
        s.wr_id.store(wr_id, Ordering::Relaxed);
        s.opcode.store(opcode_code(opcode), Ordering::Relaxed);
        // R1: Release, pairs with A1 in `complete`: publishes wr_id and opcode. The request
        // reaches the hardware (ibv_post_send) only after this store.
        s.seq.store(seq, Ordering::Release);
        encode(false, self.tag, seq)
    }

    /// Records receive `seq` and returns its hardware `wr_id`.
    #[inline]
    pub(crate) fn stage_recv(&self, seq: u64, wr_id: u64) -> u64 {
        let s = &self.rq[(seq & self.rq_mask) as usize];
        // Relaxed: published by the Release store of `seq` below.
        s.wr_id.store(wr_id, Ordering::Relaxed);
        // R1 (receive side): as in stage_send.
        s.seq.store(seq, Ordering::Release);
        encode(true, self.tag, seq)
    }

    /// Resolves a completion with hardware `wr_id` for this queue pair and retires what it
    /// completes. `None` for a completion that is not this queue pair's (stale tag or a slot
    /// that names another request). Called by the one completion queue that polls the
    /// respective queue, so each counter has a single writer.
    #[inline]
    pub(crate) fn complete(&self, hw_wr_id: u64, ok: bool) -> Option<Resolved> {
        let (recv, tag, low) = decode(hw_wr_id);
        if tag != self.tag {
            return None;
        }
        let r = if recv {
            let s = &self.rq[(low & self.rq_mask) as usize];
            // A1: Acquire, pairs with R1 in stage_recv.
            let seq = s.seq.load(Ordering::Acquire);
            if seq & SEQ_MASK != low {
                return None;
            }
            let wr_id = s.wr_id.load(Ordering::Relaxed);
            // R3: Release, pairs with A3 in rq_consumed: the slot has been read. Single
            // writer (the receive CQ), so a plain store of the maximum is enough.
            if seq + 1 > self.rq_consumed.load(Ordering::Relaxed) {
                self.rq_consumed.store(seq + 1, Ordering::Release);
            }
            Resolved {
                wr_id,
                recv: true,
                opcode: WcOpcode::Recv,
            }
        } else {
            let s = &self.sq[(low & self.sq_mask) as usize];
            // A1: Acquire, pairs with R1 in stage_send.
            let seq = s.seq.load(Ordering::Acquire);
            if seq & SEQ_MASK != low {
                return None;
            }
            let wr_id = s.wr_id.load(Ordering::Relaxed);
            let opcode = opcode_from_code(s.opcode.load(Ordering::Relaxed));
            // R2: Release, pairs with A2 in sq_retired. Single writer (the send CQ). The
            // Relaxed load reads our own last store.
            if seq + 1 > self.sq_retired.load(Ordering::Relaxed) {
                self.sq_retired.store(seq + 1, Ordering::Release);
            }
            Resolved {
                wr_id,
                recv: false,
                opcode,
            }
        };
        if !ok {
            self.set_state(QpState::Error);
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_encoding_roundtrips() {
        for (recv, tag, seq) in [(false, 1, 0), (true, 0xFFFF, SEQ_MASK), (true, 77, 12345)] {
            assert_eq!(decode(encode(recv, tag, seq)), (recv, tag, seq));
        }
        // Sequence numbers wrap at 40 bits without touching the tag.
        assert_eq!(decode(encode(false, 5, SEQ_MASK + 3)), (false, 5, 2));
    }

    #[test]
    fn signalled_completion_retires_earlier_unsignalled_requests() {
        let t = Track::new(0x11, 8, 4, false);
        let ids: Vec<u64> = (0..5)
            .map(|i| t.stage_send(i, 1000 + i, WcOpcode::RdmaWrite))
            .collect();
        assert_eq!(t.sq_retired(), 0);
        let r = t.complete(ids[3], true).unwrap();
        assert_eq!(
            r,
            Resolved {
                wr_id: 1003,
                recv: false,
                opcode: WcOpcode::RdmaWrite
            }
        );
        assert_eq!(t.sq_retired(), 4);
        // An older completion (e.g. an error flush) does not move the count back.
        t.complete(ids[1], false).unwrap();
        assert_eq!(t.sq_retired(), 4);
        assert_eq!(t.state(), QpState::Error);
        t.set_state(QpState::Rts);
        assert_eq!(t.state(), QpState::Error, "Error is sticky");
    }

    #[test]
    fn receives_and_stale_completions() {
        let t = Track::new(0x12, 4, 4, true);
        let a = t.stage_recv(0, 7);
        let b = t.stage_recv(1, 8);
        assert_eq!(t.complete(a, true).unwrap().wr_id, 7);
        assert_eq!(t.rq_consumed(), 1);
        assert_eq!(
            t.complete(b, true).unwrap(),
            Resolved {
                wr_id: 8,
                recv: true,
                opcode: WcOpcode::Recv
            }
        );
        assert_eq!(t.rq_consumed(), 2);
        // Another queue pair's tag, or a slot that was reused for a later request.
        let other = Track::new(0x12, 4, 4, true);
        assert!(t.complete(other.stage_recv(0, 1), true).is_none());
        t.stage_recv(5, 9);
        assert!(t.complete(encode(true, t.tag, 1), true).is_none());
    }
}
