//! The part of a completion queue its queue pairs share: the doorbell peers ring, the
//! rings queue pairs fill with send completions and attention requests, and the slot
//! allocation. The poller ([`ShmCq`](crate::cq::ShmCq)) sits above the queue pairs; this
//! sits below them.

use std::sync::{Arc, Mutex};

use mempool::memory::Region;
use mempool::ring::{Multi, Producer};

use crate::core::DevCore;
use crate::layout::Doorbell;
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::Completion;

/// A completion queue's shared state.
pub(crate) struct CqShared {
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
    pub(crate) fn producers(&self) -> (Producer<Completion, Multi>, Producer<u32, Multi>) {
        let t = lock(&self.tx);
        (t.0.clone(), t.1.clone())
    }

    /// Queues `slot` for attention (out of band: error transitions and the like).
    pub(crate) fn notify(&self, slot: u32) {
        let mut t = lock(&self.tx);
        // The attention ring has room for two entries per slot and queue pairs
        // deduplicate, so this does not fail; if it ever did, the doorbell still works.
        if t.1.enqueue(slot).is_err() {
            self.doorbell().ring(slot);
        } else {
            // A poller sleeping on the doorbell must see the attention request too
            // (`ring` wakes on its own).
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
