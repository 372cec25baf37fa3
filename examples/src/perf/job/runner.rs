//! The job loop: fill free slots (under `--rate-iops`, as the pace
//! allows), submit, reap, follow the controller's phases, and drain at the
//! end; one thread takes turns between its jobs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Clock;
use crate::queue::{IoReq, JobQueue, PushError, QueueError};
use crate::verify::{self, VerifyMap, UNKNOWN};
use crate::workload::{IoGen, Op, Pattern};

use super::accounting::{FreeSlots, Slot, State};
use super::latency::LatTicks;
use super::result::{counters_of, thread_cpu, Accesses, JobResult};
use super::{JobSpec, Shared, PHASE_MEASURE, PHASE_READY, PHASE_STOP};

/// The longest one idle wait of `--wait irq|hybrid` lasts with I/O in
/// flight.
const IDLE_WAIT: Duration = Duration::from_millis(10);

/// The longest a rate-limited job with nothing in flight sleeps before
/// its next I/O is due. The controller unparks the job threads at each
/// phase change and per-second tick, so this bound only limits a sleep
/// nobody ends: each wake-up of an idle job costs CPU (an idle queue
/// pair is to use under 1 % of a CPU at 1 IOPS).
const IDLE_SLEEP: Duration = Duration::from_millis(250);

pub(super) struct Runner<'a, Q, const H: bool, const V: bool> {
    pub(super) q: Q,
    pub(super) st: State<'a, H, V>,
    /// Apart from `st`, so a completion callback can read it while `st` is
    /// borrowed mutably.
    pub(super) clock: Clock,
    /// Clock ticks between two I/O starts under `--rate-iops` (0: no limit).
    pub(super) rate_ticks: u64,
    /// The tick at which the next rate-limited I/O may start.
    pub(super) rate_next: u64,
    /// How far behind its schedule a paced job may fall and still catch up,
    /// in ticks: one second of the rate, or one queue's worth if that is
    /// longer. A stall shorter than this (a descheduled thread, a device
    /// that paused) is made up by starting the owed I/Os as slots free, as
    /// fio's linear rate does; a longer one is forgiven beyond it, and the
    /// run reports the shortfall instead of bursting to make it up.
    pub(super) rate_window: u64,
}

impl<'a, Q: JobQueue, const H: bool, const V: bool> Runner<'a, Q, H, V> {
    pub(super) fn new(q: Q, spec: &'a JobSpec, clock: Clock) -> Self {
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
    pub(super) fn set_rate(&mut self, rate: u64) {
        self.rate_ticks = ((self.clock.ticks_per_sec() / rate as f64) as u64).max(1);
        self.rate_window = (self.clock.ticks_per_sec() as u64)
            .max(self.rate_ticks.saturating_mul(self.st.spec.depth as u64));
        self.rate_next = self.clock.now();
    }

    /// Fill free slots from `gen`, up to `budget` more I/Os.
    #[inline(always)]
    pub(super) fn fill(&mut self, gen: &mut IoGen, budget: &mut u64) -> Result<(), QueueError> {
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
        // I/O it starts.
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
            // across it. A refused push leaves it unused: the
            // slot goes back to `free`, and a record is read only after
            // its I/O completes.
            // SAFETY: `slot` was popped from `free`, which holds only
            // indices below `slots.len()`: it starts as `0..depth` with
            // `depth` slots, and only slots popped from it (here, on a
            // refused push or claim) or checked by indexing `slots`
            // (`complete`) go back. The compare the index made was one
            // more per I/O than the loop needs.
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
    pub(super) fn turn(&mut self) -> Result<usize, QueueError> {
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
pub(super) struct Pass<'s> {
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
pub(super) fn run_group<Q: JobQueue, const H: bool, const V: bool>(
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
