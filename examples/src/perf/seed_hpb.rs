//! `mcqio-perf seed hpb`: the shape of the HPB table that motivated host
//! HPB in mcqio (UFS 2.1 phone, iozone 4 KiB random read, 16 threads: HPB
//! off fell from 300.9 to 153.3 as the IO range grew from 1 to 32 GB, HPB
//! on stayed at 277–295), rerun on the fake UFS device with its
//! flash-translation cost model.
//!
//! Each point is a closed loop of 4 KiB random reads, `--qd` outstanding,
//! uniform over `[0, range)` of a 64 GiB sparse LU, through the engine's
//! [`UfsQueuePair`], once with HPB off (normal READ) and once with the
//! engine's HPB on (device control: the device recommends sub-regions
//! after its activation threshold, the engine loads them with READ BUFFER
//! on the same queue pair and sends HPB READ). Each point first warms up:
//! the device's map cache (both), and with HPB on until the host map stops
//! growing. Every read's first word is checked against the LBA's pattern.
//!
//! Throughput is **modelled**: reads divided by the device's modelled
//! time (virtual clock, synchronous device, completions released in
//! deadline order once `qd` commands are held), so the table depends on
//! the model's parameters and not on this machine's speed or load, and is
//! the same on every run. `--scale N` divides the ranges and the device
//! map cache by N (same cache-to-range ratios, N times less warm-up): the
//! quick form tests use.

use crate::interrupt::Interrupt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use mcqio::ufs::{HpbConfig, HpbStats, UfsController, UfsOptions, UfsQueuePair};
use mcqio::DmaBuf;
use mcqio_fixtures::ufs::{
    unwritten_word, FakeUfs, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig,
    ModelClock, UfsConfig,
};
use mcqio_fixtures::ExecMode;
use mcqio_vfio::{Backend, DmaDir};
use serde::Serialize;

use crate::run::PerfError;

const GIB: u64 = 1 << 30;
const BLOCK: u64 = 4096;
/// IO ranges of the table, GiB (before `--scale`).
const RANGES: [u64; 6] = [1, 2, 4, 8, 16, 32];

/// `seed hpb`.
#[derive(Debug, Args)]
pub struct HpbArgs {
    /// Reads measured per point (after warm-up)
    #[arg(short = 'n', long = "reads", default_value_t = 4000, value_parser = clap::value_parser!(u64).range(100..))]
    reads: u64,
    /// Outstanding reads
    #[arg(short = 'q', long = "qd", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    depth: u32,
    /// Host map budget in bytes per LU (k/M/G) [default: enough for the
    /// largest range: 8 B per 4 KiB]
    #[arg(long, value_parser = budget)]
    budget: Option<u64>,
    /// Divide the ranges and the device's map cache by this (a power of
    /// two; same shape, less warm-up)
    #[arg(long, default_value_t = 1, value_parser = scale)]
    scale: u64,
    /// Print one JSON document instead of the table
    #[arg(long)]
    json: bool,
}

fn budget(s: &str) -> Result<u64, String> {
    crate::spec::parse_size(s).map_err(|e| e.to_string())
}

fn scale(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if v.is_power_of_two() && v <= 64 => Ok(v),
        _ => Err(format!("--scale {s}: need a power of two up to 64")),
    }
}

/// The cost model and HPB parameters of the run.
#[derive(Debug, Clone, Serialize)]
pub struct ModelParams {
    /// NAND read latency tR, µs.
    pub t_read_us: f64,
    /// Parallel NAND units.
    pub dies: u32,
    /// Device map cache, bytes.
    pub map_cache_bytes: u64,
    /// Map page, bytes (4-byte device entries).
    pub map_page_bytes: u32,
    /// LBA range the device map cache covers, GiB.
    pub map_cache_covers_gib: f64,
    /// Cost of an HPB READ on top of its NAND reads, % of tR.
    pub hpb_overhead_pct: f64,
    /// LU size, bytes (sparse).
    pub lu_bytes: u64,
    /// HPB region / sub-region, bytes.
    pub hpb_region_bytes: u64,
    /// HPB sub-region, bytes.
    pub hpb_subregion_bytes: u64,
    /// Control mode.
    pub hpb_control: String,
    /// Device reads of a sub-region before it recommends it.
    pub device_activation_threshold: u32,
    /// Device's active-region limit.
    pub max_active_regions: u16,
    /// Host map budget, bytes.
    pub memory_budget: u64,
    /// How time advances.
    pub clock: String,
}

