//! The derived figures of a `mcqio-perf` report agree with each other
//! a row's IOPS lies within its own per-second min/max,
//! comes from the same completions as the samples, and the read and write
//! IOPS add up to the row's.

mod support;

use serde_json::Value;

fn perf_json(args: &[&str]) -> Value {
    let bin = env!("CARGO_BIN_EXE_mcqio-perf");
    let out = support::command(bin)
        .args(args)
        .arg("--json")
        .output()
        .expect("mcqio-perf runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// The row's IOPS within its per-second min/max, and its directions' IOPS
/// adding up to it.
fn check_row(what: &str, row: &Value) {
    let (iops, min, max) = (f(row, "iops"), f(row, "iops_min"), f(row, "iops_max"));
    let eps = 1e-6 * max.max(1.0);
    assert!(
        min - eps <= iops && iops <= max + eps,
        "{what}: iops {iops} outside its per-second min {min} / max {max}: {row}"
    );
    let dirs: f64 = ["read", "write"]
        .iter()
        .filter_map(|d| row[*d]["iops"].as_f64())
        .sum();
    assert!(
        (dirs - iops).abs() <= eps,
        "{what}: read + write iops {dirs} != iops {iops}: {row}"
    );
}

fn check_report(v: &Value) {
    check_row("total", &v["total"]);
    let mut sum = 0.0;
    for (i, j) in v["jobs"].as_array().expect("jobs").iter().enumerate() {
        check_row(&format!("job {i}"), j);
        sum += f(j, "iops");
    }
    let total = f(&v["total"], "iops");
    assert!(
        (sum - total).abs() <= 1e-6 * total,
        "jobs {sum} vs total {total}"
    );
    // The time series is the samples themselves.
    let series: Vec<f64> = v["time_series"]
        .as_array()
        .expect("time_series")
        .iter()
        .map(|s| f(s, "iops"))
        .collect();
    assert_eq!(
        series.len() as u64,
        v["total"]["iops_samples"].as_u64().unwrap()
    );
    let lo = series.iter().copied().fold(f64::INFINITY, f64::min);
    assert!((lo - f(&v["total"], "iops_min")).abs() <= 1e-6 * lo.max(1.0));
}

/// A run that ends between two seconds: five I/Os of 300 ms at QD 1 take
/// 1.5 s. The half second after the first sample used to be dropped from
/// the samples but not from the IOPS, which came out above the only
/// sample (3.33 against 3.00).
#[test]
fn a_run_that_ends_mid_second_keeps_iops_within_its_samples() {
    let v = perf_json(&["-d", "fake,latency=300ms", "-q", "1", "-n", "5"]);
    assert_eq!(v["total"]["ios"].as_u64(), Some(5), "{v}");
    check_report(&v);
}

/// The same rules on an ordinary timed mixed run with two jobs.
#[test]
fn a_timed_mixed_run_has_consistent_figures() {
    let v = perf_json(&[
        "-d", "fake", "-w", "randrw", "-j", "2", "-t", "2", "-q", "8",
    ]);
    check_report(&v);
}

/// A run with fewer than three per-second samples says
/// its min/max/avg rest on too little, in the JSON and in the table.
#[test]
fn too_few_samples_are_warned_about() {
    let v = perf_json(&["-d", "fake:null", "-t", "2"]);
    let w = v["warnings"].as_array().expect("a warnings array");
    assert!(
        w.iter()
            .any(|w| w.as_str().unwrap().contains("only 2 per-second sample(s)")),
        "{w:?}"
    );
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(["-d", "fake:null", "-n", "1000"])
        .output()
        .expect("runs");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("WARNING: only 1 per-second sample(s)"),
        "{table}"
    );
}

/// Runs `mcqio-perf` on CPU 0 only, returning its report's warnings.
fn warnings_on_one_cpu(args: &[&str]) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = support::command(env!("CARGO_BIN_EXE_mcqio-perf"));
    cmd.args(args).arg("--json");
    // SAFETY: between fork and exec the closure only builds a CPU set on
    // the stack and calls sched_setaffinity, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let out = cmd.output().expect("mcqio-perf runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["warnings"]
        .as_array()
        .expect("a warnings array")
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect()
}

/// Three busy-polling jobs squeezed onto one CPU each get
/// about a third of it; the report says so instead of presenting the
/// figures as valid.
#[test]
fn a_starved_job_is_warned_about() {
    let w = warnings_on_one_cpu(&["-d", "fake:null,sync=1", "-j", "3", "--force", "-t", "3"]);
    assert!(
        w.iter()
            .any(|w| w.starts_with("job ") && w.contains("busy-polled but got")),
        "{w:?}"
    );
}

/// The fake's device thread sharing the job's one CPU
/// waits for it; the report says the device answered late.
#[test]
fn a_descheduled_device_thread_is_warned_about() {
    let w = warnings_on_one_cpu(&["-d", "fake:null", "-t", "3"]);
    assert!(
        w.iter()
            .any(|w| w.contains("device thread") && w.contains("waited for a CPU")),
        "{w:?}"
    );
}

/// A rate the device cannot give (QD 1 at 10 ms is at
/// most 100 I/Os per second) is reported as achieved against requested,
/// with a warning, instead of no word.
#[test]
fn an_unreached_rate_is_warned_about() {
    let v = perf_json(&[
        "-d",
        "fake,latency=10ms",
        "-q",
        "1",
        "--rate-iops",
        "1000",
        "-t",
        "2",
    ]);
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("--rate-iops 1000: achieved ")),
        "{notes:?}"
    );
    let w = v["warnings"].as_array().expect("a warnings array");
    assert!(
        w.iter().any(|w| w
            .as_str()
            .unwrap()
            .starts_with("--rate-iops 1000 was not reached")),
        "{w:?}"
    );
}
