//! Completion queues.
//!
//! A completion queue has three inputs:
//!
//! * a local multi-producer ring of send completions, filled by its queue pairs when a
//!   send request finishes;
//! * a local *attention* ring of queue-pair slots that need the poller: sends blocked on
//!   credits or bounce space, and queue pairs that went to the error state;
//! * inbound messages from peers, found through the shared doorbell bitmap or, while at
//!   most [`SCAN_MAX`] queue pairs receive here, by looking at each one's next inbound slot
//!   directly, which saves the poller a cache miss per message. Peers always set their
//!   doorbell bit; in scan mode the bits stay set and cost the sender nothing.
//!
//! The two local rings are looked at only when the queue's hot line says something was
//! put in them (`cq_shared`, "The hot line"), and the scan list keeps, per queue pair, its
//! segment and the number of its next message ([`RecvWatch`]): `may_have_work` on an idle
//! queue reads five lines, none of them a queue pair's own.
//!
//! `poll` makes progress on all three and writes completions into the caller's slice: no
//! allocation, no system call, no lock on the common path.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mempool::ring::{Consumer, Ring, Single};

use crate::core::DevCore;
use crate::cq_shared::{CqShared, Hot};
use crate::dgram::{UdCore, UdRecvSide};
use crate::layout::{DOORBELL_SLOTS, Doorbell};
use crate::qpseg::RecvWatch;
use crate::rc::{QpCore, RecvSide};
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{CompletionQueue, CqNotify};
use dp_fabric::types::Completion;

/// Up to this many receiving queue pairs, `poll` scans them instead of the doorbell.
pub(crate) const SCAN_MAX: usize = 8;

/// What a completion queue knows about one attached queue pair.
pub(crate) enum SlotEntry {
    /// A reliable-connected queue pair.
    Rc {
        core: Arc<QpCore>,
        send: bool,
        recv: Option<RecvSide>,
    },
    /// A datagram queue pair.
    Ud {
        core: Arc<UdCore>,
        send: bool,
        recv: Option<UdRecvSide>,
    },
}

impl SlotEntry {
    pub(crate) fn rc(core: Arc<QpCore>, send: bool, recv: Option<RecvSide>) -> Self {
        Self::Rc { core, send, recv }
    }

    pub(crate) fn ud(core: Arc<UdCore>, send: bool, recv: Option<UdRecvSide>) -> Self {
        Self::Ud { core, send, recv }
    }

    fn receives(&self) -> bool {
        match self {
            Self::Rc { recv, .. } => recv.is_some(),
            Self::Ud { recv, .. } => recv.is_some(),
        }
    }
}

/// A receiving queue pair in the scan list: its slot, and (reliable-connected ones) the
/// look at its segment and the number of its next inbound message, kept current by
/// `service_recv` while the queue is in scan mode, so `may_have_work` reads neither the
/// slot table nor the queue pair.
#[derive(Clone, Copy, Debug)]
struct Scan {
    slot: u32,
    watch: Option<RecvWatch>,
    next_in: u64,
}

/// Queue pairs attached to or detached from a completion queue, waiting for its poller.
pub(crate) struct CqOps {
    ops: Mutex<Vec<(u32, Option<SlotEntry>)>>,
    /// Its flag is on the queue's hot line (`Hot::ops`).
    sh: Arc<CqShared>,
}

impl CqOps {
    /// Hands a queue pair to the poller (taken in at its next `poll`).
    pub(crate) fn attach(&self, slot: u32, e: SlotEntry) {
        lock(&self.ops).push((slot, Some(e)));
        // Release: pairs with the Acquire in `ShmCq::poll`: the op is queued first.
        self.sh.hot.ops.store(true, Ordering::Release);
    }

    /// Removes a queue pair; its slot is freed once the poller has let go of it.
    pub(crate) fn detach(&self, slot: u32) {
        lock(&self.ops).push((slot, None));
        // Release: as in attach.
        self.sh.hot.ops.store(true, Ordering::Release);
    }
}

/// A completion queue of the shm provider.
///
/// `repr(C)` and line-aligned: the two fields a look at an idle queue reads
/// (`may_have_work`: the shared state, for its hot line, and the scan list) share the
/// struct's first line.
#[repr(C, align(64))]
pub struct ShmCq {
    sh: Arc<CqShared>,
    scan: Vec<Scan>,
    ops: Arc<CqOps>,
    local: Consumer<Completion, Single>,
    attn: Consumer<u32, Single>,
    slots: Vec<Option<SlotEntry>>,
    depth: u32,
}

