//! The error type of every `dp-perf` command.

use std::io;

/// Why a measurement could not run.
///
/// [`PerfError::Usage`] is a bad argument (the CLI exits with status 2); everything else is a
/// failure of the host or of the code under test (status 1).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// A command-line value was rejected; the message says which and what is accepted.
    #[error("{0}")]
    Usage(String),
    /// A CPU is outside the process's allowed set.
    #[error(
        "CPU {cpu} is not in this process's allowed CPU set ({allowed}); pick CPUs from it with --cpus"
    )]
    CpuNotAllowed {
        /// The CPU asked for.
        cpu: usize,
        /// The allowed set as a core list.
        allowed: String,
    },
    /// `sched_setaffinity` failed.
    #[error("cannot pin a thread to CPU {cpu}: {source}")]
    Pin {
        /// The CPU asked for.
        cpu: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Reading the allowed CPU set failed.
    #[error("cannot read the process's CPU affinity: {0}")]
    Affinity(io::Error),
    /// A measurement thread panicked.
    #[error("a measurement thread panicked: {0}")]
    Panicked(&'static str),
    /// The code under test broke its contract (a measurement found it out).
    #[error("the code under test misbehaved: {0}")]
    Misbehaved(&'static str),
    /// A ring could not be created.
    #[error("cannot create the ring under test: {0}")]
    Ring(#[from] mempool::ring::RingError),
    /// A pool could not be created.
    #[error("cannot create the pool under test: {0}")]
    Pool(#[from] mempool::pool::PoolError),
    /// The lcore measurement failed.
    #[error("lcore measurement failed: {0}")]
    Lcore(#[from] lcore::perf::PerfError),
    /// A fabric device, connection or transfer failed.
    #[error("fabric: {0}")]
    Fabric(String),
    /// What the command needs is not on this host (no RDMA device, provider not built in);
    /// the message says how to get it.
    #[error("{0}")]
    Unavailable(String),
    /// A block IO run found bad data (`--verify`) or failed IOs; the message says which
    /// job, how many, and the first fault.
    #[error("{0}")]
    Verify(String),
    /// Memory for a buffer could not be allocated.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc {
        /// What the memory was for.
        what: &'static str,
        /// How much was asked for.
        bytes: usize,
    },
}

impl PerfError {
    /// The process exit status for this error: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::CpuNotAllowed { .. } | Self::Unavailable(_) => 2,
            _ => 1,
        }
    }
}
