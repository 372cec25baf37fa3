//! One run on one device: plan the jobs, start them pinned, drive the
//! phases (warm-up, measure, stop), sample IOPS every second, and build the
//! report.
//!
//! This file is the run controller ([`run_devices`]); `plan` opens each
//! device and gives each row its range, `samples` holds the per-second
//! stretches and the time series, `warnings` judges whether the figures
//! can be trusted, `opts` is what a run is given.

mod opts;
mod plan;
mod samples;
mod warnings;

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::clock::{Clock, ClockSource};
use crate::job::{
    self, JobResult, JobSpec, Shared, PHASE_ABORT, PHASE_MEASURE, PHASE_STOP, PHASE_WARMUP,
};
use crate::progress::{Goal, Progress};
use crate::report::{
    ClockReport, DirStats, DmaReport, JobReport, LatUs, RunReport, Stats, TotalReport,
    VerifyReport, WorkloadReport,
};
use crate::spec::{DeviceKind, DeviceSpec};
use crate::target::Target;

pub use crate::error::PerfError;
pub use crate::queue::DmaMode;
pub use opts::{PollPause, RunOpts};
use plan::plan_device;
use samples::{time_series, Interval, MIN_SAMPLE_S};
use warnings::{rate_note, starved, StarveInput};

/// How often the run controller looks for SIGINT/SIGTERM while it waits.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Job threads are named this and their index.
const JOB_THREAD_PREFIX: &str = "mcqio-perf-j";

/// Plan, run and report one device.
pub fn run_device(spec: &DeviceSpec, o: &RunOpts, clock: Clock) -> Result<RunReport, PerfError> {
    run_devices(std::slice::from_ref(spec), o, clock)
}

/// What planning devices opened and decided.
struct Planned {
    targets: Vec<Arc<Target>>,
    notes: Vec<String>,
    specs: Vec<JobSpec>,
    /// Per row: its device's index.
    job_dev: Vec<usize>,
}

/// Open and check every device of a run (its options, namespaces, sizes)
/// and close it again: `--compare`'s device is checked this way before the
/// base run measures, so a device that cannot run fails the command at
/// once rather than after the first run's whole `-t`.
pub fn check_devices(devices: &[DeviceSpec], o: &RunOpts) -> Result<(), PerfError> {
    plan_devices(devices, o).map(drop)
}

/// Open each device and plan its rows (job `i` runs on device `i %
/// devices.len()`).
fn plan_devices(devices: &[DeviceSpec], o: &RunOpts) -> Result<Planned, PerfError> {
    let ndev = devices.len().max(1);
    if o.jobs < devices.len() {
        return Err(PerfError::Usage(format!(
            "{} devices need at least {} jobs (job i runs on device i mod {}); use -j {}",
            devices.len(),
            devices.len(),
            devices.len(),
            devices.len()
        )));
    }
    let pct = o.pattern.read_pct(o.mix);
    let mut notes = Vec::new();
    let mut targets: Vec<Arc<Target>> = Vec::with_capacity(ndev);
    // One spec per row: a (thread, namespace) pair, as spdk_nvme_perf
    // associates workers with namespaces.
    let mut specs: Vec<JobSpec> = Vec::with_capacity(o.jobs);
    let mut job_dev = Vec::with_capacity(o.jobs);
    for (d, spec) in devices.iter().enumerate() {
        // This device's threads (job i runs on device i mod ndev).
        let mine: Vec<usize> = (0..o.jobs).filter(|i| i % ndev == d).collect();
        let (target, dev_notes, dev_specs) = plan_device(spec, o, pct, &mine, specs.len())?;
        job_dev.extend(dev_specs.iter().map(|_| d));
        let label = spec.label();
        notes.extend(dev_notes.into_iter().map(
            |n| {
                if ndev > 1 {
                    format!("{label}: {n}")
                } else {
                    n
                }
            },
        ));
        specs.extend(dev_specs);
        targets.push(target);
    }
    Ok(Planned {
        targets,
        notes,
        specs,
        job_dev,
    })
}

