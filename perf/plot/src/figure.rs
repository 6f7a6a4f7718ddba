//! What a picture shows, independent of how it is drawn: [`Figure`] and its series, their
//! construction from HDR histograms, merging, and the JSON form.

use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::PlotError;

/// The version of the JSON form; files carry it as `"dp-plot"`.
pub const FORMAT_VERSION: u32 = 1;

/// One point of a latency distribution: `ns` is the latency at or below which `percentile`
/// percent of the samples fall.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantile {
    /// 0 to 100.
    pub percentile: f64,
    /// Nanoseconds.
    pub ns: f64,
}

/// A latency distribution, as a percentile plot shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PercentileSeries {
    /// The legend entry.
    pub label: String,
    /// Samples behind the distribution (the tail past 1/count is the maximum).
    pub count: u64,
    /// Points in increasing percentile order.
    pub points: Vec<Quantile>,
}

impl PercentileSeries {
    /// The distribution in `h`, whose values are `ns_per_unit` nanoseconds each (1.0 for a
    /// histogram of nanoseconds): the minimum at 0 %, 10 to 40 %, then ten points per decade
    /// of 1/(1-p) from 50 % (90, 99, 99.9 % ... among them) as far as the samples resolve
    /// the tail, and the maximum at 100 %. Every point is `h.value_at_quantile(p / 100)`, so
    /// the curve passes exactly through the percentiles a report prints from the same
    /// histogram. `None` for an empty histogram.
    pub fn from_histogram(
        label: impl Into<String>,
        h: &Histogram<u64>,
        ns_per_unit: f64,
    ) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        // 1/(1-p) = m * 10^d; the tail 100/(m * 10^d) in percent is computed from the
        // integers so that 50, 90, 99 ... come out exact.
        const MANTISSAS: [f64; 10] = [1.0, 1.25, 1.6, 2.0, 2.5, 3.2, 4.0, 5.0, 6.3, 8.0];
        let n = h.len() as f64;
        let mut percentiles: Vec<f64> = vec![10.0, 20.0, 30.0, 40.0];
        'grid: for d in 0..=9 {
            for m in MANTISSAS {
                let x = m * 10f64.powi(d);
                if x < 2.0 {
                    continue;
                }
                if x > n {
                    break 'grid;
                }
                percentiles.push(100.0 - 100.0 / x);
            }
        }
        let mut points = vec![Quantile {
            percentile: 0.0,
            ns: h.min() as f64 * ns_per_unit,
        }];
        for p in percentiles {
            points.push(Quantile {
                percentile: p,
                ns: h.value_at_quantile(p / 100.0) as f64 * ns_per_unit,
            });
        }
        points.push(Quantile {
            percentile: 100.0,
            ns: h.max() as f64 * ns_per_unit,
        });
        Some(Self {
            label: label.into(),
            count: h.len(),
            points,
        })
    }

    /// The distribution of `samples` (nanoseconds), through a histogram with 3 significant
    /// digits. `None` if there are none.
    pub fn from_samples(
        label: impl Into<String>,
        samples: impl IntoIterator<Item = u64>,
    ) -> Option<Self> {
        let mut h = Histogram::<u64>::new(3).ok()?;
        for s in samples {
            h.record(s).ok()?;
        }
        Self::from_histogram(label, &h, 1.0)
    }

    /// The latency at `percentile` (the first point at or above it), if the series has one.
    pub fn at(&self, percentile: f64) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.percentile >= percentile)
            .map(|p| p.ns)
    }
}

/// One message size's result in a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepPoint {
    /// Message size.
    pub bytes: u64,
    /// Payload bandwidth, if measured at this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// Latency, if measured at this size (what it is: [`Figure::sweep_latency`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat_ns: Option<f64>,
}

/// Results over message sizes, one line in the sweep panels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSeries {
    /// The legend entry.
    pub label: String,
    /// Points in increasing size order.
    pub points: Vec<SweepPoint>,
}

