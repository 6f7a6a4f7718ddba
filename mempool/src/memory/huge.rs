//! The hugepage backends: shareable (hugetlb memfd, 2 MiB) and private
//! (`hugepage-rs`, default hugepage size).
//!
//! Both count the pool before mapping, so the common shortage is reported
//! with exact numbers without touching the kernel's reservation; both also
//! map the kernel's own refusal (`ENOMEM` at `mmap`, where hugetlb reserves
//! pages for mappings without `MAP_NORESERVE`) to the same shortage, which
//! covers races with other processes and hugetlb cgroup limits.

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::ptr::NonNull;

use memmap2::MmapOptions;

use super::MemError;
use super::kernel::HugepagePool;
use super::map::{HugeAlloc, Memory, create_memfd, round_up, seal_size, touch_pages};
use super::notice::PageSize;
use super::sys::{HUGE_2M, default_hugepage_size, hugepage_pool, pool_dir};

/// A mapped hugepage region, before it becomes a `Region`.
#[derive(Debug)]
pub(crate) struct Mapped {
    pub(crate) mem: Memory,
    pub(crate) len: usize,
    pub(crate) page_size: usize,
    pub(crate) file: Option<File>,
}

/// Why the hugepage path did not produce a region.
#[derive(Debug)]
pub(crate) enum HugeFailure {
    /// Too few pages, counted or refused by the kernel.
    Shortage { wanted: u64, pool: HugepagePool },
    /// The kernel offers no pool of this size.
    Unsupported { page_size: usize, detail: String },
    /// Any other failure of the hugepage path.
    Os(MemError),
}

impl HugeFailure {
    /// The error for `HugePolicy::Require`.
    pub(crate) fn into_error(self, name: &str) -> MemError {
        match self {
            Self::Shortage { wanted, pool } => MemError::HugepageShortage {
                name: name.to_owned(),
                wanted_pages: wanted,
                free_pages: pool.available(),
                total_pages: pool.total,
                page_size: pool.page_size,
            },
            Self::Unsupported { page_size, detail } => MemError::HugepagesUnsupported {
                name: name.to_owned(),
                page_size,
                detail,
            },
            Self::Os(e) => e,
        }
    }

    /// The reason shown in the notice when `HugePolicy::Auto` falls back.
    pub(crate) fn fallback_reason(&self) -> String {
        match self {
            Self::Shortage { wanted, pool } => {
                let avail = pool.available();
                if avail == 0 {
                    format!(
                        "no free hugepages: {avail} of {} free, see `dpctl check`",
                        pool.total
                    )
                } else {
                    format!(
                        "too few free {} hugepages: need {wanted}, {avail} of {} free, \
                         see `dpctl check`",
                        PageSize(pool.page_size),
                        pool.total
                    )
                }
            }
            Self::Unsupported { page_size, detail } => {
                format!("no {} hugepages: {detail}", PageSize(*page_size))
            }
            Self::Os(e) => format!("hugepage mapping failed: {e}"),
        }
    }
}

fn unsupported(page_size: usize, err: &io::Error) -> HugeFailure {
    HugeFailure::Unsupported {
        page_size,
        detail: format!("cannot read {} ({err})", pool_dir(page_size).display()),
    }
}

fn too_large(name: &str) -> HugeFailure {
    HugeFailure::Os(MemError::InvalidConfig {
        name: name.to_owned(),
        reason: "len overflows when rounded up to the hugepage size; ask for less",
    })
}

/// Counts the pool and checks `len` (rounded) fits in what is available.
fn plan(
    name: &str,
    len: usize,
    page_size: usize,
) -> Result<(usize, u64, HugepagePool), HugeFailure> {
    let pool = hugepage_pool(page_size).map_err(|e| unsupported(page_size, &e))?;
    let len = round_up(len, page_size).ok_or_else(|| too_large(name))?;
    let wanted = (len / page_size) as u64;
    if pool.available() < wanted {
        return Err(HugeFailure::Shortage { wanted, pool });
    }
    Ok((len, wanted, pool))
}

/// Turns an mmap error into a shortage (`ENOMEM`: the kernel refused the
/// reservation) or an OS failure.
fn map_failure(
    name: &str,
    len: usize,
    wanted: u64,
    counted: HugepagePool,
    err: io::Error,
) -> HugeFailure {
    if err.raw_os_error() == Some(libc::ENOMEM) {
        // Re-read so the message shows the pool as it is now, not as it was
        // when we counted (another process may have taken the pages).
        let pool = hugepage_pool(counted.page_size).unwrap_or(counted);
        HugeFailure::Shortage { wanted, pool }
    } else {
        HugeFailure::Os(MemError::Map {
            name: name.to_owned(),
            len,
            source: err,
        })
    }
}

