//! A cheap monotonic clock for per-I/O latency.
//!
//! The counter and its calibration come from `quanta`: on x86_64 with an
//! invariant TSC (checked through CPUID) it reads the TSC, on aarch64 the
//! generic timer's virtual counter (`cntvct_el0`), and it calibrates ticks
//! to nanoseconds against the monotonic clock itself; elsewhere it reads the
//! monotonic clock. Per read that is one counter instruction and, per
//! latency sample, one 128-bit multiply and shift. That conversion is the
//! one hand-written piece: quanta's own `delta_as_nanos` costs about 20
//! more instructions per latency sample (callgrind, `fake:null,sync=1`
//! QD128: 924.7 vs 905.7 instructions per I/O in total), so the scale
//! quanta calibrated is read out once and applied here.
//! `MCQIO_PERF_NO_TSC=1` forces `std::time::Instant`; `--clock system` too.
//!
//! quanta takes the TSC only when CPUID says it is invariant, which an
//! emulated CPU (QEMU TCG) may not say although the guest kernel runs its
//! own clock on the TSC (`tsc=reliable`): the job loop then fell back to
//! `clock_gettime` (171 ns a read in that guest, against a few ns for the
//! TSC). So when quanta declines but the kernel's current
//! clocksource is `tsc`, the TSC is read directly and calibrated here
//! against the monotonic clock (20 ms at start-up). A kernel on another
//! clocksource (hpet, acpi_pm) distrusts the TSC; then the clock stays
//! `clock_gettime`, and the report warns.
//!
//! `--clock tsc` takes the TSC anyway, calibrated here, for a kernel that
//! distrusts it for its own reasons: a QEMU TCG guest marks it unstable
//! because its vCPUs' counters are not synchronized with each other, and
//! then every `clock_gettime` there reads the emulated HPET (2.5-5 µs a read
//! in the guest side-by-side, each an exit to QEMU under its big lock, two
//! per I/O), where an independent driver such as libvfn's perf reads the TSC
//! unconditionally. A job's two stamps of an I/O are taken on its own
//! pinned CPU, so counters that differ between CPUs do not enter a latency;
//! what could is a counter whose rate changes, and the report checks that:
//! it compares the ticks the run took with the system clock's time for it
//! ([`Clock::rate_error`]) and warns past 1 %.
//!
//! The job loop reads the clock twice per I/O: just before it pushes the
//! I/O and when the poll hands back its completion.
//! Measured against one read per batch and one per poll (callgrind,
//! `fake:null,sync=1 -q 128`, release profile, instructions per I/O as
//! the difference of `-n 300000` and `-n 100000` over 200,000): 899 -> 928
//! without a histogram, and 931 -> 1016 with one (`-L`, `--json`), where
//! each I/O's own latency is now recorded instead of one value per batch.

use std::time::Instant;

/// Where the ticks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// A CPU counter (the TSC on x86_64, `cntvct_el0` on aarch64), calibrated by quanta
    /// (or here, for a TSC the kernel uses and quanta declines).
    Tsc,
    /// A monotonic clock in nanoseconds (quanta's fallback or `Instant`).
    Instant,
}

#[derive(Debug, Clone)]
enum Inner {
    Quanta(quanta::Clock),
    /// The TSC read directly, calibrated here (see the module docs).
    #[cfg(target_arch = "x86_64")]
    Rdtsc,
    Instant(Instant),
}

/// Where the kernel names its clocksource.
#[cfg(target_arch = "x86_64")]
const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// Whether the kernel's clocksource, as `current_clocksource` reads, is
/// the TSC (the kernel checked it and keeps its own time on it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn kernel_uses_tsc(current_clocksource: &str) -> bool {
    current_clocksource.trim() == "tsc"
}

/// Nanoseconds per 2^32 ticks of a counter running at `ticks_per_sec`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn ns_per_2_32(ticks_per_sec: f64) -> u64 {
    (1e9 * 4_294_967_296.0 / ticks_per_sec) as u64
}

