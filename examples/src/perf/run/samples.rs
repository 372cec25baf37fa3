//! The per-second samples: the stretches of the measured phase the run
//! controller counts, and the time series built from them and the jobs'
//! histogram snapshots.

use hdrhistogram::Histogram;

use crate::job::{self, JobResult};
use crate::report::{Percentile, Second};

use super::RunOpts;

/// A tail shorter than this (a run that ended just after a whole second)
/// joins the previous per-second sample instead of being one.
pub(super) const MIN_SAMPLE_S: f64 = 0.25;

/// One stretch of the measured phase, as the run controller counted it:
/// each is one per-second IOPS sample.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Interval {
    /// Its end, seconds since the measured phase began.
    pub(super) end_s: f64,
    /// Its length in seconds.
    pub(super) dt: f64,
    /// Completions per job in it.
    pub(super) counts: Vec<u64>,
}

impl Interval {
    /// Lengthen by a tail of `dt` seconds ending at `end_s`.
    pub(super) fn extend(&mut self, end_s: f64, dt: f64, counts: &[u64]) {
        self.end_s = end_s;
        self.dt += dt;
        for (c, d) in self.counts.iter_mut().zip(counts) {
            *c += d;
        }
    }

    /// Completions per second over all jobs.
    pub(super) fn rate(&self) -> f64 {
        self.counts.iter().sum::<u64>() as f64 / self.dt
    }
}

/// The per-second series: IOPS from the controller's samples, latency
/// percentiles from the difference of the jobs' cumulative snapshots.
pub(super) fn time_series(
    results: &[JobResult],
    total: &[f64],
    t: &[f64],
    o: &RunOpts,
    moves_data: bool,
) -> Vec<Second> {
    let mut out = Vec::with_capacity(total.len());
    for (k, (&iops, &t_s)) in total.iter().zip(t).enumerate() {
        let tick = k as u32 + 1;
        // The jobs' latencies of this second (a job that saw a later tick
        // first counts them there).
        let mut sec: Option<Histogram<u64>> = None;
        for r in results {
            for (_, sparse) in r.snapshots.iter().filter(|(k, _)| *k == tick) {
                let h = sec.get_or_insert_with(job::new_histogram);
                for &(v, c) in sparse {
                    h.saturating_record_n(v.max(1), c);
                }
            }
        }
        let lat_us = sec
            .filter(|h| !h.is_empty())
            .map(|h| {
                o.lat
                    .percentiles
                    .iter()
                    .map(|&p| Percentile {
                        p,
                        us: h.value_at_quantile(p / 100.0) as f64 / 1000.0,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Second {
            t_s,
            iops,
            mib_s: moves_data.then(|| iops * o.io_size as f64 / (1u64 << 20) as f64),
            lat_us,
        });
    }
    out
}
