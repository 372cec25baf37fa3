//! Repeats and comparisons: the median of `--repeat` runs and the ratios
//! of a `--compare` pair.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{Comparison, RunReport};

impl RunReport {
    /// Fold repeats of one run into the median one (by total IOPS), keeping
    /// every repeat's IOPS. A repeat with failures wins over the median so
    /// errors are never hidden.
    pub fn median_of(mut runs: Vec<RunReport>) -> Option<RunReport> {
        let iops: Vec<f64> = runs.iter().map(|r| r.total.stats.iops).collect();
        let pick = match runs.iter().position(RunReport::failed) {
            Some(i) => i,
            None => {
                let mut order: Vec<usize> = (0..runs.len()).collect();
                order.sort_by(|&a, &b| iops[a].total_cmp(&iops[b]));
                *order.get(order.len() / 2)?
            }
        };
        if runs.is_empty() {
            return None;
        }
        let mut r = runs.swap_remove(pick);
        if iops.len() > 1 {
            let min = iops.iter().copied().fold(f64::INFINITY, f64::min);
            let max = iops.iter().copied().fold(0.0, f64::max);
            r.notes.push(format!(
                "median of {} repeats by IOPS; repeats ranged {:.0} to {:.0} IOPS",
                iops.len(),
                min,
                max
            ));
            r.repeat_iops = iops;
        }
        Some(r)
    }
}

/// Ratios base / other.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// IOPS ratio (> 1: base is faster).
    pub iops: f64,
    /// Bandwidth ratio, when both devices move data.
    pub mib_s: Option<f64>,
    /// Mean latency ratio (< 1: base is quicker).
    pub lat_avg: f64,
    /// 99th percentile latency ratio, when both have histograms.
    pub lat_p99: Option<f64>,
    /// CPU per I/O ratio (< 1: base is cheaper).
    pub cpu_ns_per_io: f64,
}

/// Two runs of one workload (`--compare`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// The `--device` run.
    pub base: RunReport,
    /// The `--compare` run.
    pub other: RunReport,
    /// base / other.
    pub ratio: Ratio,
}

fn div(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

impl CompareReport {
    /// The single JSON shape: the base run with the other run and the
    /// ratios under `compare`.
    pub fn into_report(self) -> RunReport {
        let mut base = self.base;
        base.compare = Some(Comparison {
            run: Box::new(self.other),
            ratio: self.ratio,
        });
        base
    }

    /// Pair two runs and compute the ratios.
    pub fn new(base: RunReport, other: RunReport) -> Self {
        let (a, b) = (&base.total, &other.total);
        let ratio = Ratio {
            iops: div(a.stats.iops, b.stats.iops),
            mib_s: a.stats.mib_s.zip(b.stats.mib_s).map(|(x, y)| div(x, y)),
            lat_avg: div(a.stats.lat_us.avg, b.stats.lat_us.avg),
            lat_p99: a
                .stats
                .lat_us
                .p99
                .zip(b.stats.lat_us.p99)
                .map(|(x, y)| div(x, y)),
            cpu_ns_per_io: div(a.cpu_ns_per_io, b.cpu_ns_per_io),
        };
        CompareReport { base, other, ratio }
    }

    /// The ratio line(s) for the table output.
    /// Only figures the tables show are compared: the p99 ratio comes with
    /// `percentiles` (`-L`), when the tables print percentiles.
    pub fn ratio_text(&self, percentiles: bool) -> String {
        let r = &self.ratio;
        let mut s = format!(
            "{} vs {}: IOPS {:.2}x, ",
            self.base.device, self.other.device, r.iops
        );
        if let Some(m) = r.mib_s {
            let _ = write!(s, "MiB/s {m:.2}x, ");
        }
        let _ = write!(s, "avg latency {:.2}x", r.lat_avg);
        if let Some(p) = r.lat_p99.filter(|_| percentiles) {
            let _ = write!(s, ", p99 latency {p:.2}x");
        }
        let _ = write!(s, ", CPU per I/O {:.2}x", r.cpu_ns_per_io);
        for run in [&self.base, &self.other] {
            if run.interrupted {
                let _ = write!(
                    s,
                    " (compares a partial run: {} was interrupted)",
                    run.device
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_run;

    #[test]
    fn compare_ratios_and_shape() {
        let c = CompareReport::new(
            sample_run("fake:null", 3e6, 1.0),
            sample_run("uring:null", 2e6, 2.0),
        );
        assert!((c.ratio.iops - 1.5).abs() < 1e-12);
        assert!((c.ratio.lat_avg - 0.5).abs() < 1e-12);
        assert_eq!(c.ratio.lat_p99, Some(1.0));
        let v = serde_json::to_value(&c).unwrap();
        assert!(v["base"]["total"]["iops"].is_number());
        assert!(v["other"]["total"]["iops"].is_number());
        assert!(v["ratio"]["iops"].is_number());
        assert!(c.ratio_text(true).contains("IOPS 1.50x"));
        let back: CompareReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
        // One JSON shape for single and compared runs.
        let single = serde_json::to_value(sample_run("fake:null", 3e6, 1.0)).unwrap();
        let both = serde_json::to_value(c.clone().into_report()).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&single), keys(&both));
        assert!(single["compare"].is_null());
        assert_eq!(both["compare"]["ratio"]["iops"], 1.5);
        assert_eq!(keys(&both["compare"]["run"]), keys(&single));
    }

    #[test]
    fn median_of_repeats() {
        let runs = vec![
            sample_run("a", 3.0, 1.0),
            sample_run("a", 1.0, 1.0),
            sample_run("a", 2.0, 1.0),
        ];
        let m = RunReport::median_of(runs).unwrap();
        assert_eq!(m.total.stats.iops, 2.0);
        assert_eq!(m.repeat_iops, vec![3.0, 1.0, 2.0]);
        assert!(m.notes.iter().any(|n| n.contains("median of 3 repeats")));
        let mut bad = sample_run("a", 9.0, 1.0);
        bad.total.stats.errors = 1;
        let m = RunReport::median_of(vec![
            sample_run("a", 1.0, 1.0),
            bad,
            sample_run("a", 2.0, 1.0),
        ])
        .unwrap();
        assert_eq!(
            m.total.stats.errors, 1,
            "a failed repeat must not be hidden"
        );
        assert!(RunReport::median_of(vec![]).is_none());
        let one = RunReport::median_of(vec![sample_run("a", 5.0, 1.0)]).unwrap();
        assert!(one.repeat_iops.is_empty());
    }
}
