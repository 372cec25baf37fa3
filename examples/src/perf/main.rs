//! `mcqio-perf`: the mcqio perf tool, in the spirit of `spdk_nvme_perf` and
//! fio's `t/io_uring`.
//!
//! It runs a workload on one device — the in-process fake controller by
//! default, a real controller through VFIO, or the kernel's io_uring path as
//! a baseline — with one pinned thread and one queue per job, and prints an
//! spdk_nvme_perf-style table (or JSON with `--json`). `--compare <spec>`
//! runs the same workload on a second device and prints the ratios.
//!
//! ```text
//! mcqio-perf                                      # 3 s randread 4 KiB QD32 on the fake
//! mcqio-perf -d fake:null -q 128 --compare uring:null
//! mcqio-perf -d uring:/tmp/f,size=256M -w randrw -M 70 -L --json
//! mcqio-perf -d fake,corrupt=0.001 --verify -w randrw   # exits 1, names the bad LBAs
//! mcqio-perf -w randrw -M 70 --random-distribution zipf:1.2 --percentiles 50,99,99.9 -LL
//! mcqio-perf -d fake,ns=2 -d fake:null -j 2 --rate-iops 10000 --bytes 1G --json --output r.json
//! mcqio-perf -t 10 --plot run.svg                      # IOPS over time + latency distribution
//! ```
//!
//! Set-up subcommands: `mcqio-perf devices`, `bind <BDF>`, `unbind <BDF>`,
//! `doctor [<BDF>]`, and `dma-bench` (the DMA modes' map/unmap table; see
//! `mcqio-perf help <command>`).
//!
//! Exit status: 0 on success, 1 when an I/O failed or verification found a
//! mismatch (the first failures are printed), 2 on usage or set-up errors,
//! 128 + N when signal N (SIGINT, SIGTERM) stopped the run: it then drains
//! the I/O in flight and prints the report for the time measured.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod clock;
mod corelat;
mod dmabench;
mod error;
mod interrupt;
mod job;
mod minimal;
mod output;
mod plot;
mod progress;
mod queue;
mod report;
mod run;
mod sched;
mod seed;
mod seed_hpb;
mod setup;
mod slots;
mod spec;
mod target;
mod uring;
mod verify;
mod workload;

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser};

use crate::interrupt::Interrupt;
use crate::report::CompareReport;
use crate::report::LatOpts;
use crate::run::{DmaMode, PerfError, RunOpts};
use crate::spec::{parse_cpus, parse_duration, parse_size, DeviceKind, DeviceSpec};
use crate::target::MAX_DEPTH;
use crate::workload::{Distribution, Pattern};

/// A percentile list (`50,99,99.9`).
#[derive(Debug, Clone)]
struct Percentiles(Vec<f64>);

fn percentile_list(s: &str) -> Result<Percentiles, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let p: f64 = part
            .trim()
            .parse()
            .map_err(|_| format!("`{part}` is not a percentile"))?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!("percentile {p} is outside (0, 100]"));
        }
        v.push(p);
    }
    Ok(Percentiles(v))
}

/// A namespace list (`1,2`, `1-3`).
#[derive(Debug, Clone)]
struct NsidList(Vec<u32>);

