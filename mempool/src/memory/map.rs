//! Low-level mapping primitives shared by the huge and normal paths: the
//! owned mapping type, memfd creation, pre-faulting and length rounding.

use std::alloc::Layout;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use memmap2::MmapRaw;

use super::MemError;

/// Longest memfd name the kernel accepts (`NAME_MAX` minus `"memfd:"`).
const MEMFD_NAME_MAX: usize = 249;

/// An owned mapping; dropping it unmaps.
#[derive(Debug)]
pub(crate) enum Memory {
    /// A memmap2 mapping (memfd or anonymous). Its length is always a
    /// multiple of the page size, rounded by us, so memmap2's `munmap` in
    /// `Drop` covers exactly what was mapped, hugetlb included.
    Mmap(MmapRaw),
    /// A `hugepage-rs` allocation.
    Huge(HugeAlloc),
}

impl Memory {
    /// Base address of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        match self {
            Self::Mmap(m) => m.as_mut_ptr(),
            Self::Huge(h) => h.ptr.as_ptr(),
        }
    }
}

/// Private anonymous hugetlb memory from `hugepage_rs::alloc`.
#[derive(Debug)]
pub(crate) struct HugeAlloc {
    /// Start of the mapping returned by `hugepage_rs::alloc(layout)`.
    ptr: NonNull<u8>,
    /// The layout it was allocated with; `layout.size()` is a multiple of
    /// the default hugepage size, so `dealloc` unmaps exactly the mapping.
    layout: Layout,
}

// SAFETY: a HugeAlloc owns a process-wide mapping with no thread affinity;
// it only hands out the raw base pointer, and unmapping (Drop) needs `self`
// by value or `&mut`, so moving or sharing the owner across threads is sound.
unsafe impl Send for HugeAlloc {}
// SAFETY: `&HugeAlloc` exposes only the base address (a copy); no interior
// state is mutated through a shared reference.
unsafe impl Sync for HugeAlloc {}

impl HugeAlloc {
    /// Takes ownership of a `hugepage_rs::alloc` result.
    ///
    /// # Safety
    ///
    /// `ptr` must have been returned (non-null) by `hugepage_rs::alloc(layout)`
    /// and not yet deallocated; the new value becomes its only owner.
    pub(crate) unsafe fn from_raw(ptr: NonNull<u8>, layout: Layout) -> Self {
        Self { ptr, layout }
    }
}

impl Drop for HugeAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`layout` come from `hugepage_rs::alloc` (from_raw's
        // contract) and this is the only owner, dropped once.
        unsafe { hugepage_rs::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// `len` rounded up to a multiple of `page` (a power of two); `None` on overflow.
pub(crate) fn round_up(len: usize, page: usize) -> Option<usize> {
    debug_assert!(page.is_power_of_two());
    len.checked_add(page - 1).map(|l| l & !(page - 1))
}

/// `memfd_create("mempool:<name>", flags)` as a `File`.
pub(crate) fn create_memfd(name: &str, flags: libc::c_uint) -> io::Result<File> {
    let mut label = format!("mempool:{name}");
    if label.len() > MEMFD_NAME_MAX {
        let mut cut = MEMFD_NAME_MAX;
        while !label.is_char_boundary(cut) {
            cut -= 1;
        }
        label.truncate(cut);
    }
    let label = CString::new(label).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `label` is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(label.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Seals a memfd's size (`F_SEAL_SHRINK | F_SEAL_GROW`): a process it is shared with can
/// no longer truncate it under our mapping (which would turn our next access into a
/// `SIGBUS`). The memfd must have been created with `MFD_ALLOW_SEALING`.
pub(crate) fn seal_size(file: &File) -> io::Result<()> {
    add_seals(file.as_raw_fd(), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
}

/// Adds `seals` to a memfd.
pub(crate) fn add_seals(fd: libc::c_int, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: plain fcntl on a descriptor the caller holds; no memory is passed.
    let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The seals of a memfd (`F_GET_SEALS`); an error for descriptors that cannot be sealed.
pub(crate) fn get_seals(fd: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: plain fcntl on a descriptor the caller holds; no memory is passed.
    let rc = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if rc >= 0 {
        Ok(rc)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Allocates the whole of a shmem memfd so a shortage is `ENOSPC`/`ENOMEM`
/// here instead of a `SIGBUS` at first touch.
pub(crate) fn fallocate(file: &File, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain system call on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes one zero byte per page of a freshly created mapping, so every page
/// is faulted in (allocated, reserved pages instantiated) before the region
/// is handed out.
///
/// # Safety
///
/// `[ptr, ptr + len)` must be a live, writable mapping that nobody else
/// accesses yet and whose content is still the kernel's zero fill (so the
/// writes change nothing observable); `stride` must be non-zero.
pub(crate) unsafe fn touch_pages(ptr: *mut u8, len: usize, stride: usize) {
    debug_assert!(stride > 0);
    for off in (0..len).step_by(stride) {
        // SAFETY: off < len, so the byte lies inside the caller's mapping,
        // which is writable and not yet shared (function contract).
        unsafe { ptr.add(off).write_volatile(0) };
    }
}

/// Faults in a mapping of existing shared pages without writing them
/// (`MADV_POPULATE_WRITE`, Linux 5.14+). Returns `Ok` on older kernels,
/// where `MAP_POPULATE` at mmap time was the best effort available.
pub(crate) fn populate_shared(map: &MmapRaw, name: &str, writable: bool) -> Result<(), MemError> {
    // SAFETY: the range is exactly the live mapping owned by `map`; the
    // advice only faults pages in and never changes their contents.
    let rc = unsafe {
        libc::madvise(
            map.as_mut_ptr().cast(),
            map.len(),
            if writable {
                libc::MADV_POPULATE_WRITE
            } else {
                libc::MADV_POPULATE_READ
            },
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINVAL) {
        return Ok(());
    }
    Err(MemError::Prefault {
        name: name.to_owned(),
        source: err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, 4096), Some(4096));
        assert_eq!(round_up(4096, 4096), Some(4096));
        assert_eq!(round_up(4097, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(usize::MAX, 4096), None);
    }

    #[test]
    fn long_memfd_names_are_truncated_not_rejected() {
        let name = "é".repeat(300);
        let f = create_memfd(&name, libc::MFD_CLOEXEC).expect("memfd_create");
        assert_eq!(f.metadata().expect("fstat").len(), 0);
    }
}
