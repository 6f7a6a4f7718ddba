//! The options every `dp-perf` command takes, handed from the CLI to each measurement.
//!
//! A leaf of its own so that the command modules can take it without importing the CLI
//! (which imports them to dispatch).

use std::path::PathBuf;

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
    /// Draw the result to FILE: .svg or .png, or .json for its data (to draw several runs in
    /// one chart with `dp-perf plot`). Repeat for several files. Latency tests draw the
    /// percentile distribution; sweeps draw bandwidth and latency against size.
    #[arg(long, global = true, value_name = "FILE", value_parser = parse_plot_file)]
    pub plot: Vec<PathBuf>,
}

fn parse_plot_file(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    dp_plot::Format::of(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

fn parse_cpus(s: &str) -> Result<CpuPair, String> {
    s.parse().map_err(|e: PerfError| e.to_string())
}
