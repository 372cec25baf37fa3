//! One job: a thread, one queue, a tight submit/poll loop.
//!
//! The loop is generic over the queue (monomorphised per device) and over two
//! const flags — latency histogram on/off and verification on/off — so the
//! plain benchmark path carries no branches or work for features not in use.
//!
//! Per I/O the loop reads the clock just before it pushes the SQE (the
//! submit stamp) and again when the poll hands back its completion (the
//! completion stamp), so every latency is that I/O's own (issue 29 item 1:
//! stamps shared by a batch gave every I/O of the batch one latency). Per
//! I/O it also draws an LBA and on completion adds one latency sample to
//! its direction's counters (an array index by read/write: the same work
//! as one shared set of counters, issue 16 item 8).
//!
//! Per batch, not per I/O: the `--rate-iops` allowance (one division when a
//! rate is set) and a look at the per-second tick, which at most once a
//! second copies the latency histogram for the JSON time series.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam::utils::CachePadded;
use hdrhistogram::Histogram;

use crate::clock::Clock;
use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::verify::{self, Mismatch, VerifyMap, UNKNOWN};
use crate::workload::{Distribution, IoGen, Op, Pattern};

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

/// The longest one idle wait of `--wait irq|hybrid` lasts with I/O in
/// flight.
const IDLE_WAIT: Duration = Duration::from_millis(10);

/// The longest a rate-limited job with nothing in flight sleeps before
/// its next I/O is due. The controller unparks the job threads at each
/// phase change and per-second tick, so this bound only limits a sleep
/// nobody ends: each wake-up of an idle job costs CPU (issue 26's "an
/// idle queue pair uses under 1 % of a CPU" at 1 IOPS).
const IDLE_SLEEP: Duration = Duration::from_millis(250);

/// Highest latency the histogram tracks (60 s, in ns); larger values saturate.
pub const HIST_MAX_NS: u64 = 60_000_000_000;

