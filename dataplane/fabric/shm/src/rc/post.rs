//! Creating a reliable-connected queue pair's engine and posting to it: `post_send` checks
//! every request (keys, ranges, rights, sizes) before it queues it, `post_recv` publishes
//! receives for the peer's credits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mempool::ring::{Producer, Ring, Single};

use super::{Outcome, Pending, QpCore, RecvSide, RecvWqe, SendState, Src};
use crate::MAX_SGE;
use crate::core::DevCore;
use crate::cq_shared::CqShared;
use crate::pd::{Bind, PdInner};
use crate::qpseg::{QpSegLayout, QpSegView};
use crate::remote::PeerExports;
use crate::seg::new_segment_handing_off;
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::traits::ConnId;
use dp_fabric::types::{Payload, QpCaps, QpState, RecvWr, SendOp, SendWr, Sge};

/// Clamps requested capacities to what the device supports.
pub(crate) fn clamp_caps(c: QpCaps) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr.clamp(1, 16384),
        max_recv_wr: c.max_recv_wr.clamp(1, 16384),
        max_send_sge: c.max_send_sge.clamp(1, MAX_SGE as u32),
        max_recv_sge: c.max_recv_sge.clamp(1, MAX_SGE as u32),
        max_inline_data: c.max_inline_data.min(crate::MAX_INLINE as u32),
    }
}

impl QpCore {
    /// Creates the engine of a queue pair (state Init) for connection `conn`: the core,
    /// the producer side of its receive queue, and the receive side its completion queue
    /// will own.
    pub(crate) fn create(
        dev: &Arc<DevCore>,
        pd: &Arc<PdInner>,
        send_cq: &Arc<CqShared>,
        recv_cq: &Arc<CqShared>,
        caps: QpCaps,
        conn: ConnId,
    ) -> Result<(Arc<Self>, Producer<RecvWqe, Single>, RecvSide)> {
        let caps = clamp_caps(caps);
        let qpn = dev.alloc_qpn()?;
        let rq_cap = caps.max_recv_wr.next_power_of_two();
        let layout = QpSegLayout::new(rq_cap, dev.cfg.bounce_bytes);
        let (seg, seg_fd) =
            match new_segment_handing_off(dev.ctx_id, &format!("qp{qpn:x}"), layout.total) {
                Ok(s) => s,
                Err(e) => {
                    dev.free_qpn(qpn);
                    return Err(e);
                }
            };
        // SAFETY: the fresh segment is zeroed, page aligned, layout.total bytes long, and
        // kept alive by QpCore alongside every view.
        let view = unsafe { QpSegView::init(seg.as_ptr(), layout, qpn, dev.ctx_id) };
        let (rq_tx, rq_rx) =
            Ring::<RecvWqe>::spsc(rq_cap as usize).map_err(|e| FabricError::InvalidArgument {
                what: "max_recv_wr",
                why: e.to_string(),
            })?;
        let same = Arc::ptr_eq(send_cq, recv_cq);
        let (cq_tx, progress_tx) = send_cq.producers();
        let send_slot = send_cq.reserve_slot()?;
        let recv_slot = if same {
            send_slot
        } else {
            match recv_cq.reserve_slot() {
                Ok(s) => s,
                Err(e) => {
                    send_cq.release_slot(send_slot);
                    return Err(e);
                }
            }
        };
        let staging =
            vec![0u8; caps.max_send_wr as usize * caps.max_inline_data as usize].into_boxed_slice();
        let core = Arc::new(Self {
            dev: dev.clone(),
            qpn,
            conn,
            pd: pd.clone(),
            seg,
            seg_fd: Mutex::new(Some(seg_fd)),
            view,
            caps,
            send_cq: send_cq.clone(),
            send_slot,
            recv_cq: recv_cq.clone(),
            recv_slot,
            peer: OnceLock::new(),
            conn_ref: OnceLock::new(),
            send: SpinLock::new(SendState {
                pending: VecDeque::with_capacity(caps.max_send_wr as usize),
                staging,
                posted: 0,
                retired: 0,
                credits_used: 0,
                credit_cache: 0,
                bounce_head: 0,
                bounce_tail: 0,
                rnr_counted: false,
                ring_due: false,
                cq_tx,
                progress_tx,
                exports: PeerExports::new(),
            }),
            recv_consumed: AtomicU64::new(0),
            send_attn: AtomicBool::new(false),
            recv_attn: AtomicBool::new(false),
            credit_hint: AtomicU64::new(0),
        });
        core.set_state(QpState::Init);
        let recv = RecvSide {
            rq: rq_rx,
            next_in: 0,
            bounce_tail: 0,
            peer_credit: 0,
        };
        Ok((core, rq_tx, recv))
    }
}

