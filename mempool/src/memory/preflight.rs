//! Preflight: the machine state regions depend on, and what to fix.
//!
//! [`Preflight::gather`] reads cores, hugepage pools, the memlock limit,
//! privileges and the THP mode; [`Preflight::problems`] turns them into
//! [`Finding`]s that each carry the exact command that fixes them; `Display`
//! prints the whole report, one item per line (what `dpctl check` shows).

use std::fmt;

use super::kernel::{HugepagePool, Limit, MemlockLimit, ThpMode};
use super::notice::{PageSize, Size};
use super::sys::{self, HUGE_2M, pool_dir, reserve_command};

/// Pages suggested for a fresh 2 MiB pool (1 GiB), on top of what exists.
const SUGGESTED_POOL_PAGES: u64 = 512;

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Tuning advice: things work, but latency may suffer.
    Advice,
    /// Regions will degrade (fall back, stay unlocked) or fail.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Advice => "advice",
            Self::Warning => "warning",
        })
    }
}

/// One problem found by [`Preflight::problems`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// What is wrong and what it causes.
    pub what: String,
    /// The exact command (or setting) that fixes it.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; fix: {}", self.severity, self.what, self.fix)
    }
}

/// A snapshot of the machine state that regions depend on.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    /// Online CPUs.
    pub cores_online: usize,
    /// CPUs this process may run on (`sched_getaffinity`), ascending.
    pub cores_allowed: Vec<usize>,
    /// Default hugepage size (`Hugepagesize:` in `/proc/meminfo`), used by
    /// private hugepage regions; `None` without hugetlb support.
    pub default_hugepage_size: Option<usize>,
    /// Every hugepage pool, smallest page size first.
    pub hugepages: Vec<HugepagePool>,
    /// `RLIMIT_MEMLOCK`.
    pub memlock: MemlockLimit,
    /// Bytes already mlocked by this process (`VmLck`), if known.
    pub locked_bytes: Option<u64>,
    /// Effective uid is 0.
    pub is_root: bool,
    /// `CAP_IPC_LOCK` is in the calling thread's effective set (mlock and MR
    /// registration are then exempt from the memlock limit).
    pub cap_ipc_lock: bool,
    /// THP mode, if the kernel has THP.
    pub thp: Option<ThpMode>,
}

impl Preflight {
    /// Reads the current state. Never fails: anything unreadable is reported
    /// as absent (no pools, unknown THP), which `problems` then flags.
    pub fn gather() -> Self {
        Self {
            cores_online: sys::cores_online(),
            cores_allowed: sys::cores_allowed(),
            default_hugepage_size: sys::default_hugepage_size(),
            hugepages: sys::hugepage_pools(),
            memlock: sys::memlock_limit(),
            locked_bytes: sys::locked_bytes(),
            is_root: sys::is_root(),
            cap_ipc_lock: sys::has_cap_ipc_lock(),
            thp: sys::thp_mode(),
        }
    }

    /// The pool of `page_size` pages, if the kernel has one.
    pub fn pool(&self, page_size: usize) -> Option<&HugepagePool> {
        self.hugepages.iter().find(|p| p.page_size == page_size)
    }

    /// Everything that makes regions degrade or fail, each with its fix.
    /// Empty when the machine is ready.
    pub fn problems(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        let warn = |what: String, fix: String| Finding {
            severity: Severity::Warning,
            what,
            fix,
        };

        match self.pool(HUGE_2M) {
            None => out.push(warn(
                format!(
                    "the kernel offers no 2 MiB hugepages ({} is missing): every region \
                     falls back to 4 KiB pages and HugePolicy::Require fails",
                    pool_dir(HUGE_2M).display()
                ),
                "build the kernel with CONFIG_HUGETLBFS=y and boot with \
                 `hugepagesz=2M hugepages=512`"
                    .to_owned(),
            )),
            Some(p) if p.available() == 0 => out.push(warn(
                format!(
                    "no free 2 MiB hugepages ({} of {} free): regions fall back to 4 KiB pages \
                     (more TLB misses, one RDMA translation entry per 4 KiB) and \
                     HugePolicy::Require fails",
                    p.available(),
                    p.total
                ),
                format!(
                    "`{}` (as root)",
                    reserve_command(HUGE_2M, p.total + SUGGESTED_POOL_PAGES)
                ),
            )),
            Some(_) => {}
        }

        if !self.cap_ipc_lock
            && let Limit::Bytes(soft) = self.memlock.soft
        {
            let fix = match self.memlock.hard {
                Limit::Unlimited => {
                    "`ulimit -l unlimited` in the shell that starts the dataplane".to_owned()
                }
                Limit::Bytes(_) => concat!(
                    "add `* - memlock unlimited` to /etc/security/limits.conf ",
                    "(or `LimitMEMLOCK=infinity` in the systemd unit) and log in again, ",
                    "or run with CAP_IPC_LOCK"
                )
                .to_owned(),
            };
            out.push(warn(
                format!(
                    "RLIMIT_MEMLOCK is {} (hard {}): normal-page regions beyond it stay \
                     unlocked and swappable, and RDMA registration of more than that fails",
                    Size(soft),
                    self.memlock.hard
                ),
                fix,
            ));
        }

        if self.cores_allowed.len() < 2 {
            out.push(warn(
                format!(
                    "only {} core(s) allowed to this process ({}): a polled-mode dataplane needs \
                     one core per lcore plus one for control threads",
                    self.cores_allowed.len(),
                    CpuList(&self.cores_allowed)
                ),
                format!(
                    "start it with `taskset -c 0-{} <cmd>` and check the cgroup's cpuset.cpus",
                    self.cores_online.saturating_sub(1)
                ),
            ));
        }

        if let Some(default) = self.default_hugepage_size
            && default != HUGE_2M
        {
            out.push(Finding {
                severity: Severity::Advice,
                what: format!(
                    "the default hugepage size is {}: private hugepage regions use it, \
                     shareable ones use 2 MiB, so both pools need pages",
                    PageSize(default)
                ),
                fix: "reserve pages in both pools, or boot with `default_hugepagesz=2M`".to_owned(),
            });
        }

        if self.thp == Some(ThpMode::Always) {
            out.push(Finding {
                severity: Severity::Advice,
                what: "transparent hugepages are `always`: khugepaged compaction can stall \
                       dataplane cores"
                    .to_owned(),
                fix: "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` (as root)"
                    .to_owned(),
            });
        }
        out
    }
}

