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
//! `cntvct_el0` on aarch64 — one instruction, no system call anywhere) and
//! calls the system clock only when at least half a millisecond of counter
//! ticks passed since the last call. The counter's rate is learnt from the
//! system clock itself (in nanoseconds) over the queue's first
//! [`CALIBRATION`]; until then, and on other architectures, every reading
//! is a system-clock call.
//! The counter is never trusted for time, only to say "less than half a
//! millisecond passed": a counter that stepped backwards (another core's,
//! after a migration) or far forwards makes the next reading a system-clock
//! call. So the coarse clock lags the system clock by less than a
//! millisecond, its own resolution.

use std::time::{Duration, Instant};

/// System-clock time over which the counter's rate is measured before it
/// is used: against nanosecond readings, 2 ms pin it to well under a
/// percent (a system-clock call takes tens of ns, a few µs at worst),
/// and at QD1 a shorter calibration spares more calls (at 64 ms it was a
/// quarter of all the calls a 1M-I/O run made).
pub(crate) const CALIBRATION: Duration = Duration::from_millis(2);

/// A coarse millisecond clock (see the module docs).
#[derive(Debug)]
pub(crate) struct CoarseClock {
    epoch: Instant,
    /// Counter value at the last system-clock call.
    at: u64,
    /// Counter ticks known to take less than half a millisecond; 0 until
    /// calibrated (every reading calls the system clock).
    skip: u64,
    /// Counter value at the queue's creation (the calibration's start).
    start: u64,
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
        self.read_system(c)
    }

    #[inline(never)]
    fn read_system(&mut self, c: u64) -> u32 {
        let elapsed = self.epoch.elapsed();
        self.system_reads += 1;
        self.at = c;
        if self.skip == 0 && elapsed >= CALIBRATION {
            // Ticks per half millisecond; 0 (no counter, or one that did
            // not move forwards) keeps calling the system clock.
            let ticks = c.wrapping_sub(self.start);
            if ticks < u64::MAX / 2 {
                let half_ms = u128::from(ticks) * 500_000 / elapsed.as_nanos().max(1);
                self.skip = half_ms.min(u128::from(u64::MAX / 2)) as u64;
            }
        }
        elapsed.as_millis() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before calibration every reading calls the system clock; after it,
    /// readings less than half a millisecond of counter ticks apart do not,
    /// and a counter step backwards or past the bound does.
    #[test]
    fn the_counter_spares_system_clock_calls_only_within_half_a_millisecond() {
        let mut c = CoarseClock::new();
        c.start = 0;
        c.at = 0;
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
        c.at_counter(at, 0);
        let reads = c.system_reads;
        assert!((400..=500).contains(&c.skip), "skip {}", c.skip);
        for i in 0..100 {
            assert_eq!(
                c.at_counter(at + i, 7),
                7,
                "within the bound: no new reading"
            );
        }
        assert_eq!(c.system_reads, reads);
        c.at_counter(at + c.skip, 7);
        assert_eq!(c.system_reads, reads + 1, "past the bound: a reading");
        let at = c.at;
        c.at_counter(at - 1, 7);
        assert_eq!(c.system_reads, reads + 2, "backwards: a reading");
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
