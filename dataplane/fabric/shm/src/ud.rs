//! Unreliable-datagram queue pairs and destinations: the application's handles on the
//! engine in [`dgram`](crate::dgram), attached to their completion queues.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mempool::memory::Region;
use mempool::ring::{Producer, Single};

use crate::core::{DevCore, UdExport};
use crate::cq::{CqOps, SlotEntry};
use crate::dgram::UdCore;
use crate::layout::{Doorbell, SegKind, UD_MAX_SLOTS, UD_MTU, UdMsg, UdSegView, ud_seg_len};
use crate::msg::{MAX_MSG, Msg};
use crate::rc::RecvWqe;
use crate::seg::map_segment;
use crate::util::lock;
use crate::{MAX_SGE, Shm, unix};
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::traits::{QpInit, UdQueuePair, UdSendWr};
use dp_fabric::types::{Completion, Payload, QpState, RecvWr, SendFlags, WcOpcode, WcStatus};

/// An unreliable-datagram queue pair of the shm provider.
pub struct ShmUdQp {
    core: Arc<UdCore>,
    rq: Producer<RecvWqe, Single>,
    recv_posted: u64,
    posted: u64,
    _local: IpAddr,
    send_ops: Arc<CqOps>,
    recv_ops: Arc<CqOps>,
}

impl core::fmt::Debug for ShmUdQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmUdQp")
            .field("qpn", &self.core.qpn)
            .finish()
    }
}

impl ShmUdQp {
    pub(crate) fn new(
        dev: &Arc<DevCore>,
        init: &QpInit<'_, Shm>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<Self> {
        let (core, rq, rs) = UdCore::create(
            dev,
            &init.pd.inner,
            init.send_cq.shared(),
            init.recv_cq.shared(),
            init.caps,
            qkey,
        )?;
        let send_ops = init.send_cq.ops().clone();
        let recv_ops = init.recv_cq.ops().clone();
        if Arc::ptr_eq(init.send_cq.shared(), init.recv_cq.shared()) {
            send_ops.attach(core.send_slot, SlotEntry::ud(core.clone(), true, Some(rs)));
        } else {
            send_ops.attach(core.send_slot, SlotEntry::ud(core.clone(), true, None));
            recv_ops.attach(core.recv_slot, SlotEntry::ud(core.clone(), false, Some(rs)));
        }
        lock(&dev.ud_exports).insert(
            core.qpn,
            UdExport {
                qkey,
                recv_slot: core.recv_slot,
                seg: core.seg.clone(),
                db_seg: core.recv_cq.db_seg.clone(),
            },
        );
        Ok(Self {
            core,
            rq,
            recv_posted: 0,
            posted: 0,
            _local: local,
            send_ops,
            recv_ops,
        })
    }
}

impl Drop for ShmUdQp {
    fn drop(&mut self) {
        let c = &self.core;
        c.view
            .header()
            .state
            .store(QpState::Error.to_raw(), Ordering::Release);
        lock(&c.dev.ud_exports).remove(&c.qpn);
        self.send_ops.detach(c.send_slot);
        if !Arc::ptr_eq(&c.send_cq, &c.recv_cq) {
            self.recv_ops.detach(c.recv_slot);
        }
    }
}

impl UdQueuePair for ShmUdQp {
    type P = Shm;

    fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    fn qkey(&self) -> u32 {
        self.core.qkey
    }

