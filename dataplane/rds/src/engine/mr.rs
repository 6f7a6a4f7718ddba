//! Memory regions for RDMA (`RDS_GET_MR`, `RDS_FREE_MR`): the cookie format, the
//! [`RdmaMemory`] backend a transport plugs into the engine, and the engine's key table
//! (the kernel's per-socket `rs_rdma_keys` tree, kept as one table keyed by remote key).
//!
//! # What memory a cookie can name
//!
//! Linux pins any user pages (`pin_user_pages_fast`); an address it cannot pin fails with
//! `EFAULT`. A peer process over the shm provider can only reach memory that provider
//! shares, and a Rust caller must not have references to bytes a peer writes at any time;
//! so here the backend names memory only inside the **RDMA window** the transport was given
//! (a `mempool` region, hugepage-backed when reserved: the fabric transport's
//! `FabricTransport::expose_window`), and an address range outside it fails with `EFAULT`,
//! as an unpinnable range does in Linux. Each region is registered on its own (its pages,
//! its key), so a peer holding one cookie reaches only that region.
//!
//! # Cookies
//!
//! A cookie is `rkey | (offset << 32)` as in Linux (`rds_rdma_make_cookie`). Linux's offset
//! is the first byte's offset in its page, because its memory regions are zero-based from
//! that page; the fabric providers address a peer's memory by its virtual address, so here
//! the offset is the first byte's offset in the owner's RDMA window (a window is at most
//! 4 GiB), and the sender adds the window's base, which the peer announced when the
//! connection was made. For the application nothing changes: a cookie is opaque, and the
//! remote address of an RDMA operation is `remote_vec.addr + offset` into the region, in
//! both.

use std::collections::HashMap;

use crate::error::RdsError;
use crate::uapi::{RDS_RDMA_INVALIDATE, RDS_RDMA_READWRITE, RDS_RDMA_USE_ONCE};
use crate::wire::MAX_MSG_SIZE;

/// The page size of the kernel's accounting (`PAGE_SIZE` on x86_64).
pub const PAGE_SIZE: u64 = 4096;

/// Builds a cookie (`rds_rdma_make_cookie`).
pub const fn make_cookie(rkey: u32, offset: u32) -> u64 {
    rkey as u64 | ((offset as u64) << 32)
}

/// The remote key of a cookie (`rds_rdma_cookie_key`).
pub const fn cookie_key(cookie: u64) -> u32 {
    cookie as u32
}

/// The offset of a cookie (`rds_rdma_cookie_offset`).
pub const fn cookie_offset(cookie: u64) -> u32 {
    (cookie >> 32) as u32
}

/// Pages spanned by `[addr, addr + bytes)` (`rds_pages_in_vec`): 0 for an empty range, one
/// that wraps, or one longer than 4 GiB.
pub fn pages_in_vec(addr: u64, bytes: u64) -> u64 {
    match addr.checked_add(bytes) {
        Some(end) if end > addr && bytes <= u64::from(u32::MAX) => {
            end.div_ceil(PAGE_SIZE) - addr / PAGE_SIZE
        }
        _ => 0,
    }
}

/// Checks a `RDS_GET_MR` range as `__rds_rdma_map` does, in its order: `EINVAL` for a
/// range that wraps (also once rounded up to a page) or is empty, `EMSGSIZE` above 1 MiB
/// plus the page an unaligned start costs.
///
/// # Errors
///
/// As listed.
pub fn check_mr_range(addr: u64, bytes: u64) -> Result<(), RdsError> {
    let end = addr.checked_add(bytes).ok_or(RdsError::InvalidArgument(
        "the region's address plus length wraps around",
    ))?;
    if end.checked_next_multiple_of(PAGE_SIZE).is_none() {
        return Err(RdsError::InvalidArgument(
            "the region's end rounded up to a page wraps around",
        ));
    }
    let pages = pages_in_vec(addr, bytes);
    if pages == 0 {
        return Err(RdsError::InvalidArgument(
            "the region is empty or longer than 4 GiB",
        ));
    }
    if pages - 1 > MAX_MSG_SIZE as u64 / PAGE_SIZE {
        return Err(RdsError::MessageTooLong {
            len: bytes as usize,
            limit: MAX_MSG_SIZE,
            what: "a memory region spans at most 1 MiB of pages (plus one for an unaligned start)",
        });
    }
    Ok(())
}

/// A registration made by a [`RdmaMemory`] backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The remote key a peer uses (unique among the backend's live registrations).
    pub rkey: u32,
    /// The first byte's offset in the RDMA window (the cookie's offset).
    pub offset: u32,
}

/// The memory a transport lets the engine register for peers' RDMA (`get_mr`,
/// `free_mr` of `struct rds_transport`). Control path: it may allocate and make system
/// calls; it is never called on the data path except to free a use-once region.
pub trait RdmaMemory: Send {
    /// Registers `[addr, addr + bytes)` (process virtual addresses) for peers: read only, or
    /// read and write with `writable`. The range was checked with [`check_mr_range`].
    ///
    /// # Errors
    ///
    /// `EFAULT` ([`RdsError::Fault`]) for memory outside the transport's RDMA window;
    /// `ENOMEM` when the provider cannot register more.
    fn register(&mut self, addr: u64, bytes: u64, writable: bool) -> Result<Registered, RdsError>;

