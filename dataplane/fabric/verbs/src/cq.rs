//! Completion queues.
//!
//! `poll` calls `ibv_poll_cq` into a stack array of at most [`POLL_BATCH`] work completions
//! and converts each into the caller's slice: the queue pair is found by number in a small
//! sorted table of the queue pairs attached to this queue, the hardware `wr_id` is decoded
//! (see [`track`](super::track)) into the caller's `wr_id`, and send-queue slots are retired.
//! The table lives behind a mutex that only queue-pair creation and destruction contend
//! for; a completion of a queue pair that is no longer attached (left in the queue when it
//! was destroyed) is dropped.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::{Arc, Mutex};

use rdma_sys as ffi;

use crate::conv::{wc_opcode, wc_status};
use crate::dev::{DevInner, lock};
use crate::track::Track;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::CompletionQueue;
use dp_fabric::types::{Completion, WcOpcode, WcStatus};

/// Work completions fetched per `ibv_poll_cq` call.
pub(crate) const POLL_BATCH: usize = 32;

pub(crate) struct CqInner {
    pub cq: *mut ffi::ibv_cq,
    pub dev: Arc<DevInner>,
    /// Attached queue pairs, sorted by number.
    table: Mutex<Vec<Arc<Track>>>,
}

// SAFETY: ibv_cq handles may be used from any thread; polling is serialised by VerbsCq's
// &mut self, and the table is behind a mutex.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Queue pairs hold an Arc of their queues, so none is attached any more. A failure
        // (device removed) leaks the queue rather than panicking in Drop.
        // SAFETY: cq came from ibv_create_cq and is destroyed once.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

impl CqInner {
    /// Attaches a queue pair's tracking state (at creation).
    pub(crate) fn attach(&self, t: &Arc<Track>) {
        let mut tab = lock(&self.table);
        match tab.binary_search_by_key(&t.qpn, |e| e.qpn) {
            // A stale entry for a destroyed queue pair with the same number: replace it.
            Ok(i) => tab[i] = t.clone(),
            Err(i) => tab.insert(i, t.clone()),
        }
    }

    /// Detaches a queue pair (before it is destroyed).
    pub(crate) fn detach(&self, t: &Arc<Track>) {
        let mut tab = lock(&self.table);
        if let Ok(i) = tab.binary_search_by_key(&t.qpn, |e| e.qpn)
            && Arc::ptr_eq(&tab[i], t)
        {
            tab.remove(i);
        }
    }
}

/// A completion queue of the verbs provider.
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
    depth: u32,
}

impl core::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("device", &self.inner.dev.name())
            .field("depth", &self.depth)
            .field("queue_pairs", &lock(&self.inner.table).len())
            .finish()
    }
}

impl VerbsCq {
    pub(crate) fn new(dev: &Arc<DevInner>, depth: u32) -> Result<Self> {
        let max = dev.attr.max_cqe;
        if depth == 0 || depth > max {
            return Err(FabricError::InvalidArgument {
                what: "completion queue depth",
                why: format!("{depth} is outside 1..={max} (the device's max_cqe)"),
            });
        }
        // SAFETY: dev.ctx is live; no completion channel (polled mode), vector 0.
        let cq = unsafe {
            ffi::ibv_create_cq(dev.ctx, depth as i32, ptr::null_mut(), ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(FabricError::last_os("ibv_create_cq"));
        }
        // SAFETY: cq is live; cqe is plain data (the granted depth, at least `depth`).
        let granted = unsafe { (*cq).cqe };
        Ok(Self {
            inner: Arc::new(CqInner {
                cq,
                dev: dev.clone(),
                table: Mutex::new(Vec::new()),
            }),
            depth: u32::try_from(granted).unwrap_or(depth).max(depth),
        })
    }
}

/// The kernel's `IB_WC_WITH_INVALIDATE` (`1 << 2`; libibverbs' `IBV_WC_WITH_INV` is
/// `1 << 3`). Providers whose completions the kernel writes (Soft-RoCE copies the kernel's
/// `ib_uverbs_wc` into the user's queue) pass the kernel's bits through, where this bit is
/// libibverbs' `IBV_WC_IP_CSUM_OK`, which a reliable-connected receive never reports.
const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// Converts one work completion, or `None` if it belongs to no attached queue pair.
fn convert(tab: &[Arc<Track>], wc: &ffi::ibv_wc) -> Option<Completion> {
    let i = tab.binary_search_by_key(&wc.qp_num, |e| e.qpn).ok()?;
    let t = &tab[i];
    let status = wc_status(wc.status);
    let r = t.complete(wc.wr_id, status.is_ok())?;
    let mut c = Completion {
        wr_id: r.wr_id,
        status,
        opcode: r.opcode,
        byte_len: 0,
        imm: None,
        qp_num: wc.qp_num,
        src_qp: 0,
        invalidated: None,
    };
    if status != WcStatus::Success {
        // Only wr_id, status and qp_num are defined for failed requests.
        return Some(c);
    }
    if r.recv {
        c.opcode = wc_opcode(wc.opcode).unwrap_or(WcOpcode::Recv);
        c.byte_len = wc.byte_len;
        if wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM set the union holds the immediate (network order).
            c.imm = Some(u32::from_be(unsafe {
                wc.imm_data_invalidated_rkey_union.imm_data
            }));
        } else if wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0
            || (!t.ud && wc.wc_flags & KERNEL_WC_WITH_INVALIDATE != 0)
        {
            // SAFETY: with IBV_WC_WITH_INV set the union holds the invalidated key (host
            // order).
            c.invalidated = Some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey });
        }
        if t.ud {
            c.src_qp = wc.src_qp;
        }
    } else if r.opcode == WcOpcode::RdmaRead {
        c.byte_len = wc.byte_len;
    }
    Some(c)
}

impl CompletionQueue for VerbsCq {
    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return 0;
        }
        let mut wcs = [const { MaybeUninit::<ffi::ibv_wc>::uninit() }; POLL_BATCH];
        // SAFETY: cq is live; the array has room for `want` work completions, which the
        // provider writes and counts in its return value.
        let n = unsafe { ffi::ibv_poll_cq(self.inner.cq, want as i32, wcs.as_mut_ptr().cast()) };
        if n <= 0 {
            // n < 0 means the provider failed to read the queue (e.g. an overrun): nothing to
            // report through this interface; the queue pairs fault on their own.
            return 0;
        }
        let n = (n as usize).min(want);
        let tab = lock(&self.inner.table);
        let mut k = 0;
        for wc in &wcs[..n] {
            // SAFETY: the first n entries were written by ibv_poll_cq.
            let wc = unsafe { wc.assume_init_ref() };
            if let Some(c) = convert(&tab, wc) {
                out[k] = c;
                k += 1;
            }
        }
        k
    }

    fn depth(&self) -> u32 {
        self.depth
    }
}
