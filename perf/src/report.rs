//! How commands hand their results to the CLI.

use std::io;

/// The result of one `dp-perf` command: printed as one JSON object with `--json`, else as a
/// human-readable table.
///
/// Each command module returns its own report type; the CLI only sees this trait, so a new
/// command needs no change to the printing code.
pub trait Report {
    /// The JSON object printed with `--json`. Its top-level key names the command
    /// (`{"ring": ...}`), so outputs of several commands can be merged.
    fn to_json(&self) -> serde_json::Value;

    /// Prints the `--json` output: by default [`to_json`](Self::to_json) on one line.
    /// Reports with one record per measured size print one object per line instead.
    ///
    /// # Errors
    ///
    /// Errors of `out`.
    fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
        writeln!(out, "{}", self.to_json())
    }

    /// The table printed without `--json`.
    ///
    /// # Errors
    ///
    /// Errors of `out`.
    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()>;

    /// The picture `--plot FILE` draws: a latency distribution, results over sizes, or both.
    /// `None` for commands that have none (the CLI refuses `--plot` for them up front, see
    /// [`Command::plots`](crate::cli::Command::plots)) and for the server side of a pair.
    fn figure(&self) -> Option<dp_plot::Figure> {
        None
    }
}
