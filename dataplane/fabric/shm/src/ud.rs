//! Unreliable-datagram queue pairs.
//!
//! Each UD queue pair owns a segment with a bounded multi-producer queue of datagram slots
//! (Vyukov-style sequence numbers), which any process that resolved it may fill. Datagram
//! semantics follow hardware: a send completes successfully whether or not the datagram is
//! delivered; datagrams that find the queue full, no receive posted, a wrong Q_Key or a
//! destroyed queue pair are dropped and counted in [`ShmStats::ud_dropped`]. Every receive
//! buffer starts with a 40-byte GRH area, as on InfiniBand and RoCE.
//!
//! [`ShmStats::ud_dropped`]: super::ShmStats::ud_dropped

use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mempool::memory::Region;
use mempool::ring::{Multi, Producer, Ring, Single};

use crate::cq::{CqShared, SlotEntry};
use crate::device::{DevInner, lock};
use crate::layout::{Doorbell, UD_MTU, UdMsg, UdSegView, ud_seg_len};
use crate::msg::{MAX_MSG, Msg};
use crate::pd::PdInner;
use crate::qp::{RecvWqe, clamp_caps};
use crate::{MAX_SGE, Shm, unix};
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::traits::{QpInit, UdQueuePair, UdSendWr};
use dp_fabric::types::{
    Completion, GRH_LEN, Payload, QpCaps, QpState, RecvWr, SendFlags, WcOpcode, WcStatus,
};

/// Consecutive polls a reserved-but-unpublished slot is tolerated before it is skipped.
const STUCK_POLLS: u32 = 1 << 20;

struct UdSend {
    backlog: VecDeque<Completion>,
    cq_tx: Producer<Completion, Multi>,
    progress_tx: Producer<u32, Multi>,
}

pub(crate) struct UdCore {
    pub dev: Arc<DevInner>,
    pub qpn: u32,
    pub qkey: u32,
    pub pd: Arc<PdInner>,
    pub seg: Arc<Region>,
    pub view: UdSegView,
    pub caps: QpCaps,
    pub send_cq: Arc<CqShared>,
    pub send_slot: u32,
    pub recv_cq: Arc<CqShared>,
    pub recv_slot: u32,
    send: SpinLock<UdSend>,
    pub recv_consumed: AtomicU64,
    send_attn: AtomicBool,
    recv_attn: AtomicBool,
}

/// Receive state a completion queue owns for one UD queue pair.
pub(crate) struct UdRecvSide {
    rq: mempool::ring::Consumer<RecvWqe, Single>,
    next: u64,
    stuck: u32,
}

impl UdCore {
    /// Counts one more consumed receive (single writer: the receive CQ's poll).
    #[inline]
    fn bump_consumed(&self) {
        // Relaxed load: single writer. Release store pairs with post_recv's Acquire load.
        let v = self.recv_consumed.load(Ordering::Relaxed);
        self.recv_consumed.store(v + 1, Ordering::Release);
    }

    pub(crate) fn clear_attn(&self, send: bool) {
        let f = if send {
            &self.send_attn
        } else {
            &self.recv_attn
        };
        // Relaxed: deduplication only.
        f.store(false, Ordering::Relaxed);
    }

    /// Reports backlogged send completions. False if the lock was busy.
    pub(crate) fn progress(&self) -> bool {
        let Some(mut st) = self.send.try_lock() else {
            return false;
        };
        while let Some(c) = st.backlog.front().copied() {
            if st.cq_tx.enqueue(c).is_err() {
                break;
            }
            st.backlog.pop_front();
        }
        if !st.backlog.is_empty() && !self.send_attn.swap(true, Ordering::Relaxed) {
            let slot = self.send_slot;
            if st.progress_tx.enqueue(slot).is_err() {
                self.send_attn.store(false, Ordering::Relaxed);
            }
        }
        true
    }