/// Which latency clock `--clock` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClockChoice {
    /// The CPU counter where quanta or the kernel trusts it, else the
    /// system clock (with a warning).
    #[default]
    Auto,
    /// The CPU counter even where the kernel's clocksource is another
    /// (its rate checked against the system clock over the run).
    Tsc,
    /// The system clock (`clock_gettime`).
    System,
}

/// A calibrated tick source. Cheap to clone (no shared state), so every job
/// has its own.
#[derive(Debug, Clone)]
pub struct Clock {
    inner: Inner,
    source: ClockSource,
    ticks_per_sec: f64,
    /// Nanoseconds per 2^32 ticks, from quanta's calibration (0 for a
    /// nanosecond source): `ns = ticks * ns_per_2_32 >> 32`.
    ns_per_2_32: u64,
    /// The counter was taken by `--clock tsc` although neither quanta nor
    /// the kernel trusts it.
    forced: bool,
}

impl Clock {
    /// The clock `--clock` asks for: `auto` is [`Clock::new`]; `tsc` is the
    /// CPU counter even against the kernel's choice (an error where there
    /// is none to read); `system` is [`Clock::instant`].
    pub fn choose(choice: ClockChoice) -> Result<Self, String> {
        match choice {
            ClockChoice::Auto => Ok(Self::new()),
            ClockChoice::System => Ok(Self::instant()),
            ClockChoice::Tsc => {
                let auto = Self::new();
                if auto.source == ClockSource::Tsc {
                    return Ok(auto);
                }
                #[cfg(target_arch = "x86_64")]
                {
                    let mut c = Self::rdtsc();
                    if c.source == ClockSource::Tsc {
                        c.forced = true;
                        return Ok(c);
                    }
                }
                Err(
                    "--clock tsc: no CPU counter that moves forwards could be calibrated here"
                        .into(),
                )
            }
        }
    }

    /// Whether `--clock tsc` took the counter against the kernel's choice.
    pub fn forced(&self) -> bool {
        self.forced
    }

    /// How far the counter's rate over a span was from its calibration:
    /// `ticks` counted while the system clock advanced `wall`, as a
    /// fraction (0.01: the counter ran 1 % fast); `None` for a nanosecond
    /// source or a span too short to say.
    pub fn rate_error(&self, ticks: u64, wall: std::time::Duration) -> Option<f64> {
        if self.source != ClockSource::Tsc || wall < std::time::Duration::from_millis(100) {
            return None;
        }
        Some(ticks as f64 / self.ticks_per_sec / wall.as_secs_f64() - 1.0)
    }

    /// The best source, calibrated (quanta calibrates once per process).
    pub fn new() -> Self {
        if std::env::var_os("MCQIO_PERF_NO_TSC").is_some() {
            return Self::instant();
        }
        let q = quanta::Clock::new();
        // quanta scales counter ticks and passes monotonic nanoseconds
        // through unchanged: a scale other than 1 means a counter.
        const PROBE: u64 = 1 << 40;
        let ns = q.delta_as_nanos(0, PROBE);
        let counter = ns != PROBE && ns > 0;
        #[cfg(target_arch = "x86_64")]
        if !counter && std::fs::read_to_string(CLOCKSOURCE).is_ok_and(|s| kernel_uses_tsc(&s)) {
            return Self::rdtsc();
        }
        let ns_per_2_32 = if counter {
            q.delta_as_nanos(0, 1 << 32)
        } else {
            0
        };
        Clock {
            ns_per_2_32,
            inner: Inner::Quanta(q),
            source: if counter {
                ClockSource::Tsc
            } else {
                ClockSource::Instant
            },
            ticks_per_sec: if counter {
                PROBE as f64 / ns as f64 * 1e9
            } else {
                1e9
            },
            forced: false,
        }
    }