/// Shareable hugepages: a 2 MiB hugetlb memfd, mapped shared and populated.
pub(crate) fn map_memfd(name: &str, len: usize) -> Result<Mapped, HugeFailure> {
    let page_size = HUGE_2M;
    let (len, wanted, pool) = plan(name, len, page_size)?;
    let flags =
        libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB | libc::MFD_ALLOW_SEALING;
    let file = create_memfd(name, flags).map_err(|e| {
        if e.raw_os_error() == Some(libc::EINVAL) {
            HugeFailure::Unsupported {
                page_size,
                detail: "memfd_create(MFD_HUGETLB | MFD_HUGE_2MB) is rejected by this kernel"
                    .to_owned(),
            }
        } else {
            HugeFailure::Os(MemError::MemfdCreate {
                name: name.to_owned(),
                source: e,
            })
        }
    })?;
    // ftruncate on hugetlbfs only sets the size; the reservation is taken
    // by the mmap below.
    file.set_len(len as u64).map_err(|e| {
        HugeFailure::Os(MemError::MemfdSize {
            name: name.to_owned(),
            len,
            op: "ftruncate",
            source: e,
        })
    })?;
    seal_size(&file).map_err(|e| {
        HugeFailure::Os(MemError::MemfdSize {
            name: name.to_owned(),
            len,
            op: "fcntl(F_ADD_SEALS)",
            source: e,
        })
    })?;
    let map = MmapOptions::new()
        .len(len)
        .populate()
        .map_raw(&file)
        .map_err(|e| map_failure(name, len, wanted, pool, e))?;
    // SAFETY: `map` is a fresh writable mapping of `len` bytes of a memfd
    // nobody else has seen yet (zero-filled by the kernel).
    unsafe { touch_pages(map.as_mut_ptr(), len, page_size) };
    Ok(Mapped {
        mem: Memory::Mmap(map),
        len,
        page_size,
        file: Some(file),
    })
}

/// Private hugepages through `hugepage-rs`, at the default hugepage size.
pub(crate) fn map_anon(name: &str, len: usize) -> Result<Mapped, HugeFailure> {
    // hugepage-rs panics if /proc/meminfo lacks a parseable Hugepagesize
    // line; our parser accepts exactly what it accepts, so check first.
    let Some(page_size) = default_hugepage_size() else {
        return Err(HugeFailure::Unsupported {
            page_size: HUGE_2M,
            detail: "/proc/meminfo has no Hugepagesize line (no hugetlb support)".to_owned(),
        });
    };
    let (len, wanted, pool) = plan(name, len, page_size)?;
    let layout = Layout::from_size_align(len, page_size).map_err(|_| too_large(name))?;
    // SAFETY: `layout` has a non-zero size (len >= one page), the only
    // precondition of hugepage_rs::alloc.
    let raw = unsafe { hugepage_rs::alloc(layout) };
    // Read errno before anything else can clobber it: hugepage-rs returns
    // straight after a failed mmap.
    let err = io::Error::last_os_error();
    let Some(ptr) = NonNull::new(raw) else {
        return Err(map_failure(name, len, wanted, pool, err));
    };
    // SAFETY: `ptr` was just returned by hugepage_rs::alloc(layout).
    let huge = unsafe { HugeAlloc::from_raw(ptr, layout) };
    // SAFETY: a fresh private writable mapping of `len` bytes, reserved at
    // mmap (no MAP_NORESERVE), so faulting each page cannot SIGBUS.
    unsafe { touch_pages(ptr.as_ptr(), len, page_size) };
    Ok(Mapped {
        mem: Memory::Huge(huge),
        len,
        page_size,
        file: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> HugepagePool {
        HugepagePool {
            page_size: HUGE_2M,
            total: 0,
            free: 0,
            reserved: 0,
            surplus: 0,
            overcommit: 0,
        }
    }

    #[test]
    fn enomem_at_mmap_is_a_shortage() {
        let err = io::Error::from_raw_os_error(libc::ENOMEM);
        let f = map_failure("rx", 4 * HUGE_2M, 4, pool(), err);
        let e = f.into_error("rx");
        assert!(
            matches!(
                e,
                MemError::HugepageShortage {
                    wanted_pages: 4,
                    page_size: HUGE_2M,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn other_mmap_errors_stay_os_errors() {
        let err = io::Error::from_raw_os_error(libc::EACCES);
        let f = map_failure("rx", HUGE_2M, 1, pool(), err);
        assert!(
            f.fallback_reason()
                .starts_with("hugepage mapping failed: region 'rx': mmap")
        );
        assert!(matches!(f.into_error("rx"), MemError::Map { .. }));
    }

    #[test]
    fn fallback_reasons_give_the_counts() {
        let mut p = pool();
        let none = HugeFailure::Shortage { wanted: 3, pool: p };
        assert_eq!(
            none.fallback_reason(),
            "no free hugepages: 0 of 0 free, see `dpctl check`"
        );
        p.total = 8;
        p.free = 2;
        let few = HugeFailure::Shortage { wanted: 3, pool: p };
        assert_eq!(
            few.fallback_reason(),
            "too few free 2 MiB hugepages: need 3, 2 of 8 free, see `dpctl check`"
        );
    }
}