    fn drop_one(&self) {
        // Relaxed: statistics.
        self.dev.stats.ud_dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn drain_recv(&self, rs: &mut UdRecvSide, out: &mut [Completion]) -> (usize, bool) {
        let mut n = 0;
        while n < out.len() {
            let mut c = None;
            let rq = &mut rs.rq;
            let got = self.view.recv(rs.next, |src, m| {
                // Every queued datagram claimed a posted receive at send time.
                c = rq.dequeue().map(|w| self.land(&w, src, m));
            });
            if got.is_none() {
                if self.view.reserved_unpublished(rs.next) {
                    rs.stuck += 1;
                    if rs.stuck >= STUCK_POLLS && self.view.skip(rs.next) {
                        // A sender died mid-copy: its claim is lost with it; give it back.
                        self.view.unclaim_recv();
                        rs.next += 1;
                        rs.stuck = 0;
                        self.drop_one();
                        continue;
                    }
                }
                break;
            }
            rs.stuck = 0;
            rs.next += 1;
            match c {
                Some(c) => {
                    // Release: pairs with the Acquire in post_recv.
                    self.bump_consumed();
                    out[n] = c;
                    n += 1;
                }
                None => {
                    // A datagram without a claimed receive: a sender broke the protocol.
                    // Relaxed: statistics.
                    self.dev
                        .stats
                        .malformed_cm_msgs
                        .fetch_add(1, Ordering::Relaxed);
                    self.drop_one();
                }
            }
        }
        (n, n == out.len())
    }

    /// Lands a datagram in a receive.
    fn land(&self, w: &RecvWqe, src: *const u8, m: &UdMsg) -> Completion {
        let mut c = Completion {
            wr_id: w.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: GRH_LEN + m.len,
            imm: m.imm,
            qp_num: self.qpn,
            src_qp: m.src_qpn,
        };
        if u64::from(GRH_LEN + m.len) > u64::from(w.total) {
            c.status = WcStatus::LocLenErr;
            c.byte_len = 0;
            return c;
        }
        // The GRH area: an IPv6-style header with version 6, no addresses (the shm fabric
        // has no routing). Then the payload.
        let mut grh = [0u8; GRH_LEN as usize];
        grh[0] = 0x60;
        grh[6] = 0x1B;
        grh[7] = 64;
        let mut pieces: [(&[u8], usize); 2] = [(&grh, 0), (&[], 0)];
        // SAFETY: src points at the slot payload, m.len <= UD_MTU bytes published by the
        // sender's Release (acquired by `recv`).
        pieces[1].0 = unsafe { std::slice::from_raw_parts(src, m.len as usize) };
        let mut sge_i = 0;
        let mut sge_off = 0u32;
        for (bytes, _) in pieces {
            let mut left = bytes;
            while !left.is_empty() {
                let Some(s) = w.sge.get(sge_i).filter(|_| sge_i < w.nsge as usize) else {
                    c.status = WcStatus::LocLenErr;
                    c.byte_len = 0;
                    return c;
                };
                let room = (s.length - sge_off) as usize;
                if room == 0 {
                    sge_i += 1;
                    sge_off = 0;
                    continue;
                }
                let k = room.min(left.len());
                let Some(dst) =
                    self.pd
                        .check_local(s.lkey, s.addr + u64::from(sge_off), k as u32, true)
                else {
                    c.status = WcStatus::LocProtErr;
                    c.byte_len = 0;
                    return c;
                };
                // SAFETY: dst..dst+k lies in a live registration with local write rights
                // (checked); left is a live slice of at least k bytes.
                unsafe { ptr::copy_nonoverlapping(left.as_ptr(), dst, k) };
                left = &left[k..];
                sge_off += k as u32;
            }
        }
        c
    }
}

impl Drop for UdCore {
    fn drop(&mut self) {
        self.dev.free_qpn(self.qpn);
    }
}

/// An unreliable-datagram queue pair of the shm provider.
pub struct ShmUdQp {
    core: Arc<UdCore>,
    rq: Producer<RecvWqe, Single>,
    recv_posted: u64,
    posted: u64,
    _local: IpAddr,
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
        dev: &Arc<DevInner>,
        init: &QpInit<'_, Shm>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<Self> {
        let caps = clamp_caps(init.caps);
        let qpn = dev.alloc_qpn()?;
        let nslots = caps.max_recv_wr.next_power_of_two().clamp(16, 1 << 12);
        let seg = match dev.new_segment(&format!("ud{qpn:x}"), ud_seg_len(nslots)) {
            Ok(s) => s,
            Err(e) => {
                dev.free_qpn(qpn);
                return Err(e);
            }
        };
        // SAFETY: fresh zeroed segment of ud_seg_len(nslots) bytes, kept alive by UdCore.
        let view = unsafe { UdSegView::init(seg.as_ptr(), nslots, qpn, qkey, dev.ctx_id) };
        let rq_cap = caps.max_recv_wr.next_power_of_two() as usize;
        let (rq_tx, rq_rx) =
            Ring::<RecvWqe>::spsc(rq_cap).map_err(|e| FabricError::InvalidArgument {
                what: "max_recv_wr",
                why: e.to_string(),
            })?;
        let send_cq = init.send_cq.shared().clone();
        let recv_cq = init.recv_cq.shared().clone();
        let same = Arc::ptr_eq(&send_cq, &recv_cq);
        let (cq_tx, progress_tx) = send_cq.producers();
        let send_slot = send_cq.reserve_slot()?;
        let recv_slot = if same {
            send_slot
        } else {
            recv_cq.reserve_slot()?
        };
        let core = Arc::new(UdCore {
            dev: dev.clone(),
            qpn,
            qkey,
            pd: init.pd.inner.clone(),
            seg,
            view,
            caps,
            send_cq: send_cq.clone(),
            send_slot,
            recv_cq: recv_cq.clone(),
            recv_slot,
            send: SpinLock::new(UdSend {
                backlog: VecDeque::with_capacity(caps.max_send_wr as usize),
                cq_tx,
                progress_tx,
            }),
            recv_consumed: AtomicU64::new(0),
            send_attn: AtomicBool::new(false),
            recv_attn: AtomicBool::new(false),
        });
        // Release: senders that see Rts see an initialised queue.
        core.view
            .header()
            .state
            .store(QpState::Rts.to_raw(), Ordering::Release);
        let rs = UdRecvSide {
            rq: rq_rx,
            next: 0,
            stuck: 0,
        };
        if same {
            send_cq.attach(
                send_slot,
                SlotEntry::Ud {
                    core: core.clone(),
                    send: true,
                    recv: Some(rs),
                },
            );
        } else {
            send_cq.attach(
                send_slot,
                SlotEntry::Ud {
                    core: core.clone(),
                    send: true,
                    recv: None,
                },
            );
            recv_cq.attach(
                recv_slot,
                SlotEntry::Ud {
                    core: core.clone(),
                    send: false,
                    recv: Some(rs),
                },
            );
        }
        lock(&dev.ud_qps).insert(qpn, Arc::downgrade(&core));
        Ok(Self {
            core,
            rq: rq_tx,
            recv_posted: 0,
            posted: 0,
            _local: local,
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
        lock(&c.dev.ud_qps).remove(&c.qpn);
        c.send_cq.detach(c.send_slot);
        if !Arc::ptr_eq(&c.send_cq, &c.recv_cq) {
            c.recv_cq.detach(c.recv_slot);
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
        dev: &Arc<DevInner>,
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
        let db_fd = fds.pop().ok_or(FabricError::Protocol("missing doorbell"))?;
        let seg_fd = fds.pop().ok_or(FabricError::Protocol("missing segment"))?;
        let seg = dev.map_segment(seg_fd, seg_len, 4096, "peer-ud")?;
        // SAFETY: seg is a live mapping of seg.len() bytes kept alive in the returned value.
        let view =
            unsafe { UdSegView::attach(seg.as_ptr(), seg.len()) }.map_err(FabricError::Protocol)?;
        if view.header().qpn != qpn {
            return Err(FabricError::Protocol(
                "UD resolve answered for another queue pair",
            ));
        }
        let db_seg = dev.map_segment(db_fd, cq_seg_len, 4096, "peer-doorbell")?;
        if db_seg.len() < size_of::<Doorbell>() {
            return Err(FabricError::Protocol("peer doorbell too small"));
        }
        // SAFETY: at least one Doorbell long, page aligned.
        unsafe { &*db_seg.as_ptr().cast::<Doorbell>() }
            .hdr
            .check(super::layout::SegKind::Doorbell, db_seg.len())
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
pub(crate) fn answer_resolve(dev: &DevInner, sock: &std::os::fd::OwnedFd, qpn: u32) {
    let core = lock(&dev.ud_qps)
        .get(&qpn)
        .and_then(std::sync::Weak::upgrade);
    let mut buf = Vec::new();
    match core {
        Some(c) => {
            Msg::UdResolveRep {
                status: 0,
                qkey: c.qkey,
                cq_slot: c.recv_slot,
                seg_len: c.seg.len() as u64,
                cq_seg_len: c.recv_cq.db_seg.len() as u64,
            }
            .encode(&mut buf);
            let seg = c.seg.share_handle().map(|h| h.fd);
            let db = c.recv_cq.db_seg.share_handle().map(|h| h.fd);
            if let (Some(a), Some(b)) = (seg, db) {
                let _ = unix::send(sock.as_fd().as_raw_fd(), &buf, &[a, b]);
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