/// One row: an IO range.
#[derive(Debug, Clone, Serialize)]
pub struct HpbRow {
    /// IO range, GiB (already divided by `scale`).
    pub range_gib: f64,
    /// Modelled IOPS, HPB off.
    pub hpb_off_iops: f64,
    /// Modelled IOPS, HPB on.
    pub hpb_on_iops: f64,
    /// on / off.
    pub ratio: f64,
    /// Device map-cache hit ratio of the measured reads, HPB off.
    pub off_map_hit_ratio: f64,
    /// Share of the measured reads sent as HPB READ and accepted, HPB on.
    pub on_hpb_accepted_ratio: f64,
    /// Reads of the warm-up, HPB on.
    pub on_warmup_reads: u64,
    /// Host map bytes allocated after this row.
    pub host_map_bytes: u64,
}

/// Whether the table has the published shape: HPB off falls with the
/// range, HPB on holds, and the host map stays in its budget.
#[derive(Debug, Clone, Serialize)]
pub struct Criteria {
    /// HPB off falls with the range (each row below the previous).
    pub off_falls_with_range: bool,
    /// HPB on within 10 % of its first-row value on every row.
    pub on_within_10pct_of_first: bool,
    /// Last row: on ≥ 1.8 × off.
    pub last_on_ge_1_8x_off: bool,
    /// First row: on and off within 5 %.
    pub first_within_5pct: bool,
    /// Host map never above the budget.
    pub host_map_within_budget: bool,
}

/// The whole `seed hpb` document.
#[derive(Debug, Clone, Serialize)]
pub struct HpbReport {
    /// What ran.
    pub device: String,
    /// I/O size (4096).
    pub io_size: u64,
    /// Outstanding reads.
    pub queue_depth: u32,
    /// Reads measured per point.
    pub reads_per_point: u64,
    /// Ranges and map cache divided by this.
    pub scale: u64,
    /// The model.
    pub model: ModelParams,
    /// The rows.
    pub rows: Vec<HpbRow>,
    /// Most host map memory allocated (entries), bytes.
    pub host_map_bytes: u64,
    /// Most host map memory held at once, bytes.
    pub host_map_bytes_peak: u64,
    /// The engine's HPB counters at the end (HPB on).
    pub hpb: HpbCounters,
    /// The criteria ([`Criteria`]) on this table.
    pub criteria: Criteria,
    /// Wall time of the whole run, s (information only).
    pub wall_s: f64,
    /// Remarks.
    pub notes: Vec<String>,
    /// Stopped by SIGINT/SIGTERM: `rows` holds the ranges that ran, and
    /// the criteria judge only those.
    pub interrupted: bool,
}

/// The engine's HPB counters (a serializable copy of [`HpbStats`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct HpbCounters {
    /// Reads sent as HPB READ.
    pub hpb_reads: u64,
    /// Reads sent as normal READ.
    pub normal_reads: u64,
    /// Map loads published.
    pub map_loads: u64,
    /// Device fallbacks reported.
    pub stale_fallbacks: u64,
    /// Regions evicted.
    pub evictions: u64,
    /// Host map bytes allocated.
    pub host_map_bytes: u64,
    /// Host map budget.
    pub memory_budget: u64,
}

impl From<&HpbStats> for HpbCounters {
    fn from(s: &HpbStats) -> Self {
        HpbCounters {
            hpb_reads: s.hpb_reads,
            normal_reads: s.normal_reads,
            map_loads: s.map_loads,
            stale_fallbacks: s.stale_fallbacks,
            evictions: s.evictions,
            host_map_bytes: s.host_map_bytes,
            memory_budget: s.memory_budget,
        }
    }
}

/// Run `seed hpb`.
pub fn run(a: &HpbArgs) -> ExitCode {
    let interrupt = match Interrupt::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("mcqio-perf: error: {e}");
            return ExitCode::from(2);
        }
    };
    match seed(a, &interrupt) {
        Ok(r) => {
            if let Some(what) = interrupt.name() {
                eprintln!(
                    "mcqio-perf: interrupted by {what}; printing the {} of {} rows that ran",
                    r.rows.len(),
                    RANGES.len()
                );
            }
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("reports serialize")
                );
            } else {
                print!("{}", table(&r));
            }
            interrupt.exit_code().unwrap_or(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("mcqio-perf: error: {e}");
            ExitCode::from(2)
        }
    }
}