impl core::fmt::Debug for ShmCq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmCq")
            .field("id", &self.sh.id)
            .field("depth", &self.depth)
            .field("receivers", &self.scan.len())
            .finish()
    }
}

impl ShmCq {
    pub(crate) fn new(dev: &Arc<DevCore>, depth: u32) -> Result<Self> {
        if depth == 0 || depth > dev.attr.max_cqe {
            return Err(FabricError::InvalidArgument {
                what: "completion queue depth",
                why: format!("{depth} is outside 1..={}", dev.attr.max_cqe),
            });
        }
        let id = dev.next_id();
        let db_seg = dev.new_segment(&format!("cq{id}"), size_of::<Doorbell>())?;
        // SAFETY: the new segment is zeroed, page aligned and big enough; not yet shared.
        unsafe { (*db_seg.as_ptr().cast::<Doorbell>()).init(dev.ctx_id) };
        let cap = depth.next_power_of_two() as usize;
        let ring_err = |e: mempool::ring::RingError| FabricError::InvalidArgument {
            what: "completion queue depth",
            why: e.to_string(),
        };
        let (ctx, crx) = Ring::<Completion>::mpsc(cap).map_err(ring_err)?;
        // Queue pairs on this queue are bounded by its depth (each needs at least one entry),
        // so the attention ring (one entry per queue pair, doubled for slack) is sized by it.
        let max_slots = cap.clamp(32, DOORBELL_SLOTS);
        let (atx, arx) = Ring::<u32>::mpsc(2 * max_slots).map_err(ring_err)?;
        // Slots are handed out below `max_slots` (`CqShared::alloc_slot`), so the tables are
        // that long: a doorbell bit a peer sets above it finds no entry (`slots.get`). At
        // the full 4096 the table is ~390 KiB, which every small queue (one per rsocket)
        // paid.
        let mut slots = Vec::with_capacity(max_slots);
        slots.resize_with(max_slots, || None);
        let sh = Arc::new(CqShared {
            _dev: dev.clone(),
            id,
            db_seg,
            hot: crossbeam_utils::CachePadded::new(Hot::default()),
            tx: Mutex::new((ctx, atx)),
            used: Mutex::new(vec![false; max_slots]),
            max_slots,
        });
        Ok(Self {
            ops: Arc::new(CqOps {
                ops: Mutex::new(Vec::new()),
                sh: sh.clone(),
            }),
            sh,
            local: crx,
            attn: arx,
            slots,
            scan: Vec::with_capacity(max_slots),
            depth,
        })
    }

    pub(crate) fn shared(&self) -> &Arc<CqShared> {
        &self.sh
    }

    /// Where queue pairs attach and detach.
    pub(crate) fn ops(&self) -> &Arc<CqOps> {
        &self.ops
    }

    #[cold]
    fn absorb(&mut self) {
        // Relaxed clear before taking the list: an op queued after the take sets the flag
        // again (Release) and is absorbed next time.
        self.sh.hot.ops.store(false, Ordering::Relaxed);
        let ops = std::mem::take(&mut *lock(&self.ops.ops));
        for (slot, e) in ops {
            let i = slot as usize;
            match e {
                Some(e) => {
                    if e.receives() {
                        self.scan.push(Scan {
                            slot,
                            watch: None,
                            next_in: 0,
                        });
                    }
                    self.slots[i] = Some(e);
                    // Look once: work may have arrived before the attach was absorbed.
                    self.sh.doorbell().ring(slot);
                }
                None => {
                    self.slots[i] = None;
                    self.scan.retain(|s| s.slot != slot);
                    self.sh.release_slot(slot);
                }
            }
        }
        // The watches start (or start again, after doorbell mode, where they are not kept)
        // from the receive sides themselves.
        for s in &mut self.scan {
            (s.watch, s.next_in) = match self.slots.get(s.slot as usize) {
                Some(Some(SlotEntry::Rc {
                    core,
                    recv: Some(rs),
                    ..
                })) => (core.view.watch(), rs.next_in),
                _ => (None, 0),
            };
        }
    }