/// A fresh latency histogram (ns, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("static histogram bounds are valid")
}

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
    pub dma: crate::run::DmaMode,
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
    last_snapshot: Option<Histogram<u64>>,
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
    fn between(a: &(mcqio::QueueCounters, u64), b: &(mcqio::QueueCounters, u64)) -> Self {
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
fn counters_of<Q: JobQueue>(q: &Q) -> Option<(mcqio::QueueCounters, u64)> {
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
    fn new(histogram: bool) -> Self {
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
    fn new(spec: &JobSpec) -> Self {
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

    fn reset_counts(&mut self) {
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

#[derive(Debug, Clone, Copy)]
struct Slot {
    t_submit: u64,
    slba: u64,
    op: Op,
    generation: u32,
}

/// Everything but the queue, so completions can update it while the queue
/// is borrowed by `reap`.
struct State<'a, const H: bool, const V: bool> {
    spec: &'a JobSpec,
    free: FreeSlots,
    slots: Vec<Slot>,
    bufs: Vec<NonNull<u8>>,
    res: JobResult,
    vmap: Option<VerifyMap>,
    /// Completions count toward `res` (false during prefill and drain;
    /// tested only with a histogram, see `complete`).
    counting: bool,
    /// I/Os pushed and I/Os completed (however they ended): their
    /// difference is what is in flight, so an I/O moves one counter at
    /// each end instead of two (issue 28).
    submitted: u64,
    completed_total: u64,
    /// `submitted + completed_total` when the measured phase began: every
    /// push and every completion reads the latency clock once, so the
    /// measured phase's clock reads are what these counters moved since,
    /// plus the reads `res.clock_reads` counts itself (rate-limit checks,
    /// refused pushes), with no count per I/O.
    reads_base: u64,
    /// Per direction, a run of equal latencies not yet added to the
    /// histogram (recorded with one `record_n`): at the histogram's
    /// resolution neighbouring I/Os often take the same time.
    hist_ns: [u64; 2],
    hist_n: [u64; 2],
    /// Per direction, the measured phase's latency sum, min and max in
    /// clock ticks: converted to ns once, at the end (`lat_into_ns`), not
    /// per I/O (issue 28).
    lat_ticks: [LatTicks; 2],
}

/// A direction's latency sum, min and max, in clock ticks, and its I/O
/// count. The count is the direction's `ios` and, with the other
/// direction's, the job's: one increment per I/O instead of two (issue
/// 28). It is kept apart from `sum`: side by side, the two additions were
/// merged into one vector addition that took three more instructions.
///
/// The extremes are kept as the minimum `lo` and the width `span` of the
/// range seen, so a latency outside it is found with one subtraction and
/// one compare (`ticks - lo > span`, unsigned: below `lo` wraps to a large
/// value), where testing the minimum and the maximum apart took two
/// compares, two jumps and the entry's address (issue 28).
#[derive(Clone, Copy, Debug)]
struct LatTicks {
    sum: u64,
    lo: u64,
    span: u64,
    n: u64,
}

impl LatTicks {
    /// No latency yet: any but `u64::MAX` ticks is outside the range, and
    /// the first one sets it (`extreme`); `n` says whether there is any.
    const EMPTY: LatTicks = LatTicks {
        sum: 0,
        lo: u64::MAX,
        span: 0,
        n: 0,
    };

    /// Count one latency of `ticks`.
    #[inline(always)]
    fn add(lats: &mut [LatTicks; 2], d: usize, ticks: u64) {
        let lat = &mut lats[d];
        lat.n += 1;
        lat.sum = lat.sum.wrapping_add(ticks);
        // A new extreme is rare: a compare and an untaken jump, the
        // stores in a cold call (inline, their address was computed on
        // every completion, issue 28).
        if ticks.wrapping_sub(lat.lo) > lat.span {
            LatTicks::extreme(lats, d, ticks);
        }
    }

    /// `ticks` is a new minimum or maximum of direction `d`, or its first
    /// latency. Given the array and the index: given the entry, the caller
    /// computed its address on every completion (issue 28).
    #[cold]
    #[inline(never)]
    fn extreme(lats: &mut [LatTicks; 2], d: usize, ticks: u64) {
        let lat = &mut lats[d];
        // `n` was counted first: 1 for the first latency.
        let (min, max) = if lat.n == 1 {
            (ticks, ticks)
        } else {
            (lat.min().min(ticks), lat.max().max(ticks))
        };
        lat.lo = min;
        lat.span = max - min;
    }

    /// The smallest latency (meaningful when `n > 0`).
    fn min(&self) -> u64 {
        self.lo
    }

    /// The largest latency (meaningful when `n > 0`).
    fn max(&self) -> u64 {
        self.lo.wrapping_add(self.span)
    }
}

/// The job's free slots, a stack that never grows: a push never
/// allocates (`Vec::push` might, and its call kept the completion path's
/// values on the stack around it, issue 28), and a push past the
/// capacity (a slot freed twice) panics instead of growing.
struct FreeSlots(Vec<u32>);

impl FreeSlots {
    /// Slots `0..depth`, slot 0 popped first (LIFO keeps hot buffers hot).
    fn new(depth: usize) -> Self {
        FreeSlots((0..depth as u32).rev().collect())
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<u32> {
        self.0.pop()
    }

    #[inline(always)]
    fn push(&mut self, slot: u32) {
        // Makes `Vec::push`'s own capacity test, and its call to grow,
        // dead code.
        assert!(self.0.len() < self.0.capacity(), "a job slot freed twice");
        self.0.push(slot);
    }
}

impl<const H: bool, const V: bool> State<'_, H, V> {
    /// Add the pending run of equal latencies to the histogram.
    #[inline]
    fn flush_hist(&mut self) {
        if H {
            for d in 0..2 {
                if self.hist_n[d] > 0 {
                    if let Some(h) = self.res.dir[d].hist.as_mut() {
                        h.saturating_record_n(self.hist_ns[d].max(1), self.hist_n[d]);
                    }
                    self.hist_n[d] = 0;
                }
            }
        }
    }

    /// I/Os in flight.
    #[inline(always)]
    fn inflight(&self) -> usize {
        (self.submitted - self.completed_total) as usize
    }

    /// Start counting the measured phase's clock reads from here.
    fn reset_clock_reads(&mut self) {
        self.res.clock_reads = 0;
        self.reads_base = self.submitted + self.completed_total;
    }

    /// Clock reads since [`reset_clock_reads`](Self::reset_clock_reads).
    fn clock_reads(&self) -> u64 {
        self.res.clock_reads + (self.submitted + self.completed_total - self.reads_base)
    }

    /// Put the measured I/O counts and latency sums, minima and maxima
    /// into the result, in ns (one conversion per run instead of one per
    /// I/O).
    fn lat_into_ns(&mut self, clock: &Clock) {
        self.res.ios = self.lat_ticks.iter().map(|l| l.n).sum();
        for (dir, lat) in self.res.dir.iter_mut().zip(&self.lat_ticks) {
            dir.ios = lat.n;
            dir.lat_sum_ns = clock.ticks_to_ns(lat.sum);
            (dir.lat_min_ns, dir.lat_max_ns) = match lat.n {
                0 => (u64::MAX, 0),
                _ => (clock.ticks_to_ns(lat.min()), clock.ticks_to_ns(lat.max())),
            };
        }
    }

    /// Copy the cumulative histogram for the second that just ended (once a
    /// second, on the controller's tick).
    #[cold]
    fn snapshot(&mut self, tick: u32) {
        self.flush_hist();
        let Some(cur) = self.res.hist() else {
            return;
        };
        let mut delta = cur.clone();
        if let Some(prev) = &self.res.last_snapshot {
            if delta.subtract(prev).is_err() {
                return;
            }
        }
        let sparse = delta
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect();
        self.res.snapshots.push((tick, sparse));
        self.res.last_snapshot = Some(cur);
    }

    fn fail(&mut self, msg: impl FnOnce() -> String) {
        if self.res.failures.len() < MAX_FAILURE_DETAILS {
            let m = msg();
            self.res.failures.push(format!(
                "job {} ns {}: {m}",
                self.spec.index, self.spec.nsid
            ));
        }
    }

    #[inline(always)]
    fn complete(&mut self, slot: usize, status: IoStatus, now: u64, clock: &Clock) {
        // Only the fields a successful I/O needs are loaded here; the
        // failure paths read the whole record (issue 28).
        let (t_submit, op) = {
            let s = &self.slots[slot];
            (s.t_submit, s.op)
        };
        self.completed_total += 1;
        match status {
            IoStatus::Ok => self.free.push(slot as u32),
            IoStatus::Failed(why) => {
                self.free.push(slot as u32);
                self.failed(slot, why);
            }
            IoStatus::Lost(why) => {
                // Not freed: the device may still access the slot's memory.
                self.lose(slot, self.slots[slot], why);
                return;
            }
        }
        if V {
            let s = self.slots[slot];
            let nlb = self.spec.nlb;
            let ok = status == IoStatus::Ok;
            if let Some(vmap) = self.vmap.as_mut() {
                match s.op {
                    Op::Write => vmap.release_written(s.slba, nlb, ok.then_some(s.generation)),
                    Op::Read => vmap.release(s.slba, nlb),
                }
            }
            if ok && s.op == Op::Read {
                self.check_read(slot, s);
            }
        }
        // Without a histogram the counts and sums take every completion:
        // those outside the measured phase (prefill, warm-up, drain) land
        // in sums that are reset when it begins, or that were read when it
        // ended (`lat_into_ns`), so the flag's test is left out (issue
        // 28). A histogram is flushed on every reap, drain included, so
        // it keeps the test.
        if !H || self.counting {
            let ticks = now.wrapping_sub(t_submit);
            let d = op as usize;
            LatTicks::add(&mut self.lat_ticks, d, ticks);
            if H {
                let ns = clock.ticks_to_ns(ticks);
                if ns == self.hist_ns[d] {
                    self.hist_n[d] += 1;
                } else {
                    if self.hist_n[d] > 0 {
                        if let Some(h) = self.res.dir[d].hist.as_mut() {
                            h.saturating_record_n(self.hist_ns[d].max(1), self.hist_n[d]);
                        }
                    }
                    self.hist_ns[d] = ns;
                    self.hist_n[d] = 1;
                }
            }
        }
    }

    /// The I/O in `slot` failed (its buffer came back).
    #[cold]
    fn failed(&mut self, slot: usize, why: Failure) {
        let s = self.slots[slot];
        let nlb = self.spec.nlb;
        self.res.errors += 1;
        let op = s.op;
        self.fail(|| format!("{op:?} of {nlb} blocks at LBA {} failed: {why}", s.slba));
    }

    /// Every slot is retired (see [`State::lose`]): nothing can be issued.
    #[cold]
    fn all_lost(&self) -> QueueError {
        QueueError(format!(
            "job {}: every slot's buffer may still be accessed by the device ({} lost); stopping",
            self.spec.index, self.res.lost_slots
        ))
    }

    /// A command ended without its buffer: its slot is retired (never
    /// pushed again) and, under verification, its blocks stay claimed (a
    /// lost write may still land, so they are never rewritten or checked).
    #[cold]
    fn lose(&mut self, slot: usize, s: Slot, why: Failure) {
        let nlb = self.spec.nlb;
        self.res.errors += 1;
        self.res.lost_slots += 1;
        let op = s.op;
        self.fail(|| {
            format!(
                "{op:?} of {nlb} blocks at LBA {} failed: {why}; its buffer did not come back \
                 (the device may still access it), so slot {slot} is never used again",
                s.slba
            )
        });
    }

    #[cold]
    fn check_read(&mut self, slot: usize, s: Slot) {
        let lbads = self.spec.lbads as usize;
        let Some(vmap) = self.vmap.as_ref() else {
            return;
        };
        let mut bad: Option<Mismatch> = None;
        for b in 0..self.spec.nlb as usize {
            let lba = s.slba + b as u64;
            let generation = vmap.generation(lba);
            if generation == UNKNOWN {
                continue;
            }
            self.res.verified_blocks += 1;
            // SAFETY: the slot's buffer holds nlb * lbads bytes, is 8-aligned
            // (page-aligned slots, lbads >= 512) and the I/O has completed.
            let block = unsafe { self.bufs[slot].add(b * lbads) };
            let seed = self.spec.seed;
            // SAFETY: see above.
            let checked =
                unsafe { verify::check_block(block, lbads, lba, seed, generation as u64) };
            if let Err(m) = checked {
                bad = Some(m);
                break;
            }
        }
        if let Some(m) = bad {
            self.res.verify_mismatches += 1;
            self.fail(|| format!("verify: {m}"));
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
            // A depth limit, not a buffer problem (issue 29 item 9).
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

struct Runner<'a, Q, const H: bool, const V: bool> {
    q: Q,
    st: State<'a, H, V>,
    /// Apart from `st`, so a completion callback can read it while `st` is
    /// borrowed mutably.
    clock: Clock,
    /// Clock ticks between two I/O starts under `--rate-iops` (0: no limit).
    rate_ticks: u64,
    /// The tick at which the next rate-limited I/O may start.
    rate_next: u64,
    /// How far behind its schedule a paced job may fall and still catch up,
    /// in ticks: one second of the rate, or one queue's worth if that is
    /// longer. A stall shorter than this (a descheduled thread, a device
    /// that paused) is made up by starting the owed I/Os as slots free, as
    /// fio's linear rate does; a longer one is forgiven beyond it, and the
    /// run reports the shortfall instead of bursting to make it up.
    rate_window: u64,
}

impl<'a, Q: JobQueue, const H: bool, const V: bool> Runner<'a, Q, H, V> {
    fn new(q: Q, spec: &'a JobSpec, clock: Clock) -> Self {
        let depth = spec.depth.min(q.depth());
        let bufs = (0..depth).map(|i| q.buffer(i)).collect();
        let first = Slot {
            t_submit: 0,
            slba: 0,
            op: Op::Read,
            generation: 0,
        };
        Runner {
            st: State {
                spec,
                free: FreeSlots::new(depth),
                slots: vec![first; depth],
                bufs,
                res: JobResult::new(spec),
                vmap: V.then(|| VerifyMap::new(spec.first_lba, spec.blocks, UNKNOWN)),
                counting: false,
                submitted: 0,
                completed_total: 0,
                reads_base: 0,
                hist_ns: [0; 2],
                hist_n: [0; 2],
                lat_ticks: [LatTicks::EMPTY; 2],
            },
            q,
            clock,
            rate_ticks: 0,
            rate_next: 0,
            rate_window: 0,
        }
    }

    /// Pace I/O starts at `rate` per second from now.
    fn set_rate(&mut self, rate: u64) {
        self.rate_ticks = ((self.clock.ticks_per_sec() / rate as f64) as u64).max(1);
        self.rate_window = (self.clock.ticks_per_sec() as u64)
            .max(self.rate_ticks.saturating_mul(self.st.spec.depth as u64));
        self.rate_next = self.clock.now();
    }

    /// Fill free slots from `gen`, up to `budget` more I/Os.
    #[inline(always)]
    fn fill(&mut self, gen: &mut IoGen, budget: &mut u64) -> Result<(), QueueError> {
        if self.st.free.is_empty() {
            if self.st.inflight() == 0 {
                return Err(self.st.all_lost());
            }
            return Ok(());
        }
        if *budget == 0 {
            return Ok(());
        }
        let st = &mut self.st;
        let nlb = st.spec.nlb;
        // I/Os this batch may start: the budget, and under a rate limit the
        // I/Os whose start time has come (one clock read and one division
        // per batch, only under a rate limit).
        let mut n = *budget;
        if self.rate_ticks > 0 {
            let t = self.clock.now();
            st.res.clock_reads += 1;
            if t < self.rate_next {
                return Ok(());
            }
            // After a stall, catch up by at most the window.
            let floor = t.saturating_sub(self.rate_window);
            self.rate_next = self.rate_next.max(floor);
            let due = (t - self.rate_next)
                .checked_div(self.rate_ticks)
                .unwrap_or(0);
            n = n.min(due + 1);
        }
        let n0 = n;
        // The clock's source decided once per batch, not per stamp.
        let result = if self.clock.is_tsc() {
            Self::fill_n::<true>(&mut self.q, st, gen, &mut n, &self.clock, nlb)
        } else {
            Self::fill_n::<false>(&mut self.q, st, gen, &mut n, &self.clock, nlb)
        };
        let issued = n0 - n;
        // Counted here, once per batch: `fill_n` counts `n` down for each
        // I/O it starts (issue 28).
        self.st.submitted += issued;
        *budget -= issued;
        self.rate_next = self
            .rate_next
            .wrapping_add(issued.wrapping_mul(self.rate_ticks));
        result
    }

    /// Start up to `n` I/Os, each stamped as it is pushed, counting `n` down
    /// (the caller adds what it counted to `submitted`).
    #[inline(always)]
    fn fill_n<const TSC: bool>(
        q: &mut Q,
        st: &mut State<'a, H, V>,
        gen: &mut IoGen,
        n: &mut u64,
        clock: &Clock,
        nlb: u32,
    ) -> Result<(), QueueError> {
        while *n > 0 {
            let Some(slot) = st.free.pop() else { break };
            let (op, slba) = gen.draw();
            let mut generation = 0;
            if V {
                let vmap = st.vmap.as_mut().expect("verify map exists in verify mode");
                if !vmap.try_claim(slba, nlb) {
                    st.free.push(slot);
                    break;
                }
                if op == Op::Write {
                    generation = vmap.next_generation(slba);
                    let lbads = st.spec.lbads as usize;
                    for b in 0..nlb as usize {
                        // SAFETY: the slot is not in flight; its buffer holds
                        // nlb * lbads bytes and is 8-aligned.
                        unsafe {
                            verify::write_block(
                                st.bufs[slot as usize].add(b * lbads),
                                lbads,
                                slba + b as u64,
                                st.spec.seed,
                                generation as u64,
                            )
                        };
                    }
                }
            }
            // Counted as `submitted` (by the caller) or, refused, below.
            let t = clock.read::<TSC>();
            // The record is written before the push, so the stamp, LBA and
            // operation need not be kept in registers (or on the stack)
            // across it (issue 28). A refused push leaves it unused: the
            // slot goes back to `free`, and a record is read only after
            // its I/O completes.
            // SAFETY: `slot` was popped from `free`, which holds only
            // indices below `slots.len()`: it starts as `0..depth` with
            // `depth` slots, and only slots popped from it (here, on a
            // refused push or claim) or checked by indexing `slots`
            // (`complete`) go back. The compare the index made was one
            // more per I/O than the loop needs (issue 28).
            let s = unsafe { st.slots.get_unchecked_mut(slot as usize) };
            s.t_submit = t;
            s.slba = slba;
            s.op = op;
            if V {
                // Read only under verification.
                s.generation = generation;
            }
            match q.push(slot as usize, IoReq { op, slba, nlb }) {
                Ok(()) => *n -= 1,
                Err(e) => {
                    st.res.clock_reads += 1;
                    if V {
                        if let Some(v) = st.vmap.as_mut() {
                            v.release(slba, nlb);
                        }
                    }
                    st.free.push(slot);
                    match e {
                        PushError::Full => break,
                        // The queue refused a request the job built: a bug
                        // or a device limit, not a device error. Stop.
                        PushError::Rejected(why) => {
                            return Err(QueueError(format!(
                                "{op:?} of {nlb} blocks at LBA {slba} rejected: {why}"
                            )))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `--wait irq|hybrid`, after a poll found nothing: with I/O in
    /// flight, wait on the queue (it sleeps on its interrupt as its policy
    /// says) until the next rate-limited I/O is due; with none, under a
    /// rate limit, sleep until then. At most [`IDLE_WAIT`] with I/O in
    /// flight; with none, at most [`IDLE_SLEEP`], since the controller
    /// unparks the job threads at phase changes and per-second samples.
    #[cold]
    #[inline(never)]
    fn idle_wait(&mut self, budget: u64) -> Result<usize, QueueError> {
        let now = self.clock.now();
        let due = if self.rate_ticks > 0 && budget > 0 {
            Duration::from_nanos(self.clock.ticks_to_ns(self.rate_next.saturating_sub(now)))
        } else {
            IDLE_WAIT
        };
        if self.st.inflight() == 0 {
            let t = due.min(IDLE_SLEEP);
            if self.rate_ticks > 0 && !t.is_zero() {
                // Ended early by the controller's unpark (phase change,
                // per-second tick); a spurious return only costs a turn.
                std::thread::park_timeout(t);
            }
            return Ok(0);
        }
        let t = due.min(IDLE_WAIT);
        let st = &mut self.st;
        let clock = &self.clock;
        let n = self.q.wait(t, |slot, status| {
            st.complete(slot, status, clock.now(), clock);
        })?;
        // Its clock reads, one per completion, are counted by those.
        st.flush_hist();
        Ok(n)
    }

    /// Submit and reap once.
    #[inline(always)]
    fn turn(&mut self) -> Result<usize, QueueError> {
        // The clock's source decided once per poll, not per stamp.
        if self.clock.is_tsc() {
            self.turn_with::<true>()
        } else {
            self.turn_with::<false>()
        }
    }

    /// [`turn`](Self::turn) with the clock's source decided (`TSC`:
    /// [`Clock::is_tsc`]).
    #[inline(always)]
    fn turn_with<const TSC: bool>(&mut self) -> Result<usize, QueueError> {
        self.q.submit(self.st.inflight())?;
        let st = &mut self.st;
        let clock = &self.clock;
        // `move`: the callback holds the state's address itself, not the
        // address of a local that holds it (one load fewer per I/O).
        let n = self.q.reap(
            #[inline(always)]
            move |slot, status| {
                st.complete(slot, status, clock.read::<TSC>(), clock);
            },
        )?;
        let st = &mut self.st;
        // Its clock reads, one per completion, are counted by those.
        st.flush_hist();
        Ok(n)
    }

    /// Write every block of the job's range once so reads have something to check.
    fn prefill(&mut self) -> Result<(), QueueError> {
        let spec = self.st.spec;
        let mut gen = IoGen::new(
            Pattern::Write,
            0,
            spec.first_lba,
            spec.blocks,
            spec.nlb,
            0,
            spec.seed,
        );
        let positions = spec.blocks / spec.nlb as u64;
        let mut budget = positions;
        while budget > 0 || self.st.inflight() > 0 {
            self.fill(&mut gen, &mut budget)?;
            self.turn()?;
        }
        self.st.res.prefill_blocks = positions * spec.nlb as u64;
        Ok(())
    }

    /// Before the run: the verify prefill, if any.
    fn prepare(&mut self) -> Result<(), QueueError> {
        if V {
            self.prefill()?;
            // The per-second IOPS samples read this counter: the prefill's
            // completions happened before the run and must not land in the
            // first sample.
            self.st.completed_total = 0;
            self.st.submitted = 0;
        }
        Ok(())
    }

    /// The loop state of a job that starts in `phase` (warm-up or measure).
    fn begin<'s>(&mut self, shared: &'s Shared, phase: u32) -> Pass<'s> {
        let spec = self.st.spec;
        let seed = spec.seed ^ (spec.index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let gen = IoGen::with_distribution(
            spec.pattern,
            spec.read_pct,
            spec.first_lba,
            spec.blocks,
            spec.nlb,
            spec.seq_start,
            seed,
            spec.distribution,
        );
        if let Some(rate) = spec.rate_iops.filter(|&r| r > 0) {
            self.set_rate(rate);
        }
        let mut p = Pass {
            phase,
            gen,
            counter: &shared.completed[spec.index],
            budget: u64::MAX,
            t_start: self.clock.now(),
            cpu_start: thread_cpu(),
            t_end: 0,
            measuring: false,
            tick: shared.tick.load(Ordering::Relaxed),
            counters_start: None,
        };
        if phase == PHASE_MEASURE {
            p.measuring = true;
            // The prefill's completions were summed (see `complete`).
            self.st.lat_ticks = [LatTicks::EMPTY; 2];
            self.st.counting = true;
            p.budget = spec.ios_limit.unwrap_or(u64::MAX);
            self.st.reset_clock_reads();
            p.counters_start = counters_of(&self.q);
        }
        p
    }

    /// One turn of the job loop: follow the phase, start what may start,
    /// submit and reap. `Ok(false)` once the job is done (stopped, or its
    /// I/O count reached and drained).
    #[inline(always)]
    fn pass(&mut self, p: &mut Pass<'_>, shared: &Shared) -> Result<bool, QueueError> {
        let spec = self.st.spec;
        let ph = shared.phase.load(Ordering::Relaxed);
        if ph != p.phase {
            p.phase = ph;
            if p.phase == PHASE_MEASURE && !p.measuring {
                p.measuring = true;
                self.st.hist_n = [0; 2];
                self.st.res.reset_counts();
                self.st.lat_ticks = [LatTicks::EMPTY; 2];
                self.st.counting = true;
                p.budget = spec.ios_limit.unwrap_or(u64::MAX);
                p.t_start = self.clock.now();
                p.cpu_start = thread_cpu();
                self.st.reset_clock_reads();
                p.counters_start = counters_of(&self.q);
            } else if p.phase >= PHASE_STOP {
                if H && p.measuring {
                    // Pairs with the controller's Release store of STOP,
                    // made after its last tick: that tick is visible.
                    std::sync::atomic::fence(Ordering::Acquire);
                    let k = shared.tick.load(Ordering::Relaxed);
                    if k != p.tick {
                        self.st.snapshot(k);
                    }
                }
                p.t_end = self.clock.now();
                return Ok(false);
            }
        }
        if H && p.measuring {
            let k = shared.tick.load(Ordering::Relaxed);
            if k != p.tick {
                p.tick = k;
                self.st.snapshot(k);
            }
        }
        self.fill(&mut p.gen, &mut p.budget)?;
        if p.budget == 0 && self.st.inflight() == 0 {
            p.t_end = self.clock.now();
            return Ok(false);
        }
        if self.turn()? > 0 {
            p.counter.store(self.st.completed_total, Ordering::Relaxed);
        } else if spec.wait != mcqio::WaitPolicy::Poll {
            if self.idle_wait(p.budget)? > 0 {
                p.counter.store(self.st.completed_total, Ordering::Relaxed);
            }
        } else if spec.poll_pause.applies(self.st.inflight()) {
            // Nothing completed: pause before polling again. With the
            // device a thread on another core, a tight re-poll keeps
            // pulling the completion ring's cache line back while that
            // thread is writing into it, so every CQE store there becomes
            // a cross-core round trip. Elsewhere only when asked
            // (`PollPause`): on a controller the hint only delays seeing
            // a completion.
            std::hint::spin_loop();
        }
        Ok(true)
    }

    /// After the loop: times, the count-bound handshake, the drain.
    /// `thread_end` is the clock and the thread's CPU time when the
    /// thread's last job stopped, given to the one job of the thread that
    /// reports the thread's CPU (`None` for the others, so it is counted
    /// once); that job's time runs to the same end, so its CPU share is
    /// the thread's over the same span.
    fn end(
        mut self,
        mut p: Pass<'_>,
        shared: &Shared,
        thread_end: Option<(u64, (Duration, Duration))>,
    ) -> Result<JobResult, QueueError> {
        let spec = self.st.spec;
        let clock_reads = self.st.clock_reads();
        if p.measuring {
            if let (Some(a), Some(b)) = (p.counters_start, counters_of(&self.q)) {
                self.st.res.accesses = Some(Accesses::between(&a, &b));
            }
            if let Some((t, _)) = thread_end {
                p.t_end = t;
            }
            self.st.res.elapsed =
                Duration::from_nanos(self.clock.ticks_to_ns(p.t_end.wrapping_sub(p.t_start)));
            if let Some((_, cpu_end)) = thread_end {
                self.st.res.cpu_usr = cpu_end.0.saturating_sub(p.cpu_start.0);
                self.st.res.cpu_sys = cpu_end.1.saturating_sub(p.cpu_start.1);
                self.st.res.cpu_owner = true;
            }
        }
        if spec.ios_limit.is_some() && p.budget == 0 {
            shared.finished.fetch_add(1, Ordering::Release);
        }
        // Drain: these completions are not counted, but errors and
        // verification still are.
        self.st.flush_hist();
        self.st.lat_into_ns(&self.clock);
        self.st.counting = false;
        while self.st.inflight() > 0 {
            self.turn()?;
        }
        self.st.res.clock_reads = if p.measuring { clock_reads } else { 0 };
        p.counter.store(self.st.completed_total, Ordering::Relaxed);
        Ok(self.st.res)
    }
}

/// One job's place in its loop, kept apart from the [`Runner`] so one
/// thread can take turns between several jobs.
struct Pass<'s> {
    /// The phase this job last saw.
    phase: u32,
    /// Its I/O stream.
    gen: IoGen,
    /// Its completion counter, read by the per-second sampler.
    counter: &'s AtomicU64,
    /// I/Os it may still start in the measured phase.
    budget: u64,
    /// Clock and thread CPU when its measured phase began.
    t_start: u64,
    cpu_start: (Duration, Duration),
    /// Clock when it stopped.
    t_end: u64,
    /// Whether it is in the measured phase.
    measuring: bool,
    /// The sampler's tick it last snapshotted at.
    tick: u32,
    /// The queue's counters when its measured phase began.
    counters_start: Option<(mcqio::QueueCounters, u64)>,
}

/// Run `runners` (the jobs of one thread) to the end, taking turns.
fn run_group<Q: JobQueue, const H: bool, const V: bool>(
    mut runners: Vec<Runner<'_, Q, H, V>>,
    shared: &Shared,
    ready: impl FnOnce(Result<(), String>),
) -> Result<Vec<JobResult>, QueueError> {
    for r in &mut runners {
        if let Err(e) = r.prepare() {
            ready(Err(e.to_string()));
            return Err(e);
        }
    }
    ready(Ok(()));
    let mut phase = shared.phase.load(Ordering::Acquire);
    while phase == PHASE_READY {
        std::thread::yield_now();
        phase = shared.phase.load(Ordering::Acquire);
    }
    if phase >= PHASE_STOP {
        // The run ended (or was aborted) before this thread got to run:
        // on an oversubscribed machine a job can first look after the
        // measured phase is over. It measured nothing; entering the loop
        // would wait for a phase change that never comes.
        return Ok(runners.into_iter().map(|r| r.st.res).collect());
    }
    if runners.len() == 1 {
        // One job on the thread (the common case): its own tight loop, on
        // locals the compiler keeps in registers rather than behind the
        // vector's pointer.
        let mut r = runners.pop().expect("one runner");
        let mut p = r.begin(shared, phase);
        while r.pass(&mut p, shared)? {}
        let thread_end = (p.t_end, thread_cpu());
        return Ok(vec![r.end(p, shared, Some(thread_end))?]);
    }
    let mut passes: Vec<Pass<'_>> = runners.iter_mut().map(|r| r.begin(shared, phase)).collect();
    {
        let mut live = vec![true; runners.len()];
        let mut left = runners.len();
        while left > 0 {
            for (i, (r, p)) in runners.iter_mut().zip(passes.iter_mut()).enumerate() {
                if live[i] && !r.pass(p, shared)? {
                    live[i] = false;
                    left -= 1;
                }
            }
        }
    }
    let thread_end = (
        passes.iter().map(|p| p.t_end).max().unwrap_or(0),
        thread_cpu(),
    );
    let mut out = Vec::with_capacity(runners.len());
    for (i, (r, p)) in runners.into_iter().zip(passes).enumerate() {
        out.push(r.end(p, shared, (i == 0).then_some(thread_end))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{IoStatus, PushError};

    /// The latency range kept as its minimum and width gives the true
    /// minimum and maximum of any sequence, per direction: first latency
    /// 0, equal latencies, new extremes on both sides, and the largest
    /// value (against a min/max computed directly).
    #[test]
    fn latency_extremes_are_the_true_minimum_and_maximum() {
        let seqs: [&[u64]; 6] = [
            &[0],
            &[5, 5, 5],
            &[7, 3, 9, 1, 12, 12, 0],
            &[100, 200, 150, 50, 250],
            &[u64::MAX - 1, 3, u64::MAX - 1],
            &[1, u64::MAX - 1, 0],
        ];
        for seq in seqs {
            let mut lats = [LatTicks::EMPTY; 2];
            for (i, &t) in seq.iter().enumerate() {
                LatTicks::add(&mut lats, 1, t);
                let seen = &seq[..=i];
                let l = lats[1];
                assert_eq!(l.n, i as u64 + 1);
                assert_eq!(l.min(), *seen.iter().min().unwrap(), "{seq:?} after {i}");
                assert_eq!(l.max(), *seen.iter().max().unwrap(), "{seq:?} after {i}");
            }
            // The other direction saw nothing.
            assert_eq!(lats[0].n, 0);
            assert_eq!(lats[0].sum, 0);
        }
    }

    /// An in-memory device: every pushed I/O completes at the next reap.
    struct MemQueue {
        lbads: usize,
        bufs: Vec<Vec<u64>>,
        disk: std::collections::HashMap<u64, Vec<u8>>,
        pending: Vec<(usize, IoReq)>,
        /// Flip a byte of every n-th read (0: never).
        corrupt_every: u64,
        reads: u64,
    }

    impl MemQueue {
        fn new(depth: usize, buf_len: usize, lbads: usize) -> Self {
            MemQueue {
                lbads,
                bufs: (0..depth).map(|_| vec![0u64; buf_len / 8]).collect(),
                disk: Default::default(),
                pending: Vec::new(),
                corrupt_every: 0,
                reads: 0,
            }
        }
    }

    impl JobQueue for MemQueue {
        fn depth(&self) -> usize {
            self.bufs.len()
        }
        fn buffer_len(&self) -> usize {
            self.bufs[0].len() * 8
        }
        fn buffer(&self, slot: usize) -> NonNull<u8> {
            NonNull::new(self.bufs[slot].as_ptr() as *mut u8).unwrap()
        }
        fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
            self.pending.push((slot, req));
            Ok(())
        }
        fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
            Ok(())
        }
        fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
            let n = self.pending.len();
            for (slot, req) in std::mem::take(&mut self.pending) {
                let lb = self.lbads;
                // SAFETY: test double; the buffer is a live, exclusively borrowed Vec<u64>
                // of len()*8 bytes, viewed as bytes (u8 has no alignment needs).
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        self.bufs[slot].as_mut_ptr().cast::<u8>(),
                        self.bufs[slot].len() * 8,
                    )
                };
                for b in 0..req.nlb as usize {
                    let blk = &mut bytes[b * lb..(b + 1) * lb];
                    match req.op {
                        Op::Write => {
                            self.disk.insert(req.slba + b as u64, blk.to_vec());
                        }
                        Op::Read => match self.disk.get(&(req.slba + b as u64)) {
                            Some(d) => blk.copy_from_slice(d),
                            None => blk.fill(0),
                        },
                    }
                }
                if req.op == Op::Read {
                    self.reads += 1;
                    if self.corrupt_every > 0 && self.reads % self.corrupt_every == 0 {
                        bytes[100] ^= 0x40;
                    }
                }
                let status = if req.slba == 13 && req.op == Op::Write {
                    IoStatus::Failed(Failure::Errno(libc::EIO))
                } else {
                    IoStatus::Ok
                };
                done(slot, status);
            }
            Ok(n)
        }
    }

    fn spec(verify: bool, ios: u64) -> JobSpec {
        JobSpec {
            index: 0,
            thread: 0,
            nsid: 1,
            first_lba: 0,
            blocks: 64,
            nlb: 2,
            seq_start: 0,
            lbads: 512,
            pattern: Pattern::Randrw,
            read_pct: 50,
            depth: 8,
            ios_limit: Some(ios),
            seed: 99,
            verify,
            histogram: true,
            dma: crate::run::DmaMode::Premapped,
            dma_batch: None,
            distribution: Distribution::Uniform,
            rate_iops: None,
            wait: mcqio::WaitPolicy::Poll,
            poll_pause: PauseRule::Always,
        }
    }

    fn go(q: MemQueue, spec: &JobSpec) -> JobResult {
        let shared = Shared::new(1);
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let mut ready = None;
        let r = run(q, spec, &shared, Clock::instant(), |r| ready = Some(r)).unwrap();
        assert_eq!(ready, Some(Ok(())));
        assert_eq!(shared.finished.load(Ordering::Acquire), 1);
        r
    }

    /// Issue 16 item 1: a job whose thread first looks at the phase after
    /// the run already said STOP must return, not spin with no I/O limit.
    #[test]
    fn a_job_that_starts_after_stop_returns() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = spec(false, 1);
            s.ios_limit = None;
            let shared = Shared::new(1);
            shared.phase.store(PHASE_STOP, Ordering::Release);
            let r = run(
                MemQueue::new(8, 1024, 512),
                &s,
                &shared,
                Clock::instant(),
                |_| {},
            );
            let _ = tx.send(r.map(|r| r.ios).map_err(|e| e.to_string()));
        });
        let got = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(got, Ok(Ok(0)), "the job did not return after STOP");
    }

    #[test]
    fn counts_exactly_n_ios_and_records_each_in_the_histogram() {
        let s = spec(false, 1000);
        let r = go(MemQueue::new(8, 1024, 512), &s);
        assert_eq!(r.ios, 1000);
        let [rd, wr] = &r.dir;
        assert_eq!(rd.ios + wr.ios, 1000);
        assert!(rd.ios > 300 && wr.ios > 300, "{} {}", rd.ios, wr.ios);
        assert_eq!(
            r.hist().unwrap().len(),
            1000,
            "batched records still count every I/O"
        );
        let (_, min, max) = r.lat_ns();
        assert!(min <= max);
    }

    /// Issue 28: the job counts its latency-clock reads — one at each push
    /// and one at each completion, none per batch without a rate limit —
    /// and a queue that is not on the engine reports no register accesses.
    #[test]
    fn the_job_counts_two_clock_reads_per_io() {
        let r = go(MemQueue::new(8, 1024, 512), &spec(false, 1000));
        assert_eq!(r.ios, 1000);
        assert_eq!(r.clock_reads, 2000);
        assert_eq!(r.accesses, None);
    }

    /// Issue 16 item 8: reads and writes are counted and timed apart, each
    /// with its own histogram.
    #[test]
    fn reads_and_writes_have_their_own_counters_and_histograms() {
        let s = spec(false, 2000);
        let r = go(MemQueue::new(8, 1024, 512), &s);
        let [rd, wr] = &r.dir;
        assert_eq!(rd.hist.as_ref().unwrap().len(), rd.ios);
        assert_eq!(wr.hist.as_ref().unwrap().len(), wr.ios);
        assert!(rd.ios > 0 && wr.ios > 0);
        assert!(rd.lat_min_ns <= rd.lat_max_ns && wr.lat_min_ns <= wr.lat_max_ns);
        let mut s = spec(false, 500);
        s.read_pct = 100;
        s.pattern = Pattern::Randread;
        let r = go(MemQueue::new(8, 1024, 512), &s);
        assert_eq!((r.dir[0].ios, r.dir[1].ios), (500, 0));
        assert_eq!(r.dir[1].hist.as_ref().unwrap().len(), 0);
    }

    /// Issue 16 item 14: on each controller tick the job copies its
    /// cumulative histogram, tagged with the tick.
    #[test]
    fn a_tick_snapshots_the_histogram() {
        let mut s = spec(false, 1);
        s.ios_limit = None;
        let shared = std::sync::Arc::new(Shared::new(1));
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let sh = std::sync::Arc::clone(&shared);
        let h = std::thread::spawn(move || {
            run(
                MemQueue::new(8, 1024, 512),
                &s,
                &sh,
                Clock::instant(),
                |_| {},
            )
            .unwrap()
        });
        while shared.completed[0].load(Ordering::Relaxed) < 100 {
            std::thread::yield_now();
        }
        shared.tick.store(1, Ordering::Relaxed);
        let seen = shared.completed[0].load(Ordering::Relaxed);
        while shared.completed[0].load(Ordering::Relaxed) < seen + 1000 {
            std::thread::yield_now();
        }
        shared.phase.store(PHASE_STOP, Ordering::Release);
        let r = h.join().unwrap();
        assert_eq!(r.snapshots.len(), 1);
        let (k, snap) = &r.snapshots[0];
        assert_eq!(*k, 1);
        let n: u64 = snap.iter().map(|(_, c)| c).sum();
        assert!(n >= 100 && n < r.ios, "{n} {}", r.ios);
    }

    /// Issue 16 item 13: a rate limit spaces I/O starts by the clock: with
    /// a clock that never advances, only the first I/O may start.
    #[test]
    fn rate_limit_holds_back_ios_until_their_time() {
        let mut s = spec(false, 10);
        s.rate_iops = Some(1);
        let shared = Shared::new(1);
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let mut r = Runner::<MemQueue, false, false>::new(
            MemQueue::new(8, 1024, 512),
            &s,
            Clock::instant(),
        );
        r.rate_ticks = 1_000_000_000;
        r.rate_next = r.clock.now();
        let mut gen = IoGen::new(Pattern::Randread, 100, 0, 64, 2, 0, 1);
        let mut budget = 10;
        r.fill(&mut gen, &mut budget).unwrap();
        r.fill(&mut gen, &mut budget).unwrap();
        assert_eq!((r.st.inflight(), budget), (1, 9), "one I/O per second");
        // Its time comes: exactly one more may start.
        r.rate_next = r.clock.now();
        r.fill(&mut gen, &mut budget).unwrap();
        assert_eq!((r.st.inflight(), budget), (2, 8));
        drop(shared);
    }

    /// Issue 29 item 6: a stall (the job or the device descheduled) must not
    /// cost the run its rate. A job 100 intervals behind its schedule, with
    /// 8 slots, starts 8 I/Os now and keeps the other 92 due, so they start
    /// as soon as slots free, rather than forgetting them (the old floor of
    /// one queue's worth, which on a busy machine left `--rate-iops 100000`
    /// at 94-98 % with no way to catch up).
    #[test]
    fn a_paced_job_behind_its_schedule_keeps_what_it_owes() {
        let mut s = spec(false, 1000);
        s.rate_iops = Some(1000);
        let shared = Shared::new(1);
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let mut r = Runner::<MemQueue, false, false>::new(
            MemQueue::new(8, 1024, 512),
            &s,
            // A clock whose count is already past two minutes, so a schedule
            // can be put in the past.
            Clock::instant_since(
                std::time::Instant::now()
                    .checked_sub(std::time::Duration::from_secs(120))
                    .expect("the monotonic clock is older than two minutes"),
            ),
        );
        r.set_rate(1000);
        let ticks = r.rate_ticks;
        assert_eq!(
            ticks, 1_000_000,
            "1000 I/Os per second on a nanosecond clock"
        );
        // 100 intervals behind.
        r.rate_next = r.clock.now() - 100 * ticks;
        let mut gen = IoGen::new(Pattern::Randread, 100, 0, 64, 2, 0, 1);
        let mut budget = 1000;
        r.fill(&mut gen, &mut budget).unwrap();
        assert_eq!(r.st.inflight(), 8, "every free slot starts at once");
        let behind = (r.clock.now() - r.rate_next) / ticks;
        assert!(
            behind >= 91,
            "the remaining ~92 due I/Os stay due: {behind} intervals behind"
        );
        // A stall longer than the catch-up window (one second of the rate,
        // or a queue's worth if that is more) is forgiven beyond it: the
        // shortfall shows in the achieved rate and its warning instead of
        // a burst of a whole minute's I/Os.
        r.turn().unwrap();
        r.rate_next = r.clock.now() - 60_000 * ticks;
        r.fill(&mut gen, &mut budget).unwrap();
        let behind = (r.clock.now() - r.rate_next) / ticks;
        assert!((990..=1001).contains(&behind), "{behind} intervals behind");
        drop(shared);
    }

    #[test]
    fn verify_passes_on_a_faithful_device_and_catches_corruption() {
        let s = spec(true, 2000);
        let r = go(MemQueue::new(8, 1024, 512), &s);
        // LBA 13 is never the start of a 2-block I/O (positions are even), so no errors.
        assert_eq!((r.errors, r.verify_mismatches), (0, 0), "{:?}", r.failures);
        assert!(r.verified_blocks > 0);
        assert_eq!(r.prefill_blocks, 64);

        let mut q = MemQueue::new(8, 1024, 512);
        q.corrupt_every = 7;
        let r = go(q, &s);
        assert!(r.verify_mismatches > 0);
        assert!(r.failures[0].contains("verify: LBA"), "{}", r.failures[0]);
        assert!(
            r.failures[0].contains("payload differs at byte 100"),
            "{}",
            r.failures[0]
        );
    }

    /// A queue pair that ends its first command without the buffer (as a
    /// failed reset or an unconfirmed withdrawal does: the device may
    /// still write it) and completes every other at the next poll. It
    /// counts submissions that hand the device the lost buffer again.
    struct LosingQueue {
        pending: Vec<mcqio::Completion<crate::slots::SlotBuf>>,
        lost: Option<mcqio_vfio::Iova>,
        reused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl LosingQueue {
        fn take(&mut self, buf: crate::slots::SlotBuf, tag: u64) {
            match self.lost {
                Some(l) => {
                    if buf.iova() == l {
                        self.reused.fetch_add(1, Ordering::Relaxed);
                    }
                    self.pending.push(mcqio::Completion {
                        tag,
                        result: Ok(()),
                        buf: Some(buf),
                        dw0: 0,
                    });
                }
                None => {
                    self.lost = Some(buf.iova());
                    self.pending.push(mcqio::Completion {
                        tag,
                        result: Err(mcqio::IoError::TimedOut),
                        buf: None,
                        dw0: 0,
                    });
                }
            }
        }
    }

    impl mcqio::core::block::BlockQueue for LosingQueue {
        type Addr = u32;
        type Buf = crate::slots::SlotBuf;
        fn read(
            &mut self,
            _: u32,
            _: u64,
            _: u32,
            buf: Self::Buf,
            tag: u64,
        ) -> Result<(), mcqio::SubmitError<Self::Buf>> {
            self.take(buf, tag);
            Ok(())
        }
        fn write(
            &mut self,
            _: u32,
            _: u64,
            _: u32,
            buf: Self::Buf,
            tag: u64,
        ) -> Result<(), mcqio::SubmitError<Self::Buf>> {
            self.take(buf, tag);
            Ok(())
        }
        fn flush(&mut self, _: u32, _: u64) -> Result<(), mcqio::SubmitError<()>> {
            unreachable!("the job never flushes")
        }
        fn deallocate(
            &mut self,
            _: u32,
            _: u64,
            _: u32,
            _: u64,
        ) -> Result<(), mcqio::SubmitError<()>> {
            unreachable!("the job never trims")
        }
        fn submit(&mut self) -> bool {
            true
        }
        fn poll<F: FnMut(mcqio::Completion<Self::Buf>)>(
            &mut self,
            max: usize,
            mut f: F,
        ) -> mcqio::Result<usize> {
            let n = max.min(self.pending.len());
            for c in self.pending.drain(..n) {
                f(c);
            }
            Ok(n)
        }
        fn depth(&self) -> usize {
            64
        }
        fn outstanding(&self) -> usize {
            self.pending.len()
        }
        fn max_transfer(&self) -> u64 {
            1 << 20
        }
        fn block_shift(&self, _: u32) -> Option<u32> {
            Some(9)
        }
        fn close<F: FnMut(mcqio::Completion<Self::Buf>)>(mut self, f: F) -> mcqio::Result<()> {
            self.poll(usize::MAX, f).map(|_| ())
        }
    }

    /// Issue 27 item 9(f): a completion without its buffer means the device
    /// may still write that slot's memory; the job must never put the slot
    /// back in use (and the region is leaked at the end).
    #[test]
    fn a_slot_whose_buffer_did_not_come_back_is_never_reused() {
        let fake =
            mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
        let space = mcqio_vfio::Backend::dma(&*fake).clone();
        for verify in [false, true] {
            let s = spec(verify, 200);
            let mem = crate::slots::SlotBuffers::alloc(&space, s.depth, 1024).expect("buffers");
            let reused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let q = crate::slots::BlockJobQueue::new(
                LosingQueue {
                    pending: Vec::new(),
                    lost: None,
                    reused: reused.clone(),
                },
                1,
                mem,
            );
            let mapped = fake.iommu().mapping_count();
            let r = go_with(q, &s);
            assert_eq!(
                reused.load(Ordering::Relaxed),
                0,
                "verify={verify}: the lost slot's buffer went to the device again"
            );
            assert_eq!(r.errors, 1, "verify={verify}: {:?}", r.failures);
            assert!(
                r.failures[0].contains("did not come back"),
                "{}",
                r.failures[0]
            );
            assert_eq!(
                fake.iommu().mapping_count(),
                mapped,
                "verify={verify}: the region was unmapped"
            );
        }
    }

    /// A job whose every slot's buffer is lost stops with an error instead
    /// of waiting for a free slot forever.
    #[test]
    fn a_job_that_lost_every_slot_stops() {
        struct AllLost(Vec<usize>);
        impl JobQueue for AllLost {
            fn depth(&self) -> usize {
                2
            }
            fn buffer_len(&self) -> usize {
                1024
            }
            fn buffer(&self, _: usize) -> NonNull<u8> {
                NonNull::dangling()
            }
            fn push(&mut self, slot: usize, _: IoReq) -> Result<(), PushError> {
                self.0.push(slot);
                Ok(())
            }
            fn submit(&mut self, _: usize) -> Result<(), QueueError> {
                Ok(())
            }
            fn reap<F: FnMut(usize, IoStatus)>(
                &mut self,
                mut done: F,
            ) -> Result<usize, QueueError> {
                let n = self.0.len();
                for slot in self.0.drain(..) {
                    done(
                        slot,
                        IoStatus::Lost(Failure::Host(mcqio::IoError::TimedOut)),
                    );
                }
                Ok(n)
            }
        }
        let mut s = spec(false, 100);
        s.depth = 2;
        let shared = Shared::new(1);
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let e = run(AllLost(Vec::new()), &s, &shared, Clock::instant(), |_| {}).unwrap_err();
        assert!(e.to_string().contains("every slot"), "{e}");
    }

    fn go_with<Q: JobQueue>(q: Q, spec: &JobSpec) -> JobResult {
        let shared = Shared::new(1);
        shared.phase.store(PHASE_MEASURE, Ordering::Release);
        let mut ready = None;
        let r = run(q, spec, &shared, Clock::instant(), |r| ready = Some(r)).unwrap();
        assert_eq!(ready, Some(Ok(())));
        r
    }

    /// Spin for `d` on the monotonic clock (the test queue's own pace).
    fn spin(d: Duration) {
        let t = std::time::Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    /// Issue 29 item 1: each I/O carries its own submit and completion
    /// stamps. The queue takes 2 µs per push and 7 µs per completion, so
    /// the k-th I/O of a batch waits about 5k µs longer than the first:
    /// with one stamp per batch and one per poll they all got the same
    /// latency, and the histogram held one value per batch.
    #[test]
    fn every_io_gets_its_own_latency() {
        struct Paced(Vec<usize>);
        impl JobQueue for Paced {
            fn depth(&self) -> usize {
                8
            }
            fn buffer_len(&self) -> usize {
                1024
            }
            fn buffer(&self, _: usize) -> NonNull<u8> {
                NonNull::dangling()
            }
            fn push(&mut self, slot: usize, _: IoReq) -> Result<(), PushError> {
                spin(Duration::from_micros(2));
                self.0.push(slot);
                Ok(())
            }
            fn submit(&mut self, _: usize) -> Result<(), QueueError> {
                Ok(())
            }
            fn reap<F: FnMut(usize, IoStatus)>(
                &mut self,
                mut done: F,
            ) -> Result<usize, QueueError> {
                let n = self.0.len();
                for slot in self.0.drain(..) {
                    spin(Duration::from_micros(7));
                    done(slot, IoStatus::Ok);
                }
                Ok(n)
            }
        }
        let mut s = spec(false, 400);
        s.read_pct = 100;
        s.pattern = Pattern::Randread;
        let r = go_with(Paced(Vec::new()), &s);
        let h = r.hist().expect("histogram");
        assert_eq!(h.len(), 400);
        // Per I/O the k-th of a batch takes about 21 + 5k µs, so the middle
        // half spans about 15 µs; one stamp per batch gave every I/O the
        // same value, and only scheduling noise between batches apart.
        let (p25, p75) = (h.value_at_quantile(0.25), h.value_at_quantile(0.75));
        assert!(
            p75 - p25 >= 8_000,
            "p25 {p25} ns, p75 {p75} ns: the I/Os of a batch share one latency"
        );
    }

    #[test]
    fn failed_ios_are_counted_and_described() {
        let mut s = spec(false, 500);
        s.nlb = 1;
        s.read_pct = 0;
        s.pattern = Pattern::Write;
        let r = go(MemQueue::new(8, 512, 512), &s);
        // Sequential writes over 64 blocks hit LBA 13 every 64 I/Os.
        assert_eq!(r.errors, 500 / 64 + u64::from(500 % 64 > 13));
        assert!(
            r.failures[0].contains("Write of 1 blocks at LBA 13 failed"),
            "{}",
            r.failures[0]
        );
    }
}
