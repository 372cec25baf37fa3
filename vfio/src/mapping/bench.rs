//! The map → I/O → unmap throughput benchmark, as a library so both the
//! criterion bench and `mcqio-perf dma-bench` can run it on any [`DmaSpace`]
//! (the test IOMMU, the fixtures' fake, or a real VFIO container).
//!
//! Each thread builds its own mapper (as a queue pair would), then loops for a
//! fixed time: take a buffer, write one word per page (the "I/O": the
//! application filling it), map it, release the mapping, and recycle whatever
//! buffers come back. Rows are modes (premapped, strict, lazy at several batch
//! sizes); columns are total requests, average per thread, and difference vs
//! the best row — the shape of the ECMDQ measurement (per-CPU map/unmap test,
//! software-batched command queue at batch 1…256 vs per-CPU queues).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::{
    AppBuffer, DmaMapper, DmaMode, IoBuffer, LazyConfig, MapError, MapperConfig, MapperStats,
    PoolConfig, QueueMapper, Returned, DEFAULT_WINDOW_LEN,
};
use crate::dma::{DmaSpace, PAGE_SIZE};
use crate::iommu::{DmaDir, IommuStats};

/// One row of the table: a mode and, for lazy, its batch size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BenchMode {
    /// Pool buffers, no IOMMU call.
    Premapped,
    /// Map and unmap per I/O.
    Strict,
    /// Map per I/O, unmaps flushed every `batch`.
    Lazy {
        /// Flush-queue batch size.
        batch: usize,
    },
}

impl BenchMode {
    /// Row label: `premapped`, `strict`, `lazy/32`.
    pub fn label(&self) -> String {
        match self {
            BenchMode::Premapped => "premapped".into(),
            BenchMode::Strict => "strict".into(),
            BenchMode::Lazy { batch } => format!("lazy/{batch}"),
        }
    }

    /// Premapped, strict, and lazy at batch 1, 32, 64, 128, 256.
    pub fn standard() -> Vec<BenchMode> {
        let mut v = vec![BenchMode::Premapped, BenchMode::Strict];
        v.extend([1, 32, 64, 128, 256].map(|batch| BenchMode::Lazy { batch }));
        v
    }

    fn config(&self, io_size: usize, window_len: u64, max_delay: Duration) -> MapperConfig {
        let (mode, batch) = match *self {
            BenchMode::Premapped => (DmaMode::Premapped, 1),
            BenchMode::Strict => (DmaMode::Strict, 1),
            BenchMode::Lazy { batch } => (DmaMode::Lazy, batch),
        };
        MapperConfig {
            mode,
            pool: PoolConfig {
                buf_size: io_size,
                count: 2,
            },
            window_len,
            lazy: LazyConfig { batch, max_delay },
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// The row.
    pub mode: BenchMode,
    /// Threads, each with its own mapper.
    pub threads: usize,
    /// How long each thread loops.
    pub duration: Duration,
    /// Bytes per I/O (rounded up to 4 KiB).
    pub io_size: usize,
    /// Per-mapper IOVA window.
    pub window_len: u64,
    /// Lazy time limit.
    pub max_delay: Duration,
}

impl BenchSpec {
    /// `mode` with `threads` threads for `duration`, 4 KiB I/Os, default window
    /// and time limit.
    pub fn new(mode: BenchMode, threads: usize, duration: Duration) -> Self {
        Self {
            mode,
            threads,
            duration,
            io_size: PAGE_SIZE,
            window_len: DEFAULT_WINDOW_LEN,
            max_delay: super::DEFAULT_FLUSH_DELAY,
        }
    }
}

/// The result of one row.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// Row label.
    pub label: String,
    /// Threads.
    pub threads: usize,
    /// Completed map → I/O → unmap cycles, all threads.
    pub total: u64,
    /// Completed cycles per thread.
    pub per_thread: Vec<u64>,
    /// Longest thread run time, including its final flush.
    pub elapsed: Duration,
    /// The mappers' counters, summed.
    pub stats: MapperStats,
    /// Change of the IOMMU's counters over the row.
    pub iommu: IommuStats,
}

impl BenchRow {
    /// Average cycles per thread (per CPU when threads ≤ CPUs).
    pub fn avg_per_thread(&self) -> f64 {
        self.total as f64 / self.threads.max(1) as f64
    }

