//! Protection domains and memory regions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// The domain's memory regions and windows, for the post-time checks of a window bind
    /// and the `ibv_mr`/`ibv_mw` pointers `IBV_WR_BIND_MW` needs (see [`Keys`]).
    keys: Mutex<Keys>,
}

/// What a window bind needs to know of a registered region.
#[derive(Clone, Copy)]
pub(crate) struct MrRec {
    pub mr: *mut ffi::ibv_mr,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

/// The memory regions (by local key) and windows (by the upper 24 bits of their key) of one
/// protection domain. An entry is added when the object is created and removed, under the
/// same lock, before it is destroyed, so a bind that found its region and window here can
/// post with their pointers while it holds the lock.
///
/// A window's `ibv_mw.rkey` is kept equal to the key it is bound under (the last bind
/// posted): `IBV_WR_BIND_MW` passes it as the window's current key, which the device
/// checks, as libibverbs' own `ibv_bind_mw` does for type-1 windows.
#[derive(Default)]
pub(crate) struct Keys {
    mrs: HashMap<u32, MrRec>,
    mws: HashMap<u32, *mut ffi::ibv_mw>,
}

impl Keys {
    /// The post-time check of a window bind, the rules a verbs device applies when it
    /// executes one (IBA C10-72 to C10-75): `rkey`'s upper 24 bits name a window of this
    /// domain, `lkey` a region of it registered with `MW_BIND`, the range is not empty and
    /// lies inside the region, the rights are remote ones, and remote write has a region
    /// with local write. Returns the window and the region to post with.
    pub(crate) fn check_bind(
        &self,
        rkey: u32,
        lkey: u32,
        access: Access,
        addr: u64,
        len: u64,
    ) -> Option<(*mut ffi::ibv_mw, MrRec)> {
        let mw = *self.mws.get(&(rkey >> 8))?;
        let mr = *self.mrs.get(&lkey)?;
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let inside = addr >= mr.addr && addr.checked_add(len)? <= mr.addr.checked_add(mr.len)?;
        let ok = len > 0
            && inside
            && access.bits() & !remote.bits() == 0
            && mr.access.contains(Access::MW_BIND)
            && (!access.contains(Access::REMOTE_WRITE) || mr.access.contains(Access::LOCAL_WRITE));
        ok.then_some((mw, mr))
    }
}

impl PdInner {
    /// The domain's key table, locked. A poisoned lock is taken over: every update of the
    /// table is a single insert or remove.
    pub(crate) fn keys(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
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
                keys: Mutex::new(Keys::default()),
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
        self.inner.keys().mrs.insert(
            lkey,
            MrRec {
                mr,
                addr: a,
                len: len as u64,
                access,
            },
        );
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

    /// A type-2 window (`ibv_alloc_mw`). It is bound with [`SendOp::BindMw`] on a queue
    /// pair of this domain and, as type-2 windows are on verbs devices (IBA o10-37.2.30),
    /// must be invalidated before it is bound again. On rxe (type 2B) a bound window is
    /// reachable only through the queue pair that bound it.
    ///
    /// [`SendOp::BindMw`]: dp_fabric::SendOp::BindMw
    fn alloc_mw(&self) -> Result<VerbsMw> {
        let unsupported = |why: &'static str| FabricError::Io {
            op: why,
            source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        if self.inner.dev.max_mw == 0 {
            return Err(unsupported(
                "allocating a memory window (this RDMA device reports max_mw = 0: it has none)",
            ));
        }
        // SAFETY: pd is live; ibv_alloc_mw returns a new window or null (errno set).
        let mw = unsafe { ffi::ibv_alloc_mw(self.inner.pd, ffi::ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = match mw {
            None => {
                return Err(unsupported(
                    "allocating a memory window (this device's provider library has no ibv_alloc_mw)",
                ));
            }
            Some(p) if p.is_null() => return Err(FabricError::last_os("ibv_alloc_mw")),
            Some(p) => p,
        };
        // SAFETY: mw was just returned by ibv_alloc_mw; its key is plain data.
        let rkey = unsafe { (*mw).rkey };
        self.inner.keys().mws.insert(rkey >> 8, mw);
        Ok(VerbsMw {
            mw,
            pd: self.inner.clone(),
            rkey,
        })
    }
}

/// A type-2 memory window of the verbs provider (see
/// [`VerbsPd::alloc_mw`](ProtectionDomain::alloc_mw)). Dropping it deallocates it, which
/// makes every key it was bound under invalid.
pub struct VerbsMw {
    mw: *mut ffi::ibv_mw,
    pd: Arc<PdInner>,
    rkey: u32,
}

// SAFETY: the window's pointer is used only under its domain's key-table lock (binds, and
// Drop); libibverbs allows that from any thread.
unsafe impl Send for VerbsMw {}
// SAFETY: as above; `rkey` is immutable.
unsafe impl Sync for VerbsMw {}

impl core::fmt::Debug for VerbsMw {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsMw")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryWindow for VerbsMw {
    fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for VerbsMw {
    fn drop(&mut self) {
        // Out of the table first, under its lock, so no bind can be posted with the
        // pointer once it is freed. A failure (device removed) leaks the window.
        let mut keys = self.pd.keys();
        keys.mws.remove(&(self.rkey >> 8));
        // SAFETY: mw came from ibv_alloc_mw and is deallocated once; its PD is alive.
        unsafe { ffi::ibv_dealloc_mw(self.mw) };
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
        // Out of the domain's table first, under its lock, so no window bind is posted with
        // the pointer once it is freed. A failure (device removed) leaks the registration
        // rather than panicking in Drop; the region itself is released after this, by the
        // Arc.
        let mut keys = self._pd.keys();
        if keys.mrs.get(&self.lkey).is_some_and(|r| r.mr == self.mr) {
            keys.mrs.remove(&self.lkey);
        }
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
