//! A cheap monotonic clock for per-I/O latency.
//!
//! On x86_64 with an invariant TSC (`constant_tsc` and `nonstop_tsc` in
//! /proc/cpuinfo) the clock reads the TSC directly (`rdtsc`, a few ns) and
//! converts ticks to nanoseconds with a fixed-point multiply calibrated
//! against [`Instant`] at start-up. Elsewhere it falls back to `Instant`
//! (a vDSO call). The job loop reads the clock twice per batch, not per I/O:
//! once before building a submission batch and once when a poll finds
//! completions, so every I/O in a batch shares those two stamps.

#[cfg(target_arch = "x86_64")]
use std::time::Duration;
use std::time::Instant;

/// Where the ticks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The time-stamp counter.
    Tsc,
    /// `std::time::Instant` (nanoseconds since the clock was made).
    Instant,
}

/// A calibrated tick source. `Copy`, so every job has its own.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    source: ClockSource,
    base: Instant,
    /// Nanoseconds per tick in 32.32 fixed point.
    ns_per_tick_fp: u64,
    ticks_per_sec: f64,
}

#[cfg(target_arch = "x86_64")]
fn tsc_invariant() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| {
            s.lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| l.contains(" constant_tsc") && l.contains(" nonstop_tsc"))
        })
        .unwrap_or(false)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no memory effects; every x86_64 CPU implements it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

impl Clock {
    /// Pick the best source and calibrate it (takes about 20 ms with a TSC).
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::env::var_os("MCQIO_PERF_NO_TSC").is_none() && tsc_invariant() {
            return Self::calibrate_tsc();
        }
        Self::instant()
    }

    /// A clock on `Instant` (always available).
    pub fn instant() -> Self {
        Clock {
            source: ClockSource::Instant,
            base: Instant::now(),
            ns_per_tick_fp: 1 << 32,
            ticks_per_sec: 1e9,
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn calibrate_tsc() -> Self {
        let t0 = Instant::now();
        let c0 = rdtsc();
        while t0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let c1 = rdtsc();
        let ns = t0.elapsed().as_nanos() as f64;
        let ticks = c1.wrapping_sub(c0) as f64;
        if ticks <= 0.0 || ns <= 0.0 {
            return Self::instant();
        }
        let ns_per_tick = ns / ticks;
        Clock {
            source: ClockSource::Tsc,
            base: t0,
            ns_per_tick_fp: (ns_per_tick * (1u64 << 32) as f64) as u64,
            ticks_per_sec: ticks / ns * 1e9,
        }
    }

    /// The source in use.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// Ticks per second (the TSC frequency, or 1e9).
    pub fn ticks_per_sec(&self) -> f64 {
        self.ticks_per_sec
    }

    /// The current tick count.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.source {
            #[cfg(target_arch = "x86_64")]
            ClockSource::Tsc => rdtsc(),
            _ => self.base.elapsed().as_nanos() as u64,
        }
    }

    /// Convert a tick delta to nanoseconds.
    #[inline(always)]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        ((ticks as u128 * self.ns_per_tick_fp as u128) >> 32) as u64
    }

    /// Measured cost of one [`Clock::now`] call, in nanoseconds (for the report).
    pub fn cost_ns(&self) -> f64 {
        const CALLS: u32 = 10_000;
        let t0 = Instant::now();
        let mut acc = 0u64;
        for _ in 0..CALLS {
            acc = acc.wrapping_add(std::hint::black_box(self.now()));
        }
        std::hint::black_box(acc);
        t0.elapsed().as_nanos() as f64 / CALLS as f64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_clock_converts_one_to_one() {
        let c = Clock::instant();
        assert_eq!(c.ticks_to_ns(12345), 12345);
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }

    #[test]
    fn fixed_point_conversion() {
        // A 2.5 GHz TSC: 0.4 ns per tick.
        let c = Clock {
            source: ClockSource::Instant,
            base: Instant::now(),
            ns_per_tick_fp: (0.4 * (1u64 << 32) as f64) as u64,
            ticks_per_sec: 2.5e9,
        };
        let ns = c.ticks_to_ns(2_500_000_000);
        assert!((999_999_000..=1_000_000_000).contains(&ns), "{ns}");
    }
}