struct Bench {
    fake: Arc<FakeUfs>,
    ctrl: Arc<UfsController>,
    qp: UfsQueuePair<DmaBuf>,
    bufs: Vec<Option<DmaBuf>>,
    x: u64,
}

fn err(e: impl std::fmt::Display) -> PerfError {
    PerfError::Device(e.to_string())
}

impl Bench {
    fn open(dev: UfsConfig, hpb: Option<HpbConfig>, depth: u32) -> Result<Self, PerfError> {
        let fake = FakeUfs::new(dev).map_err(err)?;
        let backend: Arc<dyn Backend> = fake.clone();
        let ctrl = UfsController::new(
            backend,
            UfsOptions {
                queues: 1,
                depth: (depth + 4) as u16,
                hpb,
                ..UfsOptions::default()
            },
        )
        .map_err(err)?;
        let qp = ctrl.create_qpair(Default::default()).map_err(err)?;
        let bufs = (0..depth)
            .map(|_| ctrl.alloc_buf(BLOCK as usize, DmaDir::FromDevice).map(Some))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        Ok(Bench {
            fake,
            ctrl,
            qp,
            bufs,
            x: 0x2545_F491_4F6C_DD1D,
        })
    }

    /// `n` reads over `[0, blocks)`, all slots busy; checks each read's
    /// first word. Returns the modelled nanoseconds they took.
    fn reads(&mut self, n: u64, blocks: u64) -> Result<u64, PerfError> {
        let t0 = self.fake.ftl_stats().map_or(0, |s| s.modeled_ns);
        let mut lbas = vec![0u64; self.bufs.len()];
        let (mut sent, mut done) = (0u64, 0u64);
        let mut bad: Option<String> = None;
        let start = Instant::now();
        while done < n {
            for (slot, at) in lbas.iter_mut().enumerate() {
                if sent >= n {
                    break;
                }
                if let Some(b) = self.bufs[slot].take() {
                    self.x ^= self.x << 13;
                    self.x ^= self.x >> 7;
                    self.x ^= self.x << 17;
                    let lba = self.x % blocks;
                    *at = lba;
                    if let Err(e) = self.qp.read(0, lba, 1, b, slot as u64) {
                        self.bufs[slot] = Some(e.buf);
                        return Err(err(e.kind));
                    }
                    sent += 1;
                }
            }
            self.qp.submit();
            let bufs = &mut self.bufs;
            let got = self
                .qp
                .poll(64, |c| {
                    let slot = c.tag as usize;
                    let mut w = [0u8; 8];
                    match (c.result, c.buf) {
                        (Ok(()), Some(b)) => {
                            let _ = b.read_at(0, &mut w);
                            let want = unwritten_word(lbas[slot] * BLOCK);
                            if u64::from_le_bytes(w) != want && bad.is_none() {
                                bad = Some(format!(
                                    "LBA {}: read {:#x}, expected {want:#x}",
                                    lbas[slot],
                                    u64::from_le_bytes(w)
                                ));
                            }
                            bufs[slot] = Some(b);
                        }
                        (r, b) => {
                            if bad.is_none() {
                                bad = Some(format!("read of LBA {} failed: {r:?}", lbas[slot]));
                            }
                            bufs[slot] = b;
                        }
                    }
                    done += 1;
                })
                .map_err(err)?;
            if let Some(b) = bad.take() {
                return Err(PerfError::Device(b));
            }
            if got == 0 && start.elapsed() > Duration::from_secs(120) {
                return Err(PerfError::Device("reads stopped completing".into()));
            }
        }
        let t1 = self.fake.ftl_stats().map_or(0, |s| s.modeled_ns);
        Ok(t1.saturating_sub(t0))
    }

    fn hpb(&self) -> HpbStats {
        self.ctrl.hpb_stats(0).unwrap_or_default()
    }
}

