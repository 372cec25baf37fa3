//! Results: the JSON document (`--json`) and the spdk_nvme_perf-style table.
//!
//! # JSON shape
//!
//! A single run prints one [`RunReport`]:
//!
//! ```text
//! { "device": "fake:null", "backend": "...", "workload": {...},
//!   "jobs": [ {job (the row: one per job thread and namespace it drives), device, core, nsid, ios, iops, iops_min, iops_max, iops_avg,
//!              mib_s, errors, verify_mismatches, cpu_usr_pct, cpu_sys_pct,
//!              lat_us: {avg, min, max, p50, p90, p99, p99_9, p99_99}, ...}, ... ],
//!   "total": { the same fields summed/merged, plus cpu_ns_per_io, cycles_per_io },
//!   "dma": {mode, maps, unmapped_ranges, unmap_calls, invalidations, mapped_bytes} | null,
//!   "verify": {blocks_checked, mismatches, prefill_blocks} | null,
//!   "hpb": [ {lun, control, hpb_reads, normal_reads, map_loads, stale_fallbacks,
//!             evictions, host_map_bytes, host_map_bytes_peak, memory_budget} ] (with --hpb),
//!   "failures": ["first failures, described"], "notes": [...], "clock": {...} }
//! ```
//!
//! plus `"interrupted": bool` (stopped by SIGINT/SIGTERM) and `"compare"`:
//! `null` for a single run; with `--compare` the same document for the
//! `--device` run, with `"compare": { "run": RunReport, "ratio": {iops,
//! mib_s, lat_avg, lat_p99, cpu_ns_per_io} }` where every ratio is this run /
//! the other (IOPS 1.5 = this run is 1.5× faster; lat_avg 0.5 = half the
//! latency). `mib_s` and `nsid` are `null` for `uring:null`, which moves no
//! data and has no namespace.
//!
//! Every row (job or total) also has `read` and `write`: `{ios, iops, mib_s,
//! lat_us}` of that direction alone, `null` when it had no I/Os (fio's
//! split of a mixed workload). `lat_us.percentiles` is the `--percentiles`
//! list as `[{p, us}]`; `lat_us.buckets` (with `-LL` or `--plot`) the
//! histogram as `[{lo_us, hi_us, count, cumulative_pct}]` in power-of-two
//! buckets. `time_series` has one entry per second of the measured phase:
//! `{t_s, iops, mib_s, lat_us: [{p, us}]}` over all jobs.
//!
//! Percentiles are `null` unless a histogram was recorded (`-L` or `--json`).

use std::fmt::Write as _;

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

    fn percentiles(&self) -> Vec<(f64, Option<f64>)> {
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

/// One direction (reads or writes) of a mixed workload, as fio splits it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirStats {
    /// I/Os completed.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second; `null` for a device that moves no data.
    pub mib_s: Option<f64>,
    /// Latency of this direction.
    pub lat_us: LatUs,
}

/// One second of the measured phase (the JSON `time_series`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// End of the second, seconds since the measured phase began.
    pub t_s: f64,
    /// I/Os per second over it (all jobs).
    pub iops: f64,
    /// MiB per second; `null` for a device that moves no data.
    pub mib_s: Option<f64>,
    /// Latency percentiles of the I/Os completed in it (empty without a histogram).
    pub lat_us: Vec<Percentile>,
}

