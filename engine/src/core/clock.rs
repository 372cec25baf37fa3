//! The queue's coarse clock (milliseconds since the queue was created),
//! read through a CPU counter so a busy queue does not call the system
//! clock on every poll.
//!
//! `Timeouts::tick` runs once per poll that completes something. Reading
//! `Instant` there cost a `clock_gettime` per completing poll — at queue
//! depth 1 one per I/O: a vDSO call of some 50 instructions on a host with
//! a usable TSC, and a real system call (2.7 µs measured with the hpet
//! clocksource) in a guest whose kernel does not trust its TSC.
//!
//! Instead each reading first takes the CPU's counter (`rdtsc` on x86_64,
//! `cntvct_el0` on aarch64 — one instruction, no system call anywhere).
//! The counter's rate is learnt from the system clock itself (in
//! nanoseconds) over the queue's first [`CALIBRATION`]; until then, and on
//! other architectures, every reading is a system-clock call. Once
//! calibrated, a reading less than a millisecond of counter ticks after
//! the clock last moved returns the same millisecond (one compare); a
//! reading one to two milliseconds of ticks after it moves the clock on by
//! one millisecond by the counter alone. The system clock is called again
//! only when [`ANCHOR`] passed since its last call (then the clock takes
//! the system clock's value, never going back), when more than two
//! milliseconds of ticks passed since the clock last moved (an idle spell,
//! or the thread moved to a CPU whose counter is ahead), or when the
//! counter stepped backwards (another CPU's). So the counter is trusted
//! only for spans shorter than [`ANCHOR`] that it counted in steps under
//! two milliseconds, and the coarse clock strays from the system clock by
//! at most a millisecond plus the counter's rate error over [`ANCHOR`].
//!
//! Before this, the system clock was called whenever half a millisecond
//! of ticks had passed: at QD1 in a QEMU TCG guest (hpet clocksource,
//! 5–15 µs per call there, each an exit to QEMU under its big lock) that
//! was 0.14–0.31 calls per I/O, each one on the path from a completion to
//! the next submission (QEMU trace of the guest side-by-side).

use std::time::{Duration, Instant};

/// System-clock time over which the counter's rate is measured before it
/// is used: against nanosecond readings, 2 ms pin it to well under a
/// percent (a system-clock call takes tens of ns, a few µs at worst),
/// and at QD1 a shorter calibration spares more calls (at 64 ms it was a
/// quarter of all the calls a 1M-I/O run made).
pub(crate) const CALIBRATION: Duration = Duration::from_millis(2);

/// At most this long between two system-clock calls while the counter
/// keeps the time (see the module docs): a counter whose rate strays by
/// 1 % from its calibration moves a timeout by 0.3 ms.
pub(crate) const ANCHOR: Duration = Duration::from_millis(32);

/// A coarse millisecond clock (see the module docs).
#[derive(Debug)]
pub(crate) struct CoarseClock {
    epoch: Instant,
    /// Counter value at which the clock last moved to `ms`.
    at: u64,
    /// Counter ticks per millisecond; 0 until calibrated (every reading
    /// calls the system clock).
    skip: u64,
    /// Counter value at the queue's creation (the calibration's start).
    start: u64,
    /// Counter value at the last system-clock call.
    anchor: u64,
    /// Counter ticks in [`ANCHOR`] (0 until calibrated).
    anchor_ticks: u64,
    /// The clock's value, in milliseconds since `epoch`.
    ms: u32,
    /// System-clock calls made.
    pub system_reads: u64,
}

/// The CPU's free-running counter, or 0 where none is read.
#[inline(always)]
fn counter() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC is part of the x86_64 baseline and has no memory
        // effects; it only reads the time-stamp counter.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let v: u64;
        // SAFETY: reads the virtual counter, which Linux lets user space
        // read (CNTKCTL_EL1.EL0VCTEN); no memory access, no side effect.
        unsafe { std::arch::asm!("mrs {v}, cntvct_el0", v = out(reg) v, options(nomem, nostack)) };
        v
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        0
    }
}

impl CoarseClock {
    pub fn new() -> Self {
        let c = counter();
        CoarseClock {
            epoch: Instant::now(),
            at: c,
            skip: 0,
            start: c,
            anchor: c,
            anchor_ticks: 0,
            ms: 0,
            system_reads: 0,
        }
    }

    /// The clock now, given its last reading `last_ms`.
    #[inline(always)]
    pub fn now_ms(&mut self, last_ms: u32) -> u32 {
        self.at_counter(counter(), last_ms)
    }

    /// [`now_ms`](Self::now_ms) with the counter read as `c`.
    #[inline(always)]
    fn at_counter(&mut self, c: u64, last_ms: u32) -> u32 {
        if c.wrapping_sub(self.at) < self.skip {
            return last_ms;
        }
        self.advance(c)
    }

