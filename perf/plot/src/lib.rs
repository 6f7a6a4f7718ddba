//! Pictures of perf results: HdrHistogram-style latency percentile plots and size sweeps
//! (bandwidth and latency against message size), drawn with `plotters` as SVG or PNG.
//!
//! `dp-perf` (every latency test and size sweep, `--plot FILE`), `dp-perf plot` (several
//! runs in one chart) and `dpctl run --plot FILE` draw through this crate, so their pictures
//! read the same way.
//!
//! # The data: [`Figure`]
//!
//! A figure is a title and its series, and knows nothing of who measured them:
//!
//! * [`PercentileSeries`]: a latency distribution as (percentile, nanoseconds) points, taken
//!   from an HDR histogram with [`PercentileSeries::from_histogram`] at HdrHistogram's usual
//!   resolution (five steps per halving of the remaining tail);
//! * [`SweepSeries`]: one value per message size: bandwidth in Gb/s of payload, latency in
//!   nanoseconds, or both.
//!
//! Several series share one chart: figures of several runs merge with [`Figure::merge`].
//! A figure also has a JSON form ([`Figure::to_json`], [`Figure::from_json`]), so runs made
//! at different times (a `--tcp` run and its rsocket twin, a reference tool's results that a
//! script converted) can be drawn together later.
//!
//! # The pictures
//!
//! [`write()`] picks the format from the file name's extension: `.svg`, `.png`, or `.json`
//! (the figure's data). A figure draws up to three panels side by side, each only when some
//! series has data for it:
//!
//! | panel | x | y |
//! |---|---|---|
//! | latency distribution | percentile, log scale of 1/(1-p): 50, 90, 99, 99.9, 99.99 % ... | latency, log scale |
//! | bandwidth against size | message size, log scale | Gb/s of payload, log scale |
//! | latency against size | message size, log scale | latency, log scale |
//!
//! Latency axes are logarithmic because a shared or busy host puts its tail orders of
//! magnitude above its median, and a linear axis would flatten the body of the curve. Text
//! is set in DejaVu Sans, compiled in (the `dejavu` crate), so a PNG looks the same on every
//! machine; an SVG names the font family `sans-serif` and lets the viewer choose.
//!
//! # Invariants
//!
//! * Drawing never panics on odd data: points that a log axis cannot show (zero, negative,
//!   NaN, infinite) are left out, and a figure with nothing to draw is an error
//!   ([`PlotError::Empty`]).
//! * A figure file read back is checked before use ([`Figure::from_json`]): the format tag,
//!   every field, finite numbers.

mod error;
mod figure;
mod format;
mod percentile;
mod render;
mod style;
mod sweep;

pub use error::PlotError;
pub use figure::{FORMAT_VERSION, Figure, PercentileSeries, Quantile, SweepPoint, SweepSeries};
pub use format::Format;
pub use render::{render, write};
pub use style::{fmt_bytes, fmt_ns};