    /// Handles the receive side of `slot`; returns completions written.
    #[inline]
    fn service_recv(&mut self, slot: u32, out: &mut [Completion]) -> usize {
        let (n, more) = match self.slots.get_mut(slot as usize) {
            Some(Some(SlotEntry::Rc {
                core,
                recv: Some(rs),
                ..
            })) => {
                let r = core.drain_recv(rs, out);
                if r.0 > 0 && self.scan.len() <= SCAN_MAX {
                    let next_in = rs.next_in;
                    if let Some(s) = self.scan.iter_mut().find(|s| s.slot == slot) {
                        s.next_in = next_in;
                    }
                }
                r
            }
            Some(Some(SlotEntry::Ud {
                core,
                recv: Some(rs),
                ..
            })) => core.drain_recv(rs, out),
            _ => (0, false),
        };
        if more && n == out.len() {
            // Out of room: look again next poll.
            self.sh.doorbell().ring(slot);
        }
        n
    }

    /// Handles an attention entry.
    fn service_attn(&mut self, slot: u32, out: &mut [Completion]) -> usize {
        let mut busy = false;
        let mut recv = false;
        match self.slots.get(slot as usize) {
            Some(Some(SlotEntry::Rc {
                core,
                send,
                recv: r,
            })) => {
                if *send {
                    core.clear_attn(true);
                    busy = !core.progress();
                }
                if r.is_some() {
                    core.clear_attn(false);
                    recv = true;
                }
            }
            Some(Some(SlotEntry::Ud {
                core,
                send,
                recv: r,
            })) => {
                if *send {
                    core.clear_attn(true);
                    busy = !core.progress();
                }
                if r.is_some() {
                    core.clear_attn(false);
                    recv = true;
                }
            }
            _ => {}
        }
        if busy {
            self.sh.notify(slot);
        }
        if recv {
            self.service_recv(slot, out)
        } else {
            0
        }
    }
}

impl CompletionQueue for ShmCq {
    fn poll(&mut self, out: &mut [Completion]) -> usize {
        if out.is_empty() {
            return 0;
        }
        // Acquire: pairs with the Release in attach/detach.
        if self.sh.hot.ops.load(Ordering::Acquire) {
            self.absorb();
        }
        let mut n = 0;
        // The rings are drained only when their producers said so (L2, `Hot::take_local`);
        // whatever this poll leaves in them keeps the flag up.
        if self.sh.hot.take_local() {
            // Attention first: it may produce send completions for the local ring.
            let k = self.attn.len();
            for _ in 0..k {
                let Some(slot) = self.attn.dequeue() else {
                    break;
                };
                n += self.service_attn(slot, &mut out[n..]);
                if n == out.len() {
                    self.sh.hot.keep_local();
                    return n;
                }
            }
            n += self.local.dequeue_burst(&mut out[n..]);
            if n == out.len() {
                self.sh.hot.keep_local();
                return n;
            }
        }
        if self.scan.len() <= SCAN_MAX {
            for i in 0..self.scan.len() {
                let slot = self.scan[i].slot;
                n += self.service_recv(slot, &mut out[n..]);
                if n == out.len() {
                    break;
                }
            }
        } else {
            let sh = self.sh.clone();
            sh.doorbell().take(|slot| {
                if n < out.len() {
                    n += self.service_recv(slot, &mut out[n..]);
                } else {
                    sh.doorbell().ring(slot);
                }
            });
        }
        n
    }

    fn depth(&self) -> u32 {
        self.depth
    }

    fn may_have_work(&self) -> bool {
        // Acquire: as in `poll` (pairs with the Release in attach/detach, and with L1 of
        // the rings' producers).
        if self.sh.hot.ops.load(Ordering::Acquire)
            || self.sh.hot.local.load(Ordering::Acquire)
            || self.scan.len() > SCAN_MAX
        {
            return true;
        }
        self.scan.iter().any(|s| match s.watch {
            Some(w) => w.pending(s.next_in),
            // Datagram queue pairs (and anything unexpected): poll to find out.
            None => true,
        })
    }

    fn notifier(&self) -> Option<Arc<dyn CqNotify>> {
        Some(Arc::new(Notifier(self.sh.clone())))
    }
}

/// A completion queue's notifier: its doorbell's futex (see [`Doorbell`]). Peers ring the
/// doorbell for every inbound message; local attention requests ring it too.
struct Notifier(Arc<CqShared>);

impl CqNotify for Notifier {
    fn arm(&self) -> u32 {
        self.0.doorbell().arm()
    }

    fn sleep(&self, token: u32, timeout: std::time::Duration) {
        self.0.doorbell().sleep(token, timeout);
    }

    fn disarm(&self) {
        self.0.doorbell().disarm();
    }
}
