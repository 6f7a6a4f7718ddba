//! Building blocks shared by every measurement: core pinning, a spin barrier with a yielding
//! fallback, pinned one- and two-thread runners, a nanosecond timer on the calibrated TSC, and
//! percentile summaries.
//!
//! The lead's fabric benchmarks and the criterion benches in `benches/` use these too, so all
//! numbers in the perf lab come from the same clock and the same pinning rules.

mod affinity;
mod barrier;
mod runner;
mod stats;
mod timer;

pub use affinity::{CpuPair, allowed_cpus, check_cpu, pin_current};
pub use barrier::{Backoff, SpinBarrier};
pub use runner::{run_on, run_pair};
pub use stats::{Summary, median};
pub use timer::Timer;
