//! CPU sets and DPDK-style core lists (`-l 0-3,6`, `all`).
//!
//! [`CoreList::parse`] checks syntax only. [`CoreList::resolve`] turns it into concrete CPUs
//! against the process's allowed set, which [`CpuSet::process_affinity`] reads with
//! `sched_getaffinity` on the process (its main thread) once at [`Lcores::init`], before any
//! lcore is pinned. Reading it later, or from a thread that is already pinned, would only show
//! that thread's single core.
//!
//! [`Lcores::init`]: crate::Lcores::init

use core::fmt;
use core::str::FromStr;
use std::io;

/// Highest CPU number plus one that a [`CpuSet`] can hold (glibc's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

const WORDS: usize = MAX_CPUS / 64;

/// A set of CPU numbers below [`MAX_CPUS`]. Displays as a core list (`0-3,6`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuSet {
    bits: [u64; WORDS],
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        Self { bits: [0; WORDS] }
    }

    /// Adds `cpu`. Returns `false` (and changes nothing) if `cpu >= MAX_CPUS`.
    pub fn insert(&mut self, cpu: usize) -> bool {
        if cpu >= MAX_CPUS {
            return false;
        }
        self.bits[cpu / 64] |= 1 << (cpu % 64);
        true
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        cpu < MAX_CPUS && self.bits[cpu / 64] & (1 << (cpu % 64)) != 0
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_CPUS).filter(|&c| self.contains(c))
    }

    /// The affinity of the process: `sched_getaffinity(getpid())`, i.e. of its main thread.
    ///
    /// # Errors
    ///
    /// The OS error of `sched_getaffinity`.
    pub fn process_affinity() -> io::Result<Self> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        Self::affinity_of(pid)
    }

    /// The affinity of the calling thread: `sched_getaffinity(0)`.
    ///
    /// # Errors
    ///
    /// The OS error of `sched_getaffinity`.
    pub fn current_thread_affinity() -> io::Result<Self> {
        Self::affinity_of(0)
    }

    fn affinity_of(pid: libc::pid_t) -> io::Result<Self> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut raw: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        // SAFETY: `raw` is a writable cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(pid, size_of::<libc::cpu_set_t>(), &mut raw) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self::from_raw(&raw))
    }

    /// Pins the calling thread to exactly this set (`sched_setaffinity(0)`).
    ///
    /// # Errors
    ///
    /// The OS error of `sched_setaffinity` (e.g. `EINVAL` if no CPU of the set is usable).
    pub fn set_current_thread_affinity(&self) -> io::Result<()> {
        let raw = self.to_raw();
        // SAFETY: `raw` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn from_raw(raw: &libc::cpu_set_t) -> Self {
        let mut set = Self::new();
        let limit = MAX_CPUS.min(8 * size_of::<libc::cpu_set_t>());
        for cpu in 0..limit {
            // SAFETY: `cpu` is below the bit size of `raw`.
            if unsafe { libc::CPU_ISSET(cpu, raw) } {
                set.insert(cpu);
            }
        }
        set
    }

    fn to_raw(self) -> libc::cpu_set_t {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut raw: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        for cpu in self.iter() {
            if cpu < 8 * size_of::<libc::cpu_set_t>() {
                // SAFETY: `cpu` is below the bit size of `raw`.
                unsafe { libc::CPU_SET(cpu, &mut raw) };
            }
        }
        raw
    }
}

impl FromIterator<usize> for CpuSet {
    /// CPUs at or above [`MAX_CPUS`] are ignored.
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut set = Self::new();
        for c in iter {
            set.insert(c);
        }
        set
    }
}

impl fmt::Display for CpuSet {
    /// Formats as a core list: `0-3,6`, or `(none)` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.iter().peekable();
        if it.peek().is_none() {
            return f.write_str("(none)");
        }
        let mut first = true;
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

/// A parsed core list: `all`, or CPUs in the order written.
///
/// Syntax (DPDK's `-l`): comma-separated items, each a CPU number or an inclusive range `a-b`
/// with `a <= b`; whitespace around numbers, dashes and commas is ignored. `all` (alone, any
/// case) means every CPU the process may run on. A CPU may appear only once. The first CPU is the
/// main lcore unless [`LcoresConfig::main_cpu`](crate::LcoresConfig::main_cpu) says otherwise.
///
/// ```
/// use lcore::{CoreList, CoreListError, CpuSet};
///
/// let list = CoreList::parse("0-3, 6")?;
/// assert_eq!(list, CoreList::Cpus(vec![0, 1, 2, 3, 6]));
/// assert!(matches!(CoreList::parse("3-1"), Err(CoreListError::ReversedRange { .. })));
///
/// let allowed: CpuSet = (0..4).collect();
/// let err = list.resolve(&allowed, 8).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "CPU 6 is not allowed for this process, which may use CPUs 0-3; pick from those or \
///      widen the affinity (taskset/cpuset cgroup)"
/// );
/// # Ok::<(), CoreListError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreList {
    /// Every CPU in the process's allowed set, ascending.
    All,
    /// These CPUs, in the order written.
    Cpus(Vec<usize>),
}

