//! Map → I/O → unmap cost of the three DMA mapping modes.
//!
//! Two parts, both on a fake IOMMU with an IOTLB invalidation cost of 0, 1 µs
//! and 100 µs (a busy-wait per sync):
//!
//! 1. criterion: time per cycle on one thread, per mode and cost;
//! 2. the ECMDQ-shaped table (only with `cargo bench`, not `cargo test`):
//!    every mode at 1..=N threads for a fixed time; rows premapped, strict,
//!    lazy/1…256; columns total requests, average per CPU, difference vs the
//!    best row.
//!
//! Environment: `DMA_BENCH_MS` (time per table row, default 300),
//! `DMA_BENCH_THREADS` (largest thread count, default all CPUs),
//! `DMA_BENCH_IOMMU`: `fake` (default; `mcqio_fixtures::FakeIommu`, the
//! controller fake's IOMMU: syncs run outside its map lock, so concurrent
//! invalidations overlap, like per-CPU command queues) or `counting`
//! (`CountingIommu`: syncs run under the domain lock, as VFIO type1 holds
//! `iommu->lock` across unmap and sync, so they serialise like one shared
//! command queue).

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use mcqio_fixtures::{FakeIommu, FakeIommuConfig};
use mcqio_vfio::mapping::bench::{format_table, run_table, BenchMode, BenchSpec, BenchWorker};
use mcqio_vfio::mapping::testing::CountingIommu;
use mcqio_vfio::{DmaSpace, HugePages, Iommu};

/// Invalidation costs measured: free, a fast hardware sync, a slow one.
const COSTS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_micros(1),
    Duration::from_micros(100),
];

fn counting() -> bool {
    std::env::var("DMA_BENCH_IOMMU").is_ok_and(|v| v == "counting")
}

fn space(cost: Duration) -> Arc<DmaSpace> {
    let iommu: Arc<dyn Iommu> = if counting() {
        Arc::new(CountingIommu::new().with_invalidation_cost(cost))
    } else {
        Arc::new(FakeIommu::new(FakeIommuConfig {
            invalidation_cost: cost,
            ..FakeIommuConfig::default()
        }))
    };
    DmaSpace::new(iommu, HugePages::Never)
}

fn label(cost: Duration) -> String {
    let which = if counting() { "counting" } else { "fake" };
    format!("{which}/inval={}us", cost.as_micros())
}

fn per_cycle(c: &mut Criterion) {
    for cost in COSTS {
        let space = space(cost);
        let mut g = c.benchmark_group(format!("dma_modes/{}", label(cost)));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(400));
        for mode in BenchMode::standard() {
            let spec = BenchSpec::new(mode, 1, Duration::ZERO);
            let mut w = BenchWorker::new(&space, &spec).expect("bench setup");
            g.bench_function(BenchmarkId::from_parameter(mode.label()), |b| {
                b.iter_custom(|iters| w.run(iters).expect("map/unmap cycle"))
            });
        }
        g.finish();
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn table() {
    let ms = env_or("DMA_BENCH_MS", 300);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let max_threads = env_or("DMA_BENCH_THREADS", cpus).max(1) as usize;
    for cost in COSTS {
        let space = space(cost);
        for threads in 1..=max_threads {
            let rows = run_table(
                &space,
                &BenchMode::standard(),
                threads,
                Duration::from_millis(ms),
            )
            .expect("dma bench row");
            println!(
                "\nmap -> touch 4 KiB -> unmap, {} per row, {threads} thread(s), {}",
                format_args!("{ms} ms"),
                label(cost)
            );
            print!("{}", format_table(&rows));
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    per_cycle(&mut c);
    c.final_summary();
    // `cargo bench` passes --bench; `cargo test --benches` does not, and there
    // the timed table would only slow the test run down.
    if std::env::args().any(|a| a == "--bench") {
        table();
    }
}
