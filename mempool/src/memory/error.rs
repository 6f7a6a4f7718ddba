//! The error type of region creation and mapping.

use std::fmt;
use std::io;

use super::notice::{PageSize, Size};
use super::sys::reserve_command;

/// Why a region could not be created or mapped.
///
/// Every variant names the region and the failing operation, carries the
/// `io::Error` where a system call failed, and its message says what to do.
/// These are control-plane errors (region setup), so they own `String`s.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The [`RegionConfig`](super::RegionConfig) cannot describe a region.
    #[error("region '{name}': invalid configuration: {reason}")]
    InvalidConfig {
        /// Region name as given.
        name: String,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },
    /// `HugePolicy::Require` and too few hugepages are available, either
    /// counted before mapping or refused by the kernel (`ENOMEM`) at `mmap`.
    #[error("{}", shortage_message(name, *wanted_pages, *free_pages, *total_pages, *page_size))]
    HugepageShortage {
        /// Region name.
        name: String,
        /// Pages the region needs.
        wanted_pages: u64,
        /// Pages available to a new reservation (free minus reserved, plus
        /// overcommit headroom) when the shortage was detected.
        free_pages: u64,
        /// Pages in the pool (`nr_hugepages`).
        total_pages: u64,
        /// Hugepage size in bytes.
        page_size: usize,
    },
    /// `HugePolicy::Require` but this kernel cannot provide that hugepage size.
    #[error(
        "region '{name}' requires {} hugepages but {detail}; enable hugetlb support \
         (CONFIG_HUGETLBFS, kernel command line `hugepagesz=...`) or use no_huge",
        PageSize(*page_size)
    )]
    HugepagesUnsupported {
        /// Region name.
        name: String,
        /// Hugepage size asked for.
        page_size: usize,
        /// What was missing.
        detail: String,
    },
    /// `memfd_create` failed.
    #[error(
        "region '{name}': memfd_create failed: {source}; check the open-file limit \
         (`ulimit -n`) and that the kernel supports memfd (Linux 3.17+)"
    )]
    MemfdCreate {
        /// Region name.
        name: String,
        /// The OS error.
        source: io::Error,
    },
    /// Sizing or allocating the memfd failed (`ftruncate` or `fallocate`).
    #[error(
        "region '{name}': {op} of {} failed: {source}; free memory or raise the memory \
         cgroup limit (memory.max), or make the region smaller",
        Size(*len as u64)
    )]
    MemfdSize {
        /// Region name.
        name: String,
        /// Length in bytes.
        len: usize,
        /// `"ftruncate"` or `"fallocate"`.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// `mmap` failed for a reason other than a hugepage shortage.
    #[error(
        "region '{name}': mmap of {} failed: {source}; check free memory, `ulimit -v` \
         and vm.max_map_count",
        Size(*len as u64)
    )]
    Map {
        /// Region name.
        name: String,
        /// Length in bytes.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Faulting in the pages of a peer's region (`MADV_POPULATE_WRITE`) failed.
    #[error(
        "region '{name}': pre-faulting the peer's pages failed: {source}; \
         the peer's memfd may be truncated or memory is exhausted"
    )]
    Prefault {
        /// Region name.
        name: String,
        /// The OS error.
        source: io::Error,
    },
    /// `fstat` of the fd passed to [`Region::from_shared`](super::Region::from_shared) failed.
    #[error(
        "region '{name}': fstat of the shared fd failed: {source}; pass the memfd \
         received from the peer"
    )]
    SharedFd {
        /// Region name.
        name: String,
        /// The OS error.
        source: io::Error,
    },
    /// The fd passed to `from_shared` is not the region the peer described.
    #[error(
        "region '{name}': the shared fd holds {fd_len} bytes in {fd_page_size}-byte pages but \
         {len} bytes in {page_size}-byte pages were announced; pass the fd together with the \
         len and page_size of the same ShareHandle"
    )]
    SharedMismatch {
        /// Region name.
        name: String,
        /// Announced length.
        len: usize,
        /// Announced page size.
        page_size: usize,
        /// Size of the file behind the fd.
        fd_len: u64,
        /// Page size of the filesystem behind the fd (`st_blksize`).
        fd_page_size: usize,
    },
}

fn shortage_message(
    name: &str,
    wanted: u64,
    free: u64,
    total: u64,
    page_size: usize,
) -> ShortageMsg<'_> {
    ShortageMsg {
        name,
        wanted,
        free,
        total,
        page_size,
    }
}

/// Display helper for [`MemError::HugepageShortage`].
struct ShortageMsg<'a> {
    name: &'a str,
    wanted: u64,
    free: u64,
    total: u64,
    page_size: usize,
}

impl fmt::Display for ShortageMsg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            name,
            wanted,
            free,
            total,
            page_size,
        } = *self;
        if free < wanted {
            let target = total.saturating_add(wanted - free);
            write!(
                f,
                "region '{name}' needs {wanted} hugepages of {} but only {free} are free; \
                 reserve more with `{}` (as root) or use no_huge",
                PageSize(page_size),
                reserve_command(page_size, target),
            )
        } else {
            write!(
                f,
                "region '{name}' needs {wanted} hugepages of {}; {free} of {total} are free but \
                 the kernel refused the reservation (ENOMEM): check hugetlb cgroup limits and \
                 the per-node pools in /sys/devices/system/node/node*/hugepages, or use no_huge",
                PageSize(page_size),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortage_says_how_many_and_how_to_fix() {
        let e = MemError::HugepageShortage {
            name: "rx-pool".into(),
            wanted_pages: 32,
            free_pages: 0,
            total_pages: 512,
            page_size: 2 << 20,
        };
        assert_eq!(
            e.to_string(),
            "region 'rx-pool' needs 32 hugepages of 2 MiB but only 0 are free; reserve more with \
             `echo 544 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages` (as root) or \
             use no_huge"
        );
    }

    #[test]
    fn shortage_refused_despite_counts_points_at_cgroups() {
        let e = MemError::HugepageShortage {
            name: "tx".into(),
            wanted_pages: 4,
            free_pages: 8,
            total_pages: 8,
            page_size: 2 << 20,
        };
        let msg = e.to_string();
        assert!(msg.contains("8 of 8 are free"), "{msg}");
        assert!(msg.contains("cgroup"), "{msg}");
    }
}