/// A syntax error in a core list.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreListError {
    /// The list is empty or only whitespace.
    #[error("empty core list; write CPUs like `0-3,6` or `all`")]
    Empty,
    /// An item between commas is empty (`0,,1`, trailing comma).
    #[error("empty item at position {item} of core list `{list}`; remove the extra comma")]
    EmptyItem {
        /// The whole list.
        list: String,
        /// 1-based item index.
        item: usize,
    },
    /// Something that is not a CPU number.
    #[error("`{token}` in core list `{list}` is not a CPU number; write CPUs like `0-3,6`")]
    BadNumber {
        /// The whole list.
        list: String,
        /// The offending text.
        token: String,
    },
    /// A range whose start is after its end.
    #[error("range `{start}-{end}` in core list `{list}` is reversed; write `{end}-{start}`")]
    ReversedRange {
        /// The whole list.
        list: String,
        /// First number written.
        start: usize,
        /// Second number written.
        end: usize,
    },
    /// A CPU number at or above [`MAX_CPUS`].
    #[error("CPU {cpu} in core list `{list}` is out of range; CPU numbers must be below {max}")]
    OutOfRange {
        /// The whole list.
        list: String,
        /// The CPU number.
        cpu: usize,
        /// [`MAX_CPUS`].
        max: usize,
    },
    /// A CPU listed twice (directly or through overlapping ranges).
    #[error("CPU {cpu} appears more than once in core list `{list}`")]
    Duplicate {
        /// The whole list.
        list: String,
        /// The repeated CPU.
        cpu: usize,
    },
}

/// A core list that is valid syntax but does not fit this machine or process.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreSelectError {
    /// The CPU does not exist on this machine.
    #[error(
        "CPU {cpu} does not exist (this machine has CPUs 0-{last}); the process may use CPUs \
         {allowed}"
    )]
    NoSuchCpu {
        /// The requested CPU.
        cpu: usize,
        /// Highest configured CPU number.
        last: usize,
        /// The process's allowed set.
        allowed: Box<CpuSet>,
    },
    /// The CPU exists but is not in the process's affinity mask (taskset, cgroup cpuset, or
    /// offline).
    #[error(
        "CPU {cpu} is not allowed for this process, which may use CPUs {allowed}; pick from \
         those or widen the affinity (taskset/cpuset cgroup)"
    )]
    NotAllowed {
        /// The requested CPU.
        cpu: usize,
        /// The process's allowed set.
        allowed: Box<CpuSet>,
    },
    /// `all` was given but the allowed set is empty (cannot happen for a running process, but
    /// the resolver does not assume it).
    #[error("the core list `all` selects no CPUs: the allowed set is empty")]
    NoneAllowed,
}

impl CoreList {
    /// Parses a core list; see the [type docs](Self) for the syntax.
    ///
    /// # Errors
    ///
    /// [`CoreListError`] naming the offending item.
    pub fn parse(list: &str) -> Result<Self, CoreListError> {
        let trimmed = list.trim();
        if trimmed.is_empty() {
            return Err(CoreListError::Empty);
        }
        if trimmed.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        let owned = || trimmed.to_owned();
        let number = |tok: &str| -> Result<usize, CoreListError> {
            let tok = tok.trim();
            if tok.is_empty() || !tok.bytes().all(|b| b.is_ascii_digit()) {
                return Err(CoreListError::BadNumber {
                    list: owned(),
                    token: tok.to_owned(),
                });
            }
            match tok.parse::<usize>() {
                Ok(cpu) if cpu < MAX_CPUS => Ok(cpu),
                Ok(cpu) => Err(CoreListError::OutOfRange {
                    list: owned(),
                    cpu,
                    max: MAX_CPUS,
                }),
                Err(_) => Err(CoreListError::OutOfRange {
                    list: owned(),
                    cpu: usize::MAX,
                    max: MAX_CPUS,
                }),
            }
        };
        let mut cpus = Vec::new();
        let mut seen = CpuSet::new();
        for (i, item) in trimmed.split(',').enumerate() {
            let item = item.trim();
            if item.is_empty() {
                return Err(CoreListError::EmptyItem {
                    list: owned(),
                    item: i + 1,
                });
            }
            let (start, end) = match item.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b {
                        return Err(CoreListError::ReversedRange {
                            list: owned(),
                            start: a,
                            end: b,
                        });
                    }
                    (a, b)
                }
                None => {
                    let c = number(item)?;
                    (c, c)
                }
            };
            for cpu in start..=end {
                if seen.contains(cpu) {
                    return Err(CoreListError::Duplicate { list: owned(), cpu });
                }
                seen.insert(cpu);
                cpus.push(cpu);
            }
        }
        Ok(Self::Cpus(cpus))
    }

    /// The concrete CPUs, checked against `allowed` (the process's affinity) and `configured`
    /// (the number of CPUs the machine has, `sysconf(_SC_NPROCESSORS_CONF)`).
    ///
    /// # Errors
    ///
    /// [`CoreSelectError`] naming the first CPU that does not exist or is not allowed, and the
    /// allowed set.
    pub fn resolve(
        &self,
        allowed: &CpuSet,
        configured: usize,
    ) -> Result<Vec<usize>, CoreSelectError> {
        match self {
            Self::All if allowed.is_empty() => Err(CoreSelectError::NoneAllowed),
            Self::All => Ok(allowed.iter().collect()),
            Self::Cpus(cpus) => {
                for &cpu in cpus {
                    if cpu >= configured {
                        return Err(CoreSelectError::NoSuchCpu {
                            cpu,
                            last: configured.saturating_sub(1),
                            allowed: Box::new(*allowed),
                        });
                    }
                    if !allowed.contains(cpu) {
                        return Err(CoreSelectError::NotAllowed {
                            cpu,
                            allowed: Box::new(*allowed),
                        });
                    }
                }
                Ok(cpus.clone())
            }
        }
    }
}

impl FromStr for CoreList {
    type Err = CoreListError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for CoreList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Cpus(cpus) => {
                for (i, c) in cpus.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{c}")?;
                }
                Ok(())
            }
        }
    }
}

/// Number of CPUs the machine has configured (`sysconf(_SC_NPROCESSORS_CONF)`), at least 1.
pub fn configured_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The CPU the calling thread is running on (`sched_getcpu`), if the kernel reports it.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}
