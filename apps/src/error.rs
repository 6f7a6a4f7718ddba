//! [`RunError`]: why a pipeline could not be set up or launched. Shared by the runner and
//! the stages it builds (rings, rsocket contexts and listeners fail while stages are built).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use dataplane::fabric::FabricError;
use lcore::{InitError, LcoreError, LoopConfigError, SignalError};
use mempool::pool::PoolError;
use mempool::ring::RingError;

/// Why a pipeline could not run.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The core list does not fit this machine or process.
    #[error("{file}:{line}: [eal] cores: {source}")]
    Lcores {
        /// Config file.
        file: String,
        /// Line of `cores`.
        line: usize,
        /// The lcore error.
        #[source]
        source: Box<InitError>,
    },
    /// A stage's CPU is not one of the lcores (with `cores = "all"`).
    #[error(
        "{file}:{line}: stage `{stage}`: CPU {cpu} is not one of this process's lcores; pick \
         a CPU the process may use (dpctl check lists them)"
    )]
    StageCpu {
        /// Config file.
        file: String,
        /// Line of the stage.
        line: usize,
        /// The stage.
        stage: String,
        /// Its CPU.
        cpu: usize,
    },
    /// A pool could not be created.
    #[error("{file}:{line}: pool `{pool}`: {source}")]
    Pool {
        /// Config file.
        file: String,
        /// Line of the pool section.
        line: usize,
        /// The pool.
        pool: String,
        /// The pool error.
        #[source]
        source: Box<PoolError>,
    },
    /// A ring could not be created.
    #[error("cannot create ring `{ring}`: {source}")]
    Ring {
        /// The ring.
        ring: String,
        /// The ring error.
        #[source]
        source: RingError,
    },
    /// The fabric device or an rsocket context could not be set up.
    #[error("{what}: {source}")]
    Fabric {
        /// What was being done.
        what: String,
        /// The fabric error.
        #[source]
        source: FabricError,
    },
    /// An rsocket server could not listen.
    #[error(
        "stage `{stage}` cannot listen on {addr}: {source}; is another pipeline serving it? \
         (`dpctl stats` finds running pipelines)"
    )]
    Listen {
        /// The stage.
        stage: String,
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// An RDS stage's node could not be set up.
    #[error("stage `{stage}`: {message}")]
    Rds {
        /// The stage.
        stage: String,
        /// What failed and why.
        message: String,
    },
    /// An RNBD server stage could not make a device or listen.
    #[error("stage `{stage}`: {message}")]
    Rnbd {
        /// The stage.
        stage: String,
        /// What failed and why.
        message: String,
    },
    /// An rsocket stage without a fabric (validation prevents this).
    #[error("rsocket stages need a [fabric] section")]
    NoFabric,
    /// An lcore could not be launched.
    #[error("cannot launch the lcores: {0}")]
    Launch(#[from] LcoreError),
    /// A loop configuration was rejected.
    #[error("bad poll-loop configuration: {0}")]
    Loop(#[from] LoopConfigError),
    /// Ctrl-C could not be wired.
    #[error("cannot wire Ctrl-C: {0}")]
    Signals(#[from] SignalError),
    /// The telemetry socket could not be created.
    #[error(
        "cannot create the telemetry socket {path}: {source}; pass --no-telemetry to run without it"
    )]
    Telemetry {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}
