//! Pinning threads to CPUs.

use core::fmt;
use core::str::FromStr;

use lcore::CpuSet;

use crate::PerfError;

/// Two distinct CPUs: `first` runs single-core cases and the producer side of two-core cases,
/// `second` the consumer side. Parsed from `"A,B"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPair {
    /// Main CPU.
    pub first: usize,
    /// Peer CPU.
    pub second: usize,
}

impl CpuPair {
    /// `first` and `second`, which must differ.
    ///
    /// # Errors
    ///
    /// [`PerfError::Usage`] if they are equal.
    pub fn new(first: usize, second: usize) -> Result<Self, PerfError> {
        if first == second {
            return Err(PerfError::Usage(format!(
                "the two CPUs must differ (got {first},{second})"
            )));
        }
        Ok(Self { first, second })
    }

    /// Both CPUs as an array, `[first, second]`.
    pub fn as_array(self) -> [usize; 2] {
        [self.first, self.second]
    }

    /// Checks that both CPUs are in the process's allowed set.
    ///
    /// # Errors
    ///
    /// [`PerfError::CpuNotAllowed`] or [`PerfError::Affinity`].
    pub fn check(self) -> Result<(), PerfError> {
        check_cpu(self.first)?;
        check_cpu(self.second)
    }
}

impl Default for CpuPair {
    fn default() -> Self {
        Self {
            first: 0,
            second: 1,
        }
    }
}

impl fmt::Display for CpuPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.first, self.second)
    }
}

impl FromStr for CpuPair {
    type Err = PerfError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            PerfError::Usage(format!(
                "expected two CPU numbers as \"A,B\" (e.g. 0,1), got {s:?}"
            ))
        };
        let (a, b) = s.split_once(',').ok_or_else(bad)?;
        let a = a.trim().parse().map_err(|_| bad())?;
        let b = b.trim().parse().map_err(|_| bad())?;
        Self::new(a, b)
    }
}

/// The process's allowed CPUs (`sched_getaffinity` of the main thread).
///
/// The perf lab never pins the main thread; a program that does (criterion benches) must read
/// this before pinning it.
///
/// # Errors
///
/// [`PerfError::Affinity`] if the set cannot be read.
pub fn allowed_cpus() -> Result<CpuSet, PerfError> {
    CpuSet::process_affinity().map_err(PerfError::Affinity)
}

/// Checks that `cpu` is in the process's allowed set.
///
/// # Errors
///
/// [`PerfError::CpuNotAllowed`] or [`PerfError::Affinity`].
pub fn check_cpu(cpu: usize) -> Result<(), PerfError> {
    let allowed = allowed_cpus()?;
    if allowed.contains(cpu) {
        Ok(())
    } else {
        Err(PerfError::CpuNotAllowed {
            cpu,
            allowed: allowed.to_string(),
        })
    }
}

/// Pins the calling thread to exactly `cpu`.
///
/// # Errors
///
/// [`PerfError::Pin`] with the OS error, or [`PerfError::CpuNotAllowed`] if `cpu` is beyond
/// what a CPU set can hold.
pub fn pin_current(cpu: usize) -> Result<(), PerfError> {
    let mut set = CpuSet::new();
    if !set.insert(cpu) {
        return Err(PerfError::CpuNotAllowed {
            cpu,
            allowed: allowed_cpus()?.to_string(),
        });
    }
    set.set_current_thread_affinity()
        .map_err(|source| PerfError::Pin { cpu, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_pair_parses_and_rejects() {
        assert_eq!(
            "0,1".parse::<CpuPair>().unwrap(),
            CpuPair {
                first: 0,
                second: 1
            }
        );
        assert_eq!(" 3 , 2".parse::<CpuPair>().unwrap().as_array(), [3, 2]);
        for bad in ["", "0", "0,0", "a,1", "0,1,2", "-1,0"] {
            let err = bad.parse::<CpuPair>().unwrap_err();
            assert!(matches!(err, PerfError::Usage(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_cpu_is_not_allowed() {
        let err = check_cpu(lcore::cpuset::MAX_CPUS + 5).unwrap_err();
        assert!(matches!(err, PerfError::CpuNotAllowed { .. }), "{err}");
        assert_eq!(err.exit_code(), 2);
    }
}
