//! `dp-perf`: the dataplane perf lab. See the `perf` crate docs and `dp-perf --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = perf::cli::main_with(
        std::env::args_os(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
