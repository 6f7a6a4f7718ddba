//! The part of a completion queue its queue pairs share: the doorbell peers ring, the
//! rings queue pairs fill with send completions and attention requests, and the slot
//! allocation. The poller ([`ShmCq`](crate::cq::ShmCq)) sits above the queue pairs; this
//! sits below them.
//!
//! # The hot line
//!
//! What the poller must look at before it knows whether anything local is waiting (queue
//! pairs to attach or detach, send completions, attention requests) is summed up in two
//! flags on one line ([`Hot`]): producers set `local` after every enqueue on either ring
//! (through [`CqTx`], the only producer handle queue pairs get), and the poll clears it
//! before it drains them. A look at an idle queue ([`ShmCq::may_have_work`]) then reads
//! that one line, not the producer side of each ring and the attach list's flag, three
//! lines that a loop serving many idle connections fetches cold for each.
//!
//! [`ShmCq::may_have_work`]: dp_fabric::traits::CompletionQueue::may_have_work

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use mempool::memory::Region;
use mempool::ring::{Multi, Producer};

use crate::core::DevCore;
use crate::layout::Doorbell;
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::Completion;

/// The flags a poll looks at first (module doc).
#[derive(Debug, Default)]
pub(crate) struct Hot {
    /// Queue pairs wait to be attached or detached (`CqOps`).
    pub ops: AtomicBool,
    /// Something may be in the send-completion or the attention ring: set after each
    /// enqueue (L1), cleared by the poll before it drains them (L2).
    pub local: AtomicBool,
}

impl Hot {
    /// L2: the poll takes the flag before it drains the rings. Acquire: pairs with L1, so
    /// every element whose flag this clears is seen by the drain; one enqueued after the
    /// clear sets the flag again.
    #[inline]
    pub(crate) fn take_local(&self) -> bool {
        // The plain load first: an idle queue's poll does not write the line.
        self.local.load(Ordering::Relaxed) && self.local.swap(false, Ordering::Acquire)
    }

    /// The poll left elements in the rings (its output was full): look again.
    #[inline]
    pub(crate) fn keep_local(&self) {
        // Relaxed: the poller's own note to itself (same thread as `take_local`).
        self.local.store(true, Ordering::Relaxed);
    }
}

/// A producer handle on one of a completion queue's local rings: every enqueue sets the
/// queue's `local` flag (L1), so the poll and `may_have_work` learn of it from the hot line.
pub(crate) struct CqTx<T> {
    ring: Producer<T, Multi>,
    sh: Arc<CqShared>,
}

impl<T: Copy + Send> CqTx<T> {
    /// Enqueues `v` (given back if the ring is full).
    #[inline]
    pub(crate) fn enqueue(&mut self, v: T) -> core::result::Result<(), T> {
        self.ring.enqueue(v)?;
        // L1: Release, pairs with L2 (`Hot::take_local`) and with the Acquire load in
        // `may_have_work`: the element is in the ring before the flag says so.
        self.sh.hot.local.store(true, Ordering::Release);
        Ok(())
    }
}

/// A completion queue's shared state.
#[repr(C)]
pub(crate) struct CqShared {
    /// First, on a line of its own: what a poll looks at first (module doc).
    pub hot: CachePadded<Hot>,
    /// Keeps the device (and its service thread) alive while the queue exists.
    pub _dev: Arc<DevCore>,
    pub id: u64,
    pub db_seg: Arc<Region>,
    pub tx: Mutex<(Producer<Completion, Multi>, Producer<u32, Multi>)>,
    pub used: Mutex<Vec<bool>>,
    pub max_slots: usize,
}

// SAFETY: db_seg keeps the doorbell mapped; the doorbell is accessed through atomics only.
unsafe impl Send for CqShared {}
// SAFETY: as above; all other fields are Sync.
unsafe impl Sync for CqShared {}

impl CqShared {
    #[inline]
    pub(crate) fn doorbell(&self) -> &Doorbell {
        // SAFETY: db_seg was created at least one Doorbell long and lives as long as self.
        unsafe { &*self.db_seg.as_ptr().cast::<Doorbell>() }
    }

    /// Producer handles for a new queue pair: completions and attention.
    pub(crate) fn producers(self: &Arc<Self>) -> (CqTx<Completion>, CqTx<u32>) {
        let t = lock(&self.tx);
        (
            CqTx {
                ring: t.0.clone(),
                sh: self.clone(),
            },
            CqTx {
                ring: t.1.clone(),
                sh: self.clone(),
            },
        )
    }

    /// Queues `slot` for attention (out of band: error transitions and the like).
    pub(crate) fn notify(&self, slot: u32) {
        let mut t = lock(&self.tx);
        // The attention ring has room for two entries per slot and queue pairs
        // deduplicate, so this does not fail; if it ever did, the doorbell still works.
        if t.1.enqueue(slot).is_err() {
            self.doorbell().ring(slot);
        } else {
            // L1 (as in `CqTx::enqueue`); SeqCst besides, for N1 (`Doorbell::ring`): a
            // poller sleeping on the doorbell must see the attention request too, either
            // through the wake below or through its last look after its arm (`ring` wakes
            // on its own).
            self.hot.local.store(true, Ordering::SeqCst);
            self.doorbell().wake_sleepers();
        }
    }

    pub(crate) fn reserve_slot(&self) -> Result<u32> {
        let mut u = lock(&self.used);
        let i = u[..self.max_slots]
            .iter()
            .position(|b| !*b)
            .ok_or(FabricError::Exhausted {
                what: "queue pairs on this completion queue",
                limit: self.max_slots as u64,
                hint: "create the completion queue deeper, or spread queue pairs over more queues",
            })?;
        u[i] = true;
        Ok(i as u32)
    }

    pub(crate) fn release_slot(&self, slot: u32) {
        if let Some(b) = lock(&self.used).get_mut(slot as usize) {
            *b = false;
        }
    }
}
