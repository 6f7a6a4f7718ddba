//! From a [`Figure`] to a file: the panels a figure needs, laid out side by side under its
//! caption, on the SVG or bitmap backend the file name asks for.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::percentile;
use crate::style::{FIG_H, FONT, PANEL_W, fonts};
use crate::sweep::{self, Metric};
use crate::{Figure, Format, PlotError};

/// The panels `fig` has data for, in drawing order.
fn panels(fig: &Figure) -> Vec<Option<Metric>> {
    let mut v = Vec::new();
    let drawable =
        |s: &&crate::PercentileSeries| s.points.iter().any(|p| p.ns.is_finite() && p.ns > 0.0);
    if fig.percentiles.iter().any(|s| drawable(&s)) {
        v.push(None);
    }
    for m in [Metric::Bandwidth, Metric::Latency] {
        if m.present(&fig.sweep) {
            v.push(Some(m));
        }
    }
    v
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fig: &Figure,
    panels: &[Option<Metric>],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let body = root.titled(&fig.title, (FONT, 20)).map_err(err)?;
    for (area, panel) in body.split_evenly((1, panels.len())).iter().zip(panels) {
        match panel {
            None => percentile::draw(area, &fig.percentiles)?,
            Some(m) => sweep::draw(area, &fig.sweep, *m, &fig.sweep_latency)?,
        }
    }
    root.present().map_err(err)
}

/// The figure as an SVG document.
///
/// # Errors
///
/// [`PlotError::Empty`] when nothing is drawable, [`PlotError::Draw`] if drawing fails.
pub fn render(fig: &Figure) -> Result<String, PlotError> {
    let panels = checked_panels(fig)?;
    fonts();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size(&panels)).into_drawing_area();
        draw_on(&root, fig, &panels).map_err(|why| PlotError::Draw {
            path: "<svg>".into(),
            why,
        })?;
    }
    Ok(svg)
}

fn checked_panels(fig: &Figure) -> Result<Vec<Option<Metric>>, PlotError> {
    let panels = panels(fig);
    if panels.is_empty() {
        return Err(PlotError::Empty {
            title: fig.title.clone(),
        });
    }
    Ok(panels)
}

fn size(panels: &[Option<Metric>]) -> (u32, u32) {
    (PANEL_W * panels.len() as u32, FIG_H)
}

/// Writes `fig` to `path` in the format its extension names: `.svg`, `.png`, or `.json` (the
/// data, to draw later with other runs).
///
/// # Errors
///
/// [`PlotError::UnknownFormat`] for another extension, [`PlotError::Empty`] when nothing is
/// drawable (for pictures), [`PlotError::Io`] and [`PlotError::Draw`] when the file cannot be
/// written.
pub fn write(fig: &Figure, path: &Path) -> Result<(), PlotError> {
    let io = |source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    };
    match Format::of(path)? {
        Format::Json => std::fs::write(path, fig.to_json() + "\n").map_err(io),
        Format::Svg => std::fs::write(path, render(fig)?).map_err(io),
        Format::Png => {
            let panels = checked_panels(fig)?;
            fonts();
            let root = BitMapBackend::new(path, size(&panels)).into_drawing_area();
            draw_on(&root, fig, &panels).map_err(|why| PlotError::Draw {
                path: path.to_path_buf(),
                why,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PercentileSeries, SweepPoint, SweepSeries};

    fn sweep(label: &str, gbps: bool) -> SweepSeries {
        SweepSeries {
            label: label.into(),
            points: [64u64, 4096, 65536]
                .iter()
                .map(|&b| SweepPoint {
                    bytes: b,
                    gbps: gbps.then_some(b as f64 / 1000.0),
                    lat_ns: Some(1000.0 + b as f64),
                })
                .collect(),
        }
    }

    #[test]
    fn panels_follow_the_data() {
        let mut f = Figure::new("t");
        assert!(matches!(render(&f), Err(PlotError::Empty { .. })));
        f.sweep.push(sweep("a", false));
        assert_eq!(panels(&f), [Some(Metric::Latency)]);
        f.sweep.push(sweep("b", true));
        assert_eq!(panels(&f), [Some(Metric::Bandwidth), Some(Metric::Latency)]);
        f.percentiles
            .push(PercentileSeries::from_samples("p", 1..=100).unwrap());
        assert_eq!(panels(&f).len(), 3);
    }

    #[test]
    fn svg_shows_title_axes_and_every_series() {
        let mut f = Figure::new("write-lat over shm");
        f.percentiles
            .push(PercentileSeries::from_samples("2 B", 1000..=3000).unwrap());
        f.percentiles
            .push(PercentileSeries::from_samples("4 KiB", 2000..=9000).unwrap());
        f.sweep.push(sweep("rsocket", true));
        f.sweep.push(sweep("tcp", true));
        let svg = render(&f).unwrap();
        for text in [
            "write-lat over shm",
            "latency distribution",
            "bandwidth against size",
            "latency against size",
            "percentile",
            "99.9%",
            "2 B (2001 samples)",
            "4 KiB (7001 samples)",
            "rsocket",
            "tcp",
            "64 B",
        ] {
            assert!(svg.contains(text), "the SVG lacks {text:?}");
        }
        // One line of 3 points or more per series and panel: 2 percentile lines, and 2
        // series in each of the 2 sweep panels (axes, ticks and legend keys have 2 points).
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .filter(|l| l.matches(',').count() >= 3)
            .count();
        assert_eq!(lines, 6, "{svg}");
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
    }
}
