//! [`Region`]: creation (huge or normal pages), peer mapping, sharing, drop.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::huge::{self, Mapped};
use super::kernel::Limit;
use super::map::{
    Memory, add_seals, create_memfd, fallocate, get_seals, populate_shared, round_up, seal_size,
    touch_pages,
};
use super::notice::{self, Residency, Size};
use super::registry;
use super::sys::{base_page_size, has_cap_ipc_lock, locked_bytes, memlock_limit};
use super::{Backend, HugePolicy, MemError, RegionConfig};

/// Source of region ids. Relaxed: ids only need to be unique, and the
/// fetch_add read-modify-write is atomic on its own; nothing is published
/// through this counter.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A pre-faulted, page-aligned memory region; unmapped on drop.
///
/// See the [module docs](super) for backends and invariants. The region
/// hands out raw pointers only; synchronising access to its bytes is the
/// caller's job.
pub struct Region {
    /// Name from the config (or given to `from_shared`).
    name: String,
    /// Process-unique id, also the registry's `region_id`.
    id: u64,
    /// Length in bytes; a non-zero multiple of `page_size`.
    len: usize,
    /// Page size of the mapping.
    page_size: usize,
    backend: Backend,
    residency: Residency,
    /// False for a peer's region mapped read-only ([`Region::from_shared_read_only_quiet`]).
    writable: bool,
    /// Dropped (unmapped) before `file` is closed; declared first for that.
    mem: Memory,
    /// The memfd of shareable backends; registered in [`registry`] while live.
    file: Option<File>,
}

/// What a peer needs to map a shareable region: pass all three fields,
/// unchanged, to [`Region::from_shared`] on the other side (after sending
/// the fd with `SCM_RIGHTS` or letting a child inherit it).
#[derive(Clone, Copy, Debug)]
pub struct ShareHandle<'a> {
    /// The region's memfd, borrowed from the region.
    pub fd: BorrowedFd<'a>,
    /// Region length in bytes (the memfd's size).
    pub len: usize,
    /// Page size of the memfd (2 MiB for hugetlb, else the base page size).
    pub page_size: usize,
}

// Regions move between lcores and are shared by reference across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Region>();
};

fn validate(name: &str, len: usize) -> Result<(), MemError> {
    let reason = if name.is_empty() {
        "name is empty; name the region, it appears in notices and /proc/<pid>/maps"
    } else if name.contains('\0') {
        "name contains a NUL byte; use a plain name"
    } else if len == 0 {
        "len is 0; ask for at least one byte"
    } else if len > isize::MAX as usize / 2 {
        "len is larger than the address space can map; ask for less"
    } else {
        return Ok(());
    };
    Err(MemError::InvalidConfig {
        name: name.to_owned(),
        reason,
    })
}

/// Locks normal pages if the memlock limit (or `CAP_IPC_LOCK`) allows.
fn lock_pages(map: &MmapRaw) -> Residency {
    if !has_cap_ipc_lock()
        && let Limit::Bytes(limit) = memlock_limit().soft
    {
        let used = locked_bytes().unwrap_or(0);
        if used.saturating_add(map.len() as u64) > limit {
            return Residency::Unlocked(format!(
                "RLIMIT_MEMLOCK is {} with {} already locked, raise it with \
                 `ulimit -l unlimited` or grant CAP_IPC_LOCK",
                Size(limit),
                Size(used)
            ));
        }
    }
    match map.lock() {
        Ok(()) => Residency::Locked,
        Err(e) => Residency::Unlocked(format!("mlock failed: {e}, see `dpctl check`")),
    }
}

/// Normal pages backed by a shmem memfd.
fn map_normal_memfd(name: &str, len: usize) -> Result<Mapped, MemError> {
    let page_size = base_page_size();
    let len = round_up(len, page_size).ok_or_else(|| MemError::InvalidConfig {
        name: name.to_owned(),
        reason: "len overflows when rounded up to the page size; ask for less",
    })?;
    let file = create_memfd(name, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING).map_err(|e| {
        MemError::MemfdCreate {
            name: name.to_owned(),
            source: e,
        }
    })?;
    let size_err = |op, source| MemError::MemfdSize {
        name: name.to_owned(),
        len,
        op,
        source,
    };
    file.set_len(len as u64)
        .map_err(|e| size_err("ftruncate", e))?;
    fallocate(&file, len).map_err(|e| size_err("fallocate", e))?;
    seal_size(&file).map_err(|e| size_err("fcntl(F_ADD_SEALS)", e))?;
    let map = MmapOptions::new()
        .len(len)
        .populate()
        .map_raw(&file)
        .map_err(|e| MemError::Map {
            name: name.to_owned(),
            len,
            source: e,
        })?;
    // SAFETY: fresh writable shared mapping of a memfd nobody else has seen
    // yet; its pages are the kernel's zero fill.
    unsafe { touch_pages(map.as_mut_ptr(), len, page_size) };
    Ok(Mapped {
        mem: Memory::Mmap(map),
        len,
        page_size,
        file: Some(file),
    })
}