fn nsid_list(s: &str) -> Result<NsidList, String> {
    let ids = parse_cpus(s).map_err(|e| e.to_string().replace("CPU", "namespace"))?;
    ids.into_iter()
        .map(|i| match u32::try_from(i) {
            Ok(0) | Err(_) => Err(format!("namespace {i} does not exist (NSIDs start at 1)")),
            Ok(n) => Ok(n),
        })
        .collect::<Result<_, _>>()
        .map(NsidList)
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn nonzero_size(s: &str) -> Result<u64, String> {
    match size_arg(s)? {
        0 => Err("0 bytes moves nothing; give a size such as 1M or 4G".into()),
        n => Ok(n),
    }
}

/// A CPU list (`0-3,6`).
#[derive(Debug, Clone)]
struct CpuList(Vec<usize>);

fn cpu_list(s: &str) -> Result<CpuList, String> {
    let t = s.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        // spdk_nvme_perf's -c: bit i set = core i.
        let mask = u128::from_str_radix(hex, 16)
            .map_err(|_| format!("`{s}`: a core mask is hex, e.g. 0x3 for cores 0 and 1"))?;
        if mask == 0 {
            return Err(format!("`{s}`: the mask selects no core"));
        }
        return Ok(CpuList((0..128).filter(|&c| mask >> c & 1 == 1).collect()));
    }
    parse_cpus(s).map(CpuList).map_err(|e| e.to_string())
}

fn wait_policy(s: &str) -> Result<mcqio::WaitPolicy, String> {
    s.parse()
}

fn rate(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("0 I/Os per second runs nothing; leave --rate-iops out for no limit".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "`{s}`: a whole number of I/Os per second over all jobs, e.g. 10000"
        )),
    }
}

/// fio's and spdk_nvme_perf's spellings clap would match to the wrong flag
/// (`--output-format` to `--output`, `--direct` to `--quiet`), with what
/// to use here.
const FOREIGN_FLAGS: &[(&str, &str)] = &[
    ("--output-format", "fio's; use --json (or nothing, for the table)"),
    (
        "--direct",
        "fio's; mcqio-perf's I/O is always direct (the engine moves DMA buffers, no page cache), and uring:<path> opens with O_DIRECT where it may (direct=0 in the device string turns it off)",
    ),
    ("--bs", "fio's; use -o/--io-size (4k, 128k)"),
    ("--iodepth", "fio's; use -q/--qd"),
    ("--numjobs", "fio's; use -j/--jobs"),
    ("--runtime", "fio's; use -t/--time"),
    (
        "--filename",
        "fio's; name the device with -d (uring:/dev/nvme0n1, uring:<file>, vfio:<BDF>)",
    ),
    (
        "-r",
        "spdk_nvme_perf's transport ID; name the device with -d (vfio:<BDF> for trtype:PCIe traddr:<BDF>, tcp:<addr>:<port>/<subnqn> for trtype:TCP)",
    ),
];

/// The message for a foreign flag among `args`, if there is one.
fn foreign_flag(args: &[std::ffi::OsString]) -> Option<String> {
    args.iter().skip(1).find_map(|a| {
        let a = a.to_str()?;
        let name = a.split('=').next()?;
        // `-r'trtype:PCIe ...'` written without a space.
        let name = if name.starts_with("-r") && !name.starts_with("--") {
            "-r"
        } else {
            name
        };
        FOREIGN_FLAGS
            .iter()
            .find(|(f, _)| *f == name)
            .map(|(f, why)| format!("`{a}`: {f} is {why}"))
    })
}