    fn post_send(&mut self, wrs: &[UdSendWr<'_, Shm>]) -> core::result::Result<(), PostError> {
        let core = &*self.core;
        let mut st = core.send.lock();
        for (i, wr) in wrs.iter().enumerate() {
            let err = |kind| PostError { index: i, kind };
            let len = wr.payload.len();
            match wr.payload {
                Payload::Sgl(s) if s.len() > core.caps.max_send_sge as usize => {
                    return Err(err(PostErrorKind::TooManySge));
                }
                Payload::Inline(b) if b.len() > core.caps.max_inline_data as usize => {
                    return Err(err(PostErrorKind::InlineTooLong));
                }
                _ => {}
            }
            if len > UD_MTU as u64 {
                return Err(err(PostErrorKind::MessageTooLong));
            }
            if st.backlog.len() >= core.caps.max_send_wr as usize {
                return Err(err(PostErrorKind::QueueFull));
            }
            self.posted += 1;
            let mut status = WcStatus::Success;
            if let Payload::Sgl(s) = wr.payload
                && s.iter().any(|s| {
                    core.pd
                        .check_local(s.lkey, s.addr, s.length, false)
                        .is_none()
                })
            {
                status = WcStatus::LocProtErr;
            }
            if status.is_ok() {
                wr.dest.send(core, wr.payload, len as u32, wr.imm);
            }
            if wr.flags.contains(SendFlags::SIGNALED) || !status.is_ok() {
                let c = Completion {
                    wr_id: wr.wr_id,
                    status,
                    opcode: WcOpcode::Send,
                    byte_len: 0,
                    imm: None,
                    qp_num: core.qpn,
                    src_qp: 0,
                    invalidated: None,
                };
                if !st.backlog.is_empty() || st.cq_tx.enqueue(c).is_err() {
                    st.backlog.push_back(c);
                    if !core.send_attn.swap(true, Ordering::Relaxed)
                        && st.progress_tx.enqueue(core.send_slot).is_err()
                    {
                        core.send_attn.store(false, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let core = &*self.core;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sgl.len() > core.caps.max_recv_sge as usize || wr.sgl.len() > MAX_SGE {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::TooManySge,
                });
            }
            // Acquire: pairs with the Release increment in drain_recv.
            let consumed = core.recv_consumed.load(Ordering::Acquire);
            if self.recv_posted - consumed >= u64::from(core.caps.max_recv_wr)
                || self.rq.enqueue(RecvWqe::from_wr(wr)).is_err()
            {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
            }
            self.recv_posted += 1;
            core.view.add_recv(1);
        }
        Ok(())
    }
}

/// A resolved datagram destination: the peer UD queue pair's segment and doorbell, mapped
/// here, with its queue pair number and Q_Key.
pub struct ShmUdDest {
    qpn: u32,
    qkey: u32,
    _seg: Arc<Region>,
    view: UdSegView,
    db_seg: Arc<Region>,
    db_slot: u32,
}

impl core::fmt::Debug for ShmUdDest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmUdDest")
            .field("qpn", &self.qpn)
            .field("qkey", &self.qkey)
            .finish()
    }
}

// SAFETY: the views point into mappings the struct keeps alive; shared fields are atomics.
unsafe impl Send for ShmUdDest {}
// SAFETY: as above.
unsafe impl Sync for ShmUdDest {}

impl ShmUdDest {
    /// The destination's queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub(crate) fn resolve(
        dev: &Arc<DevCore>,
        _remote: IpAddr,
        qpn: u32,
        qkey: u32,
    ) -> Result<Self> {
        let ctx = qpn >> 12;
        let path = dev.dir.join("ctx").join(format!("{ctx}.sock"));
        let sock = unix::connect(&path).map_err(|e| FabricError::Io {
            op: "resolving a datagram destination (no such shm context)",
            source: e,
        })?;
        let mut buf = Vec::new();
        Msg::UdResolve { qpn }.encode(&mut buf);
        unix::send(sock.as_raw_fd(), &buf, &[]).map_err(|e| FabricError::Io {
            op: "sending a UD resolve request",
            source: e,
        })?;
        let mut rbuf = vec![0u8; MAX_MSG];
        let mut fds = Vec::new();
        let n = unix::recv(sock.as_raw_fd(), &mut rbuf, &mut fds)
            .map_err(|e| FabricError::Io {
                op: "receiving a UD resolve answer",
                source: e,
            })?
            .ok_or(FabricError::Protocol(
                "context closed the UD resolve request",
            ))?;
        let Ok(Msg::UdResolveRep {
            status,
            qkey: their_qkey,
            cq_slot,
            seg_len,
            cq_seg_len,
        }) = Msg::decode(&rbuf[..n])
        else {
            return Err(FabricError::Protocol("bad UD resolve answer"));
        };
        if status != 0 {
            return Err(FabricError::Io {
                op: "resolving a datagram destination",
                source: std::io::Error::from_raw_os_error(status as i32),
            });
        }
        if fds.len() != 2 {
            return Err(FabricError::Protocol(
                "UD resolve answer without its descriptors",
            ));
        }
        let _ = their_qkey; // Datagrams carry the sender's Q_Key; the receiver checks it.
        if seg_len > ud_seg_len(UD_MAX_SLOTS) as u64
            || cq_seg_len != size_of::<Doorbell>().next_multiple_of(4096) as u64
        {
            return Err(FabricError::Protocol(
                "UD resolve answer announces impossible segment sizes",
            ));
        }
        let db_fd = fds.pop().ok_or(FabricError::Protocol("missing doorbell"))?;
        let seg_fd = fds.pop().ok_or(FabricError::Protocol("missing segment"))?;
        let seg = map_segment(seg_fd, seg_len, 4096, "peer-ud")?;
        // SAFETY: seg is a live mapping of seg.len() bytes kept alive in the returned value.
        let view =
            unsafe { UdSegView::attach(seg.as_ptr(), seg.len()) }.map_err(FabricError::Protocol)?;
        if view.header().qpn != qpn {
            return Err(FabricError::Protocol(
                "UD resolve answered for another queue pair",
            ));
        }
        let db_seg = map_segment(db_fd, cq_seg_len, 4096, "peer-doorbell")?;
        if db_seg.len() < size_of::<Doorbell>() {
            return Err(FabricError::Protocol("peer doorbell too small"));
        }
        // SAFETY: at least one Doorbell long, page aligned.
        unsafe { &*db_seg.as_ptr().cast::<Doorbell>() }
            .hdr
            .check(SegKind::Doorbell, db_seg.len())
            .map_err(FabricError::Protocol)?;
        Ok(Self {
            qpn,
            qkey,
            _seg: seg,
            view,
            db_seg,
            db_slot: cq_slot,
        })
    }

