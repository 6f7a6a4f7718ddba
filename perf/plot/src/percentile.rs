//! The latency distribution panel: HdrHistogram's percentile plot. The x axis is 1/(1-p) on
//! a log scale, so 50, 90, 99, 99.9 and 99.99 % are evenly spaced and the tail gets the room
//! it deserves; the y axis is latency, on a log scale.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::PercentileSeries;
use crate::style::{FONT, color, fmt_ns, fmt_percentile, with_headroom};

/// 1/(1-p) for percentile `p`, at most `max`.
fn x_of(p: f64, max: f64) -> f64 {
    if p >= 100.0 {
        return max;
    }
    (1.0 / (1.0 - p / 100.0)).min(max)
}

/// How far right the axis goes: at least 99.99 %, further when a series has the samples to
/// show it (10^k samples resolve 1/(1-p) up to 10^k), at most 99.9999 %.
fn x_max(series: &[PercentileSeries]) -> f64 {
    let n = series.iter().map(|s| s.count).max().unwrap_or(0).max(1) as f64;
    10f64.powf(n.log10().ceil()).clamp(1e4, 1e6)
}

fn ok(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// `1.2M samples`.
fn count_str(n: u64) -> String {
    let n = n as f64;
    if n >= 1e6 {
        format!("{:.1}M samples", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.0}k samples", n / 1e3)
    } else {
        format!("{n} samples")
    }
}

/// Draws `series` on `area`. Series without a drawable point are left out of the chart.
pub(crate) fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[PercentileSeries],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let xmax = x_max(series);
    let values = || series.iter().flat_map(|s| s.points.iter().map(|p| p.ns));
    let ymin = values().filter(|v| ok(*v)).fold(f64::INFINITY, f64::min);
    let ymax = values().filter(|v| ok(*v)).fold(0.0, f64::max);
    let (ylo, ytop) = (ymin * 0.8, (ymax * 1.3).max(ymin * 2.0));
    let yhi = with_headroom(ylo, ytop, series.len());
    let mut keys = vec![2.0];
    let mut k = 10.0;
    while k <= xmax * 1.0001 {
        keys.push(k);
        k *= 10.0;
    }
    let mut chart = ChartBuilder::on(area)
        .caption("latency distribution", (FONT, 17))
        .margin(12)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(
            (1.0..xmax).log_scale().with_key_points(keys),
            (ylo..yhi).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency")
        .y_labels(8)
        .x_label_formatter(&|x| fmt_percentile(100.0 * (1.0 - 1.0 / x)))
        // No labels in the legend's headroom above the data.
        .y_label_formatter(&|y| {
            if *y > ytop * 1.01 {
                String::new()
            } else {
                fmt_ns(*y)
            }
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err)?;
    let n = series.len();
    for (i, s) in series.iter().enumerate() {
        let mut pts: Vec<(f64, f64)> = Vec::with_capacity(s.points.len() + 1);
        for p in s.points.iter().filter(|p| ok(p.ns)) {
            if p.percentile >= 100.0 {
                // The maximum is the last of `count` samples: it sits at 1/(1-p) = count,
                // and holds from there to the right edge, as HdrHistogram draws it (the
                // resolution of the tail ends where the samples do).
                let at = (s.count.max(1) as f64).clamp(pts.last().map_or(1.0, |l| l.0), xmax);
                pts.push((at, p.ns));
                pts.push((xmax, p.ns));
            } else {
                pts.push((x_of(p.percentile, xmax), p.ns));
            }
        }
        if pts.is_empty() {
            continue;
        }
        let c = color(i, n);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} ({})", s.label, count_str(s.count)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
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
    fn axis_positions() {
        assert_eq!(x_of(50.0, 1e4), 2.0);
        assert!((x_of(99.0, 1e4) - 100.0).abs() < 1e-9);
        assert_eq!(x_of(100.0, 1e4), 1e4);
        assert_eq!(x_of(99.9999, 1e4), 1e4);
        let s = |count| PercentileSeries {
            label: String::new(),
            count,
            points: vec![],
        };
        assert_eq!(x_max(&[s(1000)]), 1e4);
        assert_eq!(x_max(&[s(1000), s(250_000)]), 1e6);
        assert_eq!(x_max(&[s(u64::MAX)]), 1e6);
        assert_eq!(count_str(1_234_567), "1.2M samples");
    }
}
