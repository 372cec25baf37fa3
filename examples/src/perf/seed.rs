//! `mcqio-perf seed mcq`: the shape of the UFS MCQ table that motivated
//! mcqio (a phone SoC, fio 4 KiB: 8-job random write rose from about 98k to
//! 149k IOPS with MCQ while one job did not change), rerun on a UFS device:
//! random read and random write, 4 KiB, 1 and 8 jobs (`--jobs`), each in MCQ mode and
//! in legacy single-doorbell mode, with IOPS min/max/avg over the
//! per-second samples, bandwidth and the job threads' CPU (usr/sys).
//!
//! Each row is an ordinary run of the perf tool ([`crate::run::run_device`])
//! on the device with `mcq=on` or `mcq=off`. In legacy mode the jobs share
//! the one 32-slot list behind a lock (see [`crate::target`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::interrupt::Interrupt;
use crate::report::LatOpts;
use crate::run::{DmaMode, PerfError, RunOpts};
use crate::spec::{parse_duration, DeviceSpec};
use crate::workload::{Distribution, Pattern};

/// `seed`: rerun a table from the literature that mcqio is built on.
#[derive(Debug, Args)]
pub struct SeedArgs {
    #[command(subcommand)]
    what: SeedCommand,
}

/// The tables `seed` knows.
// Parsed once per process: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum SeedCommand {
    /// UFS MCQ vs legacy single doorbell: randread/randwrite 4 KiB, 1 and 8 jobs
    Mcq(McqArgs),
    /// UFS HPB off vs on: 4 KiB random read IOPS over IO ranges of 1 to 32 GiB (modelled)
    Hpb(crate::seed_hpb::HpbArgs),
}

/// `seed mcq`.
#[derive(Debug, Args)]
pub struct McqArgs {
    /// The UFS device (`--help` text in `help`).
    #[arg(
        short = 'd',
        long,
        default_value = DEFAULT_DEVICE,
        value_parser = device,
        help = "A UFS device: fake-ufs[,options], fake-ufs:null or vfio:<BDF> (the mode option mcq= is set per row)"
    )]
    device: DeviceSpec,
    /// Measured time per row (8 rows): seconds or with a unit
    #[arg(short = 't', long = "time", default_value = "2", value_parser = duration)]
    time: Duration,
    /// Queue depth per job
    #[arg(short = 'q', long = "qd", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=256))]
    depth: u32,
    /// The job counts to compare, smaller first (the seed's: 1 and 8). A
    /// controller with fewer MCQ queues than the larger count (QEMU's UFS
    /// with mcq-maxq=4) needs a smaller one: one queue pair per job.
    #[arg(short = 'j', long = "jobs", default_value = "1,8", value_parser = job_counts)]
    jobs: JobCounts,
    /// Print one JSON document instead of the table
    #[arg(long)]
    json: bool,
    /// Draw IOPS (avg) per mode and workload over the job counts into an SVG file
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

/// The default device: the fake UFS with its flash cost model in wall
/// time — 48 NAND units, tR = tPROG = 200 µs (a device ceiling of 240k
/// IOPS) — so the rows are bound by the device, as on the phone, not by
/// this machine's host CPU; `sync=1` runs the device's work on the polling
/// job threads, so a busy-polling job never starves a device thread of a
/// core. 48 units against the legacy list's 32 slots is the choice that
/// sets the 8-job gain (48/32 = 1.5, the seed's 98k → 149k).
const DEFAULT_DEVICE: &str = "fake-ufs:null,size=1G,tr=200us,tprog=200us,dies=48,sync=1";

fn device(s: &str) -> Result<DeviceSpec, String> {
    s.parse::<DeviceSpec>().map_err(|e| e.to_string())
}

/// Two job counts, smaller first.
#[derive(Debug, Clone, Copy)]
struct JobCounts([usize; 2]);

