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

mod compare;
mod latency;
mod table;
/// A byte count as people write it: `64 MiB`, `4 KiB`, `1000 B` (exact
/// binary units only, so nothing is rounded away).
pub fn bytes_text(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// `n` things, singular or plural: `1 namespace`, `4 namespaces`.
pub fn count_of(n: usize, thing: &str) -> String {
    format!("{n} {thing}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use compare::{CompareReport, Ratio};
pub use latency::{LatOpts, LatUs, Percentile, PERCENTILES};

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
    /// Whether anything failed (I/O errors or verification mismatches).
    pub fn failed(&self) -> bool {
        self.total.stats.errors > 0 || self.total.stats.verify_mismatches > 0
    }
}
