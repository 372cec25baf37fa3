//! Completion accounting: the job's slots (the record of each I/O in
//! flight and its buffer), the free-slot stack, and what a completion does
//! to the counts, the latency sums, the histogram and verification.

use std::ptr::NonNull;

use crate::clock::Clock;
use crate::queue::{Failure, IoStatus, QueueError};
use crate::verify::{self, Mismatch, VerifyMap, UNKNOWN};
use crate::workload::Op;

use super::latency::LatTicks;
use super::{JobResult, JobSpec, MAX_FAILURE_DETAILS};

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) t_submit: u64,
    pub(super) slba: u64,
    pub(super) op: Op,
    pub(super) generation: u32,
}

/// Everything but the queue, so completions can update it while the queue
/// is borrowed by `reap`.
pub(super) struct State<'a, const H: bool, const V: bool> {
    pub(super) spec: &'a JobSpec,
    pub(super) free: FreeSlots,
    pub(super) slots: Vec<Slot>,
    pub(super) bufs: Vec<NonNull<u8>>,
    pub(super) res: JobResult,
    pub(super) vmap: Option<VerifyMap>,
    /// Completions count toward `res` (false during prefill and drain;
    /// tested only with a histogram, see `complete`).
    pub(super) counting: bool,
    /// I/Os pushed and I/Os completed (however they ended): their
    /// difference is what is in flight, so an I/O moves one counter at
    /// each end instead of two.
    pub(super) submitted: u64,
    pub(super) completed_total: u64,
    /// `submitted + completed_total` when the measured phase began: every
    /// push and every completion reads the latency clock once, so the
    /// measured phase's clock reads are what these counters moved since,
    /// plus the reads `res.clock_reads` counts itself (rate-limit checks,
    /// refused pushes), with no count per I/O.
    pub(super) reads_base: u64,
    /// Per direction, a run of equal latencies not yet added to the
    /// histogram (recorded with one `record_n`): at the histogram's
    /// resolution neighbouring I/Os often take the same time.
    pub(super) hist_ns: [u64; 2],
    pub(super) hist_n: [u64; 2],
    /// Per direction, the measured phase's latency sum, min and max in
    /// clock ticks: converted to ns once, at the end (`lat_into_ns`), not
    /// per I/O.
    pub(super) lat_ticks: [LatTicks; 2],
}

/// The job's free slots, a stack that never grows: a push never
/// allocates (`Vec::push` might, and its call kept the completion path's
/// values on the stack around it), and a push past the
/// capacity (a slot freed twice) panics instead of growing.
pub(super) struct FreeSlots(Vec<u32>);

impl FreeSlots {
    /// Slots `0..depth`, slot 0 popped first (LIFO keeps hot buffers hot).
    pub(super) fn new(depth: usize) -> Self {
        FreeSlots((0..depth as u32).rev().collect())
    }

    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline(always)]
    pub(super) fn pop(&mut self) -> Option<u32> {
        self.0.pop()
    }

    #[inline(always)]
    pub(super) fn push(&mut self, slot: u32) {
        // Makes `Vec::push`'s own capacity test, and its call to grow,
        // dead code.
        assert!(self.0.len() < self.0.capacity(), "a job slot freed twice");
        self.0.push(slot);
    }
}

impl<const H: bool, const V: bool> State<'_, H, V> {
    /// Add the pending run of equal latencies to the histogram.
    #[inline]
    pub(super) fn flush_hist(&mut self) {
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
    pub(super) fn inflight(&self) -> usize {
        (self.submitted - self.completed_total) as usize
    }

    /// Start counting the measured phase's clock reads from here.
    pub(super) fn reset_clock_reads(&mut self) {
        self.res.clock_reads = 0;
        self.reads_base = self.submitted + self.completed_total;
    }

    /// Clock reads since [`reset_clock_reads`](Self::reset_clock_reads).
    pub(super) fn clock_reads(&self) -> u64 {
        self.res.clock_reads + (self.submitted + self.completed_total - self.reads_base)
    }

    /// Put the measured I/O counts and latency sums, minima and maxima
    /// into the result, in ns (one conversion per run instead of one per
    /// I/O).
    pub(super) fn lat_into_ns(&mut self, clock: &Clock) {
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
    pub(super) fn snapshot(&mut self, tick: u32) {
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
    pub(super) fn complete(&mut self, slot: usize, status: IoStatus, now: u64, clock: &Clock) {
        // Only the fields a successful I/O needs are loaded here; the
        // failure paths read the whole record.
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
        // ended (`lat_into_ns`), so the flag's test is left out. A
        // histogram is flushed on every reap, drain included, so it keeps
        // the test.
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
    pub(super) fn all_lost(&self) -> QueueError {
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
