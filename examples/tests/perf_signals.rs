//! Every subcommand that runs for a while obeys SIGINT
//! and SIGTERM. The first signal ends the table after the row in progress
//! (a run: after the I/O in flight) and prints what ran, marked partial;
//! a second ends the process at once; the exit code is 128 + the signal.

mod support;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A hang guard, not a measurement: the exit code and the "interrupted"
/// lines are what show the signal was obeyed. Long enough for a table row
/// to finish under qemu-user on a loaded machine (the aarch64 CI step).
const HANG: Duration = Duration::from_secs(120);

fn start(args: &[&str]) -> Child {
    let mut c = support::command(env!("CARGO_BIN_EXE_mcqio-perf"));
    support::hold_stop_signals(&mut c)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcqio-perf starts")
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(c.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Wait for the child (at most `limit`), returning code, stdout, stderr.
fn finish(mut c: Child, limit: Duration) -> (Option<i32>, String, String) {
    let t = Instant::now();
    while c.try_wait().expect("wait").is_none() {
        if t.elapsed() > limit {
            let _ = c.kill();
            let out = c.wait_with_output().expect("output");
            panic!(
                "still running {limit:?} after the signal: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = c.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn seed_mcq_stops_and_prints_its_partial_table() {
    let c = start(&["seed", "mcq", "-t", "20"]);
    std::thread::sleep(Duration::from_millis(1500));
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(130), "{out}\n{err}");
    assert!(out.contains("(partial: interrupted)"), "{out}");
    assert!(out.contains("interrupted: the table stops"), "{out}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
}

#[test]
fn seed_hpb_stops_on_sigterm() {
    let c = start(&["seed", "hpb"]);
    std::thread::sleep(Duration::from_millis(1000));
    signal(&c, libc::SIGTERM);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(143), "{out}\n{err}");
    assert!(
        out.contains("interrupted: the table stops after the"),
        "{out}"
    );
    assert!(err.contains("interrupted by SIGTERM"), "{err}");
}

#[test]
fn dma_bench_stops_after_the_row_in_progress() {
    let c = start(&["dma-bench", "-t", "2", "--threads", "1"]);
    std::thread::sleep(Duration::from_millis(1000));
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(130), "{out}\n{err}");
    assert!(
        out.contains("premapped"),
        "the row that was running is printed: {out}"
    );
    assert!(out.contains("interrupted: the table stops"), "{out}");
}

/// The first signal waits for the I/O in flight (here 20 s of device
/// latency); the second one does not wait.
#[test]
fn a_second_signal_ends_seed_mcq_at_once() {
    let c = start(&[
        "seed",
        "mcq",
        "-d",
        "fake-ufs,latency=20s",
        "-t",
        "30",
        "-q",
        "1",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    signal(&c, libc::SIGINT);
    // The second signal must come after the first reached the handler:
    // two sent while the program still starts would merge into one.
    assert!(
        support::signal_taken(c.id(), libc::SIGINT, HANG),
        "the first SIGINT was never taken"
    );
    std::thread::sleep(Duration::from_millis(300));
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, Duration::from_secs(8));
    assert_eq!(code, Some(130), "{out}\n{err}");
}

/// Wait for the `--compare` run's fake UFS device thread. The compare
/// device is opened and closed once before the first run (its check), so
/// its thread counts only once the first run's fake NVMe thread was seen.
fn second_run_started(c: &Child) {
    assert!(
        support::thread_started(c.id(), "fake-nvme", HANG),
        "the first run never started"
    );
    assert!(
        support::thread_started(c.id(), "fake-ufs", HANG),
        "the --compare run never started"
    );
}

/// A signal during the `--compare` run: the note sits on that run, and
/// the ratio line says it compares a partial run.
#[test]
fn an_interrupted_compare_marks_the_run_that_was_cut() {
    let c = start(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake-ufs,latency=100ms",
        "--json",
    ]);
    // Each run takes 1 s (the second at 100 ms per I/O). The second's fake
    // UFS device thread, seen after the first run's fake NVMe thread, shows
    // that the second run has begun.
    second_run_started(&c);
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(130), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let other = &v["compare"]["run"];
    assert_eq!(v["interrupted"], false, "the first run ran to its end: {v}");
    assert_eq!(other["interrupted"], true, "{v}");
    let has_note = |r: &serde_json::Value| {
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("interrupted by SIGINT"))
    };
    assert!(!has_note(&v) && has_note(other), "{v}");
}

#[test]
fn an_interrupted_compare_says_its_ratio_is_partial() {
    let c = start(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake-ufs,latency=100ms",
    ]);
    second_run_started(&c);
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(130), "{err}");
    let ratio = out
        .lines()
        .find(|l| l.contains(" vs ") && l.contains("IOPS"))
        .unwrap_or_else(|| panic!("no ratio line: {out}"));
    assert!(
        ratio.contains("compares a partial run: fake-ufs,latency=100ms was interrupted"),
        "{ratio}"
    );
}

/// An interrupted run's header gives the time measured,
/// not only the time asked for.
#[test]
fn an_interrupted_header_shows_the_time_measured() {
    let c = start(&["-d", "fake:null", "-t", "30"]);
    std::thread::sleep(Duration::from_millis(1500));
    signal(&c, libc::SIGINT);
    let (code, out, err) = finish(c, HANG);
    assert_eq!(code, Some(130), "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(header.contains("interrupted after "), "{header}");
    assert!(header.contains("(asked: 30 s)"), "{header}");
}
