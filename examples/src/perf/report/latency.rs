//! Latency summaries: avg, min and max, the percentiles asked for and the
//! power-of-two buckets, from a job's sums and histogram.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency summary in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatUs {
    /// Mean.
    pub avg: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p99_9: Option<f64>,
    /// 99.99th percentile.
    pub p99_99: Option<f64>,
    /// The `--percentiles` list (default [`PERCENTILES`]); empty without a
    /// histogram.
    #[serde(default)]
    pub percentiles: Vec<Percentile>,
    /// With `-LL`: the latency histogram in power-of-two buckets, as
    /// spdk_nvme_perf's `-LL` prints it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<Bucket>,
}

/// One percentile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    /// The percentile (e.g. 99.9).
    pub p: f64,
    /// Its latency, µs.
    pub us: f64,
}

/// One histogram bucket: latencies in `(lo_us, hi_us]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Lower bound, µs (exclusive).
    pub lo_us: f64,
    /// Upper bound, µs (inclusive).
    pub hi_us: f64,
    /// I/Os in the bucket.
    pub count: u64,
    /// Percentage of I/Os at or below `hi_us`.
    pub cumulative_pct: f64,
}

/// What latency summaries show besides avg/min/max.
#[derive(Debug, Clone, PartialEq)]
pub struct LatOpts {
    /// Percentiles to report.
    pub percentiles: Vec<f64>,
    /// Report the bucketed histogram too.
    pub buckets: bool,
}

impl Default for LatOpts {
    fn default() -> Self {
        LatOpts {
            percentiles: PERCENTILES.to_vec(),
            buckets: false,
        }
    }
}

/// The percentiles reported (as in spdk_nvme_perf's summary, trimmed).
pub const PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

/// Power-of-two buckets from 1 µs up to the largest latency.
pub fn buckets(h: &Histogram<u64>) -> Vec<Bucket> {
    let total = h.len();
    if total == 0 {
        return Vec::new();
    }
    // counts[i]: latencies in (1000 * 2^(i-1), 1000 * 2^i] ns; [0]: up to 1 µs.
    let mut counts: Vec<u64> = Vec::new();
    for v in h.iter_recorded() {
        let ns = h.highest_equivalent(v.value_iterated_to());
        let mut i = 0usize;
        let mut hi = 1000u64;
        while hi < ns && i < 63 {
            hi = hi.saturating_mul(2);
            i += 1;
        }
        if counts.len() <= i {
            counts.resize(i + 1, 0);
        }
        counts[i] += v.count_at_value();
    }
    let first = counts.iter().position(|&c| c > 0).unwrap_or(0);
    let mut seen = 0u64;
    let mut out = Vec::new();
    for (i, &count) in counts.iter().enumerate().skip(first) {
        seen += count;
        let hi = 1000u64.saturating_mul(1u64 << i.min(40));
        out.push(Bucket {
            lo_us: if i == 0 { 0.0 } else { hi as f64 / 2000.0 },
            hi_us: hi as f64 / 1000.0,
            count,
            cumulative_pct: seen as f64 / total as f64 * 100.0,
        });
    }
    out
}

impl LatUs {
    /// From a sum/min/max in ns over `n` samples and an optional histogram
    /// in ns, with the default percentiles.
    #[cfg(test)]
    pub fn from_ns(sum: u64, min: u64, max: u64, n: u64, hist: Option<&Histogram<u64>>) -> Self {
        Self::with(sum, min, max, n, hist, &LatOpts::default())
    }

    /// From a sum/min/max in ns over `n` samples and an optional histogram
    /// in ns, with the percentiles and buckets `o` asks for.
    pub fn with(
        sum: u64,
        min: u64,
        max: u64,
        n: u64,
        hist: Option<&Histogram<u64>>,
        o: &LatOpts,
    ) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        let p = |q: f64| {
            hist.filter(|h| !h.is_empty())
                .map(|h| us(h.value_at_quantile(q / 100.0)))
        };
        LatUs {
            avg: if n == 0 {
                0.0
            } else {
                sum as f64 / n as f64 / 1000.0
            },
            min: if n == 0 { 0.0 } else { us(min) },
            max: us(max),
            p50: p(PERCENTILES[0]),
            p90: p(PERCENTILES[1]),
            p99: p(PERCENTILES[2]),
            p99_9: p(PERCENTILES[3]),
            p99_99: p(PERCENTILES[4]),
            percentiles: o
                .percentiles
                .iter()
                .filter_map(|&q| p(q).map(|us| Percentile { p: q, us }))
                .collect(),
            buckets: match hist {
                Some(h) if o.buckets => buckets(h),
                _ => Vec::new(),
            },
        }
    }

    pub(super) fn percentiles(&self) -> Vec<(f64, Option<f64>)> {
        if !self.percentiles.is_empty() {
            return self.percentiles.iter().map(|p| (p.p, Some(p.us))).collect();
        }
        vec![
            (PERCENTILES[0], self.p50),
            (PERCENTILES[1], self.p90),
            (PERCENTILES[2], self.p99),
            (PERCENTILES[3], self.p99_9),
            (PERCENTILES[4], self.p99_99),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_from_a_known_histogram() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        // 1..=10000 ns, one each: p50 = 5000 ns, p99 = 9900 ns.
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let l = LatUs::from_ns((1..=10_000u64).sum(), 1, 10_000, 10_000, Some(&h));
        assert!((l.avg - 5.0005).abs() < 1e-9, "{}", l.avg);
        assert_eq!(l.min, 0.001);
        assert_eq!(l.max, 10.0);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() <= b * 0.001 + 0.001;
        assert!(close(l.p50, 5.0), "{:?}", l.p50);
        assert!(close(l.p90, 9.0), "{:?}", l.p90);
        assert!(close(l.p99, 9.9), "{:?}", l.p99);
        assert!(close(l.p99_9, 9.99), "{:?}", l.p99_9);
        assert!(close(l.p99_99, 10.0), "{:?}", l.p99_99);
        let none = LatUs::from_ns(0, u64::MAX, 0, 0, None);
        assert_eq!((none.avg, none.min, none.p50), (0.0, 0.0, None));
    }
}
