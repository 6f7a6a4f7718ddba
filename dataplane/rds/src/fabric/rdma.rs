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

/// The window announcement appended to RDS-IB's private data (the kernel's rule for the
/// struct: "add new fields at the end"; a kernel peer reads only its own fields): magic
/// `DPRW`, 4 reserved bytes, the window's base address (big-endian).
pub const WINDOW_EXT_LEN: usize = 16;
const WINDOW_MAGIC: [u8; 4] = *b"DPRW";

/// The most private data the RDMA CM carries on a connect request (56 bytes on
/// InfiniBand): the announcement is appended only where it fits (IPv4; IPv6's private
/// data already takes all 56 bytes).
pub const CM_PRIVATE_MAX: usize = 56;

/// Appends the announcement of a window based at `base` after the `n` bytes of private
/// data in `buf`, if it fits; returns the new length.
pub fn append_window(buf: &mut [u8], n: usize, base: u64) -> usize {
    if n + WINDOW_EXT_LEN > CM_PRIVATE_MAX || n + WINDOW_EXT_LEN > buf.len() {
        return n;
    }
    buf[n..n + 4].copy_from_slice(&WINDOW_MAGIC);
    buf[n + 4..n + 8].fill(0);
    buf[n + 8..n + 16].copy_from_slice(&base.to_be_bytes());
    n + WINDOW_EXT_LEN
}

/// The window base a peer announced after its `struct_len` bytes of RDS-IB private data;
/// 0 (cookies are zero-based, as a kernel peer's) without an announcement. Any value is
/// accepted: it only places our RDMA operations in the peer's own memory, where its
/// provider checks every access against the key.
pub fn peer_window(private: &[u8], struct_len: usize) -> u64 {
    match private.get(struct_len..struct_len + WINDOW_EXT_LEN) {
        Some(t) if t[..4] == WINDOW_MAGIC => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&t[8..16]);
            u64::from_be_bytes(b)
        }
        _ => 0,
    }
}

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

    fn window(&self) -> (u64, u64) {
        (self.window.as_ptr() as u64, self.window.len() as u64)
    }

    fn deregister(&mut self, rkey: u32) {
        // Dropping the registration revokes its key.
        self.mrs.remove(&rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_window_announcement_round_trip_and_limits() {
        let mut b = [0u8; 80];
        assert_eq!(append_window(&mut b, 32, 0x7f12_3456_7000), 48);
        assert_eq!(peer_window(&b[..48], 32), 0x7f12_3456_7000);
        assert_eq!(peer_window(&b[..47], 32), 0, "truncated: none");
        assert_eq!(peer_window(&b[..32], 32), 0, "a kernel peer: zero-based");
        b[32] = b'X';
        assert_eq!(peer_window(&b[..48], 32), 0, "bad magic: none");
        assert_eq!(
            append_window(&mut b, 56, 1),
            56,
            "IPv6: no room in 56 bytes"
        );
    }
}
