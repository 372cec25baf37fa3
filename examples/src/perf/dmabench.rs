//! `mcqio-perf dma-bench`: the map → I/O → unmap throughput table (rows: premapped, strict, lazy at several batch sizes; columns: total
//! requests, average per thread, difference vs the best row), run by
//! `mcqio_vfio::mapping::bench` on the fake IOMMU (with its invalidation
//! cost model) or on a real VFIO container.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use mcqio_fixtures::{FakeConfig, FakeController, NamespaceConfig};
use mcqio_vfio::mapping::bench::{self, BenchMode, BenchSpec};
use mcqio_vfio::{Backend, DmaSpace, VfioBackend};
use serde::Serialize;

use crate::interrupt::Interrupt;
use crate::spec::{parse_cpus, parse_duration, parse_size, DeviceKind, DeviceSpec};

/// The fake IOMMU's cost per IOTLB invalidation unless `--inval-cost` says
/// otherwise: the setting the README's table was measured with.
pub const DEFAULT_INVAL_COST: Duration = Duration::from_micros(100);

/// `dma-bench`.
#[derive(Debug, Args)]
pub struct DmaBenchArgs {
    /// Whose IOMMU: `fake` (the fixtures' fake IOMMU) or `vfio:<BDF>`
    #[arg(short = 'd', long, default_value = "fake", value_parser = |s: &str| s.parse::<DeviceSpec>().map_err(|e| e.to_string()))]
    device: DeviceSpec,
    /// Thread counts to run, e.g. 1,2 or 1-4 (default: 1 to the number of CPUs)
    #[arg(long, value_parser = |s: &str| parse_cpus(s).map_err(|e| e.to_string()))]
    threads: Option<std::vec::Vec<usize>>,
    /// Lazy batch sizes (rows lazy/N), e.g. 1,32,64,128,256
    #[arg(long, value_parser = |s: &str| parse_cpus(s).map_err(|e| e.to_string()))]
    batches: Option<std::vec::Vec<usize>>,
    /// Time per row: seconds or with a unit (1, 300ms)
    #[arg(short = 't', long = "time", default_value = "1", value_parser = |s: &str| parse_duration(s).map_err(|e| e.to_string()))]
    time: Duration,
    /// Busy-wait the fake IOMMU charges per IOTLB invalidation (a real
    /// IOMMU's cost is what it is: fake only), e.g. 100us, 0
    #[arg(long = "inval-cost", value_parser = |s: &str| parse_duration(s).map_err(|e| e.to_string()))]
    inval_cost: Option<Duration>,
    /// Bytes per I/O
    #[arg(short = 'o', long = "io-size", default_value = "4k", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    io_size: u64,
    /// Print JSON instead of the table
    #[arg(long)]
    json: bool,
    /// Also draw requests per second over threads, one line per mode, into an SVG file
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
}

/// One row as JSON.
#[derive(Debug, Serialize)]
struct Row {
    mode: String,
    threads: usize,
    total_requests: u64,
    avg_per_thread: f64,
    requests_per_s: f64,
    vs_best_pct: f64,
    maps: u64,
    unmap_calls: u64,
    invalidations: u64,
}

fn space_for(
    spec: &DeviceSpec,
    inval_cost: Option<Duration>,
) -> Result<(Arc<dyn Backend>, Arc<DmaSpace>), String> {
    // dma-bench measures the IOMMU only: no device option changes that.
    spec.check_keys(&[], "dma-bench")
        .map_err(|e| e.to_string())?;
    let backend: Arc<dyn Backend> = match &spec.kind {
        DeviceKind::Fake { .. } => {
            // The controller is only the owner of the fake IOMMU here; a tiny
            // null namespace keeps it cheap.
            let mut cfg = FakeConfig {
                namespaces: vec![NamespaceConfig::null(1 << 20, 4096)],
                ..FakeConfig::default()
            };
            cfg.iommu.invalidation_cost = inval_cost.unwrap_or(DEFAULT_INVAL_COST);
            FakeController::new(cfg).map_err(|e| e.to_string())?
        }
        DeviceKind::Vfio { bdf } => {
            if inval_cost.is_some() {
                return Err(
                    "--inval-cost sets the fake IOMMU's cost; a real IOMMU's is measured".into(),
                );
            }
            Arc::new(VfioBackend::open(bdf).map_err(|e| e.to_string())?)
        }
        _ => {
            return Err(format!(
                "dma-bench needs an IOMMU: use fake or vfio:<BDF>, not `{}` (uring: and tcp: devices have none)",
                spec.label()
            ))
        }
    };
    let space = Arc::clone(backend.dma());
    Ok((backend, space))
}