/// Throughput and latency of one job or of the total.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// I/Os completed in the measured phase.
    pub ios: u64,
    /// Reads among them.
    pub reads: u64,
    /// Writes among them.
    pub writes: u64,
    /// I/Os per second over the measured phase, from the completions the
    /// per-second samples counted (so it lies between `iops_min` and
    /// `iops_max`; `ios` is the job's own count and may differ by the
    /// I/Os that completed while it noticed the end).
    pub iops: f64,
    /// Smallest per-second sample (a tail under 0.25 s joins the last one).
    pub iops_min: f64,
    /// Largest per-second sample.
    pub iops_max: f64,
    /// Mean of the per-second samples.
    pub iops_avg: f64,
    /// Number of per-second samples.
    pub iops_samples: usize,
    /// MiB per second; `null` for a device that moves no data (`uring:null`).
    pub mib_s: Option<f64>,
    /// Failed I/Os.
    pub errors: u64,
    /// Reads that failed verification.
    pub verify_mismatches: u64,
    /// User CPU, percent of the job thread's wall time (total: mean over jobs).
    pub cpu_usr_pct: f64,
    /// System CPU, percent (as `cpu_usr_pct`).
    pub cpu_sys_pct: f64,
    /// Latency in microseconds.
    pub lat_us: LatUs,
    /// Length of the measured phase, seconds (total: the longest job).
    pub elapsed_s: f64,
    /// Reads alone; `null` when there were none.
    #[serde(default)]
    pub read: Option<DirStats>,
    /// Writes alone; `null` when there were none.
    #[serde(default)]
    pub write: Option<DirStats>,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    /// Job number.
    pub job: usize,
    /// Device label.
    pub device: String,
    /// Core the job was pinned to.
    pub core: Option<usize>,
    /// Namespace; `null` for a device without one (`uring:null`). On UFS
    /// the logical unit's LUN + 1 (`-N` counts from 1 on every device).
    pub nsid: Option<u32>,
    /// UFS: the logical unit (LUN) the job ran on; absent on other devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun: Option<u32>,
    /// The numbers.
    #[serde(flatten)]
    pub stats: Stats,
}

impl JobReport {
    /// What the job addressed, for rows: `ns1`, or `LU0` on UFS.
    pub fn unit(&self) -> Option<String> {
        match (self.lun, self.nsid) {
            (Some(l), _) => Some(format!("LU{l}")),
            (None, Some(ns)) => Some(format!("ns{ns}")),
            (None, None) => None,
        }
    }
}

/// The Total row plus whole-run costs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TotalReport {
    /// Sums and merges over jobs.
    #[serde(flatten)]
    pub stats: Stats,
    /// Job-thread CPU time (user + system) per I/O, ns.
    pub cpu_ns_per_io: f64,
    /// The same in TSC cycles (reference cycles at the TSC rate), when the TSC is the clock.
    pub cycles_per_io: Option<f64>,
    /// CPU of the whole process during the measured phase, percent of one
    /// core: job threads plus helpers such as the fake's device thread.
    pub process_cpu_pct: f64,
    /// The same (getrusage of the process, user + system) per I/O, ns.
    #[serde(default)]
    pub process_cpu_ns_per_io: f64,
    /// What the engine's queues did per I/O (`null` when no job ran on
    /// the engine, e.g. io_uring).
    #[serde(default)]
    pub per_io: Option<PerIoReport>,
}

/// The engine's register accesses and system-clock calls per I/O in the
/// measured phase, all jobs together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PerIoReport {
    /// Doorbell register stores per I/O.
    pub doorbell_writes: f64,
    /// Register loads per I/O.
    pub register_reads: f64,
    /// The engine's system-clock calls (its timeout clock) per I/O.
    pub engine_clock_calls: f64,
    /// System calls the wire made per I/O (NVMe/TCP: `sendmsg` and
    /// `recv`; 0 on the PCIe and UFS wires).
    #[serde(default)]
    pub wire_syscalls: f64,
    /// Sleeps on the queue's interrupt per I/O (`--wait irq|hybrid`).
    #[serde(default)]
    pub interrupt_sleeps: f64,
    /// Of those, the sleeps the interrupt ended, per I/O.
    #[serde(default)]
    pub interrupt_wakeups: f64,
}

