//! One job: a thread, one queue, a tight submit/poll loop.
//!
//! The loop is generic over the queue (monomorphised per device) and over two
//! const flags — latency histogram on/off and verification on/off — so the
//! plain benchmark path carries no branches or work for features not in use.
//!
//! Per I/O the loop reads the clock just before it pushes the SQE (the
//! submit stamp) and again when the poll hands back its completion (the
//! completion stamp), so every latency is that I/O's own, not one stamp
//! shared by a batch. Per I/O it also draws an LBA and on completion adds
//! one latency sample to its direction's counters (an array index by
//! read/write: the same work as one shared set of counters).
//!
//! Per batch, not per I/O: the `--rate-iops` allowance (one division when a
//! rate is set) and a look at the per-second tick, which at most once a
//! second copies the latency histogram for the JSON time series.
//!
//! The files: this one holds what the run controller and a job share (the
//! phases, [`Shared`], [`JobSpec`]) and the entry [`run_many`]; `runner`
//! the loop itself (filling, pacing, submit and reap, the phases, the
//! drain); `accounting` what a completion does (slots, counts, histogram,
//! verification); `latency` the per-direction latency sums in clock ticks;
//! `result` what a job hands back ([`JobResult`]).

mod accounting;
mod latency;
mod result;
mod runner;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam::utils::CachePadded;

use crate::clock::Clock;
use crate::queue::{JobQueue, QueueError};
use crate::workload::{Distribution, Pattern};

pub use result::{new_histogram, process_cpu, Accesses, DirResult, JobResult};
use runner::{run_group, Runner};

/// Jobs wait for the go signal.
pub const PHASE_READY: u32 = 0;
/// Jobs run, their numbers are thrown away.
pub const PHASE_WARMUP: u32 = 1;
/// Jobs run and count.
pub const PHASE_MEASURE: u32 = 2;
/// Jobs stop issuing, drain and return.
pub const PHASE_STOP: u32 = 3;
/// Set-up failed somewhere: leave without running.
pub const PHASE_ABORT: u32 = 4;

/// How many failures a job describes in detail.
pub const MAX_FAILURE_DETAILS: usize = 8;

/// State the run controller and the jobs share.
#[derive(Debug)]
pub struct Shared {
    /// One of the `PHASE_*` values.
    pub phase: AtomicU32,
    /// Completions so far per job (for the per-second samples and progress).
    pub completed: Vec<CachePadded<AtomicU64>>,
    /// Jobs that have finished their I/O count (`-n`).
    pub finished: AtomicU32,
    /// Jobs that stopped on a queue error.
    pub failed: AtomicU32,
    /// Seconds of the measured phase sampled so far: the controller bumps it
    /// after each per-second sample, and jobs then snapshot their histograms.
    pub tick: AtomicU32,
}

impl Shared {
    /// State for `jobs` jobs.
    pub fn new(jobs: usize) -> Self {
        Shared {
            phase: AtomicU32::new(PHASE_READY),
            completed: (0..jobs)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            finished: AtomicU32::new(0),
            failed: AtomicU32::new(0),
            tick: AtomicU32::new(0),
        }
    }
}

/// What one job does.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Row number: one per (thread, namespace) pair, the index of its
    /// completion counter and of its line in the report.
    pub index: usize,
    /// The job thread (and so the core) it runs on.
    pub thread: usize,
    /// Namespace (1-based).
    pub nsid: u32,
    /// First LBA the job may touch.
    pub first_lba: u64,
    /// Blocks in the job's range.
    pub blocks: u64,
    /// Blocks per I/O.
    pub nlb: u32,
    /// Where a sequential stream starts (I/O-sized positions into the range).
    pub seq_start: u64,
    /// Logical block size in bytes.
    pub lbads: u32,
    /// Access pattern.
    pub pattern: Pattern,
    /// Percentage of reads.
    pub read_pct: u8,
    /// Queue depth.
    pub depth: usize,
    /// Stop after this many I/Os in the measured phase.
    pub ios_limit: Option<u64>,
    /// Seed for the LBA stream and the verify tags.
    pub seed: u64,
    /// Write tags and check reads.
    pub verify: bool,
    /// Record a latency histogram.
    pub histogram: bool,
    /// How buffers are mapped for the device (mcqio devices).
    pub dma: crate::queue::DmaMode,
    /// Lazy flush batch (`--dma-batch`).
    pub dma_batch: Option<usize>,
    /// How random positions are spread.
    pub distribution: Distribution,
    /// I/Os per second this job may start (`--rate-iops` / jobs).
    pub rate_iops: Option<u64>,
    /// How the job waits when a poll found nothing (`--wait`).
    pub wait: mcqio::WaitPolicy,
    /// When a polling job executes a spin-wait hint after a poll that
    /// found nothing ([`crate::run::PollPause`]).
    pub poll_pause: PauseRule,
}