/// Formats a sorted CPU list compactly: `0-3,8,10-11`.
struct CpuList<'a>(&'a [usize]);

impl fmt::Display for CpuList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl fmt::Display for Preflight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "mempool preflight")?;
        writeln!(
            f,
            "  cores:      {} online, {} allowed to this process ({})",
            self.cores_online,
            self.cores_allowed.len(),
            CpuList(&self.cores_allowed)
        )?;
        if self.hugepages.is_empty() {
            writeln!(f, "  hugepages:  none (no {})", sys::HUGEPAGES_DIR)?;
        }
        for p in &self.hugepages {
            let default = if self.default_hugepage_size == Some(p.page_size) {
                " (default size)"
            } else {
                ""
            };
            writeln!(
                f,
                "  hugepages:  {}{default}: total {}, free {}, reserved {}, surplus {}, \
                 available {}",
                PageSize(p.page_size),
                p.total,
                p.free,
                p.reserved,
                p.surplus,
                p.available()
            )?;
        }
        write!(
            f,
            "  memlock:    soft {}, hard {}",
            self.memlock.soft, self.memlock.hard
        )?;
        match self.locked_bytes {
            Some(b) => writeln!(f, ", {} locked now", Size(b))?,
            None => writeln!(f)?,
        }
        writeln!(
            f,
            "  privileges: {}, {}",
            if self.is_root { "root" } else { "not root" },
            if self.cap_ipc_lock {
                "CAP_IPC_LOCK"
            } else {
                "no CAP_IPC_LOCK"
            }
        )?;
        match self.thp {
            Some(mode) => writeln!(f, "  THP:        {mode}")?,
            None => writeln!(f, "  THP:        not available")?,
        }
        let problems = self.problems();
        if problems.is_empty() {
            write!(f, "  ok: nothing to fix")?;
        }
        for (i, p) in problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Preflight {
        Preflight {
            cores_online: 4,
            cores_allowed: vec![0, 1, 2, 3],
            default_hugepage_size: Some(HUGE_2M),
            hugepages: vec![HugepagePool {
                page_size: HUGE_2M,
                total: 1024,
                free: 1024,
                reserved: 0,
                surplus: 0,
                overcommit: 0,
            }],
            memlock: MemlockLimit {
                soft: Limit::Unlimited,
                hard: Limit::Unlimited,
            },
            locked_bytes: Some(0),
            is_root: false,
            cap_ipc_lock: false,
            thp: Some(ThpMode::Madvise),
        }
    }

    #[test]
    fn a_ready_machine_has_no_problems() {
        let m = machine();
        assert_eq!(m.problems(), vec![]);
        assert!(m.to_string().ends_with("ok: nothing to fix"), "{m}");
    }

    #[test]
    fn empty_pool_and_memlock_are_flagged_with_commands() {
        let mut m = machine();
        m.hugepages[0].free = 10;
        m.hugepages[0].reserved = 10;
        m.memlock = MemlockLimit {
            soft: Limit::Bytes(8 << 20),
            hard: Limit::Unlimited,
        };
        m.cores_allowed = vec![3];
        m.thp = Some(ThpMode::Always);
        let p = m.problems();
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(p[0].what.contains("0 of 1024 free"), "{}", p[0]);
        assert!(
            p[0].fix
                .contains("echo 1536 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
            "{}",
            p[0]
        );
        assert!(p[1].what.contains("8.0 MiB"), "{}", p[1]);
        assert!(p[1].fix.contains("ulimit -l unlimited"), "{}", p[1]);
        assert!(p[2].what.contains("(3)"), "{}", p[2]);
        assert_eq!(p[3].severity, Severity::Advice);
    }

    #[test]
    fn cap_ipc_lock_exempts_from_memlock() {
        let mut m = machine();
        m.memlock.soft = Limit::Bytes(0);
        m.cap_ipc_lock = true;
        assert_eq!(m.problems(), vec![]);
    }

    #[test]
    fn cpu_lists_are_compact() {
        assert_eq!(CpuList(&[0, 1, 2, 3, 8, 10, 11]).to_string(), "0-3,8,10-11");
        assert_eq!(CpuList(&[5]).to_string(), "5");
        assert_eq!(CpuList(&[]).to_string(), "none");
    }

    #[test]
    fn available_counts_reservations_and_overcommit() {
        let p = HugepagePool {
            page_size: HUGE_2M,
            total: 8,
            free: 6,
            reserved: 4,
            surplus: 1,
            overcommit: 3,
        };
        assert_eq!(p.available(), 2 + 2);
    }
}