/// Normal pages, private and anonymous.
fn map_normal_anon(name: &str, len: usize) -> Result<Mapped, MemError> {
    let page_size = base_page_size();
    let len = round_up(len, page_size).ok_or_else(|| MemError::InvalidConfig {
        name: name.to_owned(),
        reason: "len overflows when rounded up to the page size; ask for less",
    })?;
    let map = MmapOptions::new()
        .len(len)
        .populate()
        .map_anon()
        .map_err(|e| MemError::Map {
            name: name.to_owned(),
            len,
            source: e,
        })?;
    let map = MmapRaw::from(map);
    // SAFETY: fresh private writable anonymous mapping, zero-filled, not
    // yet visible to anyone else.
    unsafe { touch_pages(map.as_mut_ptr(), len, page_size) };
    Ok(Mapped {
        mem: Memory::Mmap(map),
        len,
        page_size,
        file: None,
    })
}

impl Region {
    /// Creates a region as `cfg` asks; see the [module docs](super) for
    /// which backend each combination gets. Emits one notice line.
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidConfig`] for an empty name or zero length;
    /// [`MemError::HugepageShortage`] / [`MemError::HugepagesUnsupported`]
    /// under [`HugePolicy::Require`]; the system-call variants when memory,
    /// descriptors or address space run out.
    ///
    /// # Examples
    ///
    /// ```
    /// use mempool::memory::{Backend, Region, RegionConfig};
    ///
    /// let r = Region::new(&RegionConfig::new("ctl-ring", 10_000).no_huge())?;
    /// assert_eq!(r.backend(), Backend::NormalAnon);
    /// assert!(r.len() >= 10_000 && r.len() % r.page_size() == 0);
    /// assert!(r.contains(r.as_ptr() as usize, r.len()));
    /// # Ok::<(), mempool::memory::MemError>(())
    /// ```
    pub fn new(cfg: &RegionConfig) -> Result<Self, MemError> {
        let name = cfg.name.as_str();
        validate(name, cfg.len)?;
        let why_normal = match cfg.huge {
            HugePolicy::Never => "hugepages off (no_huge)".to_owned(),
            HugePolicy::Auto | HugePolicy::Require => {
                let (tried, backend) = if cfg.shareable {
                    (huge::map_memfd(name, cfg.len), Backend::HugeMemfd)
                } else {
                    (huge::map_anon(name, cfg.len), Backend::HugeAnon)
                };
                match tried {
                    Ok(m) => {
                        return Ok(Self::finish(
                            name,
                            m,
                            backend,
                            Residency::Hugetlb,
                            None,
                            false,
                            cfg.quiet,
                        ));
                    }
                    Err(f) if cfg.huge == HugePolicy::Require => return Err(f.into_error(name)),
                    Err(f) => f.fallback_reason(),
                }
            }
        };
        let (mapped, backend) = if cfg.shareable {
            (map_normal_memfd(name, cfg.len)?, Backend::NormalMemfd)
        } else {
            (map_normal_anon(name, cfg.len)?, Backend::NormalAnon)
        };
        let residency = match &mapped.mem {
            Memory::Mmap(m) => lock_pages(m),
            Memory::Huge(_) => Residency::Hugetlb,
        };
        Ok(Self::finish(
            name,
            mapped,
            backend,
            residency,
            Some(&why_normal),
            false,
            cfg.quiet,
        ))
    }