/// What an IOTLB invalidation costs in this run, for the chart's title: the
/// fake IOMMU's modelled busy-wait as configured, or a real IOMMU's own.
fn inval_text(cost_us: Option<f64>) -> String {
    match cost_us {
        Some(c) => format!("fake IOMMU modelling {c} us per IOTLB invalidation"),
        None => "the host IOMMU's own IOTLB invalidation cost".into(),
    }
}

/// Run the table.
pub fn run(a: &DmaBenchArgs) -> ExitCode {
    let fail = |e: String| {
        eprintln!("mcqio-perf: error: {e}");
        ExitCode::from(2)
    };
    if a.time.is_zero() {
        return fail("-t 0: give a positive time per row (e.g. 1, 300ms)".into());
    }
    if let Err(e) = crate::output::claim_plot(a.plot.as_deref()) {
        return fail(e);
    }
    // A row runs to its end (the map/unmap loop has no stop flag); a signal
    // ends the table after it, and a second one the process.
    let interrupt = match Interrupt::install() {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let (_backend, space) = match space_for(&a.device, a.inval_cost) {
        Ok(s) => s,
        Err(e) => return fail(format!("{}: {e}", a.device.label())),
    };
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a.threads.clone().unwrap_or_else(|| (1..=ncpu).collect());
    let mut modes = vec![BenchMode::Premapped, BenchMode::Strict];
    match &a.batches {
        Some(b) => modes.extend(b.iter().map(|&batch| BenchMode::Lazy {
            batch: batch.max(1),
        })),
        None => modes = BenchMode::standard(),
    }
    let duration = a.time;
    let secs = a.time.as_secs_f64();
    let cost_us = match a.device.kind {
        DeviceKind::Fake { .. } => {
            Some(a.inval_cost.unwrap_or(DEFAULT_INVAL_COST).as_secs_f64() * 1e6)
        }
        _ => None,
    };
    let mut json_rows = Vec::new();
    // Per mode label: (threads, requests/s) for --plot.
    let mut chart: Vec<crate::plot::Series> = Vec::new();
    let mut cut = false;
    for &t in &threads {
        if cut {
            break;
        }
        let mut rows = Vec::with_capacity(modes.len());
        for &mode in &modes {
            if interrupt.signal().is_some() {
                cut = true;
                break;
            }
            let mut spec = BenchSpec::new(mode, t.max(1), duration);
            spec.io_size = a.io_size.max(1) as usize;
            match bench::run_map_unmap(&space, &spec) {
                Ok(r) => rows.push(r),
                Err(e) => return fail(format!("{} with {t} thread(s): {e}", mode.label())),
            }
        }
        for r in &rows {
            let pt = (r.threads as f64, r.rate());
            match chart.iter_mut().find(|(l, _)| *l == r.label) {
                Some((_, pts)) => pts.push(pt),
                None => chart.push((r.label.clone(), vec![pt])),
            }
        }
        if a.json {
            let best = rows.iter().map(|r| r.total).max().unwrap_or(0).max(1) as f64;
            json_rows.extend(rows.iter().map(|r| Row {
                mode: r.label.clone(),
                threads: r.threads,
                total_requests: r.total,
                avg_per_thread: r.avg_per_thread(),
                requests_per_s: r.rate(),
                vs_best_pct: (r.total as f64 - best) / best * 100.0,
                maps: r.iommu.maps,
                unmap_calls: r.iommu.unmap_calls,
                invalidations: r.iommu.invalidations,
            }));
        } else {
            println!(
                "map -> I/O -> unmap on {}{} ({} B I/Os, {secs} s per row, {t} thread(s))",
                a.device.label(),
                cost_us.map_or_else(String::new, |c| format!(" IOMMU, {c} us per invalidation")),
                a.io_size,
            );
            print!("{}", bench::format_table(&rows));
            println!();
        }
    }
    if let Some(what) = interrupt.name() {
        eprintln!("mcqio-perf: interrupted by {what}; printing the rows that ran");
        if !a.json {
            println!("interrupted: the table stops after the rows above");
        }
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "map -> I/O -> unmap on {} ({} B I/Os, {})",
            a.device.label(),
            a.io_size,
            inval_text(cost_us)
        );
        if let Err(e) =
            crate::plot::line_chart(path, &title, "threads", "requests per second", &chart)
        {
            return fail(format!("cannot write {}: {e}", path.display()));
        }
    }
    if a.json {
        let doc = serde_json::json!({ "device": a.device.raw, "io_size": a.io_size, "seconds_per_row": secs, "invalidation_cost_us": cost_us, "rows": json_rows, "interrupted": interrupt.signal().is_some() });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON values serialize")
        );
    }
    interrupt.exit_code().unwrap_or(ExitCode::SUCCESS)
}