/// The workload as run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    /// fio pattern name.
    pub pattern: String,
    /// Percentage of reads.
    pub read_pct: u8,
    /// Bytes per I/O.
    pub io_size: u64,
    /// Queue depth per job.
    pub queue_depth: usize,
    /// Jobs (threads).
    pub jobs: usize,
    /// Measured seconds asked for (`-t`), if time-bound.
    pub time_s: Option<f64>,
    /// I/Os per job asked for (`-n`), if count-bound.
    pub ios_per_job: Option<u64>,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Whether data was verified.
    pub verify: bool,
    /// DMA mode.
    pub dma: String,
    /// Seed of the LBA streams and tags.
    pub seed: u64,
    /// How random positions are spread (fio's `random_distribution`).
    #[serde(default)]
    pub distribution: String,
    /// Start of the region under test in each namespace, bytes.
    #[serde(default)]
    pub offset: u64,
    /// Size of the region under test in each namespace, bytes (`null`: to the end).
    #[serde(default)]
    pub size: Option<u64>,
    /// `--rate-iops` over all jobs.
    #[serde(default)]
    pub rate_iops: Option<u64>,
    /// `--wait`: `poll`, `irq`, `hybrid:SPIN`.
    #[serde(default)]
    pub wait: String,
    /// When polling jobs paused after an empty poll (`--poll-pause`
    /// resolved for this device): `always`, `busy` (more than one command
    /// in flight) or `never`.
    #[serde(default)]
    pub poll_pause: String,
    /// `--bytes`: total bytes to move.
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// IOMMU counters over the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DmaReport {
    /// DMA mode.
    pub mode: String,
    /// Map calls during the measured phase.
    pub maps: u64,
    /// Ranges unmapped during the measured phase.
    pub unmapped_ranges: u64,
    /// Unmap calls during the measured phase.
    pub unmap_calls: u64,
    /// IOTLB invalidations during the measured phase.
    pub invalidations: u64,
    /// Bytes mapped at the end of the measured phase.
    pub mapped_bytes: u64,
}

/// HPB counters of one LU over the whole run (warm-up included), with
/// `--hpb`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HpbReport {
    /// The LU.
    pub lun: u8,
    /// `host` or `device` control.
    pub control: String,
    /// Reads sent as HPB READ.
    pub hpb_reads: u64,
    /// Reads sent as normal READ.
    pub normal_reads: u64,
    /// Map loads (READ BUFFER) published.
    pub map_loads: u64,
    /// HPB READs the device served with its own lookup (it reported the
    /// entry stale or invalid).
    pub stale_fallbacks: u64,
    /// Regions evicted from the host map.
    pub evictions: u64,
    /// Host map memory allocated, bytes.
    pub host_map_bytes: u64,
    /// Most host map memory held at once, bytes.
    pub host_map_bytes_peak: u64,
    /// The budget, bytes.
    pub memory_budget: u64,
}

impl From<&mcqio::ufs::HpbStats> for HpbReport {
    fn from(s: &mcqio::ufs::HpbStats) -> Self {
        HpbReport {
            lun: s.lun,
            control: if s.host_control { "host" } else { "device" }.into(),
            hpb_reads: s.hpb_reads,
            normal_reads: s.normal_reads,
            map_loads: s.map_loads,
            stale_fallbacks: s.stale_fallbacks,
            evictions: s.evictions,
            host_map_bytes: s.host_map_bytes,
            host_map_bytes_peak: s.host_map_bytes_peak,
            memory_budget: s.memory_budget,
        }
    }
}

/// Verification summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Blocks whose contents were checked.
    pub blocks_checked: u64,
    /// Reads that did not match.
    pub mismatches: u64,
    /// Blocks written by the prefill before the run.
    pub prefill_blocks: u64,
}

/// The timer used for latency.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockReport {
    /// `tsc` or `instant`.
    pub source: String,
    /// Cost of one clock read, ns (measured at start-up).
    pub ns_per_call: f64,
    /// Ticks per second.
    pub ticks_per_sec: f64,
    /// Reads of this clock per I/O in the measured phase (all jobs).
    #[serde(default)]
    pub reads_per_io: f64,
    /// `--clock tsc` took the counter although the kernel's clocksource is
    /// another.
    #[serde(default)]
    pub forced: bool,
    /// The counter's rate over the measured phase against the system
    /// clock's, as a fraction (0.01: 1 % fast); `null` for `instant`.
    #[serde(default)]
    pub rate_error: Option<f64>,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The device spec.
    pub device: String,
    /// What is underneath (engine/backend description).
    pub backend: String,
    /// The workload.
    pub workload: WorkloadReport,
    /// Per-job rows.
    pub jobs: Vec<JobReport>,
    /// The Total row.
    pub total: TotalReport,
    /// IOMMU counters, for devices with an IOMMU.
    pub dma: Option<DmaReport>,
    /// HPB counters per LU, with `--hpb` (empty otherwise).
    #[serde(default)]
    pub hpb: Vec<HpbReport>,
    /// Verification summary, with `--verify`.
    pub verify: Option<VerifyReport>,
    /// The first failures (I/O errors, verify mismatches), described.
    pub failures: Vec<String>,
    /// Remarks (fallbacks taken, what a device measures).
    pub notes: Vec<String>,
    /// Reasons the figures may not be valid (a starved job or device
    /// thread, too few per-second samples); empty when there are none.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The latency clock.
    pub clock: ClockReport,
    /// With `--repeat N`: total IOPS of every repeat, in run order; the rest
    /// of the report is the median repeat (or the first one that failed).
    #[serde(default)]
    pub repeat_iops: Vec<f64>,
    /// The run was stopped by SIGINT/SIGTERM: the numbers cover the time
    /// measured until then.
    #[serde(default)]
    pub interrupted: bool,
    /// With `--compare`: the other device's run and the ratios; `null` for
    /// a single run. The document's shape is the same either way.
    #[serde(default)]
    pub compare: Option<Comparison>,
    /// One entry per second of the measured phase: IOPS, MiB/s and latency
    /// percentiles over that second (all jobs together).
    #[serde(default)]
    pub time_series: Vec<Second>,
}