    /// Cycles per second, all threads.
    pub fn rate(&self) -> f64 {
        self.total as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn add_stats(a: &mut MapperStats, b: &MapperStats) {
    a.maps += b.maps;
    a.premapped_ios += b.premapped_ios;
    a.unmaps += b.unmaps;
    a.unmap_calls += b.unmap_calls;
    a.unmap_ranges += b.unmap_ranges;
    a.invalidations += b.invalidations;
    a.flushes_full += b.flushes_full;
    a.flushes_timed += b.flushes_timed;
    a.flushes_forced += b.flushes_forced;
    a.bytes_pinned += b.bytes_pinned;
    a.peak_bytes_pinned += b.peak_bytes_pinned;
    a.queued_bytes += b.queued_bytes;
}

fn delta(after: IommuStats, before: IommuStats) -> IommuStats {
    IommuStats {
        maps: after.maps - before.maps,
        unmapped_ranges: after.unmapped_ranges - before.unmapped_ranges,
        unmap_calls: after.unmap_calls - before.unmap_calls,
        invalidations: after.invalidations - before.invalidations,
        mapped_bytes: after.mapped_bytes,
    }
}

/// The buffer the application fills: one word per page.
fn touch(buf: &mut IoBuffer, seq: u64) {
    match buf {
        IoBuffer::App(b) => {
            for page in b.as_mut_slice().chunks_exact_mut(PAGE_SIZE) {
                page[..8].copy_from_slice(&seq.to_ne_bytes());
            }
        }
        IoBuffer::Pool(b) => {
            for off in (0..b.len()).step_by(PAGE_SIZE) {
                // Cannot fail: `off + 8 <= len` for every page.
                let _ = b.write_bytes(off, &seq.to_ne_bytes());
            }
        }
    }
}

/// The rendezvous points of one row. The IOMMU counters are read while every
/// thread is parked between setup and loop, and between loop and teardown,
/// so pool and window setup do not count as I/O-path work.
struct Phases {
    ready: Barrier,
    go: Barrier,
    done: Barrier,
    finished: Barrier,
}

type WorkerResult = Result<(u64, Duration, MapperStats), MapError>;

/// One thread's mapper and buffers: the unit both the timed table and
/// criterion's per-iteration measurement drive.
#[derive(Debug)]
pub struct BenchWorker {
    mapper: QueueMapper,
    free: Vec<IoBuffer>,
    returned: Vec<Returned>,
    seq: u64,
}

impl BenchWorker {
    /// A mapper for `mode` on `space` plus the buffers it needs: one pool
    /// buffer, or `batch + 1` application buffers (the flush queue holds up to
    /// `batch` of them).
    pub fn new(space: &Arc<DmaSpace>, spec: &BenchSpec) -> Result<Self, MapError> {
        let cfg = spec
            .mode
            .config(spec.io_size, spec.window_len, spec.max_delay);
        let mut mapper = QueueMapper::new(space, &cfg)?;
        let mut free: Vec<IoBuffer> = Vec::new();
        if let Some(pool) = mapper.pool() {
            free.push(pool.alloc()?.into());
        } else {
            for _ in 0..cfg.lazy.batch + 1 {
                free.push(AppBuffer::for_space(space, spec.io_size)?.into());
            }
        }
        Ok(Self {
            returned: Vec::with_capacity(free.len()),
            mapper,
            free,
            seq: 0,
        })
    }

    /// One map → touch → release cycle, recycling whatever comes back.
    #[inline]
    pub fn cycle(&mut self) -> Result<(), MapError> {
        let mut buf = loop {
            match self.free.pop() {
                Some(b) => break b,
                None => {
                    self.mapper.flush(&mut self.returned)?;
                    self.free.extend(self.returned.drain(..).map(|r| r.buf));
                }
            }
        };
        touch(&mut buf, self.seq);
        let len = buf.len();
        let m = self
            .mapper
            .map(buf, len, DmaDir::Bidirectional, self.seq)
            .map_err(|f| f.error)?;
        self.mapper.release(m, &mut self.returned)?;
        if self.seq % 64 == 0 {
            self.mapper.poll(&mut self.returned)?;
        }
        self.free.extend(self.returned.drain(..).map(|r| r.buf));
        self.seq += 1;
        Ok(())
    }

    /// Run `cycles` cycles and the final flush; the time it took.
    pub fn run(&mut self, cycles: u64) -> Result<Duration, MapError> {
        let t0 = Instant::now();
        for _ in 0..cycles {
            self.cycle()?;
        }
        self.flush()?;
        Ok(t0.elapsed())
    }

    /// Flush queued unmaps and take their buffers back.
    pub fn flush(&mut self) -> Result<(), MapError> {
        self.mapper.flush(&mut self.returned)?;
        self.free.extend(self.returned.drain(..).map(|r| r.buf));
        Ok(())
    }

    /// The mapper's counters.
    pub fn stats(&self) -> MapperStats {
        self.mapper.stats()
    }
}

fn run_until(w: &mut BenchWorker, stop: &AtomicBool) -> Result<(u64, Duration), MapError> {
    let t0 = Instant::now();
    let mut n = 0u64;
    // At least one cycle per thread, however late the scheduler runs it.
    loop {
        w.cycle()?;
        n += 1;
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    w.flush()?;
    Ok((n, t0.elapsed()))
}

/// One thread: set up, loop until `stop`, passing every barrier even on error.
fn worker(space: &Arc<DmaSpace>, spec: &BenchSpec, ph: &Phases, stop: &AtomicBool) -> WorkerResult {
    let built = BenchWorker::new(space, spec);
    ph.ready.wait();
    ph.go.wait();
    match built {
        Ok(mut w) => {
            let r = run_until(&mut w, stop).map(|(n, t)| (n, t, w.stats()));
            ph.done.wait();
            ph.finished.wait();
            r
        }
        Err(e) => {
            ph.done.wait();
            ph.finished.wait();
            Err(e)
        }
    }
}

/// Run one row: `spec.threads` threads of map → touch → unmap for `spec.duration`.
pub fn run_map_unmap(space: &Arc<DmaSpace>, spec: &BenchSpec) -> Result<BenchRow, MapError> {
    let threads = spec.threads.max(1);
    let ph = Phases {
        ready: Barrier::new(threads + 1),
        go: Barrier::new(threads + 1),
        done: Barrier::new(threads + 1),
        finished: Barrier::new(threads + 1),
    };
    let stop = AtomicBool::new(false);
    let counters = space.iommu().counters();
    let (results, before, after) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| worker(space, spec, &ph, &stop)))
            .collect();
        ph.ready.wait();
        let before = counters.snapshot();
        ph.go.wait();
        std::thread::sleep(spec.duration);
        stop.store(true, Ordering::Relaxed);
        ph.done.wait();
        let after = counters.snapshot();
        ph.finished.wait();
        let results: Vec<WorkerResult> = handles
            .into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect();
        (results, before, after)
    });
    let mut row = BenchRow {
        label: spec.mode.label(),
        threads,
        total: 0,
        per_thread: Vec::with_capacity(threads),
        elapsed: Duration::ZERO,
        stats: MapperStats::default(),
        iommu: delta(after, before),
    };
    for r in results {
        let (n, elapsed, stats) = r?;
        row.total += n;
        row.per_thread.push(n);
        row.elapsed = row.elapsed.max(elapsed);
        add_stats(&mut row.stats, &stats);
    }
    row.stats.iommu = after;
    Ok(row)
}