    /// [`Region::new`] for a shareable region that is handed to one peer once: the memfd is
    /// returned to the caller instead of being kept by the region, so a process with many
    /// such regions (one per connection, say) does not hold a descriptor for each. The
    /// region is not listed in the [`registry`] and its
    /// [`share_handle`](Region::share_handle) is `None`; the mapping stays valid after the
    /// caller closes the descriptor.
    ///
    /// # Errors
    ///
    /// As [`Region::new`]; [`MemError::InvalidConfig`] for a config that is not shareable.
    pub fn new_handing_off(cfg: &RegionConfig) -> Result<(Self, OwnedFd), MemError> {
        if !cfg.shareable {
            return Err(MemError::InvalidConfig {
                name: cfg.name.clone(),
                reason: "only a shareable region has a memfd to hand off; set shareable(true)",
            });
        }
        let mut r = Self::new(cfg)?;
        registry::remove(r.as_ptr() as usize, r.id);
        let file = r.file.take().ok_or_else(|| MemError::InvalidConfig {
            name: cfg.name.clone(),
            reason: "the region came out without a memfd",
        })?;
        Ok((r, OwnedFd::from(file)))
    }

    /// Maps a peer's shareable region from its memfd, read-write and
    /// `MAP_SHARED`, pre-faulted (and `mlock`ed for normal pages).
    ///
    /// `len` and `page_size` are the peer's [`ShareHandle`] fields; they are
    /// checked against the fd (`st_size` and `st_blksize`, which is the
    /// hugepage size on hugetlbfs) so a mixed-up fd fails here, not with a
    /// `SIGBUS` later. The fd is owned by the new region and closed on drop.
    /// The region is listed in the [`registry`] like any shareable region.
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidConfig`] for inconsistent arguments,
    /// [`MemError::SharedFd`] / [`MemError::SharedMismatch`] when the fd is
    /// not the announced region, [`MemError::Map`] / [`MemError::Prefault`]
    /// when mapping fails.
    pub fn from_shared(
        fd: OwnedFd,
        len: usize,
        page_size: usize,
        name: &str,
    ) -> Result<Self, MemError> {
        Self::map_shared(fd, len, page_size, name, false, true)
    }

    /// [`Region::from_shared`] for control segments mapped in large numbers (one or more
    /// per connection): no notice line, and the descriptor is closed once the memory is
    /// mapped (the mapping stays valid), so thousands of peer mappings do not use
    /// thousands of descriptors. Such a region cannot be shared again: its
    /// [`share_handle`](Region::share_handle) is `None` and the [`registry`] does not list
    /// it.
    ///
    /// # Errors
    ///
    /// As [`Region::from_shared`].
    pub fn from_shared_quiet(
        fd: OwnedFd,
        len: usize,
        page_size: usize,
        name: &str,
    ) -> Result<Self, MemError> {
        Self::map_shared(fd, len, page_size, name, true, true)
    }

    /// [`Region::from_shared_quiet`], mapped read-only (`PROT_READ`): for a peer's memory
    /// this process must never write, such as a table the peer alone maintains (and has
    /// sealed with [`Region::seal_future_write`], so no writable mapping is possible).
    /// [`Region::store_u8`] and [`Region::copy_in`] panic on such a region; raw pointers
    /// from [`Region::as_ptr`] must only be read.
    ///
    /// # Errors
    ///
    /// As [`Region::from_shared`].
    pub fn from_shared_read_only_quiet(
        fd: OwnedFd,
        len: usize,
        page_size: usize,
        name: &str,
    ) -> Result<Self, MemError> {
        Self::map_shared(fd, len, page_size, name, true, false)
    }

    fn map_shared(
        fd: OwnedFd,
        len: usize,
        page_size: usize,
        name: &str,
        quiet: bool,
        writable: bool,
    ) -> Result<Self, MemError> {
        validate(name, len)?;
        if !page_size.is_power_of_two()
            || page_size < base_page_size()
            || !len.is_multiple_of(page_size)
        {
            return Err(MemError::InvalidConfig {
                name: name.to_owned(),
                reason: "page_size must be a power of two no smaller than the base page and \
                         len a multiple of it; pass the ShareHandle fields unchanged",
            });
        }
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| MemError::SharedFd {
            name: name.to_owned(),
            source: e,
        })?;
        let fd_page_size = usize::try_from(meta.blksize()).unwrap_or(0);
        if meta.len() != len as u64 || fd_page_size != page_size {
            return Err(MemError::SharedMismatch {
                name: name.to_owned(),
                len,
                page_size,
                fd_len: meta.len(),
                fd_page_size,
            });
        }
        // A file the peer can still shrink would turn our next access past its new end
        // into a SIGBUS: map only memfds sealed against shrinking (every shareable region
        // mempool creates is).
        let sealed = get_seals(file.as_raw_fd()).is_ok_and(|s| s & libc::F_SEAL_SHRINK != 0);
        if !sealed {
            return Err(MemError::SharedFd {
                name: name.to_owned(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the memfd is not sealed against shrinking (F_SEAL_SHRINK), so its owner \
                     could truncate it under this mapping; share regions created by mempool \
                     (they are sealed), or seal the memfd",
                ),
            });
        }
        let opts = MmapOptions::new().len(len).populate().clone();
        let mapped = if writable {
            opts.map_raw(&file)
        } else {
            opts.map_raw_read_only(&file)
        };
        let map = mapped.map_err(|e| MemError::Map {
            name: name.to_owned(),
            len,
            source: e,
        })?;
        populate_shared(&map, name, writable)?;
        let (backend, residency) = if page_size > base_page_size() {
            (Backend::HugeMemfd, Residency::Hugetlb)
        } else {
            (Backend::NormalMemfd, lock_pages(&map))
        };
        let mapped = Mapped {
            mem: Memory::Mmap(map),
            len,
            page_size,
            // Quiet peer mappings give their descriptor back at once (see
            // `from_shared_quiet`); the kernel keeps the mapped pages alive.
            file: (!quiet).then_some(file),
        };
        let mut r = Self::finish(name, mapped, backend, residency, None, true, quiet);
        r.writable = writable;
        Ok(r)
    }

    /// Registers (if shareable), announces and wraps a mapping.
    fn finish(
        name: &str,
        m: Mapped,
        backend: Backend,
        residency: Residency,
        why_normal: Option<&str>,
        from_peer: bool,
        quiet: bool,
    ) -> Self {
        debug_assert!(m.len > 0 && m.len.is_multiple_of(m.page_size));
        debug_assert!((m.mem.as_ptr() as usize).is_multiple_of(m.page_size));
        debug_assert!(m.file.is_none() || backend.is_shareable());
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if let Some(file) = &m.file {
            registry::insert(
                m.mem.as_ptr() as usize,
                m.len,
                m.page_size,
                file.as_fd(),
                id,
            );
        }
        if !quiet {
            notice::emit(&notice::region_notice(
                name,
                m.len,
                m.page_size,
                backend,
                &residency,
                why_normal,
                from_peer,
            ));
        }
        Self {
            name: name.to_owned(),
            id,
            len: m.len,
            page_size: m.page_size,
            backend,
            residency,
            writable: true,
            mem: m.mem,
            file: m.file,
        }
    }

    /// Base address; aligned to [`page_size`](Self::page_size) and stable
    /// until drop.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Length in bytes: the requested length rounded up to whole pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a region holds at least one page. Present for the
    /// `len`/`is_empty` convention.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page size of the backing memory (4 KiB, 2 MiB, ...).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The backend the region got.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether the pages can never be swapped out: `mlock` succeeded for
    /// normal pages, or the region is on hugetlb pages (which the kernel
    /// never swaps, so they need no `mlock`).
    pub fn is_locked(&self) -> bool {
        !matches!(self.residency, Residency::Unlocked(_))
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process-unique id (the registry's `region_id`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether `[addr, addr + len)` lies inside the region. An empty range
    /// counts when `addr` itself is inside.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        registry::range_within(self.as_ptr() as usize, self.len, addr, len)
    }

    /// Seals the region's memfd against new writable mappings and writes
    /// (`F_SEAL_FUTURE_WRITE`): the mapping this process already holds stays writable,
    /// while a peer given the memfd can from now on only map it read-only. For tables this
    /// process maintains and peers only read. Permanent.
    ///
    /// # Errors
    ///
    /// [`MemError::SharedFd`] for a region without a memfd or a kernel without the seal
    /// (Linux 5.1+).
    pub fn seal_future_write(&self) -> Result<(), MemError> {
        let err = |source| MemError::SharedFd {
            name: self.name.clone(),
            source,
        };
        let f = self.file.as_ref().ok_or_else(|| {
            err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the region has no memfd; create it shareable",
            ))
        })?;
        add_seals(f.as_raw_fd(), libc::F_SEAL_FUTURE_WRITE).map_err(err)
    }

    /// False for a region mapped read-only ([`Region::from_shared_read_only_quiet`]).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The memfd and geometry a peer needs, or `None` for anonymous backends.
    pub fn share_handle(&self) -> Option<ShareHandle<'_>> {
        self.file.as_ref().map(|f| ShareHandle {
            fd: f.as_fd(),
            len: self.len,
            page_size: self.page_size,
        })
    }

    /// Reads byte `off` with a volatile load: the way to poll memory that a peer (or an
    /// RDMA provider) writes asynchronously, such as the last byte of a latency buffer.
    ///
    /// # Panics
    ///
    /// If `off` is outside the region (a caller bug, never a peer's input).
    #[inline]
    pub fn load_u8(&self, off: usize) -> u8 {
        assert!(
            off < self.len,
            "offset {off} outside region '{}' of {} bytes",
            self.name,
            self.len
        );
        // SAFETY: off < len, so the byte is inside the live mapping; volatile because other
        // processes or the fabric may write it concurrently.
        unsafe { self.as_ptr().add(off).read_volatile() }
    }

    /// Writes byte `off` with a volatile store (see [`Region::load_u8`]).
    ///
    /// # Panics
    ///
    /// If `off` is outside the region.
    #[inline]
    pub fn store_u8(&self, off: usize, v: u8) {
        assert!(self.writable, "region '{}' is mapped read-only", self.name);
        assert!(
            off < self.len,
            "offset {off} outside region '{}' of {} bytes",
            self.name,
            self.len
        );
        // SAFETY: off < len, inside the live, writable mapping.
        unsafe { self.as_ptr().add(off).write_volatile(v) }
    }

    /// Copies `src` into the region at `off`.
    ///
    /// The copy is not atomic with respect to peers: order it with the fabric (post the
    /// send that reads these bytes afterwards, or copy after the completion that says a
    /// peer's write has landed).
    ///
    /// # Panics
    ///
    /// If the range is outside the region.
    pub fn copy_in(&self, off: usize, src: &[u8]) {
        assert!(self.writable, "region '{}' is mapped read-only", self.name);
        assert!(
            off.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "range {off}+{} outside region '{}' of {} bytes",
            src.len(),
            self.name,
            self.len
        );
        // SAFETY: the destination range lies inside the live, writable mapping (checked);
        // src is a live slice that cannot overlap the mapping's bytes through a reference
        // (the region never hands out references).
        unsafe { super::copy::copy_bytes(src.as_ptr(), self.as_ptr().add(off), src.len()) }
    }

    /// Copies bytes at `off` out of the region into `dst` (ordering as [`Region::copy_in`]).
    ///
    /// # Panics
    ///
    /// If the range is outside the region.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.checked_add(dst.len()).is_some_and(|e| e <= self.len),
            "range {off}+{} outside region '{}' of {} bytes",
            dst.len(),
            self.name,
            self.len
        );
        // SAFETY: the source range lies inside the live mapping (checked); dst is a live
        // exclusive slice outside the mapping.
        unsafe { super::copy::copy_bytes(self.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `len` bytes at `src_off` of region `src` to `off` of this one (ordering as
    /// [`Region::copy_in`]): a RAM disk's block into a transport's buffer with one copy and
    /// no reference to either mapping. `src` may be this region; the ranges may overlap.
    ///
    /// # Panics
    ///
    /// If either range is outside its region, or this region is read-only.
    pub fn copy_from(&self, off: usize, src: &Self, src_off: usize, len: usize) {
        assert!(self.writable, "region '{}' is mapped read-only", self.name);
        for (r, o) in [(self, off), (src, src_off)] {
            assert!(
                o.checked_add(len).is_some_and(|e| e <= r.len),
                "range {o}+{len} outside region '{}' of {} bytes",
                r.name,
                r.len
            );
        }
        let (from, to) = (
            src.as_ptr() as usize + src_off,
            self.as_ptr() as usize + off,
        );
        if from.abs_diff(to) < len {
            // SAFETY: both ranges lie inside live mappings (checked), the destination
            // writable; `copy` allows their overlap (a region with itself); neither mapping
            // is referenced.
            unsafe { core::ptr::copy(src.as_ptr().add(src_off), self.as_ptr().add(off), len) }
        } else {
            // SAFETY: as above, and the ranges do not overlap (checked just above).
            unsafe {
                super::copy::copy_bytes(src.as_ptr().add(src_off), self.as_ptr().add(off), len)
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Unregister before the fields drop: the registry must stop handing
        // out dups of the fd before `file` closes it.
        if self.file.is_some() {
            registry::remove(self.as_ptr() as usize, self.id);
        }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("base", &self.as_ptr())
            .field("len", &self.len)
            .field("page_size", &self.page_size)
            .field("backend", &self.backend)
            .field("locked", &self.is_locked())
            .finish()
    }
}
