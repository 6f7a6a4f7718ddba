//! `dp-perf plot`: several runs in one chart. Each run writes its figure's data with
//! `--plot FILE.json`; this command reads them, merges their series (in the order given) and
//! draws the result with `--plot OUT.svg` (or `.png`, or `.json` to merge further).
//!
//! ```text
//! dp-perf rstream --pair -S all --plot rs.json
//! dp-perf rstream --pair -S all --tcp --plot tcp.json
//! dp-perf plot rs.json tcp.json --title "rstream: rsockets and kernel TCP" --plot rstream.svg
//! ```
//!
//! A figure file may also come from elsewhere (a script that converted a reference tool's
//! output): the format is `dp_plot::Figure`'s JSON form, checked field by field when read.

use std::io;
use std::path::PathBuf;

use clap::Args;
use dp_plot::Figure;

use crate::{PerfError, Report};

/// Options of `dp-perf plot`.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// Figure files written by `--plot FILE.json`.
    #[arg(value_name = "FIGURE.json", required = true)]
    pub files: Vec<PathBuf>,
    /// The chart's caption [default: the first file's].
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

impl PlotArgs {
    /// Reads and merges the files.
    ///
    /// # Errors
    ///
    /// [`PerfError::Usage`] naming the file that cannot be read or is not a figure, or the
    /// figures that cannot share a chart.
    pub fn run(&self) -> Result<PlotReport, PerfError> {
        let figures = self
            .files
            .iter()
            .map(|f| Figure::read(f))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PerfError::Usage(e.to_string()))?;
        let figure = Figure::merge(figures, self.title.as_deref())
            .map_err(|e| PerfError::Usage(e.to_string()))?;
        if !figure.is_drawable() {
            return Err(PerfError::Usage(format!(
                "nothing to plot: no series in {} has a positive, finite value",
                self.files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(PlotReport { figure })
    }
}

/// The merged figure.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotReport {
    /// Every series of every file.
    pub figure: Figure,
}

impl Report for PlotReport {
    fn to_json(&self) -> serde_json::Value {
        let f = &self.figure;
        serde_json::json!({"plot": {
            "title": f.title,
            "percentiles": f.percentiles.iter().map(|s| &s.label).collect::<Vec<_>>(),
            "sweep": f.sweep.iter().map(|s| &s.label).collect::<Vec<_>>(),
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let f = &self.figure;
        writeln!(out, "{}", f.title)?;
        for s in &f.percentiles {
            let at = |p| s.at(p).map_or_else(|| "-".into(), dp_plot::fmt_ns);
            writeln!(
                out,
                "  distribution  {:<40} p50 {:>10}  p99 {:>10}  p99.9 {:>10}  ({} samples)",
                s.label,
                at(50.0),
                at(99.0),
                at(99.9),
                s.count
            )?;
        }
        for s in &f.sweep {
            writeln!(
                out,
                "  sweep         {:<40} {} sizes",
                s.label,
                s.points.len()
            )?;
        }
        Ok(())
    }

    fn figure(&self) -> Option<Figure> {
        Some(self.figure.clone())
    }
}