fn seed(a: &HpbArgs, interrupt: &Interrupt) -> Result<HpbReport, PerfError> {
    let wall = Instant::now();
    let lu_bytes = 64 * GIB / a.scale;
    let max_range = RANGES[RANGES.len() - 1] * GIB / a.scale;
    let budget = a.budget.unwrap_or(max_range / BLOCK * 8);
    let ftl = FtlConfig {
        t_read: Duration::from_micros(50),
        dies: 4,
        // 80 map pages of 16 KiB: the device caches the map of 1.25 GiB.
        map_cache_bytes: (80 * (16 << 10) / a.scale).max(16 << 10),
        map_page_bytes: 16 << 10,
        clock: ModelClock::Virtual {
            hold_depth: a.depth,
        },
        ..FtlConfig::default()
    };
    let dev_hpb = DevHpb {
        control: DevControl::Device,
        max_active_regions: 2048,
        ..DevHpb::default()
    };
    let dev = UfsConfig {
        exec: ExecMode::Sync,
        queues: 1,
        lus: vec![LuConfig::sparse_bytes(lu_bytes)],
        ftl: Some(ftl.clone()),
        hpb: Some(dev_hpb.clone()),
        ..UfsConfig::default()
    };
    let host_cfg = HpbConfig {
        memory_budget: budget,
        ..HpbConfig::default()
    };
    let mut off = Bench::open(dev.clone(), None, a.depth)?;
    let mut on = Bench::open(dev, Some(host_cfg), a.depth)?;
    if on.ctrl.hpb_stats(0).is_none() {
        return Err(PerfError::Device("HPB did not come up on LU 0".into()));
    }
    let srgn_blocks = (512u64 << dev_hpb.subregion_size) / BLOCK;
    let mut rows = Vec::new();
    let mut peak = 0;
    for &g in &RANGES {
        if interrupt.signal().is_some() {
            break;
        }
        let range = g * GIB / a.scale;
        let blocks = range / BLOCK;
        // HPB off: fill the device's map cache, then measure.
        let cache_pages = ftl.cache_pages();
        off.reads((cache_pages * 8).max(2000), blocks)?;
        let f0 = off.fake.ftl_stats().unwrap_or_default();
        let t_off = off.reads(a.reads, blocks)?;
        let f1 = off.fake.ftl_stats().unwrap_or_default();
        let hits = f1.map_hits - f0.map_hits;
        let lookups = hits + (f1.map_misses - f0.map_misses);
        // HPB on: read until the host map stops growing (the device
        // recommends a sub-region after its threshold of reads), then
        // measure.
        let srgns = blocks.div_ceil(srgn_blocks);
        let batch = (srgns * 2).max(2000);
        let mut warm = 0u64;
        loop {
            let before = on.hpb().map_loads;
            on.reads(batch, blocks)?;
            warm += batch;
            let loads = on.hpb().map_loads - before;
            let valid = on.hpb().valid_subregions;
            if valid >= srgns.min(budget / (srgn_blocks * 8)) * 99 / 100 && loads * 100 < srgns {
                break;
            }
            if warm > srgns * 64 + 20_000 {
                break;
            }
        }
        let d0 = on.fake.ftl_stats().unwrap_or_default();
        let t_on = on.reads(a.reads, blocks)?;
        let d1 = on.fake.ftl_stats().unwrap_or_default();
        let h = on.hpb();
        peak = peak.max(h.host_map_bytes_peak);
        let iops = |t: u64| {
            if t == 0 {
                0.0
            } else {
                a.reads as f64 * 1e9 / t as f64
            }
        };
        let (io, ion) = (iops(t_off), iops(t_on));
        rows.push(HpbRow {
            range_gib: range as f64 / GIB as f64,
            hpb_off_iops: io.round(),
            hpb_on_iops: ion.round(),
            ratio: if io > 0.0 { ion / io } else { 0.0 },
            off_map_hit_ratio: hits as f64 / lookups.max(1) as f64,
            on_hpb_accepted_ratio: (d1.hpb_accepted - d0.hpb_accepted) as f64 / a.reads as f64,
            on_warmup_reads: warm,
            host_map_bytes: h.host_map_bytes,
        });
    }
    let h = on.hpb();
    let criteria = match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => Criteria {
            off_falls_with_range: rows
                .windows(2)
                .all(|w| w[1].hpb_off_iops < w[0].hpb_off_iops),
            on_within_10pct_of_first: rows
                .iter()
                .all(|r| (r.hpb_on_iops - first.hpb_on_iops).abs() <= 0.10 * first.hpb_on_iops),
            last_on_ge_1_8x_off: last.hpb_on_iops >= 1.8 * last.hpb_off_iops,
            first_within_5pct: (first.hpb_on_iops - first.hpb_off_iops).abs()
                <= 0.05 * first.hpb_off_iops,
            host_map_within_budget: h.host_map_bytes <= budget && peak <= budget,
        },
        // Interrupted before the first row: no table to judge.
        _ => Criteria {
            off_falls_with_range: false,
            on_within_10pct_of_first: false,
            last_on_ge_1_8x_off: false,
            first_within_5pct: false,
            host_map_within_budget: h.host_map_bytes <= budget && peak <= budget,
        },
    };
    let model = ModelParams {
        t_read_us: ftl.t_read.as_secs_f64() * 1e6,
        dies: ftl.dies,
        map_cache_bytes: ftl.map_cache_bytes,
        map_page_bytes: ftl.map_page_bytes,
        map_cache_covers_gib: (ftl.cache_pages() * ftl.entries_per_page() * BLOCK) as f64
            / GIB as f64,
        hpb_overhead_pct: f64::from(dev_hpb.overhead_ppm) / 1e4,
        lu_bytes,
        hpb_region_bytes: 512 << dev_hpb.region_size,
        hpb_subregion_bytes: 512 << dev_hpb.subregion_size,
        hpb_control: "device".into(),
        device_activation_threshold: dev_hpb.activation_threshold,
        max_active_regions: dev_hpb.max_active_regions,
        memory_budget: budget,
        clock: format!(
            "virtual: completions released in deadline order once {} are held; synchronous device",
            a.depth
        ),
    };
    let notes = vec![
        "IOPS are modelled (reads / the device's modelled time), not measured on this machine's clock: the same on every run"
            .into(),
        "seed (UFS 2.1 phone, iozone 4 KiB random read, 16 threads): HPB off 300.9 -> 153.3 from 1 to 32 GB, HPB on 277-295"
            .into(),
    ];
    Ok(HpbReport {
        device: "fake-ufs (sync, cost model, HPB device control, 64 GiB sparse LU / scale)".into(),
        io_size: BLOCK,
        queue_depth: a.depth,
        reads_per_point: a.reads,
        scale: a.scale,
        model,
        rows,
        host_map_bytes: h.host_map_bytes,
        host_map_bytes_peak: peak,
        hpb: HpbCounters::from(&h),
        criteria,
        wall_s: wall.elapsed().as_secs_f64(),
        notes,
        interrupted: interrupt.signal().is_some(),
    })
}