/// When a polling job pauses after an empty poll (`--poll-pause`,
/// resolved for its device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseRule {
    /// After every empty poll.
    Always,
    /// With more than one command in flight.
    Busy,
    /// Never.
    Never,
}

impl PauseRule {
    /// The name `--poll-pause` and the report use.
    pub fn name(self) -> &'static str {
        match self {
            PauseRule::Always => "always",
            PauseRule::Busy => "busy",
            PauseRule::Never => "never",
        }
    }

    /// Whether to pause after an empty poll with `inflight` commands out.
    #[inline]
    fn applies(self, inflight: usize) -> bool {
        match self {
            PauseRule::Always => true,
            PauseRule::Busy => inflight > 1,
            PauseRule::Never => false,
        }
    }
}

/// Run one job on `q` until the controller says stop (or the I/O count is
/// reached). The caller pins the thread; this returns after draining.
#[cfg(test)]
pub fn run<Q: JobQueue>(
    q: Q,
    spec: &JobSpec,
    shared: &Shared,
    clock: Clock,
    ready: impl FnOnce(Result<(), String>),
) -> Result<JobResult, QueueError> {
    let mut r = run_many(vec![q], std::slice::from_ref(spec), shared, clock, ready)?;
    Ok(r.pop().expect("one job, one result"))
}

/// Run several jobs from the calling thread, each on its own queue
/// (`qs[i]` serves `specs[i]`), taking turns: spdk_nvme_perf's namespace
/// contexts of one worker, each with its own queue pair and queue depth.
/// The caller pins the thread; this returns after draining them all.
pub fn run_many<Q: JobQueue>(
    qs: Vec<Q>,
    specs: &[JobSpec],
    shared: &Shared,
    clock: Clock,
    ready: impl FnOnce(Result<(), String>),
) -> Result<Vec<JobResult>, QueueError> {
    assert_eq!(qs.len(), specs.len(), "a queue per job");
    for (q, spec) in qs.iter().zip(specs) {
        let need = spec.nlb as usize * spec.lbads as usize;
        let e = if q.depth() < spec.depth {
            // A depth limit, not a buffer problem.
            Some(QueueError(format!(
                "queue depth {} is deeper than this device's queue pair ({} slots): use -q {} or less",
                spec.depth,
                q.depth(),
                q.depth()
            )))
        } else if q.buffer_len() < need {
            Some(QueueError(format!(
                "the queue offers {} slots of {} bytes; the job needs {} of {need}",
                q.depth(),
                q.buffer_len(),
                spec.depth
            )))
        } else {
            None
        };
        if let Some(e) = e {
            ready(Err(e.to_string()));
            return Err(e);
        }
    }
    let (histogram, verify) = specs
        .first()
        .map_or((false, false), |s| (s.histogram, s.verify));
    macro_rules! group {
        ($h:literal, $v:literal) => {
            run_group::<Q, $h, $v>(
                qs.into_iter()
                    .zip(specs)
                    .map(|(q, spec)| Runner::new(q, spec, clock.clone()))
                    .collect(),
                shared,
                ready,
            )
        };
    }
    let r = match (histogram, verify) {
        (false, false) => group!(false, false),
        (true, false) => group!(true, false),
        (false, true) => group!(false, true),
        (true, true) => group!(true, true),
    };
    if r.is_err() {
        shared.failed.fetch_add(1, Ordering::Release);
    }
    r
}
