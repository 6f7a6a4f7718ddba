//! Shared-memory segments: creating this process's, and mapping a peer's.
//!
//! Every object a peer touches lives in a memfd segment (a shareable `mempool` region on
//! normal pages). Segments we create start zeroed; segments a peer hands us are mapped from
//! the descriptor it sent, at the length it announced.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use mempool::memory::{Region, RegionConfig};

use dp_fabric::error::{FabricError, Result};

/// Creates a zero-filled shareable segment of `len` bytes for context `ctx_id`.
pub(crate) fn new_segment(ctx_id: u32, what: &str, len: usize) -> Result<Arc<Region>> {
    let name = format!("shm-{ctx_id}-{what}");
    let r = Region::new(
        &RegionConfig::new(name, len)
            .shareable(true)
            .no_huge()
            .quiet(),
    )
    .map_err(|e| FabricError::Io {
        op: "creating a shared segment",
        source: std::io::Error::other(e),
    })?;
    Ok(Arc::new(r))
}

/// Maps a peer's segment of `len` bytes (`page`: its page size).
pub(crate) fn map_segment(fd: OwnedFd, len: u64, page: u64, what: &str) -> Result<Arc<Region>> {
    let len = usize::try_from(len).map_err(|_| FabricError::Protocol("segment too large"))?;
    let page = usize::try_from(page).map_err(|_| FabricError::Protocol("bad page size"))?;
    let r = Region::from_shared_quiet(fd, len, page, what).map_err(|e| FabricError::Io {
        op: "mapping a peer segment",
        source: std::io::Error::other(e),
    })?;
    Ok(Arc::new(r))
}