fn job_counts(s: &str) -> Result<JobCounts, String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|e| format!("`{p}`: {e}")))
        .collect::<Result<_, _>>()?;
    match v[..] {
        [a, b] if a >= 1 && a < b && b <= 256 => Ok(JobCounts([a, b])),
        _ => Err("two job counts, smaller first, between 1 and 256 (as 1,8)".into()),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Ok(d) if d.is_zero() => Err("-t 0 measures nothing".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// One row of the table (and of the JSON `rows` array).
#[derive(Debug, Clone, Serialize)]
pub struct SeedRow {
    /// `randread` or `randwrite`.
    pub workload: String,
    /// Jobs (threads, one queue each in MCQ mode).
    pub jobs: usize,
    /// `mcq` or `legacy`.
    pub mode: String,
    /// Lowest per-second IOPS (the run's average when it had no full second).
    pub iops_min: f64,
    /// Highest per-second IOPS.
    pub iops_max: f64,
    /// Mean of the per-second IOPS.
    pub iops_avg: f64,
    /// Bandwidth, MiB/s.
    pub mib_s: f64,
    /// Job threads' user CPU, percent of one core per job.
    pub cpu_usr_pct: f64,
    /// Job threads' system CPU, percent of one core per job.
    pub cpu_sys_pct: f64,
    /// A signal cut this row short: its figures cover less than `time_s`.
    pub partial: bool,
}

/// The whole `seed mcq` document.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    /// The device as given.
    pub device: String,
    /// I/O size in bytes (4096).
    pub io_size: u64,
    /// Queue depth per job.
    pub queue_depth: usize,
    /// Measured seconds per row.
    pub time_s: f64,
    /// The rows: workload x jobs x mode.
    pub rows: Vec<SeedRow>,
    /// Remarks (shared cores, the legacy lock, the device).
    pub notes: Vec<String>,
    /// Stopped by SIGINT/SIGTERM: `rows` is the part of the table that ran.
    pub interrupted: bool,
}

/// Run `seed`.
pub fn run(a: &SeedArgs) -> ExitCode {
    let m = match &a.what {
        SeedCommand::Mcq(m) => m,
        SeedCommand::Hpb(h) => return crate::seed_hpb::run(h),
    };
    match mcq(m) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcqio-perf: error: {e}");
            ExitCode::from(2)
        }
    }
}

const WORKLOADS: [Pattern; 2] = [Pattern::Randread, Pattern::Randwrite];

fn mcq(a: &McqArgs) -> Result<ExitCode, PerfError> {
    crate::output::claim_plot(a.plot.as_deref()).map_err(PerfError::Usage)?;
    if !a.device.is_ufs(&mcqio_vfio::SysRoots::default()) {
        return Err(PerfError::Usage(format!(
            "seed mcq compares UFS MCQ with the legacy single doorbell: `{}` is not a UFS device (use fake-ufs, fake-ufs:null or vfio:<BDF> of a UFS host controller)",
            a.device.label()
        )));
    }
    let usable: Vec<usize> = core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n).collect()
        });
    let ncpu = usable.len().max(1);
    let mut notes = Vec::new();
    let jobs_list = a.jobs.0;
    if jobs_list.iter().any(|&j| j > ncpu) {
        eprintln!(
            "mcqio-perf: warning: {} busy-polling jobs on {ncpu} CPU(s) (as with --force): \
             they share cores, so the numbers include the scheduler's time slicing",
            jobs_list[1]
        );
        notes.push(format!(
            "this process has {ncpu} CPU(s): the {}-job rows busy-poll on shared cores (unpinned), \
             so they include the scheduler's time slicing",
            jobs_list[1]
        ));
    }
    let clock = crate::clock::Clock::new();
    let interrupt = Interrupt::install().map_err(PerfError::Usage)?;
    let mut rows = Vec::new();
    'rows: for pattern in WORKLOADS {
        for jobs in jobs_list {
            for mcq in [false, true] {
                if interrupt.signal().is_some() {
                    break 'rows;
                }
                let mut spec = a.device.clone();
                spec.opts.mcq = Some(mcq);
                let o = RunOpts {
                    pattern,
                    mix: 70,
                    io_size: 4096,
                    depth: a.depth as usize,
                    io_queue_size: None,
                    wait: mcqio::WaitPolicy::Poll,
                    poll_pause: crate::run::PollPause::Auto,
                    jobs,
                    cpus: if jobs <= ncpu {
                        usable[..jobs].to_vec()
                    } else {
                        Vec::new()
                    },
                    time: Some(a.time),
                    ios: None,
                    warmup: Duration::ZERO,
                    verify: false,
                    histogram: false,
                    dma: DmaMode::Premapped,
                    dma_batch: None,
                    seed: 0x5eed_0c0f_fee0,
                    progress: false,
                    interrupt: interrupt.flag(),
                    distribution: Distribution::Uniform,
                    offset: 0,
                    size: None,
                    nsids: None,
                    rate_iops: None,
                    bytes: None,
                    hpb: None,
                    lat: LatOpts::default(),
                };
                let r = crate::run::run_device(&spec, &o, clock.clone())?;
                for n in &r.notes {
                    if n.starts_with("legacy single-doorbell mode") && !notes.contains(n) {
                        notes.push(n.clone());
                    }
                }
                let t = &r.total.stats;
                if t.errors > 0 {
                    return Err(PerfError::Device(format!(
                        "{}: {} I/O(s) failed in the {} {}-job {} row",
                        spec.label(),
                        t.errors,
                        pattern.name(),
                        jobs,
                        if mcq { "MCQ" } else { "legacy" }
                    )));
                }
                rows.push(SeedRow {
                    workload: pattern.name().to_string(),
                    jobs,
                    mode: if mcq { "mcq" } else { "legacy" }.into(),
                    iops_min: t.iops_min,
                    iops_max: t.iops_max,
                    iops_avg: t.iops_avg,
                    mib_s: t.mib_s.unwrap_or(0.0),
                    cpu_usr_pct: t.cpu_usr_pct,
                    cpu_sys_pct: t.cpu_sys_pct,
                    partial: r.interrupted,
                });
            }
        }
    }
    if let Some(tr) = a.device.opts.nand_read {
        let units = a.device.opts.nand_units.unwrap_or(4);
        notes.push(format!(
            "the fake's cost model bounds the rows: {units} NAND units at tR {} us cap the device at {:.0}k IOPS; \
             the legacy list holds at most 32 commands (32 / tR = {:.0}k IOPS), so one job at QD {} gets the same \
             from both modes, while {} MCQ queues keep enough in flight to reach the device's cap",
            tr.as_micros(),
            f64::from(units) / tr.as_secs_f64() / 1e3,
            32.0 / tr.as_secs_f64() / 1e3,
            a.depth,
            jobs_list[1]
        ));
    }
    notes.push(
        "seed (UFS 4.0 on a phone SoC, fio 4 KiB): randwrite with 8 jobs rose from about 98k to 149k IOPS with MCQ; 1 job did not change"
            .into(),
    );
    let report = SeedReport {
        device: a.device.raw.clone(),
        io_size: 4096,
        queue_depth: a.depth as usize,
        time_s: a.time.as_secs_f64(),
        rows,
        notes,
        interrupted: interrupt.signal().is_some(),
    };
    if let Some(what) = interrupt.name() {
        eprintln!(
            "mcqio-perf: interrupted by {what}; printing the {} of {} rows that ran",
            report.rows.len(),
            WORKLOADS.len() * jobs_list.len() * 2
        );
    }
    if let Some(path) = &a.plot {
        // Grouped bars: one group per workload and job count, a bar per
        // mode (lines would join jobs=1 to jobs=8 as if they were a series).
        let groups: Vec<crate::plot::BarGroup> = WORKLOADS
            .iter()
            .flat_map(|w| jobs_list.map(|j| (w.name(), j)))
            .map(|(w, j)| {
                let v = ["legacy", "mcq"]
                    .iter()
                    .map(|m| {
                        report
                            .rows
                            .iter()
                            .find(|r| r.workload == w && r.jobs == j && r.mode == *m)
                            .map_or(0.0, |r| r.iops_avg)
                    })
                    .collect();
                (format!("{w}, {j} job(s)"), v)
            })
            .collect();
        crate::plot::bar_chart(
            path,
            &format!(
                "UFS MCQ vs legacy single doorbell: 4 KiB random, QD {} per job, on {}",
                a.depth,
                a.device.label()
            ),
            "IOPS (avg of per-second samples)",
            &["legacy single doorbell", "MCQ"],
            &groups,
        )
        .map_err(|e| PerfError::Output {
            path: path.clone(),
            msg: e.to_string(),
        })?;
    }
    if a.json {
        let doc = serde_json::to_string_pretty(&report).expect("reports serialize");
        println!("{doc}");
    } else {
        print!("{}", table(&report));
    }
    Ok(interrupt.exit_code().unwrap_or(ExitCode::SUCCESS))
}

