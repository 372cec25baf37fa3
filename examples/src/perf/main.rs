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
//! ```
//!
//! Set-up subcommands: `mcqio-perf devices`, `bind <BDF>`, `unbind <BDF>`,
//! `doctor [<BDF>]`, and `dma-bench` (the DMA modes' map/unmap table; see
//! `mcqio-perf help <command>`).
//!
//! Exit status: 0 on success, 1 when an I/O failed or verification found a
//! mismatch (the first failures are printed), 2 on usage or set-up errors.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod clock;
mod dmabench;
mod job;
mod nvme;
mod queue;
mod report;
mod run;
mod setup;
mod spec;
mod target;
mod uring;
mod verify;
mod workload;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser};

use crate::report::CompareReport;
use crate::run::{DmaMode, PerfError, RunOpts};
use crate::spec::{parse_cpus, parse_size, DeviceSpec};
use crate::workload::Pattern;

/// A CPU list (`0-3,6`).
#[derive(Debug, Clone)]
struct CpuList(Vec<usize>);

fn cpu_list(s: &str) -> Result<CpuList, String> {
    parse_cpus(s).map(CpuList).map_err(|e| e.to_string())
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn device(s: &str) -> Result<DeviceSpec, String> {
    s.parse::<DeviceSpec>().map_err(|e| e.to_string())
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1e7).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds")),
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "mcqio-perf",
    version,
    about = "Measure NVMe I/O through mcqio (fake, VFIO) or the kernel's io_uring",
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
        value_parser = device,
        help = "Device: fake[,lbads=,ns=,size=,corrupt=,error=,latency=,qpairs=,core=,sync=], fake:null, \
                vfio:<BDF>[,qpairs=], uring:<path>[,size=,lbads=,direct=], uring:null"
    )]
    device: DeviceSpec,
    /// Access pattern
    #[arg(short = 'w', long = "rw", value_enum, default_value = "randread")]
    pattern: Pattern,
    /// Read percentage for rw/randrw
    #[arg(short = 'M', long = "rwmixread", default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100))]
    mix: u8,
    /// I/O size (4k, 128k, bytes)
    #[arg(short = 'o', long = "io-size", default_value = "4k", value_parser = size)]
    io_size: u64,
    /// Queue depth per job
    #[arg(short = 'q', long = "qd", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65535))]
    depth: u32,
    /// Jobs: threads, each pinned to a core with its own queue pair / ring
    #[arg(short = 'j', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    jobs: u32,
    /// Cores for the jobs (job i on the i-th listed core), e.g. 0,1 or 0-3
    #[arg(long, value_parser = cpu_list)]
    cpus: Option<CpuList>,
    /// Seconds to measure
    #[arg(short = 't', long = "time", default_value = "3", value_parser = seconds)]
    time: f64,
    /// I/Os per job to complete instead of a time
    #[arg(short = 'n', long = "ios", value_parser = clap::value_parser!(u64).range(1..))]
    ios: Option<u64>,
    /// Seconds of warm-up before measuring
    #[arg(long, default_value = "0", value_parser = seconds)]
    warmup: f64,
    /// DMA buffer mode
    #[arg(long, value_enum, default_value = "premapped")]
    dma: DmaMode,
    /// Lazy-unmap batch size (with --dma lazy)
    #[arg(long = "dma-batch")]
    dma_batch: Option<u32>,
    /// Write LBA/seed/generation tags and check every read
    #[arg(long)]
    verify: bool,
    /// Print latency percentiles (50, 90, 99, 99.9, 99.99)
    #[arg(short = 'L', long = "latency")]
    latency: bool,
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
}

impl RunArgs {
    fn opts(&self) -> Result<RunOpts, PerfError> {
        let jobs = self.jobs as usize;
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = match &self.cpus {
            Some(CpuList(c)) => {
                if c.len() < jobs {
                    return Err(PerfError::Usage(format!(
                        "--cpus lists {} core(s) for {jobs} job(s); list one core per job",
                        c.len()
                    )));
                }
                c.clone()
            }
            // Default: job i on core i, as long as there are cores.
            None if jobs <= ncpu => (0..jobs).collect(),
            None => Vec::new(),
        };
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
            mix: self.mix,
            io_size: self.io_size,
            depth: self.depth as usize,
            jobs,
            cpus,
            time: Duration::from_secs_f64(self.time),
            ios: self.ios,
            warmup: Duration::from_secs_f64(self.warmup),
            verify: self.verify,
            // JSON always carries percentiles; the table shows them with -L.
            histogram: self.latency || self.json,
            dma: self.dma,
            dma_batch: self.dma_batch.map(|b| b as usize),
            seed,
            progress: !self.quiet && !self.json,
        })
    }
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
    let o = args.opts()?;
    if o.time.is_zero() && o.ios.is_none() {
        return Err(PerfError::Usage(
            "-t 0 measures nothing; give a time or -n <count>".into(),
        ));
    }
    let clock = clock::Clock::new();
    let mut bases = Vec::new();
    let mut others = Vec::new();
    for _ in 0..args.repeat {
        bases.push(run::run_device(&args.device, &o, clock)?);
        if let Some(c) = &args.compare {
            others.push(run::run_device(c, &o, clock)?);
        }
    }
    let base = report::RunReport::median_of(bases).expect("at least one repeat ran");
    let other = report::RunReport::median_of(others);
    let failed: Vec<report::RunReport> = std::iter::once(&base)
        .chain(other.as_ref())
        .filter(|r| r.failed())
        .cloned()
        .collect();
    if args.json {
        let doc = match other {
            Some(other) => serde_json::to_string_pretty(&CompareReport::new(base.clone(), other)),
            None => serde_json::to_string_pretty(&base),
        }
        .expect("reports serialize");
        println!("{doc}");
    } else {
        print!("{}", base.table(args.latency));
        if let Some(other) = &other {
            println!();
            print!("{}", other.table(args.latency));
            println!();
            println!(
                "{}",
                CompareReport::new(base.clone(), other.clone()).ratio_text()
            );
        }
    }
    for r in &failed {
        print_failures(r);
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
