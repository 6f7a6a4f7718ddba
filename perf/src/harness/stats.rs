//! Percentile summaries of latency samples, and medians of repetitions.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Percentiles of a set of samples (any unit; the perf lab records nanoseconds).
///
/// Recorded in an HDR histogram with 3 significant digits, so every percentile is within
/// 0.1 % of the exact sample value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Smallest sample.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Largest sample.
    pub max: u64,
}

impl Summary {
    /// Summarises `samples`, or returns `None` if there are none.
    pub fn from_samples(samples: impl IntoIterator<Item = u64>) -> Option<Self> {
        // 3 significant digits, auto-resizing. `record`, not `saturating_record`: the latter
        // never resizes and clamps anything past the initial range (about 2 µs) to its
        // lowest value, which would turn outliers into 2 ns samples.
        let mut h = Histogram::<u64>::new(3).ok()?;
        for s in samples {
            h.record(s).ok()?;
        }
        Self::from_histogram(&h)
    }

    /// Summarises a histogram, or returns `None` if it is empty.
    pub fn from_histogram(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        Some(Self {
            count: h.len(),
            min: h.min(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            mean: h.mean(),
            max: h.max(),
        })
    }
}

/// The median of `values` (the mean of the middle two for an even count), or `None` if empty
/// or if any value is NaN. Reorders `values`.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [1.0, f64::NAN]), None);
    }

    #[test]
    fn summary_percentiles() {
        let s = Summary::from_samples(1..=1000).unwrap();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 1);
        assert_eq!(s.max, 1000);
        assert!((499..=501).contains(&s.p50), "{s:?}");
        assert!((989..=991).contains(&s.p99), "{s:?}");
        assert!((998..=1000).contains(&s.p999), "{s:?}");
        assert!((s.mean - 500.5).abs() < 1.0, "{s:?}");
        assert_eq!(Summary::from_samples(core::iter::empty()), None);
    }
}
