//! `dp-perf`: the dataplane perf lab. See the `perf` crate docs and `dp-perf --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Unlocked handles: measurement threads (an rsocket context's CM thread, a region's
    // notice) may print while the command runs; holding the locks here would block them.
    let code = perf::cli::main_with(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    ExitCode::from(code)
}