/// Run every mode in `modes` with `threads` threads for `duration` each.
pub fn run_table(
    space: &Arc<DmaSpace>,
    modes: &[BenchMode],
    threads: usize,
    duration: Duration,
) -> Result<Vec<BenchRow>, MapError> {
    modes
        .iter()
        .map(|&mode| run_map_unmap(space, &BenchSpec::new(mode, threads, duration)))
        .collect()
}

/// Render rows as a table; "vs best" compares total requests with the best row.
pub fn format_table(rows: &[BenchRow]) -> String {
    use std::fmt::Write;
    let best = rows.iter().map(|r| r.total).max().unwrap_or(0).max(1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<11} {:>3} {:>14} {:>14} {:>11} {:>9} {:>10} {:>10} {:>10}",
        "mode",
        "thr",
        "total req",
        "avg per CPU",
        "req/s",
        "vs best",
        "maps",
        "unmapcalls",
        "invals"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<11} {:>3} {:>14} {:>14.0} {:>11.0} {:>8.2}% {:>10} {:>10} {:>10}",
            r.label,
            r.threads,
            r.total,
            r.avg_per_thread(),
            r.rate(),
            (r.total as f64 - best as f64) / best as f64 * 100.0,
            r.iommu.maps,
            r.iommu.unmap_calls,
            r.iommu.invalidations,
        );
    }
    s
}