    fn send(&self, from: &UdCore, payload: Payload<'_>, len: u32, imm: Option<u32>) {
        // Relaxed: a destroyed destination only means drops; no data depends on it.
        let h = self.view.header();
        if QpState::from_raw(h.state.load(Ordering::Relaxed)) != QpState::Rts || h.qkey != self.qkey
        {
            from.drop_one();
            return;
        }
        if !self.view.claim_recv() {
            // No receive posted at arrival: dropped, as on hardware.
            from.drop_one();
            return;
        }
        let meta = UdMsg {
            src_qpn: from.qpn,
            qkey: self.qkey,
            len,
            imm,
        };
        let ok = self.view.send(&meta, |dst| match payload {
            Payload::Inline(b) => {
                // SAFETY: dst has UD_MTU bytes; len <= UD_MTU was checked at post.
                unsafe { ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
            }
            Payload::Sgl(sgl) => {
                let mut at = dst;
                for s in sgl.iter().filter(|s| s.length > 0) {
                    // SAFETY: every entry was checked against its registration; the total
                    // fits the slot (len <= UD_MTU).
                    unsafe {
                        ptr::copy_nonoverlapping(s.addr as *const u8, at, s.length as usize);
                        at = at.add(s.length as usize);
                    }
                }
            }
        });
        if ok {
            // SAFETY: validated doorbell mapping kept alive by self.
            unsafe { &*self.db_seg.as_ptr().cast::<Doorbell>() }.ring(self.db_slot);
        } else {
            self.view.unclaim_recv();
            from.drop_one();
        }
    }
}

/// Answers a UD resolve request on the context socket (service thread).
pub(crate) fn answer_resolve(dev: &DevCore, sock: &OwnedFd, qpn: u32) {
    let mut buf = Vec::new();
    let ex = lock(&dev.ud_exports);
    match ex.get(&qpn) {
        Some(e) => {
            Msg::UdResolveRep {
                status: 0,
                qkey: e.qkey,
                cq_slot: e.recv_slot,
                seg_len: e.seg.len() as u64,
                cq_seg_len: e.db_seg.len() as u64,
            }
            .encode(&mut buf);
            let seg = e.seg.share_handle().map(|h| h.fd);
            let db = e.db_seg.share_handle().map(|h| h.fd);
            if let (Some(a), Some(b)) = (seg, db) {
                let _ = unix::send(sock.as_raw_fd(), &buf, &[a, b]);
            }
        }
        None => {
            Msg::UdResolveRep {
                status: libc::ENOENT as u32,
                qkey: 0,
                cq_slot: 0,
                seg_len: 0,
                cq_seg_len: 0,
            }
            .encode(&mut buf);
            let _ = unix::send(sock.as_raw_fd(), &buf, &[]);
        }
    }
}