/// The table: a row per workload, jobs and mode, then MCQ / legacy ratios.
fn table(r: &SeedReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "UFS MCQ vs legacy single doorbell on {} ({} B random I/O, QD {} per job, {:.1} s per row)",
        r.device, r.io_size, r.queue_depth, r.time_s
    );
    let _ = writeln!(
        out,
        "{:<10} {:>4} {:<7} {:>10} {:>10} {:>10} {:>9} {:>7} {:>7}",
        "workload", "jobs", "mode", "IOPS min", "IOPS max", "IOPS avg", "MiB/s", "usr%", "sys%"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:<10} {:>4} {:<7} {:>10.0} {:>10.0} {:>10.0} {:>9.1} {:>7.1} {:>7.1}{}",
            row.workload,
            row.jobs,
            row.mode,
            row.iops_min,
            row.iops_max,
            row.iops_avg,
            row.mib_s,
            row.cpu_usr_pct,
            row.cpu_sys_pct,
            if row.partial {
                "  (partial: interrupted)"
            } else {
                ""
            }
        );
    }
    if r.interrupted {
        let _ = writeln!(
            out,
            "interrupted: the table stops after the rows above (a partial row covers less than {:.1} s)",
            r.time_s
        );
    }
    let _ = writeln!(out);
    for pair in r.rows.chunks(2) {
        if let [l, m] = pair {
            if l.iops_avg > 0.0 {
                let _ = writeln!(
                    out,
                    "{} {} job(s): MCQ / legacy = {:.2}x",
                    m.workload,
                    m.jobs,
                    m.iops_avg / l.iops_avg
                );
            }
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    out
}
