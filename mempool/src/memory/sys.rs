//! Readers for the kernel state the memory layer depends on: page sizes,
//! hugepage pools, the memlock limit, capabilities, THP and CPU affinity.
//!
//! Every reader degrades to "unknown" (an `Option` or a conservative default)
//! instead of failing: they feed notices and the preflight report, and the
//! authoritative answer is always the system call that follows them.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

use super::kernel::{HugepagePool, Limit, MemlockLimit, ThpMode};

/// The hugepage size the shareable backend asks for (`MFD_HUGE_2MB`).
pub(crate) const HUGE_2M: usize = 2 << 20;

/// Where the kernel lists one directory per supported hugepage size.
pub(crate) const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";

/// `CAP_IPC_LOCK` bit in the capability sets of `/proc/self/status`.
const CAP_IPC_LOCK: u32 = 14;

/// The base page size (`sysconf(_SC_PAGESIZE)`), 4 KiB on x86_64.
pub(crate) fn base_page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf only reads a configuration value.
        let raw = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(raw)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The default hugepage size from `/proc/meminfo` (`Hugepagesize:`), which
/// is the size `MAP_HUGETLB` without a size flag (and so `hugepage-rs`) uses.
pub(crate) fn default_hugepage_size() -> Option<usize> {
    parse_hugepage_size(&fs::read_to_string("/proc/meminfo").ok()?)
}

/// Parses the `Hugepagesize:` line exactly as `hugepage-rs` does (a number,
/// optionally followed by `kB`), so that "we found it" implies "it will not
/// panic parsing it".
pub(crate) fn parse_hugepage_size(meminfo: &str) -> Option<usize> {
    let rest = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))?;
    let mut parts = rest.split_whitespace();
    let n: usize = parts.next()?.parse().ok()?;
    let mult = match parts.next() {
        None => 1,
        Some("kB") => 1024,
        Some(_) => return None,
    };
    n.checked_mul(mult).filter(|&s| s > 0)
}

/// Directory of one hugepage pool, e.g. `hugepages-2048kB`.
pub(crate) fn pool_dir(page_size: usize) -> PathBuf {
    PathBuf::from(format!("{HUGEPAGES_DIR}/hugepages-{}kB", page_size / 1024))
}

/// The shell command that sets the pool of `page_size` pages to `pages`.
pub(crate) fn reserve_command(page_size: usize, pages: u64) -> String {
    format!(
        "echo {pages} > {}/nr_hugepages",
        pool_dir(page_size).display()
    )
}

fn read_counter(dir: &std::path::Path, file: &str) -> io::Result<u64> {
    let text = fs::read_to_string(dir.join(file))?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad {file}: {text:?}")))
}

/// Reads the counters of the pool of `page_size` pages. `NotFound` means
/// the kernel does not support that size (or has no hugetlb at all).
pub(crate) fn hugepage_pool(page_size: usize) -> io::Result<HugepagePool> {
    let dir = pool_dir(page_size);
    Ok(HugepagePool {
        page_size,
        total: read_counter(&dir, "nr_hugepages")?,
        free: read_counter(&dir, "free_hugepages")?,
        reserved: read_counter(&dir, "resv_hugepages")?,
        surplus: read_counter(&dir, "surplus_hugepages")?,
        overcommit: read_counter(&dir, "nr_overcommit_hugepages").unwrap_or(0),
    })
}

/// Every pool the kernel exposes, smallest page size first.
pub(crate) fn hugepage_pools() -> Vec<HugepagePool> {
    let Ok(entries) = fs::read_dir(HUGEPAGES_DIR) else {
        return Vec::new();
    };
    let mut pools: Vec<HugepagePool> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: usize = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            hugepage_pool(kb.checked_mul(1024)?).ok()
        })
        .collect();
    pools.sort_by_key(|p| p.page_size);
    pools
}

/// `RLIMIT_MEMLOCK` of this process.
pub(crate) fn memlock_limit() -> MemlockLimit {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid, writable rlimit for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if rc != 0 {
        // Unknown: report the most restrictive reading rather than guessing.
        return MemlockLimit {
            soft: Limit::Bytes(0),
            hard: Limit::Bytes(0),
        };
    }
    let conv = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            Limit::Unlimited
        } else {
            Limit::Bytes(v)
        }
    };
    MemlockLimit {
        soft: conv(rl.rlim_cur),
        hard: conv(rl.rlim_max),
    }
}

/// A field of `/proc/thread-self/status` (falling back to `/proc/self`,
/// before Linux 3.17). Capabilities are per thread, so the calling thread's
/// file is the one that predicts what its `mlock` may do.
fn status_field(name: &str) -> Option<String> {
    let status = fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| fs::read_to_string("/proc/self/status"))
        .ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// Whether the calling thread's effective capability set holds
/// `CAP_IPC_LOCK` (mlock and RDMA memory registration past `RLIMIT_MEMLOCK`).
pub(crate) fn has_cap_ipc_lock() -> bool {
    status_field("CapEff")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Bytes this process already has mlocked (`VmLck`), counted against the limit.
pub(crate) fn locked_bytes() -> Option<u64> {
    let v = status_field("VmLck")?;
    let kb: u64 = v.strip_suffix("kB")?.trim().parse().ok()?;
    kb.checked_mul(1024)
}

/// Whether the effective user is root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The transparent-hugepage mode, the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/enabled`.
pub(crate) fn thp_mode() -> Option<ThpMode> {
    let text = fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    match &text[start..end] {
        "always" => Some(ThpMode::Always),
        "madvise" => Some(ThpMode::Madvise),
        "never" => Some(ThpMode::Never),
        _ => None,
    }
}

/// Online CPUs (`sysconf(_SC_NPROCESSORS_ONLN)`).
pub(crate) fn cores_online() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(0)
}

/// CPUs this thread may run on (`sched_getaffinity`), ascending.
pub(crate) fn cores_allowed() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(1024);
    // SAFETY: every index is below CPU_SETSIZE, the capacity of `set`.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_like_hugepage_rs() {
        assert_eq!(
            parse_hugepage_size("MemTotal: 1 kB\nHugepagesize:    2048 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(
            parse_hugepage_size("Hugepagesize: 1048576 kB"),
            Some(1 << 30)
        );
        assert_eq!(parse_hugepage_size("Hugepagesize: 4096"), Some(4096));
        assert_eq!(parse_hugepage_size("Hugepagesize: 2 MB"), None);
        assert_eq!(parse_hugepage_size("Hugepagesize:"), None);
        assert_eq!(parse_hugepage_size("MemTotal: 1 kB"), None);
    }

    #[test]
    fn reserve_command_names_the_sysfs_pool() {
        assert_eq!(
            reserve_command(2 << 20, 544),
            "echo 544 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
        );
    }

    #[test]
    fn affinity_is_within_online_cpus() {
        let allowed = cores_allowed();
        assert!(!allowed.is_empty());
        assert!(allowed.len() <= cores_online());
    }
}