/// The `--compare` part of a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The `--compare` device's run.
    pub run: Box<RunReport>,
    /// This run / the other.
    pub ratio: Ratio,
}

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

const RULE: &str = "========================================================================================================";

fn row(out: &mut String, name: &str, s: &Stats) {
    let _ = writeln!(
        out,
        "{name:<44}: {:>12.2} {:>10} {:>10.2} {:>10.2} {:>10.2}",
        s.iops,
        s.mib_s
            .map_or_else(|| "-".to_string(), |m| format!("{m:.2}")),
        s.lat_us.avg,
        s.lat_us.min,
        s.lat_us.max
    );
}

/// The `read`/`write` rows under a row of a mixed workload.
fn dir_rows(out: &mut String, s: &Stats) {
    if s.read.is_none() || s.write.is_none() {
        return;
    }
    for (name, d) in [("  read", &s.read), ("  write", &s.write)] {
        if let Some(d) = d {
            let _ = writeln!(
                out,
                "{name:<44}: {:>12.2} {:>10} {:>10.2} {:>10.2} {:>10.2}",
                d.iops,
                d.mib_s
                    .map_or_else(|| "-".to_string(), |m| format!("{m:.2}")),
                d.lat_us.avg,
                d.lat_us.min,
                d.lat_us.max
            );
        }
    }
}

impl RunReport {
    /// Whether anything failed (I/O errors or verification mismatches).
    pub fn failed(&self) -> bool {
        self.total.stats.errors > 0 || self.total.stats.verify_mismatches > 0
    }

