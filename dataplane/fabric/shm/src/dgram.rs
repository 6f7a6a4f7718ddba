//! The engine of unreliable-datagram queue pairs: the datagram slot queue and the receive
//! side. [`ShmUdQp`](crate::ud::ShmUdQp) and [`ShmUdDest`](crate::ud::ShmUdDest), above the
//! completion queues, are the application's handles.
//!
//! Each UD queue pair owns a segment with a bounded multi-producer queue of datagram slots
//! (Vyukov-style sequence numbers), which any process that resolved it may fill. Datagram
//! semantics follow hardware: a send completes successfully whether or not the datagram is
//! delivered; datagrams that find the queue full, no receive posted, a wrong Q_Key or a
//! destroyed queue pair are dropped and counted in [`ShmStats::ud_dropped`]. Every receive
//! buffer starts with a 40-byte GRH area, as on InfiniBand and RoCE.
//!
//! [`ShmStats::ud_dropped`]: crate::ShmStats::ud_dropped

use std::collections::VecDeque;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mempool::memory::Region;
use mempool::ring::{Producer, Ring, Single};

use crate::core::DevCore;
use crate::cq_shared::{CqShared, CqTx};
use crate::layout::{UdMsg, UdSegView, ud_seg_len};
use crate::pd::PdInner;
use crate::rc::{RecvWqe, clamp_caps};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::types::{Completion, GRH_LEN, QpCaps, QpState, WcOpcode, WcStatus};

/// Consecutive polls a reserved-but-unpublished slot is tolerated before it is skipped.
const STUCK_POLLS: u32 = 1 << 20;

pub(crate) struct UdSend {
    pub backlog: VecDeque<Completion>,
    pub cq_tx: CqTx<Completion>,
    pub progress_tx: CqTx<u32>,
}

pub(crate) struct UdCore {
    pub dev: Arc<DevCore>,
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
    pub send: SpinLock<UdSend>,
    pub recv_consumed: AtomicU64,
    pub send_attn: AtomicBool,
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

    pub(crate) fn drop_one(&self) {
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
                        .peer_violations
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
            invalidated: None,
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

impl UdCore {
    /// Creates the engine of a UD queue pair: the core, the producer side of its receive
    /// queue, and the receive side its completion queue will own.
    pub(crate) fn create(
        dev: &Arc<DevCore>,
        pd: &Arc<PdInner>,
        send_cq: &Arc<CqShared>,
        recv_cq: &Arc<CqShared>,
        caps: QpCaps,
        qkey: u32,
    ) -> Result<(Arc<Self>, Producer<RecvWqe, Single>, UdRecvSide)> {
        let caps = clamp_caps(caps);
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
        let same = Arc::ptr_eq(send_cq, recv_cq);
        let (cq_tx, progress_tx) = send_cq.producers();
        let send_slot = send_cq.reserve_slot()?;
        let recv_slot = if same {
            send_slot
        } else {
            recv_cq.reserve_slot()?
        };
        let core = Arc::new(Self {
            dev: dev.clone(),
            qpn,
            qkey,
            pd: pd.clone(),
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
        Ok((core, rq_tx, rs))
    }
}
