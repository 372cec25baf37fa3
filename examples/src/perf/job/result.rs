//! What a job measured: its result, per direction, the engine's register
//! accesses, and the CPU time it used.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::queue::JobQueue;
#[cfg(doc)]
use crate::workload::Op;

use super::JobSpec;

/// Highest latency the histogram tracks (60 s, in ns); larger values saturate.
pub const HIST_MAX_NS: u64 = 60_000_000_000;

/// A fresh latency histogram (ns, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("static histogram bounds are valid")
}
/// CPU time (user, system) of the calling thread.
pub fn thread_cpu() -> (Duration, Duration) {
    cpu(libc::RUSAGE_THREAD)
}

/// CPU time (user, system) of the whole process.
pub fn process_cpu() -> (Duration, Duration) {
    cpu(libc::RUSAGE_SELF)
}

fn cpu(who: libc::c_int) -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the owned `ru`.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// What a job measured.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Job number.
    pub index: usize,
    /// Namespace.
    pub nsid: u32,
    /// I/Os completed (successfully or not) in the measured phase.
    pub ios: u64,
    /// Reads (`dir[0]`, [`Op::Read`]) and writes (`dir[1]`) among them.
    pub dir: [DirResult; 2],
    /// I/Os that failed (any phase, including prefill and drain).
    pub errors: u64,
    /// Reads whose data did not verify (any phase).
    pub verify_mismatches: u64,
    /// Blocks checked by verification.
    pub verified_blocks: u64,
    /// The first failures, described.
    pub failures: Vec<String>,
    /// Latencies (both directions) completed since the previous snapshot,
    /// one entry per controller tick the job saw: (tick, sparse histogram
    /// as (value ns, count) pairs). Sparse, because a full histogram is a
    /// few hundred KiB and a long run has one per second per job.
    pub snapshots: Vec<(u32, Vec<(u64, u64)>)>,
    /// The cumulative histogram at the last snapshot (to take differences).
    pub(super) last_snapshot: Option<Histogram<u64>>,
    /// Length of the measured phase.
    pub elapsed: Duration,
    /// User CPU time in the measured phase.
    pub cpu_usr: Duration,
    /// System CPU time in the measured phase.
    pub cpu_sys: Duration,
    /// Whether `cpu_usr`/`cpu_sys` are this job's thread's: of several jobs
    /// on one thread, one reports the thread's CPU and the others none.
    pub cpu_owner: bool,
    /// Blocks written by the verify prefill.
    pub prefill_blocks: u64,
    /// Slots retired because a command ended without its buffer (the
    /// device may still access it); they count in `errors` too.
    pub lost_slots: u64,
    /// The engine's register accesses and system-clock calls during the
    /// measured phase (`None`: not an engine queue).
    pub accesses: Option<Accesses>,
    /// Latency-clock reads during the measured phase.
    pub clock_reads: u64,
}

/// What the engine's queue did during the measured phase, from its
/// counters ([`mcqio::QueueCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accesses {
    /// Doorbell register stores.
    pub doorbell_writes: u64,
    /// Register loads.
    pub register_reads: u64,
    /// The engine's system-clock calls (its coarse timeout clock).
    pub system_clock_reads: u64,
    /// System calls the wire made on the I/O path (NVMe/TCP: `sendmsg`
    /// and `recv`; 0 on wires that make none).
    pub wire_syscalls: u64,
    /// Sleeps on the queue's interrupt (`--wait irq|hybrid`).
    pub interrupt_sleeps: u64,
    /// Of those, the sleeps the interrupt ended.
    pub interrupt_wakeups: u64,
}

impl Accesses {
    pub(super) fn between(
        a: &(mcqio::QueueCounters, u64),
        b: &(mcqio::QueueCounters, u64),
    ) -> Self {
        let ((a, wa), (b, wb)) = (a, b);
        Accesses {
            doorbell_writes: b.doorbell_writes - a.doorbell_writes,
            register_reads: b.register_reads - a.register_reads,
            system_clock_reads: b.system_clock_reads - a.system_clock_reads,
            wire_syscalls: wb.saturating_sub(*wa),
            interrupt_sleeps: b.interrupt_sleeps - a.interrupt_sleeps,
            interrupt_wakeups: b.interrupt_wakeups - a.interrupt_wakeups,
        }
    }
}

/// A queue's engine counters with its wire's system calls.
pub(super) fn counters_of<Q: JobQueue>(q: &Q) -> Option<(mcqio::QueueCounters, u64)> {
    q.counters().map(|c| (c, q.wire_syscalls()))
}

/// What one direction (reads or writes) of a job measured.
#[derive(Debug, Clone)]
pub struct DirResult {
    /// I/Os completed in the measured phase.
    pub ios: u64,
    /// Sum of latencies, ns.
    pub lat_sum_ns: u64,
    /// Smallest latency, ns.
    pub lat_min_ns: u64,
    /// Largest latency, ns.
    pub lat_max_ns: u64,
    /// Latency histogram, if requested.
    pub hist: Option<Histogram<u64>>,
}

impl DirResult {
    pub(super) fn new(histogram: bool) -> Self {
        DirResult {
            ios: 0,
            lat_sum_ns: 0,
            lat_min_ns: u64::MAX,
            lat_max_ns: 0,
            hist: histogram.then(new_histogram),
        }
    }

    fn reset(&mut self) {
        self.ios = 0;
        self.lat_sum_ns = 0;
        self.lat_min_ns = u64::MAX;
        self.lat_max_ns = 0;
        if let Some(h) = &mut self.hist {
            h.reset();
        }
    }
}

impl JobResult {
    pub(super) fn new(spec: &JobSpec) -> Self {
        JobResult {
            index: spec.index,
            nsid: spec.nsid,
            ios: 0,
            dir: [
                DirResult::new(spec.histogram),
                DirResult::new(spec.histogram),
            ],
            errors: 0,
            verify_mismatches: 0,
            verified_blocks: 0,
            failures: Vec::new(),
            snapshots: Vec::new(),
            last_snapshot: None,
            elapsed: Duration::ZERO,
            cpu_usr: Duration::ZERO,
            cpu_sys: Duration::ZERO,
            cpu_owner: false,
            prefill_blocks: 0,
            lost_slots: 0,
            accesses: None,
            clock_reads: 0,
        }
    }

    pub(super) fn reset_counts(&mut self) {
        self.ios = 0;
        self.dir.iter_mut().for_each(DirResult::reset);
        self.snapshots.clear();
        self.last_snapshot = None;
    }

    /// Reads and writes together: (sum, min, max) of latency in ns.
    pub fn lat_ns(&self) -> (u64, u64, u64) {
        let [r, w] = &self.dir;
        (
            r.lat_sum_ns.saturating_add(w.lat_sum_ns),
            r.lat_min_ns.min(w.lat_min_ns),
            r.lat_max_ns.max(w.lat_max_ns),
        )
    }

    /// Reads and writes together: the merged histogram, if recorded.
    pub fn hist(&self) -> Option<Histogram<u64>> {
        let [r, w] = &self.dir;
        let mut h = r.hist.clone()?;
        if let Some(w) = &w.hist {
            let _ = h.add(w);
        }
        Some(h)
    }
}
