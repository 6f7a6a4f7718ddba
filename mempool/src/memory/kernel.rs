//! What the kernel reports about the resources regions depend on: hugepage pools, the memlock
//! limit and the transparent-hugepage mode.
//!
//! Plain values with no behaviour beyond arithmetic and formatting: `sys.rs` reads them from the
//! kernel, the allocators (`huge.rs`, `region.rs`) consult them, and `preflight.rs` reports them
//! with what to fix.

use std::fmt;

use super::notice::Size;

/// Counters of one hugepage pool (`/sys/kernel/mm/hugepages/hugepages-<N>kB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugepagePool {
    /// Page size in bytes.
    pub page_size: usize,
    /// `nr_hugepages`: pages in the persistent pool.
    pub total: u64,
    /// `free_hugepages`: pages not faulted in (includes reserved ones).
    pub free: u64,
    /// `resv_hugepages`: free pages promised to existing mappings.
    pub reserved: u64,
    /// `surplus_hugepages`: overcommitted pages currently allocated.
    pub surplus: u64,
    /// `nr_overcommit_hugepages`: how many surplus pages may be allocated.
    pub overcommit: u64,
}

impl HugepagePool {
    /// Pages a new mapping can reserve: free minus reserved, plus the
    /// overcommit headroom (which the kernel may still fail to supply).
    pub fn available(&self) -> u64 {
        self.free
            .saturating_sub(self.reserved)
            .saturating_add(self.overcommit.saturating_sub(self.surplus))
    }
}

/// A resource limit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `RLIM_INFINITY`.
    Unlimited,
    /// A byte count.
    Bytes(u64),
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::Bytes(b) => Size(*b).fmt(f),
        }
    }
}

/// `RLIMIT_MEMLOCK`: bounds `mlock` and RDMA memory registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemlockLimit {
    /// Soft limit (what applies now).
    pub soft: Limit,
    /// Hard limit (how far an unprivileged process may raise the soft one).
    pub hard: Limit,
}

/// Transparent-hugepage mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpMode {
    /// THP for every anonymous mapping (khugepaged compacts in the background).
    Always,
    /// THP only where `madvise(MADV_HUGEPAGE)` asks.
    Madvise,
    /// THP off.
    Never,
}

impl fmt::Display for ThpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Always => "always",
            Self::Madvise => "madvise",
            Self::Never => "never",
        })
    }
}