/// Plan, run and report several devices at once (`-d A -d B`): job `i`
/// runs on device `i % devices.len()`, and within a device the jobs take
/// its namespaces round-robin, so the table has a row per device,
/// namespace and core, as spdk_nvme_perf prints.
pub fn run_devices(
    devices: &[DeviceSpec],
    o: &RunOpts,
    clock: Clock,
) -> Result<RunReport, PerfError> {
    let ndev = devices.len().max(1);
    let Planned {
        targets,
        mut notes,
        mut specs,
        job_dev,
    } = plan_devices(devices, o)?;
    let pct = o.pattern.read_pct(o.mix);
    let rows = specs.len();
    // I/O counts and rates are shares of the whole run, per row.
    for spec in &mut specs {
        spec.ios_limit = job_ios(o, spec.index, rows);
        spec.rate_iops = o
            .rate_iops
            .map(|r| (r / rows as u64 + u64::from((spec.index as u64) < r % rows as u64)).max(1));
    }
    // Whether the run is count-bound, and (for progress) the largest count
    // a row has.
    let ios_limit = specs.iter().filter_map(|s| s.ios_limit).max();
    let thread_of: Vec<usize> = specs.iter().map(|s| s.thread).collect();
    let shared = Arc::new(Shared::new(rows));
    let (tx, rx) = mpsc::channel::<(usize, Result<(), String>)>();
    let mut handles = Vec::with_capacity(o.jobs);
    for job in 0..o.jobs {
        let mine: Vec<JobSpec> = specs.iter().filter(|s| s.thread == job).cloned().collect();
        let target = Arc::clone(&targets[job % ndev]);
        let shared = Arc::clone(&shared);
        let tx = tx.clone();
        let clock = clock.clone();
        let core = o.cpus.get(job).copied();
        let h = std::thread::Builder::new()
            .name(format!("{JOB_THREAD_PREFIX}{job}"))
            .spawn(move || -> (Result<Vec<JobResult>, String>, bool) {
                let pinned = core
                    .is_none_or(|id| core_affinity::set_for_current(core_affinity::CoreId { id }));
                let r = target.run_jobs(&mine, &shared, clock, |r| {
                    let _ = tx.send((job, r));
                });
                (r, pinned)
            })
            .map_err(|e| PerfError::Job {
                job,
                msg: format!("cannot start thread: {e}"),
            })?;
        handles.push(h);
    }
    drop(tx);
    // Idle rate-limited jobs park until their next I/O: a phase change or
    // a per-second tick unparks them (`wake`), so they see it at once.
    let job_threads: Vec<std::thread::Thread> =
        handles.iter().map(|h| h.thread().clone()).collect();
    let wake = || job_threads.iter().for_each(std::thread::Thread::unpark);
    let mut setup_err = None;
    for _ in 0..o.jobs {
        match rx.recv() {
            Ok((_, Ok(()))) => {}
            Ok((job, Err(msg))) => {
                setup_err.get_or_insert(PerfError::Job { job, msg });
            }
            Err(_) => {
                setup_err.get_or_insert(PerfError::Job {
                    job: 0,
                    msg: "a job thread exited during set-up".into(),
                });
                break;
            }
        }
    }
    if let Some(e) = setup_err {
        shared.phase.store(PHASE_ABORT, Ordering::Release);
        wake();
        for h in handles {
            let _ = h.join();
        }
        return Err(e);
    }

    let tty = o.progress && std::io::stderr().is_terminal();
    let counts = |s: &Shared| -> Vec<u64> {
        s.completed
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    };
    if !o.warmup.is_zero() {
        shared.phase.store(PHASE_WARMUP, Ordering::Release);
        wake();
        let t0 = Instant::now();
        let first = counts(&shared).iter().sum::<u64>();
        let mut last = (t0, first);
        let bar = Progress::new(tty, "warmup", Goal::Time(o.warmup));
        while t0.elapsed() < o.warmup && !o.interrupt.load(Ordering::Relaxed) {
            let left = o.warmup.saturating_sub(t0.elapsed());
            std::thread::sleep(left.min(SIGNAL_POLL));
            let now = (Instant::now(), counts(&shared).iter().sum::<u64>());
            bar.update(now.0 - t0, now.1 - first);
            if (now.0 - last.0) >= Duration::from_secs(1) {
                bar.rate(now.1 - last.1, (now.0 - last.0).as_secs_f64(), o.io_size);
                last = now;
            }
        }
        bar.finish();
    }
    let iommu_before: Vec<_> = targets.iter().map(|t| t.iommu_stats()).collect();
    let proc_before = job::process_cpu();
    let sched_before = crate::sched::snapshot();
    let t0 = Instant::now();
    let ticks0 = clock.now();
    let base = counts(&shared);
    shared.phase.store(PHASE_MEASURE, Ordering::Release);
    wake();
    // The measured phase cut into intervals, each a per-second sample; the
    // intervals cover the phase from t0 to the last count, so the IOPS
    // figures come from the same completions as the samples.
    let mut intervals: Vec<Interval> = Vec::new();
    let mut last_t = t0;
    let mut last_c = base.clone();
    let end = o.time.map(|t| t0 + t);
    let bar = Progress::new(
        tty,
        "run",
        match (o.time, ios_limit) {
            (Some(t), _) => Goal::Time(t),
            (None, _) => Goal::Ios(specs.iter().filter_map(|s| s.ios_limit).sum()),
        },
    );
    let base_sum: u64 = base.iter().sum();
    let mut interrupted = o.interrupt.load(Ordering::Relaxed);
    while !interrupted {
        let next = last_t + Duration::from_secs(1);
        let deadline = end.map_or(next, |e| next.min(e));
        // Sleep in short steps: count-bound jobs may finish, a signal may come.
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if ios_limit.is_some() && shared.finished.load(Ordering::Acquire) as usize == rows {
                break;
            }
            if o.interrupt.load(Ordering::Relaxed) {
                break;
            }
            bar.update(now - t0, counts(&shared).iter().sum::<u64>() - base_sum);
            let step = if ios_limit.is_some() {
                Duration::from_millis(5)
            } else {
                SIGNAL_POLL
            };
            std::thread::sleep(step.min(deadline - now));
        }
        interrupted = o.interrupt.load(Ordering::Relaxed);
        let now = Instant::now();
        let c = counts(&shared);
        let dt = (now - last_t).as_secs_f64();
        let done = interrupted
            || shared.failed.load(Ordering::Acquire) > 0
            || (ios_limit.is_some() && shared.finished.load(Ordering::Acquire) as usize == rows)
            || end.is_some_and(|e| now >= e);
        if dt >= 0.9 || done {
            let d: Vec<u64> = c.iter().zip(&last_c).map(|(a, b)| a - b).collect();
            bar.rate(d.iter().sum(), dt, o.io_size);
            let end_s = (now - t0).as_secs_f64();
            match intervals.last_mut() {
                // A short tail (a run that ended between two seconds) is
                // too short to be a sample of its own: it joins the last
                // second, so its completions still count.
                Some(last) if dt < MIN_SAMPLE_S => last.extend(end_s, dt, &d),
                _ => {
                    intervals.push(Interval {
                        end_s,
                        dt,
                        counts: d,
                    });
                    // Jobs snapshot their histograms when they see the new tick.
                    shared.tick.fetch_add(1, Ordering::Relaxed);
                    wake();
                }
            }
            last_t = now;
            last_c = c;
        }
        if done {
            break;
        }
    }
    let measured_s: f64 = intervals.iter().map(|i| i.dt).sum();
    let samples: Vec<Vec<f64>> = (0..rows)
        .map(|j| {
            intervals
                .iter()
                .map(|i| i.counts[j] as f64 / i.dt)
                .collect()
        })
        .collect();
    let total_samples: Vec<f64> = intervals.iter().map(Interval::rate).collect();
    let sample_t: Vec<f64> = intervals.iter().map(|i| i.end_s).collect();
    // Completions per job over the sampled intervals.
    let sampled: Vec<u64> = (0..rows)
        .map(|j| intervals.iter().map(|i| i.counts[j]).sum())
        .collect();
    shared.phase.store(PHASE_STOP, Ordering::Release);
    wake();
    let sched_after = crate::sched::snapshot();
    let iommu_after: Vec<_> = targets.iter().map(|t| t.iommu_stats()).collect();
    let proc_after = job::process_cpu();
    let proc_cpu = (proc_after.0 + proc_after.1).saturating_sub(proc_before.0 + proc_before.1);
    let wall_span = t0.elapsed();
    let rate_error = clock.rate_error(clock.now().wrapping_sub(ticks0), wall_span);
    let wall = wall_span.as_secs_f64();
    bar.finish();
    let mut results = Vec::with_capacity(rows);
    let mut job_err = None;
    let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    // Measured again once the jobs stopped: a run whose cores moved apart
    // or together meanwhile shows two numbers.
    for (t, spec) in targets.iter().zip(devices) {
        if let Some(n) = t.fake_cores().and_then(crate::corelat::note_after) {
            notes.push(if ndev > 1 {
                format!("{}: {n}", spec.label())
            } else {
                n
            });
        }
    }
    for (i, h) in joined.into_iter().enumerate() {
        match h {
            Ok((Ok(r), pinned)) => {
                if !pinned {
                    notes.push(format!("job {i}: could not pin to core {}", o.cpus[i]));
                }
                results.extend(r);
            }
            Ok((Err(msg), _)) => {
                job_err.get_or_insert(PerfError::Job { job: i, msg });
            }
            Err(_) => {
                job_err.get_or_insert(PerfError::Job {
                    job: i,
                    msg: "the job thread panicked".into(),
                });
            }
        }
    }
    if let Some(e) = job_err {
        return Err(e);
    }
    results.sort_by_key(|r| r.index);

    // Build the report. `uring:null` (NOPs) moves no data and has no
    // namespace: it reports neither bandwidth nor a namespace.
    let moves = |d: &DeviceSpec| !matches!(d.kind, DeviceKind::UringNull);
    let moves_data = devices.iter().any(moves);
    let mib = |bytes_per_s: f64| bytes_per_s / (1u64 << 20) as f64;
    let summarize = |s: &[f64], fallback: f64| -> (f64, f64, f64) {
        if s.is_empty() {
            (fallback, fallback, fallback)
        } else {
            let min = s.iter().copied().fold(f64::INFINITY, f64::min);
            let max = s.iter().copied().fold(0.0, f64::max);
            (min, max, s.iter().sum::<f64>() / s.len() as f64)
        }
    };
    let mut jobs = Vec::with_capacity(results.len());
    let mut merged: Option<Histogram<u64>> = o.histogram.then(job::new_histogram);
    // Per direction over all jobs: ios, (sum, min, max) ns, histogram.
    let mut dir_tot: [DirTotal; 2] = [
        (0, 0, u64::MAX, 0, o.histogram.then(job::new_histogram)),
        (0, 0, u64::MAX, 0, o.histogram.then(job::new_histogram)),
    ];
    // A direction's share of its row's IOPS: the row's IOPS come from the
    // sampled intervals, and a direction is the same fraction of them as
    // of the row's completions.
    let dir_stats =
        |ios: u64, sum: u64, min: u64, max: u64, h: Option<&Histogram<u64>>, row: (u64, f64)| {
            (ios > 0).then(|| {
                let iops = if row.0 > 0 {
                    row.1 * ios as f64 / row.0 as f64
                } else {
                    0.0
                };
                DirStats {
                    ios,
                    iops,
                    mib_s: moves_data.then(|| mib(iops * o.io_size as f64)),
                    lat_us: LatUs::with(sum, min, max, ios, h, &o.lat),
                }
            })
        };
    let mut tot = Stats::default();
    let (mut lat_sum, mut lat_min, mut lat_max) = (0u64, u64::MAX, 0u64);
    let (mut usr, mut sys, mut elapsed_sum) = (0.0f64, 0.0f64, 0.0f64);
    let mut failures = Vec::new();
    let mut verify = VerifyReport::default();
    for r in &results {
        let el = r.elapsed.as_secs_f64();
        // Over the controller's intervals, the samples' own completions:
        // the job's clock runs from when it saw the measured phase start to
        // when it saw it stop, and a descheduled job sees either late.
        let iops = if measured_s > 0.0 {
            sampled[r.index] as f64 / measured_s
        } else {
            0.0
        };
        let (mn, mx, avg) = summarize(&samples[r.index], iops);
        let (r_sum, r_min, r_max) = r.lat_ns();
        let r_hist = r.hist();
        let [rd, wr] = &r.dir;
        let per_dir = |d: &job::DirResult| {
            dir_stats(
                d.ios,
                d.lat_sum_ns,
                d.lat_min_ns,
                d.lat_max_ns,
                d.hist.as_ref(),
                (r.ios, iops),
            )
        };
        let stats = Stats {
            ios: r.ios,
            reads: rd.ios,
            writes: wr.ios,
            read: per_dir(rd),
            write: per_dir(wr),
            iops,
            iops_min: mn,
            iops_max: mx,
            iops_avg: avg,
            iops_samples: samples[r.index].len(),
            mib_s: moves(&devices[job_dev[r.index]]).then(|| mib(iops * o.io_size as f64)),
            errors: r.errors,
            verify_mismatches: r.verify_mismatches,
            cpu_usr_pct: if el > 0.0 {
                r.cpu_usr.as_secs_f64() / el * 100.0
            } else {
                0.0
            },
            cpu_sys_pct: if el > 0.0 {
                r.cpu_sys.as_secs_f64() / el * 100.0
            } else {
                0.0
            },
            lat_us: LatUs::with(r_sum, r_min, r_max, r.ios, r_hist.as_ref(), &o.lat),
            elapsed_s: el,
        };
        for (t, d) in dir_tot.iter_mut().zip(&r.dir) {
            t.0 += d.ios;
            t.1 = t.1.saturating_add(d.lat_sum_ns);
            t.2 = t.2.min(d.lat_min_ns);
            t.3 = t.3.max(d.lat_max_ns);
            if let (Some(m), Some(h)) = (t.4.as_mut(), d.hist.as_ref()) {
                let _ = m.add(h);
            }
        }
        tot.ios += r.ios;
        tot.reads += rd.ios;
        tot.writes += wr.ios;
        tot.iops += iops;
        tot.errors += r.errors;
        tot.verify_mismatches += r.verify_mismatches;
        tot.elapsed_s = tot.elapsed_s.max(el);
        lat_sum = lat_sum.saturating_add(r_sum);
        lat_min = lat_min.min(r_min);
        lat_max = lat_max.max(r_max);
        usr += r.cpu_usr.as_secs_f64();
        sys += r.cpu_sys.as_secs_f64();
        // A thread's CPU counts once, against its own time.
        if r.cpu_owner {
            elapsed_sum += el;
        }
        if let (Some(m), Some(h)) = (merged.as_mut(), r_hist.as_ref()) {
            let _ = m.add(h);
        }
        failures.extend(r.failures.iter().cloned());
        verify.blocks_checked += r.verified_blocks;
        verify.mismatches += r.verify_mismatches;
        verify.prefill_blocks += r.prefill_blocks;
        let dev = &devices[job_dev[r.index]];
        jobs.push(JobReport {
            job: r.index,
            device: dev.label(),
            core: o.cpus.get(thread_of[r.index]).copied(),
            nsid: moves(dev).then_some(r.nsid),
            lun: (moves(dev) && targets[job_dev[r.index]].is_ufs())
                .then(|| r.nsid.saturating_sub(1)),
            stats,
        });
    }
    let (mn, mx, avg) = summarize(&total_samples, tot.iops);
    tot.iops_min = mn;
    tot.iops_max = mx;
    tot.iops_avg = avg;
    tot.iops_samples = total_samples.len();
    // The jobs' bandwidth summed: a device that moves no data adds none.
    tot.mib_s = moves_data.then(|| jobs.iter().filter_map(|j| j.stats.mib_s).sum());
    tot.cpu_usr_pct = if elapsed_sum > 0.0 {
        usr / elapsed_sum * 100.0
    } else {
        0.0
    };
    tot.cpu_sys_pct = if elapsed_sum > 0.0 {
        sys / elapsed_sum * 100.0
    } else {
        0.0
    };
    tot.lat_us = LatUs::with(lat_sum, lat_min, lat_max, tot.ios, merged.as_ref(), &o.lat);
    let [dr, dw] = &dir_tot;
    tot.read = dir_stats(dr.0, dr.1, dr.2, dr.3, dr.4.as_ref(), (tot.ios, tot.iops));
    tot.write = dir_stats(dw.0, dw.1, dw.2, dw.3, dw.4.as_ref(), (tot.ios, tot.iops));
    let time_series = time_series(&results, &total_samples, &sample_t, o, moves_data);
    let mut warnings = starved(&StarveInput {
        samples: total_samples.len(),
        jobs: results
            .iter()
            .filter(|r| r.cpu_owner)
            .map(|r| {
                // A job that sleeps on interrupts (--wait irq|hybrid) is
                // not starved by taking less than a CPU.
                let polled = !matches!(*targets[job_dev[r.index]], Target::Uring(_))
                    && o.wait == mcqio::WaitPolicy::Poll;
                (thread_of[r.index], polled, r.cpu_usr + r.cpu_sys, r.elapsed)
            })
            .collect(),
        // Only the fakes' device threads: the main thread sleeps between
        // samples, so its waits say nothing about the run.
        threads: crate::sched::waits(&sched_before, &sched_after)
            .into_iter()
            .filter(|(tid, name, _)| {
                *tid != std::process::id() && !name.starts_with(JOB_THREAD_PREFIX)
            })
            .map(|(tid, name, wait)| (format!("{name} ({tid})"), wait))
            .collect(),
        wall_s: wall,
    });
    if let Some(rate) = o.rate_iops {
        let (note, short) = rate_note(rate, tot.iops);
        notes.push(note);
        warnings.extend(short);
    }
    let cpu_ns_per_io = if tot.ios > 0 {
        (usr + sys) * 1e9 / tot.ios as f64
    } else {
        0.0
    };
    // Register accesses and clock reads per I/O, over the jobs on the engine.
    let per_io = {
        let engine: Vec<_> = results
            .iter()
            .filter_map(|r| r.accesses.map(|a| (a, r.ios)))
            .collect();
        let ios: u64 = engine.iter().map(|e| e.1).sum();
        (ios > 0).then(|| {
            let per = |f: fn(&crate::job::Accesses) -> u64| {
                engine.iter().map(|e| f(&e.0)).sum::<u64>() as f64 / ios as f64
            };
            crate::report::PerIoReport {
                doorbell_writes: per(|a| a.doorbell_writes),
                register_reads: per(|a| a.register_reads),
                engine_clock_calls: per(|a| a.system_clock_reads),
                wire_syscalls: per(|a| a.wire_syscalls),
                interrupt_sleeps: per(|a| a.interrupt_sleeps),
                interrupt_wakeups: per(|a| a.interrupt_wakeups),
            }
        })
    };
    let clock_reads_per_io = if tot.ios > 0 {
        results.iter().map(|r| r.clock_reads).sum::<u64>() as f64 / tot.ios as f64
    } else {
        0.0
    };
    let clock_ns = clock.cost_ns();
    if let Some(e) = rate_error.filter(|e| e.abs() > 0.01) {
        warnings.push(format!(
            "the latency clock's counter ran {:+.2} % off the system clock over the run: \
             latencies are off by as much",
            e * 100.0
        ));
    }
    if clock.forced() {
        notes.push(format!(
            "latency clock: the TSC, forced by --clock tsc although the kernel's clocksource is \
             another; each job stamps its I/O on its own pinned CPU; over the run it ran {} the \
             system clock",
            rate_error.map_or("unchecked against".into(), |e| format!(
                "{:+.3} % off",
                e * 100.0
            ))
        ));
    }
    if clock.source() == ClockSource::Instant {
        warnings.push(format!(
            "the latency clock is the system clock (no usable TSC or CNTVCT counter): each of its \
             {clock_reads_per_io:.2} reads per I/O is a clock_gettime call of {clock_ns:.0} ns, \
             part of every figure here"
        ));
    }
    let process_cpu_ns_per_io = if tot.ios > 0 {
        proc_cpu.as_secs_f64() * 1e9 / tot.ios as f64
    } else {
        0.0
    };
    let total = TotalReport {
        per_io,
        stats: tot,
        cpu_ns_per_io,
        process_cpu_ns_per_io,
        process_cpu_pct: if wall > 0.0 {
            proc_cpu.as_secs_f64() / wall * 100.0
        } else {
            0.0
        },
        cycles_per_io: (clock.source() == ClockSource::Tsc)
            .then(|| cpu_ns_per_io * clock.ticks_per_sec() / 1e9),
    };
    // IOMMU counters summed over the devices that have an IOMMU.
    let mut dma: Option<DmaReport> = None;
    for (a, b) in iommu_before.iter().zip(&iommu_after) {
        if let (Some(a), Some(b)) = (a, b) {
            let d = dma.get_or_insert_with(|| DmaReport {
                mode: o.dma.name().into(),
                ..DmaReport::default()
            });
            d.maps += b.maps - a.maps;
            d.unmapped_ranges += b.unmapped_ranges - a.unmapped_ranges;
            d.unmap_calls += b.unmap_calls - a.unmap_calls;
            d.invalidations += b.invalidations - a.invalidations;
            d.mapped_bytes += b.mapped_bytes;
        }
    }
    let hpb = targets.iter().flat_map(|t| t.hpb_stats()).collect();
    Ok(RunReport {
        warnings,
        hpb,
        device: devices
            .iter()
            .map(|d| d.raw.clone())
            .collect::<Vec<_>>()
            .join(" + "),
        backend: targets
            .iter()
            .map(|t| t.describe())
            .collect::<Vec<_>>()
            .join("; "),
        workload: WorkloadReport {
            pattern: o.pattern.name().into(),
            read_pct: pct,
            io_size: o.io_size,
            queue_depth: o.depth,
            jobs: o.jobs,
            time_s: o.time.map(|t| t.as_secs_f64()),
            ios_per_job: o.ios,
            warmup_s: o.warmup.as_secs_f64(),
            verify: o.verify,
            dma: match (o.dma, o.dma_batch) {
                (DmaMode::Lazy, Some(b)) => format!("lazy (batch {b})"),
                (m, _) => m.name().into(),
            },
            seed: o.seed,
            distribution: o.distribution.name(),
            offset: o.offset,
            size: o.size,
            rate_iops: o.rate_iops,
            wait: wait_name(o.wait),
            poll_pause: specs.first().map_or("", |s| s.poll_pause.name()).into(),
            bytes: o.bytes,
        },
        jobs,
        total,
        dma,
        verify: o.verify.then_some(verify),
        failures,
        notes,
        clock: ClockReport {
            source: match clock.source() {
                ClockSource::Tsc => "tsc".into(),
                ClockSource::Instant => "instant".into(),
            },
            ns_per_call: clock_ns,
            ticks_per_sec: clock.ticks_per_sec(),
            reads_per_io: clock_reads_per_io,
            forced: clock.forced(),
            rate_error,
        },
        repeat_iops: Vec::new(),
        interrupted,
        compare: None,
        time_series,
    })
}

/// The I/O count of row `i` of `rows`: `-n`, or its share of `--bytes` in
/// whole I/Os (the first rows take the remainder, so the total is exact).
fn job_ios(o: &RunOpts, i: usize, rows: usize) -> Option<u64> {
    match o.bytes {
        Some(b) => {
            let total = b.div_ceil(o.io_size);
            let jobs = rows as u64;
            Some(total / jobs + u64::from((i as u64) < total % jobs))
        }
        None => o.ios,
    }
}

/// One direction over all jobs: I/Os, latency sum/min/max (ns), histogram.
type DirTotal = (u64, u64, u64, u64, Option<Histogram<u64>>);

/// `--wait` as given: `poll`, `irq`, `hybrid:50us`.
fn wait_name(w: mcqio::WaitPolicy) -> String {
    match w {
        mcqio::WaitPolicy::Poll => "poll".into(),
        mcqio::WaitPolicy::Interrupt => "irq".into(),
        mcqio::WaitPolicy::Hybrid { spin } if spin.as_nanos() % 1000 != 0 => {
            format!("hybrid:{}ns", spin.as_nanos())
        }
        mcqio::WaitPolicy::Hybrid { spin } => format!("hybrid:{}us", spin.as_micros()),
    }
}