    /// Deregisters the region of `rkey`: from now on a peer's access with it fails.
    fn deregister(&mut self, rkey: u32);

    /// The RDMA window: its first byte's address and its length. The local side of an
    /// RDMA operation must lie inside it (the transport reaches it through one local
    /// registration).
    fn window(&self) -> (u64, u64);
}

/// A live memory region of a socket (`struct rds_mr`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    /// The owning socket's slot and generation.
    pub(crate) sock: u32,
    pub(crate) generation: u32,
    /// `RDS_RDMA_USE_ONCE`: freed when the peer's RDMA extension header names it.
    pub(crate) use_once: bool,
}

/// The engine's memory regions: the backend, and every live region by remote key.
pub(crate) struct MrTable {
    backend: Box<dyn RdmaMemory>,
    keys: HashMap<u32, MrEntry>,
}

impl core::fmt::Debug for MrTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MrTable")
            .field("regions", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl MrTable {
    pub(crate) fn new(backend: Box<dyn RdmaMemory>) -> Self {
        Self {
            backend,
            keys: HashMap::new(),
        }
    }

    /// Registers a region for socket (`sock`, `generation`) and returns its cookie.
    pub(crate) fn get(
        &mut self,
        sock: u32,
        generation: u32,
        addr: u64,
        bytes: u64,
        flags: u64,
    ) -> Result<u64, RdsError> {
        check_mr_range(addr, bytes)?;
        let r = self
            .backend
            .register(addr, bytes, flags & RDS_RDMA_READWRITE != 0)?;
        if self.keys.contains_key(&r.rkey) {
            // A backend must not hand out a live key twice (the kernel BUG()s here).
            self.backend.deregister(r.rkey);
            return Err(RdsError::NoMemory(
                "the transport returned a remote key that is still in use",
            ));
        }
        let _ = flags & RDS_RDMA_INVALIDATE; // deregistration always revokes the key here
        self.keys.insert(
            r.rkey,
            MrEntry {
                sock,
                generation,
                use_once: flags & RDS_RDMA_USE_ONCE != 0,
            },
        );
        Ok(make_cookie(r.rkey, r.offset))
    }

    /// The region of `rkey` if socket (`sock`, `generation`) owns it.
    pub(crate) fn lookup(&self, sock: u32, generation: u32, rkey: u32) -> Option<MrEntry> {
        self.keys
            .get(&rkey)
            .filter(|e| e.sock == sock && e.generation == generation)
            .copied()
    }

    /// Frees the region of `rkey` if socket (`sock`, `generation`) owns it.
    pub(crate) fn free(&mut self, sock: u32, generation: u32, rkey: u32) -> bool {
        if self.lookup(sock, generation, rkey).is_none() {
            return false;
        }
        self.keys.remove(&rkey);
        self.backend.deregister(rkey);
        true
    }

    /// Frees every region of a socket (on close: `rds_rdma_drop_keys`). Returns how many.
    pub(crate) fn free_socket(&mut self, sock: u32, generation: u32) -> usize {
        let mut gone = Vec::new();
        self.keys.retain(|&k, e| {
            let mine = e.sock == sock && e.generation == generation;
            if mine {
                gone.push(k);
            }
            !mine
        });
        for &k in &gone {
            self.backend.deregister(k);
        }
        gone.len()
    }

    /// The offset in the window of `[addr, addr + bytes)`, if the range lies inside it.
    pub(crate) fn window_offset(&self, addr: u64, bytes: u64) -> Option<u64> {
        let (base, len) = self.backend.window();
        let off = addr.checked_sub(base)?;
        (off.checked_add(bytes)? <= len).then_some(off)
    }

    /// Live regions.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cookie_layout_is_linux() {
        let c = make_cookie(0x1234_5678, 0x9abc);
        assert_eq!(c, 0x0000_9abc_1234_5678);
        assert_eq!(cookie_key(c), 0x1234_5678);
        assert_eq!(cookie_offset(c), 0x9abc);
    }

    #[test]
    fn test_pages_in_vec() {
        assert_eq!(pages_in_vec(0, 0), 0);
        assert_eq!(pages_in_vec(4096, 1), 1);
        assert_eq!(pages_in_vec(4095, 2), 2);
        assert_eq!(pages_in_vec(8192, 8192), 2);
        assert_eq!(pages_in_vec(u64::MAX - 1, 4), 0);
        assert_eq!(pages_in_vec(0, 1 << 33), 0);
    }

    #[test]
    fn test_get_mr_range_errors() {
        let einval = |r: Result<(), RdsError>| matches!(r, Err(RdsError::InvalidArgument(_)));
        assert!(einval(check_mr_range(4096, 0)));
        assert!(einval(check_mr_range(u64::MAX - 10, 20)));
        assert!(einval(check_mr_range(u64::MAX - 4000, 10)));
        // 1 MiB at an unaligned start spans 257 pages: allowed; one more page is not.
        assert!(check_mr_range(100, MAX_MSG_SIZE as u64).is_ok());
        assert!(check_mr_range(0, MAX_MSG_SIZE as u64 + PAGE_SIZE).is_ok());
        assert!(matches!(
            check_mr_range(100, MAX_MSG_SIZE as u64 + PAGE_SIZE),
            Err(RdsError::MessageTooLong { .. })
        ));
    }
}