    /// The human-readable table.
    pub fn table(&self, percentiles: bool) -> String {
        let mut out = String::new();
        let w = &self.workload;
        let bound = match (w.ios_per_job, w.time_s) {
            (Some(n), Some(t)) => format!("{n} I/Os per job or {t} s, whichever came first"),
            (Some(n), None) => format!("{n} I/Os per job"),
            (None, Some(t)) => format!("{t} s"),
            _ => String::new(),
        };
        // What was measured, not what was asked for (issue 29 item 9).
        let bound = if self.interrupted {
            format!(
                "interrupted after {:.2} s (asked: {bound})",
                self.total.stats.elapsed_s
            )
        } else {
            bound
        };
        let _ = writeln!(
            out,
            "{} ({}): {} {}B, read {}%, QD {} x {} job(s), {bound}{}{}",
            self.device,
            self.backend,
            w.pattern,
            w.io_size,
            w.read_pct,
            w.queue_depth,
            w.jobs,
            if w.warmup_s > 0.0 {
                format!(" after {} s warm-up", w.warmup_s)
            } else {
                String::new()
            },
            if w.verify { ", verify" } else { "" }
        );
        let _ = writeln!(out, "{RULE}");
        let _ = writeln!(
            out,
            "{:<44}  {:>12} {:>10} {:>32}",
            "", "", "", "Latency(us)"
        );
        let _ = writeln!(
            out,
            "{:<44}: {:>12} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        for j in &self.jobs {
            let core = j
                .core
                .map_or_else(|| "any core".to_string(), |c| format!("core {c}"));
            row(
                &mut out,
                &match j.unit() {
                    Some(u) => format!("{} {u} from {core}", j.device),
                    None => format!("{} from {core}", j.device),
                },
                &j.stats,
            );
            dir_rows(&mut out, &j.stats);
        }
        let _ = writeln!(out, "{RULE}");
        let t = &self.total.stats;
        row(&mut out, "Total", t);
        dir_rows(&mut out, t);
        let _ = writeln!(out);
        if t.iops_samples > 0 {
            let _ = writeln!(
                out,
                "IOPS per second: min {:.0}, max {:.0}, avg {:.0} ({} samples)",
                t.iops_min, t.iops_max, t.iops_avg, t.iops_samples
            );
        }
        let _ = write!(
            out,
            "CPU (job threads): usr {:.1}%, sys {:.1}%; {:.0} ns",
            t.cpu_usr_pct, t.cpu_sys_pct, self.total.cpu_ns_per_io
        );
        if let Some(c) = self.total.cycles_per_io {
            let _ = write!(out, " ({c:.0} TSC cycles)");
        }
        let _ = writeln!(out, " of CPU per I/O");
        let _ = writeln!(
            out,
            "CPU (whole process, incl. device threads): {:.1}% of one core; {:.0} ns per I/O",
            self.total.process_cpu_pct, self.total.process_cpu_ns_per_io
        );
        let _ = write!(out, "Per I/O:");
        if let Some(p) = &self.total.per_io {
            let _ = write!(
                out,
                " {:.3} doorbell writes, {:.3} register reads, {:.4} engine clock calls;",
                p.doorbell_writes, p.register_reads, p.engine_clock_calls
            );
            if p.wire_syscalls > 0.0 {
                let _ = write!(
                    out,
                    " {:.4} wire system calls (sendmsg + recv);",
                    p.wire_syscalls
                );
            }
            if p.interrupt_sleeps > 0.0 {
                let _ = write!(
                    out,
                    " {:.3} interrupt sleeps ({:.3} ended by the interrupt);",
                    p.interrupt_sleeps, p.interrupt_wakeups
                );
            }
        }
        let c = &self.clock;
        let _ = writeln!(
            out,
            " latency clock {}{} ({:.2} reads per I/O, {:.1} ns per read)",
            c.source,
            if c.forced {
                ", forced by --clock tsc"
            } else {
                ""
            },
            c.reads_per_io,
            c.ns_per_call
        );
        let _ = writeln!(
            out,
            "Errors: {} failed I/O(s), {} verify mismatch(es)",
            t.errors, t.verify_mismatches
        );
        if let Some(v) = &self.verify {
            let _ = writeln!(
                out,
                "Verify: {} blocks checked ({} prefilled)",
                v.blocks_checked, v.prefill_blocks
            );
        }
        if let Some(d) = &self.dma {
            let _ = writeln!(
                out,
                "DMA ({}): {} maps, {} unmap calls ({} ranges), {} invalidations during the run; {} bytes mapped",
                d.mode, d.maps, d.unmap_calls, d.unmapped_ranges, d.invalidations, d.mapped_bytes
            );
        }
        for h in &self.hpb {
            let _ = writeln!(
                out,
                "HPB LU{} ({} control): {} HPB reads, {} normal reads, {} map loads, {} device fallbacks, \
                 {} evictions; host map {} bytes (peak {}) of a {}-byte budget",
                h.lun,
                h.control,
                h.hpb_reads,
                h.normal_reads,
                h.map_loads,
                h.stale_fallbacks,
                h.evictions,
                h.host_map_bytes,
                h.host_map_bytes_peak,
                h.memory_budget
            );
        }
        if percentiles {
            let _ = writeln!(out);
            let mut rows: Vec<(String, &LatUs)> = Vec::new();
            if self.jobs.len() > 1 {
                for j in &self.jobs {
                    rows.push((
                        match j.unit() {
                            Some(u) => format!("job {} ({} {u})", j.job, j.device),
                            None => format!("job {} ({})", j.job, j.device),
                        },
                        &j.stats.lat_us,
                    ));
                }
            }
            rows.push(("Total".into(), &t.lat_us));
            if let (Some(r), Some(w)) = (&t.read, &t.write) {
                rows.push(("Total reads".into(), &r.lat_us));
                rows.push(("Total writes".into(), &w.lat_us));
            }
            for (name, l) in rows {
                let _ = writeln!(out, "Summary latency data for {name}:");
                for (p, v) in l.percentiles() {
                    match v {
                        Some(v) => {
                            let _ = writeln!(out, "  {p:>9.5}% : {v:>12.3}us");
                        }
                        None => {
                            let _ = writeln!(out, "  {p:>9.5}% : {:>12}", "n/a");
                        }
                    }
                }
                if !l.buckets.is_empty() {
                    let _ = writeln!(out, "Latency histogram for {name}:");
                    let _ = writeln!(
                        out,
                        "  {:>25}   {:>10}  {:>12}",
                        "Range in us", "Cumulative", "IO count"
                    );
                    for b in &l.buckets {
                        let _ = writeln!(
                            out,
                            "  {:>11.3} - {:>11.3}:   {:>9.4}%  ({:>10})",
                            b.lo_us, b.hi_us, b.cumulative_pct, b.count
                        );
                    }
                }
            }
        }
        for w in &self.warnings {
            let _ = writeln!(out, "WARNING: {w}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_run(device: &str, iops: f64, avg: f64) -> RunReport {
        let stats = Stats {
            ios: 1000,
            reads: 1000,
            iops,
            iops_min: iops,
            iops_max: iops,
            iops_avg: iops,
            iops_samples: 1,
            mib_s: Some(iops * 4096.0 / 1048576.0),
            lat_us: LatUs {
                avg,
                min: 0.5,
                max: 9.0,
                p50: Some(1.0),
                p90: Some(2.0),
                p99: Some(4.0),
                p99_9: Some(8.0),
                p99_99: Some(9.0),
                ..Default::default()
            },
            elapsed_s: 1.0,
            ..Default::default()
        };
        RunReport {
            device: device.into(),
            backend: "test".into(),
            workload: WorkloadReport {
                pattern: "randread".into(),
                read_pct: 100,
                io_size: 4096,
                queue_depth: 32,
                jobs: 1,
                time_s: Some(1.0),
                ios_per_job: None,
                warmup_s: 0.0,
                verify: false,
                dma: "premapped".into(),
                seed: 1,
                distribution: "uniform".into(),
                offset: 0,
                size: None,
                rate_iops: None,
                wait: "poll".into(),
                poll_pause: "always".into(),
                bytes: None,
            },
            jobs: vec![JobReport {
                job: 0,
                device: device.into(),
                core: Some(0),
                nsid: Some(1),
                lun: None,
                stats: stats.clone(),
            }],
            total: TotalReport {
                stats,
                cpu_ns_per_io: 100.0,
                cycles_per_io: Some(300.0),
                process_cpu_pct: 200.0,
                process_cpu_ns_per_io: 200.0,
                per_io: Some(PerIoReport {
                    doorbell_writes: 0.0625,
                    register_reads: 0.0,
                    engine_clock_calls: 0.001,
                    wire_syscalls: 0.0,
                    interrupt_sleeps: 0.0,
                    interrupt_wakeups: 0.0,
                }),
            },
            dma: None,
            hpb: Vec::new(),
            verify: None,
            failures: vec![],
            notes: vec![],
            clock: ClockReport {
                source: "tsc".into(),
                ns_per_call: 7.0,
                ticks_per_sec: 3e9,
                reads_per_io: 2.0,
                ..ClockReport::default()
            },
            repeat_iops: vec![],
            interrupted: false,
            warnings: vec![],
            compare: None,
            time_series: vec![],
        }
    }

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

    /// Issue 16 item 9: a chosen percentile list, and power-of-two buckets
    /// whose counts add up and whose cumulative share ends at 100 %.
    #[test]
    fn chosen_percentiles_and_buckets() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let o = LatOpts {
            percentiles: vec![25.0, 99.5],
            buckets: true,
        };
        let l = LatUs::with(1, 1, 10_000, 10_000, Some(&h), &o);
        let ps: Vec<f64> = l.percentiles.iter().map(|p| p.p).collect();
        assert_eq!(ps, vec![25.0, 99.5]);
        assert!(
            (l.percentiles[0].us - 2.5).abs() < 0.01,
            "{:?}",
            l.percentiles
        );
        assert!(
            (l.percentiles[1].us - 9.95).abs() < 0.02,
            "{:?}",
            l.percentiles
        );
        // Buckets (0,1] (1,2] (2,4] (4,8] (8,16] µs.
        let b = &l.buckets;
        assert_eq!(b.len(), 5, "{b:?}");
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 10_000);
        assert_eq!((b[0].hi_us, b[1].hi_us, b[4].hi_us), (1.0, 2.0, 16.0));
        assert!((b[0].cumulative_pct - 10.0).abs() < 0.1, "{b:?}");
        assert_eq!(b[4].cumulative_pct, 100.0);
        let t = {
            let mut r = sample_run("fake", 1.0, 1.0);
            r.total.stats.lat_us = l.clone();
            r.table(true)
        };
        assert!(t.contains("99.50000%"), "{t}");
        assert!(t.contains("Range in us"), "{t}");
        assert!(!LatUs::with(1, 1, 1, 1, Some(&h), &LatOpts::default())
            .percentiles
            .is_empty());
    }

