//! The error of every operation of this crate.

use std::io;
use std::path::PathBuf;

/// Why a figure could not be read, drawn or written.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The file name does not say which format to write.
    #[error(
        "{}: cannot tell the plot format from the file name; end it in .svg, .png or .json",
        path.display()
    )]
    UnknownFormat {
        /// The file name given.
        path: PathBuf,
    },
    /// The figure has no point any panel can show.
    #[error("nothing to plot in \"{title}\": no series has a positive, finite value")]
    Empty {
        /// The figure's title.
        title: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A figure file is not a valid figure.
    #[error("{}: not a dp-plot figure: {why}", path.display())]
    BadFigure {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Figures of different kinds cannot share a chart.
    #[error("cannot draw these together: {0}")]
    Mismatch(String),
    /// The drawing library failed (for example, writing the image).
    #[error("drawing {}: {why}", path.display())]
    Draw {
        /// The file being drawn.
        path: PathBuf,
        /// The library's message.
        why: String,
    },
}
