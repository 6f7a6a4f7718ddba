//! Shared-memory segments: creating this process's, and mapping a peer's.
//!
//! Every object a peer touches lives in a memfd segment (a shareable `mempool` region on
//! normal pages). Segments we create start zeroed; segments a peer hands us are mapped from
//! the descriptor it sent, at the length it announced.

use std::os::fd::{AsRawFd, OwnedFd};
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

/// [`new_segment`] for a segment sent to one peer once (a queue pair's segment): its memfd
/// is returned instead of kept, so a process with many connections does not hold a
/// descriptor for each segment. Drop the descriptor once it has been sent.
pub(crate) fn new_segment_handing_off(
    ctx_id: u32,
    what: &str,
    len: usize,
) -> Result<(Arc<Region>, OwnedFd)> {
    let name = format!("shm-{ctx_id}-{what}");
    let (r, fd) = Region::new_handing_off(
        &RegionConfig::new(name, len)
            .shareable(true)
            .no_huge()
            .quiet(),
    )
    .map_err(|e| FabricError::Io {
        op: "creating a shared segment",
        source: std::io::Error::other(e),
    })?;
    Ok((Arc::new(r), fd))
}

/// Maps a peer's segment of `len` bytes (`page`: its page size), read-write. The memfd
/// must be exactly `len` bytes and sealed against shrinking (mempool checks both), so the
/// peer cannot truncate it under our mapping.
pub(crate) fn map_segment(fd: OwnedFd, len: u64, page: u64, what: &str) -> Result<Arc<Region>> {
    map(fd, len, page, what, true)
}

/// As [`map_segment`], read-only: for what the peer maintains and we only read.
pub(crate) fn map_segment_read_only(
    fd: OwnedFd,
    len: u64,
    page: u64,
    what: &str,
) -> Result<Arc<Region>> {
    map(fd, len, page, what, false)
}

fn map(fd: OwnedFd, len: u64, page: u64, what: &str, writable: bool) -> Result<Arc<Region>> {
    // Mapping pre-faults every page. A memfd with holes would make that allocate memory
    // on the peer's behalf: map only memfds whose pages all exist already (ours are
    // allocated when created).
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one stat into the buffer we own; the descriptor is live.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(FabricError::Protocol(
            "peer segment descriptor is not a file",
        ));
    }
    // SAFETY: fstat succeeded, so it initialised the buffer.
    let st = unsafe { st.assume_init() };
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    if allocated < len {
        return Err(FabricError::Protocol(
            "peer segment is not fully allocated (a sparse memfd)",
        ));
    }
    let len = usize::try_from(len).map_err(|_| FabricError::Protocol("segment too large"))?;
    let page = usize::try_from(page).map_err(|_| FabricError::Protocol("bad page size"))?;
    let r = if writable {
        Region::from_shared_quiet(fd, len, page, what)
    } else {
        Region::from_shared_read_only_quiet(fd, len, page, what)
    };
    let r = r.map_err(|e| FabricError::Io {
        op: "mapping a peer segment",
        source: std::io::Error::other(e),
    })?;
    Ok(Arc::new(r))
}
