//! The reasons not to take a run's figures at face value: a starved job
//! or device thread, too few samples, a rate limit not reached.

use std::time::Duration;

/// A busy-polling thread that got less than this share of a CPU was
/// starved: its figures measure the scheduler, not the device.
const STARVED_CPU: f64 = 0.5;

/// A device thread that waited for a CPU longer than this share of the
/// measured phase, while runnable, was descheduled.
const DESCHEDULED: f64 = 0.2;

/// Fewer per-second samples than this make min/max/avg IOPS too thin to trust.
const MIN_SAMPLES: usize = 3;

/// `--rate-iops` within this share of the request counts as reached.
const RATE_REACHED: f64 = 0.98;

/// The achieved rate against `--rate-iops`: a note, and
/// a warning when the run fell short of it by more than 2%.
pub(super) fn rate_note(requested: u64, achieved: f64) -> (String, Option<String>) {
    let pct = achieved / requested as f64 * 100.0;
    let note =
        format!("--rate-iops {requested}: achieved {achieved:.0} I/Os per second ({pct:.1}%)");
    let short = (achieved < RATE_REACHED * requested as f64).then(|| {
        format!(
            "--rate-iops {requested} was not reached: {achieved:.0} I/Os per second ({pct:.1}%); the device, the queue \
             depth (at most QD / latency I/Os per second per job) or a starved thread held it back"
        )
    });
    (note, short)
}

/// What [`starved`] judges a run by.
#[derive(Debug, Clone)]
pub(super) struct StarveInput {
    /// Per-second samples taken.
    pub(super) samples: usize,
    /// Per job: index, whether it busy-polls, its CPU time, its wall time.
    pub(super) jobs: Vec<(usize, bool, Duration, Duration)>,
    /// Per device thread: its name and how long it waited for a CPU
    /// while runnable in the measured phase, ns.
    pub(super) threads: Vec<(String, u64)>,
    /// Length of the measured phase, s.
    pub(super) wall_s: f64,
}

/// The reasons not to take a run's figures at face value: a
/// busy-polling job, or a fake's device thread, that got far less than a
/// CPU (getrusage per thread against wall time), or fewer than
/// three per-second samples.
pub(super) fn starved(r: &StarveInput) -> Vec<String> {
    let mut out = Vec::new();
    for &(job, polled, cpu, wall) in &r.jobs {
        let share = cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        if polled && !wall.is_zero() && share < STARVED_CPU {
            out.push(format!(
                "job {job} busy-polled but got {:.0}% of a CPU over its {:.2} s: the machine (or another job on its core) \
                 took the rest, so its latency and IOPS measure the scheduler",
                share * 100.0,
                wall.as_secs_f64()
            ));
        }
    }
    for (name, wait) in &r.threads {
        let share = *wait as f64 / 1e9 / r.wall_s.max(1e-9);
        if share > DESCHEDULED {
            out.push(format!(
                "thread {name} (a fake's device thread) was runnable but waited for a CPU {:.0}% of the \
                 measured {:.2} s: descheduled, the device answers late, so latency and IOPS measure the scheduler",
                share * 100.0,
                r.wall_s
            ));
        }
    }
    if r.samples < MIN_SAMPLES {
        out.push(format!(
            "only {} per-second sample(s): IOPS min/max/avg rest on too little to trust (run -t {MIN_SAMPLES} or longer)",
            r.samples
        ));
    }
    out
}