fn device(s: &str) -> Result<DeviceSpec, String> {
    s.parse::<DeviceSpec>().map_err(|e| e.to_string())
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn io_size(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("an I/O moves at least one logical block (e.g. 512, 4k)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "mcqio-perf",
    version,
    about = "Measure NVMe and UFS I/O through mcqio (fake, VFIO) or the kernel's io_uring",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<setup::Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[arg(
        short = 'd',
        long,
        default_value = "fake",
        action = clap::ArgAction::Append,
        value_parser = device,
        help = "Device: fake[,lbs=,lbads=,ns=,size=,corrupt=,error=,latency=,qpairs=,core=,sync=], fake:null, \
                fake-ufs[,mcq=on|off,queues=,lus=,size=,latency=,core=,sync=,tr=,tprog=,dies=], fake-ufs:null, \
                vfio:<BDF>[,qpairs=,mcq=,shadow=] (NVMe or UFS), uring:<path>[,size=,lbs=,lbads=,direct=], uring:null, \
                tcp:<addr>:<port>/<subsystem NQN>[,hdgst,ddgst,qpairs=,kato=] (NVMe/TCP) \
                (lbs= in bytes, lbads= as NVMe's log2; default fake: 1 namespace of 64 MiB, 512 B blocks). \
                Repeat -d to run several devices at once: job i runs on device i mod N"
    )]
    device: Vec<DeviceSpec>,
    /// Access pattern
    #[arg(short = 'w', long = "rw", value_enum, default_value = "randread")]
    pattern: Pattern,
    /// Read percentage for rw/randrw [default: 70]
    #[arg(short = 'M', long = "rwmixread", value_parser = clap::value_parser!(u8).range(0..=100))]
    mix: Option<u8>,
    /// I/O size (4k, 128k, bytes)
    #[arg(short = 'o', long = "io-size", default_value = "4k", value_parser = io_size)]
    io_size: u64,
    /// Queue depth per job: 1 to 4096 here (the engine's limit); a device may
    /// offer fewer slots per queue pair (the fake UFS: 255 with MCQ, 32 on
    /// the legacy single-doorbell list), and the run then says so
    #[arg(short = 'q', long = "qd", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=MAX_DEPTH as i64))]
    depth: u32,
    /// NVMe I/O queue entries per queue pair (SQ and CQ); default: the queue
    /// depth plus the CQ head batch, so the controller never finds a CQ
    /// full. depth + 1 ..= CAP.MQES + 1; NVMe (fake, vfio) only
    #[arg(short = 'i', long = "io-queue-size", value_parser = clap::value_parser!(u16).range(2..))]
    io_queue_size: Option<u16>,
    /// Jobs: threads, each pinned to a core with its own queue pair / ring
    #[arg(short = 'j', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    jobs: u32,
    /// Cores for the jobs (job i on the i-th listed core), e.g. 0,1 or 0-3,
    /// or spdk_nvme_perf's hex core mask (-c 0x3)
    #[arg(short = 'c', long, value_parser = cpu_list)]
    cpus: Option<CpuList>,
    /// Time to measure: seconds or with a unit (3, 1s, 500ms, 2m) [default: 3 s
    /// without -n]; with -n the run ends at whichever comes first
    #[arg(short = 't', long = "time", value_parser = duration)]
    time: Option<Duration>,
    /// I/Os per job to complete (with -t: whichever comes first)
    #[arg(short = 'n', long = "ios", value_parser = clap::value_parser!(u64).range(1..))]
    ios: Option<u64>,
    /// Warm-up before measuring: seconds or with a unit (2, 500ms)
    #[arg(long, default_value = "0", value_parser = duration)]
    warmup: Duration,
    /// DMA buffer mode
    #[arg(long, value_enum, default_value = "premapped")]
    dma: DmaMode,
    /// Lazy-unmap batch size (with --dma lazy)
    #[arg(long = "dma-batch")]
    dma_batch: Option<u32>,
    /// Write LBA/seed/generation tags and check every read
    #[arg(long)]
    verify: bool,
    /// Print latency percentiles (-L; the list is --percentiles) and with
    /// -LL also the latency histogram in power-of-two buckets
    #[arg(short = 'L', long = "latency", action = clap::ArgAction::Count)]
    latency: u8,
    /// Latency percentiles to report, e.g. 50,99,99.9 [default: 50,90,99,99.9,99.99]
    #[arg(long, value_parser = percentile_list)]
    percentiles: Option<Percentiles>,
    /// How random offsets are spread (fio's random_distribution): uniform,
    /// zipf:θ, pareto:h, normal:σ% (σ as a percentage of the region)
    #[arg(
        long = "random-distribution",
        alias = "random_distribution",
        default_value = "uniform"
    )]
    distribution: Distribution,
    /// Start of the region under test in each namespace (bytes, 4k, 1G)
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// Size of the region under test in each namespace [default: to the end]
    #[arg(long, visible_alias = "range", value_parser = size_arg)]
    size: Option<u64>,
    /// Namespaces to run on, e.g. 1,2 [default: all]. As spdk_nvme_perf:
    /// max(jobs, namespaces) rows, row r on job r mod jobs and namespace r
    /// mod namespaces; a job with several drives each on its own queue pair
    /// at the full -q, a namespace with several jobs is shared by them
    #[arg(short = 'N', long = "nsid", value_parser = nsid_list)]
    nsids: Option<NsidList>,
    /// Limit the I/O rate: I/Os per second over all jobs (a job that fell
    /// behind, descheduled or stalled, makes up to one second of it; the
    /// report gives the rate achieved and warns below 98%)
    #[arg(long = "rate-iops", value_parser = rate)]
    rate_iops: Option<u64>,
    /// How a job waits when a poll found nothing: `poll` spins (the
    /// default), `irq` sleeps on its queue's interrupt, `hybrid[:SPIN]`
    /// spins SPIN (default 50us) after the last completion, then sleeps.
    /// Without a rate limit, a job with nothing in flight spins in every
    /// mode; under one, `irq` and `hybrid` sleep until the next I/O's
    /// time. NVMe, UFS MCQ and tcp (it sleeps on the connection's socket;
    /// UFS legacy mode and io_uring poll)
    #[arg(long = "wait", value_name = "MODE", default_value = "poll", value_parser = wait_policy)]
    wait: mcqio::WaitPolicy,
    /// When a polling job executes a spin-wait hint (x86 PAUSE, arm
    /// YIELD) after a poll that found nothing: `always`, `busy` (with more
    /// than one command in flight: with one, the hint delays the next
    /// I/O's completion) or `never`; `auto` is `always` on the in-process
    /// fakes (their device thread writes the completion line the job
    /// polls) and `never` on `vfio:`, `tcp:` and `uring:` (as SPDK's,
    /// libvfn's and xNVMe's poll loops)
    #[arg(
        long = "poll-pause",
        value_name = "WHEN",
        value_enum,
        default_value = "auto"
    )]
    poll_pause: run::PollPause,
    /// The latency clock: `auto` reads the CPU counter (TSC, CNTVCT) where
    /// quanta or the kernel trusts it and the system clock otherwise (with
    /// a warning); `tsc` reads the counter even where the kernel's
    /// clocksource is another (a QEMU TCG guest's hpet: its clock_gettime
    /// costs microseconds), checking its rate against the system clock
    /// over the run; `system` always calls clock_gettime
    #[arg(
        long = "clock",
        value_name = "SOURCE",
        value_enum,
        default_value = "auto"
    )]
    clock: clock::ClockChoice,
    /// Move this many bytes in total and stop (size-based run; with -t:
    /// whichever comes first)
    #[arg(long, value_parser = nonzero_size, conflicts_with = "ios")]
    bytes: Option<u64>,
    /// Write the report (table or --json) to FILE instead of stdout
    #[arg(long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Draw IOPS over time and the latency distribution into an SVG file
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON document instead of the table
    #[arg(long)]
    json: bool,
    /// Run the same workload on a second device and print both plus the ratios
    #[arg(long, value_parser = device)]
    compare: Option<DeviceSpec>,
    /// Seed for LBA streams and verify tags (default: from the clock)
    #[arg(long)]
    seed: Option<u64>,
    /// Run each device this many times (alternating with --compare) and
    /// report the median run; guards comparisons against placement noise
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// No live progress line on stderr
    #[arg(long)]
    quiet: bool,
    /// UFS Host Performance Booster on the device's HPB LUs (fake-ufs: with
    /// the flash cost model, sparse LUs and the device's HPB in device
    /// control); its counters go into the report
    #[arg(long)]
    hpb: bool,
    /// Host map budget per LU for --hpb (bytes, k/M/G; 8 B per 4 KiB covered)
    #[arg(long = "hpb-budget", default_value = "64M", value_parser = size_arg, requires = "hpb")]
    hpb_budget: u64,
    /// Run more busy-polling jobs than this process has CPUs (they then
    /// share cores and measure the scheduler as much as the device)
    #[arg(long)]
    force: bool,
    /// The engine alone: one queue pair on the first device, reads kept at
    /// -q in flight until -n completed (default 1000000), nothing per I/O
    /// but read, submit, poll and a counter (no clock or statistics; random
    /// positions, or in order with -w read); prints one line. For telling
    /// engine cost from tool cost (callgrind, strace)
    #[arg(long)]
    minimal: bool,
}

