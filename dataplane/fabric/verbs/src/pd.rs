//! Protection domains and memory regions.

use std::sync::Arc;

use mempool::memory::Region;
use rdma_sys as ffi;

use crate::Verbs;
use crate::conv::access_flags;
use crate::dev::DevInner;
use crate::sys::{errno, os_err};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{MemoryRegion, MemoryWindow, ProtectionDomain};
use dp_fabric::types::Access;

pub(crate) struct PdInner {
    pub pd: *mut ffi::ibv_pd,
    pub dev: Arc<DevInner>,
}

// SAFETY: ibv_pd handles may be used from any thread (libibverbs is thread safe); the
// pointer is only deallocated in Drop, when no clone is left.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every memory region, queue pair and address handle of the domain holds an Arc of
        // it, so nothing depends on the domain any more. A failure (device removed) leaks
        // the domain rather than panicking in Drop.
        // SAFETY: pd was allocated by ibv_alloc_pd and is deallocated once.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
    }
}

/// A protection domain of the verbs provider. Clones share the domain.
#[derive(Clone)]
pub struct VerbsPd {
    pub(crate) inner: Arc<PdInner>,
}

impl core::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: pd is live while self is; handle is plain data.
        let handle = unsafe { (*self.inner.pd).handle };
        f.debug_struct("VerbsPd")
            .field("device", &self.inner.dev.name())
            .field("handle", &handle)
            .finish()
    }
}

impl VerbsPd {
    pub(crate) fn new(dev: &Arc<DevInner>) -> Result<Self> {
        // SAFETY: dev.ctx is live for as long as dev.
        let pd = unsafe { ffi::ibv_alloc_pd(dev.ctx) };
        if pd.is_null() {
            return Err(FabricError::last_os("ibv_alloc_pd"));
        }
        Ok(Self {
            inner: Arc::new(PdInner {
                pd,
                dev: dev.clone(),
            }),
        })
    }

    fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
        keep: Option<Arc<Region>>,
    ) -> Result<VerbsMr> {
        let a = addr as u64;
        let bad = |why: String| FabricError::Registration {
            addr: a,
            len: len as u64,
            access: format!("{access:?}"),
            why,
        };
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(bad("REMOTE_WRITE requires LOCAL_WRITE (as in verbs)".into()));
        }
        if len == 0 {
            return Err(bad(
                "verbs cannot register zero bytes; register at least one byte".into(),
            ));
        }
        // SAFETY: the caller (reg_region, or reg_raw's caller) guarantees the range stays
        // mapped while the region is registered; pd is live.
        let mr = unsafe {
            ffi::ibv_reg_mr(self.inner.pd, addr.cast(), len, access_flags(access) as i32)
        };
        if mr.is_null() {
            let e = errno();
            let hint = match e {
                libc::ENOMEM | libc::EPERM | libc::EAGAIN => {
                    "; pinning it exceeded the locked-memory limit: raise RLIMIT_MEMLOCK \
                     (`ulimit -l unlimited`, or LimitMEMLOCK= for a service)"
                }
                libc::EFAULT => "; the range is not mapped",
                _ => "",
            };
            return Err(bad(format!("ibv_reg_mr failed: {}{hint}", os_err(e))));
        }
        // SAFETY: mr was just returned by ibv_reg_mr; its keys are plain data.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(VerbsMr {
            mr,
            _pd: self.inner.clone(),
            _keep: keep,
            addr: a,
            len,
            access,
            lkey,
            rkey,
        })
    }
}

impl ProtectionDomain for VerbsPd {
    type P = Verbs;

    fn reg_region(
        &self,
        region: &Arc<Region>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        if offset.checked_add(len).is_none_or(|e| e > region.len()) {
            return Err(FabricError::Registration {
                addr: region.as_ptr() as u64,
                len: len as u64,
                access: format!("{access:?}"),
                why: format!(
                    "range {offset}+{len} is outside the {}-byte region",
                    region.len()
                ),
            });
        }
        // SAFETY: offset + len <= region.len(), so the pointer stays inside the mapping.
        let addr = unsafe { region.as_ptr().add(offset) };
        // The memory region keeps the region mapped for as long as it is registered.
        self.register(addr, len, access, Some(region.clone()))
    }

    unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<VerbsMr> {
        self.register(addr, len, access, None)
    }

    /// Not implemented on this provider yet (`ibv_alloc_mw` and `IBV_WR_BIND_MW`):
    /// always fails with `EOPNOTSUPP`, and binds and local invalidations are refused at
    /// post time.
    fn alloc_mw(&self) -> Result<VerbsMw> {
        Err(FabricError::Io {
            op: "allocating a memory window (the verbs provider has no memory windows yet)",
            source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })
    }
}

/// A memory window of the verbs provider: none can exist yet (see
/// [`VerbsPd::alloc_mw`](ProtectionDomain::alloc_mw)).
#[derive(Debug)]
pub enum VerbsMw {}

impl MemoryWindow for VerbsMw {
    fn rkey(&self) -> u32 {
        match *self {}
    }
}

/// A memory region registered with the verbs provider. Dropping it deregisters it, which
/// revokes its keys; the hardware cannot touch the memory afterwards.
pub struct VerbsMr {
    mr: *mut ffi::ibv_mr,
    _pd: Arc<PdInner>,
    _keep: Option<Arc<Region>>,
    addr: u64,
    len: usize,
    access: Access,
    lkey: u32,
    rkey: u32,
}

// SAFETY: the ibv_mr is only read (keys copied at creation) and deregistered in Drop;
// libibverbs allows that from any thread.
unsafe impl Send for VerbsMr {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for VerbsMr {}

impl core::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // A failure (device removed) leaks the registration rather than panicking in Drop;
        // the region itself is released after this, by the Arc.
        // SAFETY: mr came from ibv_reg_mr and is deregistered once; its PD is alive (_pd).
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

impl MemoryRegion for VerbsMr {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn access(&self) -> Access {
        self.access
    }
}