    /// Issue 16 item 8: a mixed workload's rows split into read and write.
    #[test]
    fn mixed_rows_split_by_direction() {
        let mut r = sample_run("fake", 1000.0, 1.0);
        let d = DirStats {
            ios: 500,
            iops: 500.0,
            mib_s: Some(1.95),
            lat_us: LatUs::default(),
        };
        r.total.stats.read = Some(d.clone());
        r.total.stats.write = Some(DirStats { iops: 321.0, ..d });
        let t = r.table(false);
        assert!(t.contains("  read "), "{t}");
        assert!(t.contains("  write ") && t.contains("321.00"), "{t}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["total"]["write"]["iops"], 321.0);
        assert!(v["jobs"][0]["read"].is_null());
    }

    /// Issue 28: the text report says what the engine did per I/O at the
    /// device's registers and which latency clock was read how often, at
    /// what cost; the JSON carries the same fields.
    #[test]
    fn the_report_gives_register_accesses_and_clock_reads_per_io() {
        let r = sample_run("fake:null", 1e6, 2.0);
        let t = r.table(false);
        assert!(
            t.contains(
                "Per I/O: 0.062 doorbell writes, 0.000 register reads, 0.0010 engine clock calls; \
                 latency clock tsc (2.00 reads per I/O, 7.0 ns per read)"
            ),
            "{t}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["total"]["per_io"]["doorbell_writes"], 0.0625);
        assert_eq!(v["total"]["per_io"]["register_reads"], 0.0);
        assert_eq!(v["total"]["per_io"]["engine_clock_calls"], 0.001);
        assert_eq!(v["clock"]["reads_per_io"], 2.0);
        assert_eq!(v["clock"]["ns_per_call"], 7.0);
        // A run without engine queues (io_uring) still names its clock.
        let mut u = r.clone();
        u.total.per_io = None;
        let t = u.table(false);
        assert!(
            t.contains("Per I/O: latency clock tsc (2.00 reads per I/O, 7.0 ns per read)"),
            "{t}"
        );
    }

    #[test]
    fn json_roundtrip_has_required_fields() {
        let r = sample_run("fake:null", 1e6, 2.0);
        let s = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        for k in ["device", "workload", "jobs", "total"] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        for k in [
            "ios",
            "iops",
            "iops_min",
            "iops_max",
            "iops_avg",
            "mib_s",
            "errors",
            "cpu_usr_pct",
            "cpu_sys_pct",
        ] {
            assert!(
                v["total"].get(k).is_some_and(|x| x.is_number()),
                "total.{k}"
            );
            assert!(
                v["jobs"][0].get(k).is_some_and(|x| x.is_number()),
                "jobs[0].{k}"
            );
        }
        for k in ["avg", "min", "max", "p50", "p90", "p99", "p99_9", "p99_99"] {
            assert!(
                v["total"]["lat_us"].get(k).is_some_and(|x| x.is_number()),
                "lat_us.{k}"
            );
        }
        let back: RunReport = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
    }

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
        // Issue 16 item 7: one JSON shape for single and compared runs.
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

    #[test]
    fn table_has_rows() {
        let mut r = sample_run("uring:null", 1234.5, 2.0);
        r.total.stats.errors = 2;
        let t = r.table(true);
        assert!(t.contains("uring:null ns1 from core 0"));
        assert!(t.contains("Total"));
        assert!(t.contains("1234.50"));
        assert!(t.contains("99.99000%"));
        assert!(t.contains("2 failed I/O(s)"));
        assert!(r.failed());
    }
}