/// Default measured time without -t and -n.
const DEFAULT_TIME: Duration = Duration::from_secs(3);

impl RunArgs {
    fn opts(&self, interrupt: Arc<AtomicBool>) -> Result<RunOpts, PerfError> {
        let jobs = self.jobs as usize;
        // The CPUs this process may run on (its affinity mask).
        let usable: Vec<usize> = core_affinity::get_core_ids()
            .map(|ids| ids.into_iter().map(|c| c.id).collect())
            .unwrap_or_else(|| {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n).collect()
            });
        let ncpu = usable.len().max(1);
        let cpus = match &self.cpus {
            Some(CpuList(c)) => {
                if c.len() < jobs {
                    return Err(PerfError::Usage(format!(
                        "--cpus lists {} core(s) for {jobs} job(s); list one core per job",
                        c.len()
                    )));
                }
                if let Some(bad) = c.iter().find(|id| !usable.contains(id)) {
                    return Err(PerfError::Usage(format!(
                        "--cpus: CPU {bad} is not available to this process (it may run on {})",
                        cpu_ranges(&usable)
                    )));
                }
                c.clone()
            }
            // Default: job i on core i, as long as there are cores.
            None if jobs <= ncpu => usable[..jobs].to_vec(),
            None => Vec::new(),
        };
        let polled = self.device.iter().chain(self.compare.as_ref()).any(|d| {
            matches!(
                d.kind,
                DeviceKind::Fake { .. }
                    | DeviceKind::FakeUfs { .. }
                    | DeviceKind::Vfio { .. }
                    | DeviceKind::Tcp { .. }
            )
        });
        if polled && jobs > ncpu && !self.force {
            return Err(PerfError::Usage(format!(
                "{jobs} jobs busy-poll but this process has {ncpu} CPU(s): jobs would share cores \
                 and measure the scheduler; use -j {ncpu} or less, or --force"
            )));
        }
        if polled && jobs > ncpu {
            eprintln!(
                "mcqio-perf: warning: {jobs} busy-polling jobs on {ncpu} CPU(s) (--force): \
                 they share cores, so the numbers include the scheduler's time slicing"
            );
        }
        if let Some(m) = self.mix {
            if !matches!(self.pattern, Pattern::Rw | Pattern::Randrw) {
                return Err(PerfError::Usage(format!(
                    "-M {m} sets the read share of a mixed workload, but -w {} is not mixed (use -w rw or -w randrw)",
                    self.pattern.name()
                )));
            }
        }
        if self.dma_batch.is_some() && self.dma != DmaMode::Lazy {
            return Err(PerfError::Usage(
                "--dma-batch applies to --dma lazy only".into(),
            ));
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        Ok(RunOpts {
            pattern: self.pattern,
            mix: self.mix.unwrap_or(70),
            io_size: self.io_size,
            depth: self.depth as usize,
            io_queue_size: self.io_queue_size,
            wait: self.wait,
            poll_pause: self.poll_pause,
            jobs,
            cpus,
            time: match (self.time, self.ios.or(self.bytes)) {
                (Some(t), _) => Some(t),
                (None, Some(_)) => None,
                (None, None) => Some(DEFAULT_TIME),
            },
            ios: self.ios,
            warmup: self.warmup,
            verify: self.verify,
            // JSON always carries percentiles; the table shows them with -L.
            histogram: self.latency > 0 || self.json || self.plot.is_some(),
            dma: self.dma,
            dma_batch: self.dma_batch.map(|b| b as usize),
            seed,
            progress: !self.quiet && !self.json,
            interrupt,
            distribution: self.distribution,
            offset: self.offset,
            size: self.size,
            nsids: self.nsids.as_ref().map(|n| n.0.clone()),
            rate_iops: self.rate_iops,
            bytes: self.bytes,
            hpb: self.hpb.then_some(self.hpb_budget),
            lat: LatOpts {
                percentiles: self
                    .percentiles
                    .as_ref()
                    .map_or_else(|| report::PERCENTILES.to_vec(), |p| p.0.clone()),
                buckets: self.latency >= 2 || self.plot.is_some(),
            },
        })
    }
}