    /// The TSC, calibrated against the monotonic clock over 20 ms.
    #[cfg(target_arch = "x86_64")]
    fn rdtsc() -> Self {
        let (t0, c0) = (Instant::now(), tsc());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (c1, t1) = (tsc(), Instant::now());
        let ticks_per_sec = c1.wrapping_sub(c0) as f64 / (t1 - t0).as_secs_f64();
        if !(ticks_per_sec.is_finite() && ticks_per_sec > 1e6) {
            return Self::instant();
        }
        Clock {
            inner: Inner::Rdtsc,
            source: ClockSource::Tsc,
            ticks_per_sec,
            ns_per_2_32: ns_per_2_32(ticks_per_sec),
            forced: false,
        }
    }

    /// A clock on `Instant` (always available).
    pub fn instant() -> Self {
        Clock {
            inner: Inner::Instant(Instant::now()),
            source: ClockSource::Instant,
            ticks_per_sec: 1e9,
            ns_per_2_32: 0,
            forced: false,
        }
    }

    /// A clock on `Instant` counting from `base` (tests put schedules in
    /// the past with a base well before now).
    #[cfg(test)]
    pub fn instant_since(base: Instant) -> Self {
        Clock {
            inner: Inner::Instant(base),
            ..Self::instant()
        }
    }

    /// The source in use.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// Ticks per second (the counter frequency, or 1e9).
    pub fn ticks_per_sec(&self) -> f64 {
        self.ticks_per_sec
    }