impl QpCore {
    /// Posts send requests (the body of `RcQueuePair::post_send`): the peer's doorbell
    /// rings once for the messages of the whole list, when it is queued (or refused).
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let mut st = self.send.lock();
        let r = self.post_locked(&mut st, wrs);
        self.ring_peer(&mut st);
        r
    }

    fn post_locked(
        &self,
        st: &mut SendState,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), PostError> {
        let core = self;
        let state = core.state();
        let err = |index, kind| PostError { index, kind };
        for (i, wr) in wrs.iter().enumerate() {
            if !matches!(state, QpState::Rts | QpState::Error) {
                return Err(err(i, PostErrorKind::BadState(state)));
            }
            let (nsge, inline_len) = match wr.payload {
                Payload::Sgl(s) => {
                    if s.len() > core.caps.max_send_sge as usize {
                        return Err(err(i, PostErrorKind::TooManySge));
                    }
                    (s.len(), None)
                }
                Payload::Inline(b) => {
                    if matches!(wr.op, SendOp::Read(_)) {
                        return Err(err(i, PostErrorKind::Unsupported));
                    }
                    if b.len() > core.caps.max_inline_data as usize {
                        return Err(err(i, PostErrorKind::InlineTooLong));
                    }
                    (0, Some(b.len() as u32))
                }
            };
            // No remote invalidation here (shm keys are not fast-registered MRs).
            if let Some(b) = Bind::of(wr.op) {
                if !wr.is_empty() || !core.pd.bind_is_valid(&b) {
                    return Err(err(i, PostErrorKind::BadBind));
                }
            } else if matches!(wr.op, SendOp::LocalInv(_)) && !wr.is_empty() {
                return Err(err(i, PostErrorKind::Unsupported));
            }
            if matches!(
                wr.op,
                SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_)
            ) && wr.len() > u64::from(core.dev.cfg.bounce_bytes)
            {
                return Err(err(i, PostErrorKind::MessageTooLong));
            }
            if wr.len() > 1 << 31 {
                return Err(err(i, PostErrorKind::MessageTooLong));
            }
            if st.posted - st.retired >= u64::from(core.caps.max_send_wr) {
                return Err(err(i, PostErrorKind::QueueFull));
            }
            st.posted += 1;
            let seq = st.posted;
            if st.pending.is_empty() {
                let src = match wr.payload {
                    Payload::Sgl(s) => Src::Sgl(s),
                    Payload::Inline(b) => Src::Bytes(b),
                };
                if let Outcome::Done(status, len) = core.exec(st, wr.op, wr.flags, src) {
                    if core.report(st, seq, wr.wr_id, wr.op, wr.flags, status, len) {
                        continue;
                    }
                    let mut p = to_pending(seq, wr, nsge, None);
                    p.done = Some((status, len));
                    st.pending.push_back(p);
                    core.queue_progress(st);
                    continue;
                }
            }
            if let (Payload::Inline(b), Some(_)) = (wr.payload, inline_len) {
                let off = core.staging_off(seq);
                st.staging[off..off + b.len()].copy_from_slice(b);
            }
            st.pending.push_back(to_pending(seq, wr, nsge, inline_len));
            core.queue_progress(st);
        }
        Ok(())
    }

    /// Posts receives into `rq` (the body of `RcQueuePair::post_recv`; the queue pair's
    /// owner holds the producer side and the count of receives it posted).
    pub(crate) fn post_recv(
        &self,
        rq: &mut Producer<RecvWqe, Single>,
        recv_posted: &mut u64,
        wrs: &[RecvWr<'_>],
    ) -> core::result::Result<(), PostError> {
        let core = self;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sgl.len() > core.caps.max_recv_sge as usize {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::TooManySge,
                });
            }
            // Acquire: pairs with the Release increment in drain_recv.
            let consumed = core.recv_consumed.load(Ordering::Acquire);
            if *recv_posted - consumed >= u64::from(core.caps.max_recv_wr) {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
            }
            let w = RecvWqe::from_wr(wr);
            if rq.enqueue(w).is_err() {
                // rq capacity >= max_recv_wr and the check above bounds occupancy.
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
            }
            core.view.publish_recv(*recv_posted, w.total);
            *recv_posted += 1;
        }
        if core.state() == QpState::Error {
            // Flush what was just posted.
            core.notify_recv();
        }
        Ok(())
    }
}

fn to_pending(seq: u64, wr: &SendWr<'_>, nsge: usize, inline_len: Option<u32>) -> Pending {
    let mut sge = [Sge::default(); MAX_SGE];
    if let Payload::Sgl(s) = wr.payload {
        sge[..nsge].copy_from_slice(&s[..nsge]);
    }
    Pending {
        seq,
        wr_id: wr.wr_id,
        op: wr.op,
        flags: wr.flags,
        nsge: nsge as u8,
        sge,
        inline_len,
        done: None,
    }
}