/// `0-3,6` for a sorted CPU list.
fn cpu_ranges(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "no CPU".into()
    } else {
        format!("CPUs {}", out.join(","))
    }
}

/// Why a run completed no I/O, as far as the report can tell.
fn nothing_completed(r: &report::RunReport) -> String {
    let t = &r.total.stats;
    let mut why = format!(
        "{}: no I/O completed in the {:.2} s measured, so there is nothing to report",
        r.device, t.elapsed_s
    );
    if r.device.contains("latency=") {
        why.push_str(": the device's latency= is longer than the run (use -t longer than it)");
    } else if t.errors > 0 {
        why.push_str(": every I/O failed");
    } else {
        why.push_str(": the device answered nothing (a stalled device or a run cut short)");
    }
    why
}

fn print_failures(r: &report::RunReport) {
    let t = &r.total.stats;
    eprintln!(
        "mcqio-perf: {}: {} failed I/O(s), {} verify mismatch(es); first failures:",
        r.device, t.errors, t.verify_mismatches
    );
    for f in &r.failures {
        eprintln!("  {f}");
    }
}

fn perf(args: &RunArgs) -> Result<ExitCode, PerfError> {
    let interrupt = Interrupt::install().map_err(PerfError::Usage)?;
    let o = args.opts(interrupt.flag())?;
    if args.minimal {
        let spec = &args.device[0];
        let m = minimal::MinimalOpts {
            depth: o.depth,
            io_queue_size: o.io_queue_size,
            io_size: o.io_size,
            ios: o.ios.unwrap_or(1_000_000),
            random: match args.pattern {
                Pattern::Randread => true,
                Pattern::Read => false,
                _ => {
                    return Err(PerfError::Usage(
                        "--minimal only reads: use -w randread (the default) or -w read".into(),
                    ))
                }
            },
            cpus: o.cpus.clone(),
        };
        let r = minimal::run(spec, &m)?;
        println!("{}", r.line(&spec.raw, o.depth));
        return Ok(ExitCode::SUCCESS);
    }
    output::claim_all([args.output.as_deref()]).map_err(PerfError::Usage)?;
    output::claim_plot(args.plot.as_deref()).map_err(PerfError::Usage)?;
    if o.time.is_some_and(|t| t.is_zero()) && o.ios.is_none() && o.bytes.is_none() {
        return Err(PerfError::Usage(
            "-t 0 measures nothing; give a time or -n <count>".into(),
        ));
    }
    let clock = clock::Clock::choose(args.clock).map_err(PerfError::Usage)?;
    if let Some(c) = &args.compare {
        // Opened and closed here, reopened for its own run: the two may
        // be one device with other options (`--compare vfio:X,mcq=off`).
        run::check_devices(std::slice::from_ref(c), &o)?;
    }
    let mut bases = Vec::new();
    let mut others = Vec::new();
    for _ in 0..args.repeat {
        bases.push(run::run_devices(&args.device, &o, clock.clone())?);
        if interrupt.signal().is_some() {
            break;
        }
        if let Some(c) = &args.compare {
            others.push(run::run_device(c, &o, clock.clone())?);
        }
        if interrupt.signal().is_some() {
            break;
        }
    }
    let mut base = report::RunReport::median_of(bases).expect("at least one repeat ran");
    let mut other = report::RunReport::median_of(others);
    if let Some(what) = interrupt.name() {
        // The note goes on the run the signal cut short (each run records
        // whether it saw the signal); a signal between two runs cut none,
        // and the base run says what did not run.
        let cut = match other.as_mut() {
            Some(o) if o.interrupted => o,
            _ => &mut base,
        };
        cut.interrupted = true;
        cut.notes.push(format!(
            "interrupted by {what}: the numbers cover the {:.2} s measured before it",
            cut.total.stats.elapsed_s
        ));
        eprintln!("mcqio-perf: interrupted by {what}; reporting the time measured");
        if let (Some(c), None) = (&args.compare, &other) {
            base.notes
                .push(format!("the --compare run on {c} did not run"));
        }
    }
    let failed: Vec<report::RunReport> = std::iter::once(&base)
        .chain(other.as_ref())
        .filter(|r| r.failed())
        .cloned()
        .collect();
    // A run in which nothing completed measured nothing:
    // the figures are zeros, not a result.
    let empty: Vec<String> = std::iter::once(&base)
        .chain(other.as_ref())
        .filter(|r| r.total.stats.ios == 0)
        .map(nothing_completed)
        .collect();
    if let Some(path) = &args.plot {
        let mut runs = vec![&base];
        runs.extend(other.as_ref());
        plot::perf_chart(path, &runs).map_err(|e| PerfError::Output {
            path: path.clone(),
            msg: e.to_string(),
        })?;
    }
    let mut doc = String::new();
    if args.json {
        // One shape for both: a compared run is the base run with `compare` set.
        doc = match other {
            Some(other) => {
                serde_json::to_string_pretty(&CompareReport::new(base.clone(), other).into_report())
            }
            None => serde_json::to_string_pretty(&base),
        }
        .expect("reports serialize");
        doc.push('\n');
    } else {
        let lat = args.latency > 0;
        doc.push_str(&base.table(lat));
        if let Some(other) = &other {
            doc.push('\n');
            doc.push_str(&other.table(lat));
            doc.push('\n');
            doc.push_str(&CompareReport::new(base.clone(), other.clone()).ratio_text(lat));
            doc.push('\n');
        }
    }
    match &args.output {
        Some(path) => std::fs::write(path, &doc).map_err(|e| PerfError::Output {
            path: path.clone(),
            msg: e.to_string(),
        })?,
        None => print!("{doc}"),
    }
    for r in &failed {
        print_failures(r);
    }
    for why in &empty {
        eprintln!("mcqio-perf: error: {why}");
    }
    Ok(match interrupt.exit_code() {
        // The shell's convention for "ended by signal N".
        Some(code) => code,
        None if failed.is_empty() && empty.is_empty() => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    })
}

fn main() -> ExitCode {
    quiet_on_closed_pipe();
    // The library logs through `log`; RUST_LOG=debug (or warn, trace) shows it.
    env_logger::init();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(msg) = foreign_flag(&args) {
        eprintln!("mcqio-perf: error: {msg}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(args);
    let result = match &cli.cmd {
        None => perf(&cli.run),
        Some(c) => return setup::run(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcqio-perf: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Output into a pipe whose reader has gone (`mcqio-perf devices | head`)
/// ends the program quietly, as it ends a C tool: SIGPIPE goes back to its
/// default action, where Rust's runtime ignores it and every `println!`
/// after the reader left would panic. Sockets are not affected: the
/// engine's sends pass MSG_NOSIGNAL (std's do too), so a closed NVMe/TCP
/// connection is still an error, not a signal.
fn quiet_on_closed_pipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no
    // handler (no code runs in signal context); done first in `main`,
    // before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
