//! How every picture looks: sizes, fonts, colours, and the number formats of the axes.

use std::sync::Once;

use plotters::style::{FontStyle, HSLColor, RGBColor, register_font};

/// Width of one panel in pixels.
pub(crate) const PANEL_W: u32 = 640;
/// Height of a picture in pixels, caption included.
pub(crate) const FIG_H: u32 = 460;
/// The font family every text uses.
pub(crate) const FONT: &str = "sans-serif";

/// Tableau's ten colours: distinct for up to ten series, and readable by most colour-blind
/// viewers.
const TABLEAU10: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of series `i` of `n`: Tableau's ten, or a hue wheel when there are more (a
/// sweep over many sizes then reads as a gradient).
pub(crate) fn color(i: usize, n: usize) -> RGBColor {
    if n <= TABLEAU10.len() {
        return TABLEAU10[i % TABLEAU10.len()];
    }
    let h = 0.8 * i as f64 / (n - 1).max(1) as f64;
    let c = HSLColor(h, 0.75, 0.42);
    let (r, g, b) = plotters::style::Color::rgb(&c);
    RGBColor(r, g, b)
}

/// Registers DejaVu Sans as [`FONT`] once per process: `plotters` lays text out with it
/// (ab_glyph), for the PNG backend's glyphs and the SVG backend's label sizes.
pub(crate) fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font compiled in; a failure would be a build
        // problem, and it shows as a drawing error naming the font.
        let _ = register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// The top of a log axis from `lo` to `hi` with room above the data for a legend of
/// `entries` lines (in the upper left corner), so that it never hides a curve.
pub(crate) fn with_headroom(lo: f64, hi: f64, entries: usize) -> f64 {
    // A panel's plotting area is about 330 px high; a legend line takes about 16 px.
    let f = ((entries as f64 * 16.0 + 18.0) / 330.0).min(0.6);
    hi * (hi / lo).powf(f / (1.0 - f))
}

/// Up to three significant digits, without trailing zeros: `850`, `12.3`, `1.05`, `4`.
fn sig3(v: f64) -> String {
    let decimals = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Nanoseconds for an axis: `850 ns`, `12.3 µs`, `4.56 ms`, `1.2 s`.
pub fn fmt_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{} ns", sig3(ns))
    } else if a < 1e6 {
        format!("{} µs", sig3(ns / 1e3))
    } else if a < 1e9 {
        format!("{} ms", sig3(ns / 1e6))
    } else {
        format!("{} s", sig3(ns / 1e9))
    }
}

/// A message size for an axis, in powers of 1024: `64 B`, `4 KiB`, `1.5 MiB`.
pub fn fmt_bytes(bytes: f64) -> String {
    if bytes < 1024.0 {
        format!("{} B", sig3(bytes))
    } else if bytes < 1024.0 * 1024.0 {
        format!("{} KiB", sig3(bytes / 1024.0))
    } else if bytes < 1024.0 * 1024.0 * 1024.0 {
        format!("{} MiB", sig3(bytes / 1024.0 / 1024.0))
    } else {
        format!("{} GiB", sig3(bytes / 1024.0 / 1024.0 / 1024.0))
    }
}

/// A percentile axis label: `50%`, `99.9%`.
pub(crate) fn fmt_percentile(p: f64) -> String {
    let s = format!("{p:.4}");
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// Gigabits per second for an axis.
pub(crate) fn fmt_gbps(g: f64) -> String {
    format!("{} Gb/s", sig3(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_read_like_a_person_wrote_them() {
        assert_eq!(fmt_ns(850.0), "850 ns");
        assert_eq!(fmt_ns(12_345.0), "12.3 µs");
        assert_eq!(fmt_ns(4_560_000.0), "4.56 ms");
        assert_eq!(fmt_ns(2e9), "2 s");
        assert_eq!(fmt_ns(1.5), "1.5 ns");
        assert_eq!(fmt_bytes(64.0), "64 B");
        assert_eq!(fmt_bytes(4096.0), "4 KiB");
        assert_eq!(fmt_bytes(1.5 * 1024.0 * 1024.0), "1.5 MiB");
        assert_eq!(fmt_percentile(50.0), "50%");
        assert_eq!(fmt_percentile(99.99), "99.99%");
        assert_eq!(fmt_gbps(0.25), "0.25 Gb/s");
        assert_eq!(fmt_gbps(40.0), "40 Gb/s");
    }

    #[test]
    fn headroom_grows_with_the_legend() {
        assert!(with_headroom(1.0, 10.0, 1) > 10.0);
        assert!(with_headroom(1.0, 10.0, 5) > with_headroom(1.0, 10.0, 1));
        // At most 60 % of the axis: the data keeps 40 %.
        let top = with_headroom(1.0, 10.0, 100);
        assert!((top.log10() - 2.5).abs() < 1e-9, "{top}");
    }

    #[test]
    fn colours_are_distinct() {
        for n in [3, 10, 23] {
            let c: Vec<RGBColor> = (0..n).map(|i| color(i, n)).collect();
            for i in 0..n {
                for j in i + 1..n {
                    assert_ne!(c[i], c[j], "series {i} and {j} of {n}");
                }
            }
        }
    }
}