    /// The current tick count.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        // Both TSC sources, quanta's counter and the direct one, are one
        // RDTSC: one compare instead of the two-level match (twice per
        // I/O).
        #[cfg(target_arch = "x86_64")]
        if self.source == ClockSource::Tsc {
            return tsc();
        }
        match &self.inner {
            Inner::Quanta(q) => q.raw(),
            #[cfg(target_arch = "x86_64")]
            Inner::Rdtsc => tsc(),
            Inner::Instant(base) => base.elapsed().as_nanos() as u64,
        }
    }

    /// Whether [`now`](Self::now) is one RDTSC: the job loop then takes
    /// its per-I/O stamps with [`read::<true>`](Self::read), with the
    /// source decided once per batch instead of once per read.
    #[inline(always)]
    pub fn is_tsc(&self) -> bool {
        cfg!(target_arch = "x86_64") && self.source == ClockSource::Tsc
    }

    /// [`now`](Self::now) for a caller that asked [`is_tsc`](Self::is_tsc)
    /// once: `TSC` must be its answer. Two stamps per I/O, each one
    /// compare and branch fewer.
    #[inline(always)]
    pub fn read<const TSC: bool>(&self) -> u64 {
        debug_assert_eq!(TSC, self.is_tsc());
        #[cfg(target_arch = "x86_64")]
        if TSC {
            return tsc();
        }
        self.now()
    }

    /// Convert a tick delta to nanoseconds.
    #[inline(always)]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        if self.ns_per_2_32 == 0 {
            return ticks; // already nanoseconds
        }
        ((ticks as u128 * self.ns_per_2_32 as u128) >> 32) as u64
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

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: RDTSC is in the x86_64 baseline; it reads the time-stamp
    // counter and touches no memory.
    unsafe { std::arch::x86_64::_rdtsc() }
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

    /// The quanta clock is monotonic and converts ticks
    /// at the rate it reports (bounds generous: only the ratio is checked).
    #[test]
    fn quanta_clock_is_calibrated() {
        let c = Clock::new();
        let a = c.now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = c.now();
        assert!(b > a);
        let ns = c.ticks_to_ns(b - a);
        assert!(ns >= 20_000_000, "{ns}");
        let per_sec = c.ticks_to_ns(c.ticks_per_sec() as u64);
        assert!(
            (990_000_000..=1_010_000_000).contains(&per_sec),
            "{per_sec} ns in one second of ticks ({:?})",
            c.source()
        );
    }

    /// The TSC is taken when the kernel keeps its time on it,
    /// even where quanta declines it; and the conversion of a rate.
    #[test]
    fn the_tsc_is_used_when_the_kernel_uses_it() {
        assert!(kernel_uses_tsc("tsc\n"));
        assert!(!kernel_uses_tsc("hpet\n"));
        assert!(!kernel_uses_tsc("acpi_pm"));
        assert!(!kernel_uses_tsc("kvm-clock\n"));
        // 1 GHz: one ns per tick; 2 GHz: half.
        assert_eq!(ns_per_2_32(1e9), 1 << 32);
        assert_eq!(ns_per_2_32(2e9), 1 << 31);
        let c = Clock {
            inner: Inner::Instant(Instant::now()),
            source: ClockSource::Tsc,
            ticks_per_sec: 3e9,
            ns_per_2_32: ns_per_2_32(3e9),
            forced: false,
        };
        assert_eq!(c.ticks_to_ns(3_000_000_000), 1_000_000_000 - 1);
    }

    /// The directly read TSC calibrates to a plausible rate, reads
    /// monotonically, and converts a second of its ticks to a second.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_direct_tsc_is_calibrated() {
        let c = Clock::rdtsc();
        assert_eq!(c.source(), ClockSource::Tsc);
        assert!(
            (1e8..1e11).contains(&c.ticks_per_sec()),
            "{}",
            c.ticks_per_sec()
        );
        let (a, b) = (c.now(), c.now());
        assert!(b >= a);
        let ns = c.ticks_to_ns(c.ticks_per_sec() as u64);
        assert!((999_000_000..=1_001_000_000).contains(&ns), "{ns}");
    }

    /// The hand-written conversion agrees with quanta's own to within one
    /// part per million (plus a nanosecond of rounding).
    #[test]
    fn conversion_matches_quanta() {
        let c = Clock::new();
        let Inner::Quanta(q) = &c.inner else {
            return;
        };
        for ticks in [0u64, 1, 999, 123_456, 1 << 20, 3_000_000_000, 1 << 40] {
            let ours = c.ticks_to_ns(ticks);
            let theirs = q.delta_as_nanos(0, ticks);
            let diff = ours.abs_diff(theirs);
            assert!(
                diff <= 1 + theirs / 1_000_000,
                "{ticks} ticks: {ours} vs {theirs} ns"
            );
        }
    }

    /// `--clock system` is the system clock; `--clock tsc` is a counter,
    /// marked forced exactly when `auto` would not have taken one.
    #[test]
    fn clock_choices() {
        let sys = Clock::choose(ClockChoice::System).unwrap();
        assert_eq!(sys.source(), ClockSource::Instant);
        assert!(!sys.forced());
        let auto = Clock::choose(ClockChoice::Auto).unwrap();
        assert!(!auto.forced());
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            let tsc = Clock::choose(ClockChoice::Tsc).unwrap();
            assert_eq!(tsc.source(), ClockSource::Tsc);
            assert_eq!(tsc.forced(), auto.source() != ClockSource::Tsc);
        }
    }

    /// The rate check: ticks against the system clock's span, `None` for
    /// a nanosecond source or a span under 100 ms.
    #[test]
    fn rate_error_compares_ticks_with_the_system_clock() {
        use std::time::Duration;
        let mut c = Clock::instant();
        assert_eq!(c.rate_error(1_000_000_000, Duration::from_secs(1)), None);
        c.source = ClockSource::Tsc;
        c.ticks_per_sec = 2e9;
        let e = c.rate_error(2_020_000_000, Duration::from_secs(1)).unwrap();
        assert!((e - 0.01).abs() < 1e-9, "{e}");
        let e = c.rate_error(1_000_000_000, Duration::from_secs(1)).unwrap();
        assert!((e + 0.5).abs() < 1e-9, "{e}");
        assert_eq!(c.rate_error(1, Duration::from_millis(99)), None);
        // A real counter over a real span: well within a percent.
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            let c = Clock::choose(ClockChoice::Tsc).unwrap();
            let (t0, k0) = (Instant::now(), c.now());
            std::thread::sleep(Duration::from_millis(150));
            let e = c.rate_error(c.now() - k0, t0.elapsed()).unwrap();
            assert!(e.abs() < 0.05, "{e}");
        }
    }
}
