//! The fabric transport's RDMA window: the memory sockets may register for peers
//! (`RDS_GET_MR`), and the [`RdmaMemory`] backend that registers it with the provider.
//!
//! A node that wants RDMA gives its transport one `mempool` region, the window
//! ([`FabricTransport::expose_window`](super::FabricTransport::expose_window)); RDMA buffers
//! are carved from it by the application, as DPDK and SPDK applications take DMA memory
//! from their hugepage pools. `RDS_GET_MR` registers exactly the pages of the asked range
//! (its own key, read-only unless `RDS_RDMA_READWRITE`), so a cookie reaches that range and
//! nothing else of ours; a range outside the window fails with `EFAULT`.

use std::collections::HashMap;
use std::sync::Arc;

use dp_fabric::{Access, MemoryRegion, ProtectionDomain, Provider};
use mempool::memory::Region;

use crate::engine::{PAGE_SIZE, RdmaMemory, Registered};
use crate::error::RdsError;

/// The largest window: cookie offsets are 32 bits.
pub const MAX_WINDOW: usize = u32::MAX as usize;

/// The registrations of one window, by remote key.
pub(crate) struct WindowMemory<P: Provider> {
    pd: P::Pd,
    window: Arc<Region>,
    mrs: HashMap<u32, P::Mr>,
}

impl<P: Provider> WindowMemory<P> {
    pub(crate) fn new(pd: P::Pd, window: Arc<Region>) -> Self {
        Self {
            pd,
            window,
            mrs: HashMap::new(),
        }
    }
}

impl<P: Provider> RdmaMemory for WindowMemory<P> {
    fn register(&mut self, addr: u64, bytes: u64, writable: bool) -> Result<Registered, RdsError> {
        let base = self.window.as_ptr() as u64;
        let len = self.window.len() as u64;
        let inside = addr >= base && addr.checked_add(bytes).is_some_and(|e| e <= base + len);
        if !inside {
            return Err(RdsError::Fault(
                "the range is not inside the node's RDMA window: take RDMA buffers from the region given to FabricTransport::expose_window",
            ));
        }
        let off = addr - base;
        let first = off / PAGE_SIZE * PAGE_SIZE;
        let end = (off + bytes).next_multiple_of(PAGE_SIZE).min(len);
        let mut access = Access::LOCAL_WRITE | Access::REMOTE_READ;
        if writable {
            access = access | Access::REMOTE_WRITE;
        }
        let mr = self
            .pd
            .reg_region(&self.window, first as usize, (end - first) as usize, access)
            .map_err(|_| {
                RdsError::NoMemory(
                    "the provider refused to register the range (over shm a range that overlaps another registered range must lie inside it or share no page with it)",
                )
            })?;
        let rkey = mr.rkey();
        if self.mrs.contains_key(&rkey) {
            return Err(RdsError::NoMemory(
                "the provider returned a remote key that is still in use",
            ));
        }
        self.mrs.insert(rkey, mr);
        Ok(Registered {
            rkey,
            offset: off as u32,
        })
    }

    fn deregister(&mut self, rkey: u32) {
        // Dropping the registration revokes its key.
        self.mrs.remove(&rkey);
    }
}