/// The table: one row per range, then the criteria.
fn table(r: &HpbReport) -> String {
    use std::fmt::Write as _;
    let m = &r.model;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "UFS HPB off vs on on {} ({} B random read, QD {}, {} reads per point)",
        r.device, r.io_size, r.queue_depth, r.reads_per_point
    );
    let _ = writeln!(
        out,
        "model: tR {} us, {} NAND units, map cache {} KiB (covers {:.2} GiB), HPB READ overhead {:.1} %, \
         region {} MiB / sub-region {} MiB, host map budget {} MiB",
        m.t_read_us,
        m.dies,
        m.map_cache_bytes >> 10,
        m.map_cache_covers_gib,
        m.hpb_overhead_pct,
        m.hpb_region_bytes >> 20,
        m.hpb_subregion_bytes >> 20,
        m.memory_budget >> 20
    );
    let _ = writeln!(
        out,
        "{:>10} {:>12} {:>12} {:>7} {:>9} {:>9} {:>12}",
        "range GiB", "HPB off IOPS", "HPB on IOPS", "on/off", "off hit", "on HPB", "host map MiB"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:>10} {:>12.0} {:>12.0} {:>7.2} {:>9.3} {:>9.3} {:>12.1}",
            row.range_gib,
            row.hpb_off_iops,
            row.hpb_on_iops,
            row.ratio,
            row.off_map_hit_ratio,
            row.on_hpb_accepted_ratio,
            row.host_map_bytes as f64 / (1 << 20) as f64
        );
    }
    if r.interrupted {
        let _ = writeln!(
            out,
            "interrupted: the table stops after the {} of {} ranges above",
            r.rows.len(),
            RANGES.len()
        );
    }
    let c = &r.criteria;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "HPB off falls with the range: {}; HPB on within 10% of its first row: {}; last row on >= 1.8x off: {}; \
         first row within 5%: {}; host map within budget ({} of {} bytes): {}",
        c.off_falls_with_range,
        c.on_within_10pct_of_first,
        c.last_on_ge_1_8x_off,
        c.first_within_5pct,
        r.host_map_bytes_peak,
        m.memory_budget,
        c.host_map_within_budget
    );
    let _ = writeln!(
        out,
        "engine HPB counters: {} HPB reads, {} normal reads, {} map loads, {} device fallbacks, {} evictions",
        r.hpb.hpb_reads, r.hpb.normal_reads, r.hpb.map_loads, r.hpb.stale_fallbacks, r.hpb.evictions
    );
    for n in &r.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    let _ = writeln!(out, "(wall time {:.1} s)", r.wall_s);
    out
}
