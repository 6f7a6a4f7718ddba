//! The options every `dp-perf` command takes, handed from the CLI to each measurement.
//!
//! A leaf of its own so that the command modules can take it without importing the CLI
//! (which imports them to dispatch).

use clap::Args;

use crate::PerfError;
use crate::harness::CpuPair;

/// Options every command takes (global: accepted before or after the command name).
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Print one JSON object on one line instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Tiny iteration counts: checks that everything runs; the numbers are meaningless.
    #[arg(long, global = true)]
    pub quick: bool,
    /// The two CPUs to use, "A,B": single-core cases and producers run on A, consumers on B.
    #[arg(long, global = true, value_name = "A,B", default_value = "0,1", value_parser = parse_cpus)]
    pub cpus: CpuPair,
}

fn parse_cpus(s: &str) -> Result<CpuPair, String> {
    s.parse().map_err(|e: PerfError| e.to_string())
}