    /// A millisecond or more of ticks since the clock last moved (or not
    /// calibrated): move it by the counter, or call the system clock.
    #[inline(never)]
    fn advance(&mut self, c: u64) -> u32 {
        let d = c.wrapping_sub(self.at);
        if self.skip != 0 && d < 2 * self.skip && c.wrapping_sub(self.anchor) < self.anchor_ticks {
            self.at = self.at.wrapping_add(self.skip);
            self.ms = self.ms.wrapping_add(1);
            return self.ms;
        }
        self.read_system(c)
    }

    #[inline(never)]
    fn read_system(&mut self, c: u64) -> u32 {
        let elapsed = self.epoch.elapsed();
        self.system_reads += 1;
        self.at = c;
        self.anchor = c;
        if self.skip == 0 && elapsed >= CALIBRATION {
            // Ticks per millisecond; 0 (no counter, or one that did not
            // move forwards) keeps calling the system clock.
            let ticks = c.wrapping_sub(self.start);
            if ticks < u64::MAX / 2 {
                let ms = u128::from(ticks) * 1_000_000 / elapsed.as_nanos().max(1);
                self.skip = ms.min(u128::from(u64::MAX / 64)) as u64;
                self.anchor_ticks = self.skip.saturating_mul(ANCHOR.as_millis() as u64);
            }
        }
        // Never back: the counter may have run a little fast since the
        // last call.
        let now = elapsed.as_millis() as u32;
        if now.wrapping_sub(self.ms) < u32::MAX / 2 {
            self.ms = now;
        }
        self.ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before calibration every reading calls the system clock. After it,
    /// readings under a millisecond of ticks after the clock moved return
    /// the same millisecond; one to two milliseconds of ticks move it by
    /// one without a call; a system-clock call comes past [`ANCHOR`], after
    /// a jump of two milliseconds or more, and when the counter steps
    /// backwards.
    #[test]
    fn the_counter_keeps_the_time_between_system_clock_calls() {
        let mut c = CoarseClock::new();
        c.start = 0;
        c.at = 0;
        c.anchor = 0;
        // The system clock has not reached the calibration (however slow
        // this machine): `elapsed` of a later instant is zero.
        c.epoch = Instant::now() + Duration::from_secs(3600);
        for i in 0..10 {
            c.at_counter(i, 0);
        }
        assert_eq!(c.system_reads, 10, "uncalibrated: every reading");
        // Calibrate as if 1000 ticks passed per ms (the system clock moves
        // on a little while this runs: the estimate can only come out low).
        let ms = 10 * CALIBRATION.as_millis() as u64;
        c.epoch = Instant::now() - Duration::from_millis(ms);
        let at = 1000 * ms;
        let m0 = c.at_counter(at, 0);
        assert_eq!(u64::from(m0), ms);
        let reads = c.system_reads;
        assert!((800..=1000).contains(&c.skip), "skip {}", c.skip);
        let skip = c.skip;
        for i in 0..skip {
            assert_eq!(c.at_counter(at + i, m0), m0, "under a millisecond: no move");
        }
        assert_eq!(c.system_reads, reads);
        // Step by step, a millisecond at a time, up to the anchor: the
        // counter alone moves the clock.
        let mut last = m0;
        let steps = c.anchor_ticks / skip;
        for k in 1..steps {
            let m = c.at_counter(at + k * skip + skip / 3, last);
            assert_eq!(m, last + 1, "step {k}");
            last = m;
        }
        assert_eq!(c.system_reads, reads, "within the anchor: no call");
        // Past the anchor: a system-clock call.
        c.at_counter(at + (steps + 1) * skip, last);
        assert_eq!(c.system_reads, reads + 1, "past the anchor: a call");
        // A jump of two milliseconds or more: a call.
        let a = c.at;
        c.at_counter(a + 2 * skip, c.ms);
        assert_eq!(c.system_reads, reads + 2, "a jump: a call");
        // Backwards: a call, and the clock never goes back.
        let before = c.ms;
        let a = c.at;
        let m = c.at_counter(a - 1, before);
        assert_eq!(c.system_reads, reads + 3, "backwards: a call");
        assert!(m >= before);
    }

    /// A clock that moved ahead by the counter is not moved back by the
    /// system clock's value.
    #[test]
    fn the_system_clock_never_moves_the_clock_back() {
        let mut c = CoarseClock::new();
        c.ms = 1_000_000;
        assert_eq!(c.read_system(c.at), 1_000_000);
        c.ms = 0;
        assert!(c.read_system(c.at) < 1000);
    }

    /// The counter moves on this machine's architectures (x86_64, aarch64).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn the_counter_moves() {
        let a = counter();
        let mut b = counter();
        while b == a {
            b = counter();
        }
        assert_ne!(a, b);
    }
}
