//! Memory regions: the pages every pool, ring and registered buffer lives in.
//!
//! This is the bottom layer of the mempool, the counterpart of DPDK's EAL
//! memory subsystem. A [`Region`] is one contiguous, page-aligned virtual
//! range that is fully resident when [`Region::new`] returns. Pools carve
//! objects out of regions; the RDMA provider registers one MR per region and
//! finds the lkey by address; the shm provider passes a region's memfd to a
//! peer process, which maps it with [`Region::from_shared`].
//!
//! # Backends
//!
//! | [`Backend`]    | chosen when                     | how                                                        |
//! |----------------|---------------------------------|------------------------------------------------------------|
//! | `HugeMemfd`    | shareable, hugepages allowed    | `memfd_create(MFD_HUGETLB \| MFD_HUGE_2MB)`, `MAP_SHARED \| MAP_POPULATE` |
//! | `HugeAnon`     | private, hugepages allowed      | `hugepage-rs` (`MAP_PRIVATE \| MAP_ANONYMOUS \| MAP_HUGETLB`), one write per page |
//! | `NormalMemfd`  | shareable, no hugepages         | `memfd_create`, `fallocate`, `MAP_SHARED \| MAP_POPULATE`, one write per page, `mlock` |
//! | `NormalAnon`   | private, no hugepages           | anonymous `MAP_POPULATE` map, one write per page, `mlock`  |
//!
//! [`HugePolicy`] picks between the huge and normal rows: `Auto` tries
//! hugepages and falls back to normal pages, `Require` turns a shortage into
//! [`MemError::HugepageShortage`], and `Never` is DPDK's `--no-huge`.
//! Every region announces the backend it got, and why, in one line through the
//! notice sink ([`set_notice_sink`]); [`Preflight`] reports the machine state
//! behind those choices (free hugepages, memlock limit, cores) with the
//! commands that fix it.
//!
//! # Invariants
//!
//! - **Resident at creation.** Every page is faulted in before `Region::new`
//!   returns. Hugetlb memory is reserved by the kernel at `mmap` (neither
//!   backend passes `MAP_NORESERVE`), so a hugepage shortage is an error
//!   here and never a `SIGBUS` on the data path. Normal memfd pages are
//!   allocated with `fallocate`, which reports `ENOSPC` instead of faulting.
//! - **Page-granular.** [`Region::as_ptr`] is aligned to
//!   [`Region::page_size`] and [`Region::len`] is the requested length
//!   rounded up to a whole number of pages. Lengths handed to the kernel are
//!   always rounded by this module, never by `memmap2` (whose `huge()` path
//!   does not round, so `munmap` of a hugetlb range would fail and leak).
//! - **Fixed address.** A region never moves or grows; `as_ptr` is stable
//!   until drop, and drop unmaps.
//! - **Locked or pinned.** Hugetlb pages are never swapped. Normal pages are
//!   `mlock`ed when `RLIMIT_MEMLOCK` (or `CAP_IPC_LOCK`) allows;
//!   [`Region::is_locked`] reports the outcome and the notice says why not.
//! - **Shareable means memfd.** Shareable regions are listed in the
//!   process-global [`registry`] while they live, so a transport can turn any
//!   buffer address into (memfd, offset) for a peer.
//!
//! The module hands out raw pointers only: who writes where, and how writers
//! in different processes synchronise, is the business of the layers above.

pub mod copy;
mod error;
mod huge;
mod kernel;
mod map;
mod notice;
mod preflight;
mod region;
pub mod registry;
mod sys;

use std::fmt;

pub use error::MemError;
pub use kernel::{HugepagePool, Limit, MemlockLimit, ThpMode};
pub use notice::{set_notice_sink, stderr_notice_sink};
pub use preflight::{Finding, Preflight, Severity};
pub use region::{Region, ShareHandle};

/// Whether a region may, must, or must not use hugepages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HugePolicy {
    /// Try 2 MiB hugepages; if none are free (or the kernel has none), fall
    /// back to normal pages and say why in the region's notice.
    #[default]
    Auto,
    /// Hugepages or nothing: a shortage is [`MemError::HugepageShortage`].
    Require,
    /// Normal pages only, like DPDK's `--no-huge`.
    Never,
}

/// What to allocate: the input of [`Region::new`].
///
/// ```
/// use mempool::memory::{HugePolicy, RegionConfig};
///
/// let cfg = RegionConfig::new("rx-pool", 64 << 20).shareable(true).huge(HugePolicy::Auto);
/// assert_eq!(cfg.len, 64 << 20);
/// assert!(RegionConfig::new("ctl", 4096).no_huge().huge == HugePolicy::Never);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    /// Name used in notices, errors and `/proc/<pid>/maps` (`memfd:mempool:<name>`).
    pub name: String,
    /// Requested length in bytes; the region rounds it up to whole pages.
    pub len: usize,
    /// Back the region with a memfd that peers can map ([`Region::share_handle`]).
    /// Default: `false` (anonymous, private to this process and its threads).
    pub shareable: bool,
    /// Hugepage policy. Default: [`HugePolicy::Auto`].
    pub huge: HugePolicy,
    /// Suppress the one-line backend notice (for internal control segments that would
    /// otherwise print one line each). Default: `false`.
    pub quiet: bool,
}

impl RegionConfig {
    /// A private region of `len` bytes with [`HugePolicy::Auto`].
    pub fn new(name: impl Into<String>, len: usize) -> Self {
        Self {
            name: name.into(),
            len,
            shareable: false,
            huge: HugePolicy::Auto,
            quiet: false,
        }
    }

    /// Sets whether peers can map the region (memfd backing).
    #[must_use]
    pub fn shareable(mut self, shareable: bool) -> Self {
        self.shareable = shareable;
        self
    }

    /// Sets the hugepage policy.
    #[must_use]
    pub fn huge(mut self, policy: HugePolicy) -> Self {
        self.huge = policy;
        self
    }

    /// Suppresses the backend notice for this region.
    #[must_use]
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Normal pages only: shorthand for `.huge(HugePolicy::Never)`.
    #[must_use]
    pub fn no_huge(self) -> Self {
        self.huge(HugePolicy::Never)
    }
}

/// Which kernel object backs a region.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// memfd on the kernel's internal hugetlbfs (2 MiB pages), shareable.
    HugeMemfd,
    /// Private anonymous hugetlb mapping (default hugepage size).
    HugeAnon,
    /// memfd on shmem (base pages), shareable.
    NormalMemfd,
    /// Private anonymous mapping (base pages).
    NormalAnon,
}

impl Backend {
    /// `true` for the hugetlb backends.
    pub fn is_huge(self) -> bool {
        matches!(self, Self::HugeMemfd | Self::HugeAnon)
    }

    /// `true` for the memfd backends, whose regions peers can map.
    pub fn is_shareable(self) -> bool {
        matches!(self, Self::HugeMemfd | Self::NormalMemfd)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::HugeMemfd => "hugepage memfd",
            Self::HugeAnon => "anonymous hugepages",
            Self::NormalMemfd => "memfd",
            Self::NormalAnon => "anonymous",
        })
    }
}