/// One picture: a title, latency distributions, and results over sizes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    /// Always [`FORMAT_VERSION`] in files this crate writes.
    #[serde(rename = "dp-plot")]
    pub version: u32,
    /// The caption.
    pub title: String,
    /// The latency distribution panel's series.
    #[serde(default)]
    pub percentiles: Vec<PercentileSeries>,
    /// The sweep panels' series.
    #[serde(default)]
    pub sweep: Vec<SweepSeries>,
    /// What the sweep's latency is, for the axis ("p50, one way", "time per transfer").
    #[serde(default)]
    pub sweep_latency: String,
}

impl Figure {
    /// An empty figure titled `title`.
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            version: FORMAT_VERSION,
            title: title.into(),
            ..Self::default()
        }
    }

    /// Whether some series has a point some panel can show.
    pub fn is_drawable(&self) -> bool {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        self.percentiles
            .iter()
            .any(|s| s.points.iter().any(|p| ok(p.ns)))
            || self.sweep.iter().any(|s| {
                s.points
                    .iter()
                    .any(|p| p.bytes > 0 && (p.gbps.is_some_and(ok) || p.lat_ns.is_some_and(ok)))
            })
    }

    /// Several figures in one: every series of each, in order, under `title` (or the first
    /// figure's title when `None`).
    ///
    /// # Errors
    ///
    /// [`PlotError::Mismatch`] when the figures' sweep latencies mean different things
    /// (a median next to a mean per transfer would mislead), or when there are none.
    pub fn merge(figures: Vec<Self>, title: Option<&str>) -> Result<Self, PlotError> {
        let mut it = figures.into_iter();
        let mut out = it
            .next()
            .ok_or_else(|| PlotError::Mismatch("no figures given".into()))?;
        for f in it {
            if !f.sweep.is_empty() {
                if out.sweep_latency.is_empty() {
                    out.sweep_latency = f.sweep_latency.clone();
                } else if !f.sweep_latency.is_empty() && f.sweep_latency != out.sweep_latency {
                    return Err(PlotError::Mismatch(format!(
                        "one figure's sweep latency is \"{}\", another's \"{}\"",
                        out.sweep_latency, f.sweep_latency
                    )));
                }
            }
            out.percentiles.extend(f.percentiles);
            out.sweep.extend(f.sweep);
        }
        if let Some(t) = title {
            out.title = t.to_owned();
        }
        Ok(out)
    }

    /// The JSON form (pretty-printed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses and checks a figure written by [`to_json`](Self::to_json); `path` names the
    /// source in errors.
    ///
    /// # Errors
    ///
    /// [`PlotError::BadFigure`] saying what is wrong: not JSON, an unknown or missing field,
    /// another format version, a number that is not finite, percentiles out of order or
    /// outside 0 to 100.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, PlotError> {
        let bad = |why: String| PlotError::BadFigure {
            path: path.to_path_buf(),
            why,
        };
        let f: Self = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if f.version != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                f.version
            )));
        }
        for s in &f.percentiles {
            let mut prev = -1.0;
            for p in &s.points {
                let valid = p.percentile.is_finite()
                    && p.ns.is_finite()
                    && (0.0..=100.0).contains(&p.percentile);
                if !valid || p.percentile < prev {
                    return Err(bad(format!(
                        "series \"{}\": point {p:?} is not finite, outside 0-100 %, or out of order",
                        s.label
                    )));
                }
                prev = p.percentile;
            }
        }
        for s in &f.sweep {
            for p in &s.points {
                let finite = |v: Option<f64>| v.is_none_or(f64::is_finite);
                if !finite(p.gbps) || !finite(p.lat_ns) {
                    return Err(bad(format!(
                        "series \"{}\": point {p:?} is not finite",
                        s.label
                    )));
                }
            }
        }
        Ok(f)
    }

    /// Reads a figure file.
    ///
    /// # Errors
    ///
    /// [`PlotError::Io`], or [`PlotError::BadFigure`] as [`from_json`](Self::from_json).
    pub fn read(path: &Path) -> Result<Self, PlotError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlotError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_from_a_histogram() {
        let s = PercentileSeries::from_samples("x", 1..=10_000).unwrap();
        assert_eq!(s.count, 10_000);
        let first = s.points[0];
        assert_eq!((first.percentile, first.ns), (0.0, 1.0));
        let last = s.points.last().unwrap();
        assert_eq!(last.percentile, 100.0);
        assert!((9_990.0..=10_010.0).contains(&last.ns), "{last:?}");
        let p50 = s.at(50.0).unwrap();
        assert!((4_990.0..=5_010.0).contains(&p50), "{p50}");
        let p99 = s.at(99.0).unwrap();
        assert!((9_890.0..=9_910.0).contains(&p99), "{p99}");
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        for q in [0.5, 0.9, 0.99, 0.999, 0.9999] {
            assert_eq!(
                s.at(q * 100.0),
                Some(h.value_at_quantile(q) as f64),
                "the curve passes through the histogram's own p{q}"
            );
        }
        // 10,000 samples resolve the tail to 99.99 %, and no further.
        let tail = s.points[s.points.len() - 2].percentile;
        assert!((99.98..=99.99).contains(&tail), "{tail}");
        assert!(
            s.points
                .windows(2)
                .all(|w| w[0].percentile <= w[1].percentile && w[0].ns <= w[1].ns),
            "increasing"
        );
        // Enough points to draw a tail: ten per decade of 1/(1-p).
        assert!(s.points.len() > 40, "{}", s.points.len());
        assert_eq!(PercentileSeries::from_samples("x", []), None);
    }

    #[test]
    fn scale_applies_to_every_value() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        h.record(100).unwrap();
        let s = PercentileSeries::from_histogram("x", &h, 2.5).unwrap();
        assert!(s.points.iter().all(|p| p.ns == 250.0), "{s:?}");
    }

    #[test]
    fn json_round_trip_and_checks() {
        let mut f = Figure::new("t");
        f.percentiles
            .push(PercentileSeries::from_samples("a", [5, 6, 7]).unwrap());
        f.sweep.push(SweepSeries {
            label: "b".into(),
            points: vec![SweepPoint {
                bytes: 64,
                gbps: Some(1.5),
                lat_ns: None,
            }],
        });
        let p = Path::new("f.json");
        assert_eq!(Figure::from_json(&f.to_json(), p).unwrap(), f);
        let e = Figure::from_json("{}", p).unwrap_err().to_string();
        assert!(
            e.contains("f.json: not a dp-plot figure: missing field"),
            "{e}"
        );
        let e = Figure::from_json(&f.to_json().replace("\"dp-plot\": 1", "\"dp-plot\": 7"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("format version 7"), "{e}");
        let e = Figure::from_json(
            &f.to_json().replace("\"label\": \"a\"", "\"lable\": \"a\""),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `lable`"), "{e}");
        let mut g = f.clone();
        g.percentiles[0].points.reverse();
        let e = Figure::from_json(&g.to_json(), p).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
    }

    #[test]
    fn merge_keeps_every_series_and_rejects_mixed_latencies() {
        let mut a = Figure::new("a");
        a.sweep_latency = "p50".into();
        a.sweep.push(SweepSeries {
            label: "one".into(),
            points: vec![],
        });
        let mut b = a.clone();
        b.sweep[0].label = "two".into();
        let m = Figure::merge(vec![a.clone(), b.clone()], Some("both")).unwrap();
        assert_eq!(m.title, "both");
        let labels: Vec<&str> = m.sweep.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["one", "two"]);
        b.sweep_latency = "mean".into();
        assert!(matches!(
            Figure::merge(vec![a, b], None),
            Err(PlotError::Mismatch(_))
        ));
        assert!(Figure::merge(vec![], None).is_err());
    }

    #[test]
    fn drawable_needs_a_positive_finite_point() {
        let mut f = Figure::new("t");
        assert!(!f.is_drawable());
        f.sweep.push(SweepSeries {
            label: "s".into(),
            points: vec![SweepPoint {
                bytes: 64,
                gbps: Some(0.0),
                lat_ns: Some(f64::NAN),
            }],
        });
        assert!(!f.is_drawable());
        f.sweep[0].points[0].gbps = Some(2.0);
        assert!(f.is_drawable());
    }
}
