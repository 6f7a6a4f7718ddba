//! `dpctl`: run and inspect dataplane pipelines.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run and inspect dataplane pipelines.
#[derive(Debug, Parser)]
#[command(name = "dpctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the preflight report: cores, hugepages, memlock, shm rendezvous directory, and
    /// what to fix. Exits 1 if something must be fixed before running.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check => {
            let (text, blocking) = apps::check::report();
            print!("{text}");
            if blocking {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
