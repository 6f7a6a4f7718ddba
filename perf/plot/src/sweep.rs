//! The sweep panels: bandwidth against message size, and latency against message size, both
//! axes on log scales (sizes in powers of two).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::style::{FONT, color, fmt_bytes, fmt_gbps, fmt_ns, with_headroom};
use crate::{SweepPoint, SweepSeries};

/// Which value of a [`SweepPoint`] a panel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    /// Gb/s of payload.
    Bandwidth,
    /// Nanoseconds.
    Latency,
}

impl Metric {
    pub(crate) fn value(self, p: &SweepPoint) -> Option<f64> {
        let v = match self {
            Self::Bandwidth => p.gbps,
            Self::Latency => p.lat_ns,
        }?;
        (v.is_finite() && v > 0.0 && p.bytes > 0).then_some(v)
    }

    /// Whether any point of `series` has this metric.
    pub(crate) fn present(self, series: &[SweepSeries]) -> bool {
        series
            .iter()
            .any(|s| s.points.iter().any(|p| self.value(p).is_some()))
    }
}

/// Powers of two from `lo` to `hi`, every `step`-th so that at most 9 are labelled.
fn size_keys(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    let step = ((b - a) / 8 + 1).max(1);
    (a..=b)
        .filter(|k| (k - a) % step == 0)
        .map(|k| 2f64.powi(k))
        .collect()
}

/// Draws `metric` of `series` against size on `area`; `latency` says what the latency is.
pub(crate) fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[SweepSeries],
    metric: Metric,
    latency: &str,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let pts = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter_map(move |p| metric.value(p).map(|v| (p.bytes as f64, v)))
    };
    let xmin = pts().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let xmax = pts().map(|p| p.0).fold(0.0, f64::max);
    let ymin = pts().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let ymax = pts().map(|p| p.1).fold(0.0, f64::max);
    let (xlo, xhi) = (xmin / 1.5, (xmax * 1.5).max(xmin * 3.0));
    let (ylo, ytop) = (ymin * 0.7, (ymax * 1.4).max(ymin * 2.0));
    let yhi = with_headroom(ylo, ytop, series.len());
    let (caption, y_desc) = match metric {
        Metric::Bandwidth => (
            "bandwidth against size".to_owned(),
            "Gb/s of payload".to_owned(),
        ),
        Metric::Latency => (
            "latency against size".to_owned(),
            if latency.is_empty() {
                "latency".to_owned()
            } else {
                format!("latency ({latency})")
            },
        ),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 17))
        .margin(12)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(
            (xlo..xhi).log_scale().with_key_points(size_keys(xlo, xhi)),
            (ylo..yhi).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_desc)
        .y_labels(8)
        .x_label_formatter(&|x| fmt_bytes(*x))
        // No labels in the legend's headroom above the data.
        .y_label_formatter(&|y| match metric {
            _ if *y > ytop * 1.01 => String::new(),
            Metric::Bandwidth => fmt_gbps(*y),
            Metric::Latency => fmt_ns(*y),
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err)?;
    let n = series.len();
    for (i, s) in series.iter().enumerate() {
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|p| metric.value(p).map(|v| (p.bytes as f64, v)))
            .collect();
        if line.is_empty() {
            continue;
        }
        let c = color(i, n);
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(line.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .label_font((FONT, 12))
        .draw()
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_axis_keys_are_powers_of_two_and_few() {
        assert_eq!(size_keys(40.0, 1500.0), [64.0, 128.0, 256.0, 512.0, 1024.0]);
        let many = size_keys(1.0, 8.0 * 1024.0 * 1024.0);
        assert!(many.len() <= 9, "{many:?}");
        assert!(many.iter().all(|k| k.log2().fract() == 0.0));
    }

    #[test]
    fn metric_skips_what_a_log_axis_cannot_show() {
        let p = |gbps, lat_ns| SweepPoint {
            bytes: 64,
            gbps,
            lat_ns,
        };
        assert_eq!(Metric::Bandwidth.value(&p(Some(2.0), None)), Some(2.0));
        assert_eq!(Metric::Bandwidth.value(&p(Some(0.0), None)), None);
        assert_eq!(Metric::Latency.value(&p(None, Some(f64::INFINITY))), None);
        assert_eq!(Metric::Latency.value(&p(None, None)), None);
    }
}
