//! How far apart two cores are: the one-way latency of handing a cache
//! line from one to the other, measured by two pinned threads passing a
//! counter back and forth.
//!
//! Why mcqio-perf measures it: a fake controller's device thread talks to
//! the job thread through shared memory, so on a fake every command moves
//! cache lines between the two cores, and the IOPS follow this latency —
//! on a VM whose vCPUs the hypervisor places sometimes on one core complex,
//! sometimes on two, from one run to the next. A UFS command moves more
//! lines than an NVMe one (UTRD, command descriptor, response, CQE against
//! SQE and CQE), so the two transports do not follow it equally. The
//! number goes into the report's notes, measured right before the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Round trips per sample, and samples (the median is reported).
const ROUND_TRIPS: u64 = 4000;
const SAMPLES: usize = 5;
/// Give up (no number) when a sample takes longer: the two threads are
/// not both running, e.g. when pinning failed or a core is busy.
const SAMPLE_LIMIT: Duration = Duration::from_millis(200);

/// The counter on its own cache lines (128 bytes: adjacent-line prefetch).
#[repr(align(128))]
struct Line(AtomicU64);

/// One-way cache-line latency between cores `a` and `b` in nanoseconds
/// (half the median round trip), or `None` when the threads could not be
/// pinned there or did not both run.
pub fn one_way_ns(a: usize, b: usize) -> Option<f64> {
    if a == b {
        return None;
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let (l, s) = (Arc::clone(&line), Arc::clone(&stop));
    // The echo side: answers each odd value with the next even one.
    let echo = std::thread::Builder::new()
        .name("mcqio-perf-corelat".into())
        .spawn(move || {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: b }) {
                s.store(true, Ordering::Release);
                return;
            }
            let mut want = 1;
            while !s.load(Ordering::Relaxed) {
                if l.0.load(Ordering::Acquire) == want {
                    l.0.store(want + 1, Ordering::Release);
                    want += 2;
                }
                std::hint::spin_loop();
            }
        })
        .ok()?;
    let r = measure(&line, &stop, a);
    stop.store(true, Ordering::Release);
    let _ = echo.join();
    r
}

/// The caller's side, on the current thread pinned to `a`.
fn measure(line: &Line, stop: &AtomicBool, a: usize) -> Option<f64> {
    // The caller's own affinity is put back afterwards (it may be a job's
    // or the main thread's).
    let before = affinity();
    if !core_affinity::set_for_current(core_affinity::CoreId { id: a }) {
        return None;
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    let mut v = 0;
    'outer: for _ in 0..SAMPLES {
        let t0 = Instant::now();
        for _ in 0..ROUND_TRIPS {
            v += 1;
            line.0.store(v, Ordering::Release);
            v += 1;
            let mut spins = 0u32;
            while line.0.load(Ordering::Acquire) != v {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0
                    && (stop.load(Ordering::Acquire) || t0.elapsed() > SAMPLE_LIMIT)
                {
                    break 'outer;
                }
            }
        }
        samples.push(t0.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64);
    }
    restore(before);
    if samples.len() < SAMPLES {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    Some(samples[SAMPLES / 2] / 2.0)
}

fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // writes at most its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

fn restore(set: Option<libc::cpu_set_t>) {
    if let Some(set) = set {
        // SAFETY: `set` came from sched_getaffinity for this thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// The report's note for a fake whose device thread runs on core `d`
/// while the first job runs on core `j`, measured now, before the run.
/// `None`: nothing measured.
pub fn note_before((j, d): (usize, usize)) -> Option<String> {
    let ns = one_way_ns(j, d)?;
    Some(format!(
        "cores {j} (job) and {d} (the fake's device thread) hand a cache line over in {ns:.0} ns one way \
         (before the run): every command moves lines between them, so a fake's IOPS follow this number"
    ))
}

/// The same, measured again after the run.
pub fn note_after((j, d): (usize, usize)) -> Option<String> {
    let ns = one_way_ns(j, d)?;
    Some(format!(
        "cores {j} and {d}: {ns:.0} ns one way after the run"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_core_has_no_number() {
        assert_eq!(one_way_ns(0, 0), None);
    }

    #[test]
    fn two_cores_give_a_positive_latency() {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        if cores.len() < 2 {
            eprintln!("one core: nothing to measure");
            return;
        }
        // None when the two threads could not both run (a busy machine,
        // another test polling a core): no number rather than a wrong one.
        match one_way_ns(cores[0].id, cores[1].id) {
            Some(ns) => assert!(ns.is_finite() && ns > 0.0, "{ns}"),
            None => eprintln!("the two threads did not both run: no number"),
        }
    }
}
