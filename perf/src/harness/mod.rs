//! Building blocks shared by every measurement: core pinning, a spin barrier with a yielding
//! fallback, pinned one- and two-thread runners, a nanosecond timer on the calibrated TSC, and
//! percentile summaries; and for the client/server benchmarks (fabric tests, `rstream`,
//! `rtrs`, `blk`), the provider choice, the `--pair` process pair and the idle wait.
//!
//! The lead's fabric benchmarks and the criterion benches in `benches/` use these too, so all
//! numbers in the perf lab come from the same clock and the same pinning rules.

mod affinity;
mod barrier;
mod idle;
mod pair;
mod provider;
mod runner;
mod stats;
mod timer;

pub use affinity::{CpuPair, allowed_cpus, check_cpu, pin_current};
pub use barrier::{Backoff, SpinBarrier};
pub(crate) use idle::Idle;
pub(crate) use pair::{Peer, SHM_PAIR_IP, Server, parse_addr, shm_dir, start_role};
pub use provider::ProviderKind;
#[cfg(feature = "verbs")]
pub(crate) use provider::verbs_pair_ip;
pub(crate) use provider::{open_err, open_verbs};
pub use runner::{run_on, run_pair};
pub use stats::{Summary, median};
pub use timer::Timer;
