//! Runs the built `mcqio-perf` binary end to end (short runs, JSON checked
//! for the documented fields).

mod support;

use serde_json::Value;

/// Runs `mcqio-perf`, under `MCQIO_TEST_RUNNER` if set: a cross-built test
/// (`.ci/aarch64`) cannot exec the aarch64 binary directly, so it names the
/// emulator command line there (`qemu-aarch64 -L /usr/aarch64-linux-gnu`).
fn perf(args: &[&str]) -> (i32, String, String) {
    let bin = env!("CARGO_BIN_EXE_mcqio-perf");
    let mut cmd = support::command(bin);
    let out = cmd.args(args).output().expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check_run(v: &Value) {
    for k in ["device", "workload", "jobs", "total"] {
        assert!(v.get(k).is_some(), "missing {k} in {v}");
    }
    let total = &v["total"];
    for k in [
        "ios",
        "iops",
        "iops_min",
        "iops_max",
        "iops_avg",
        "errors",
        "cpu_usr_pct",
        "cpu_sys_pct",
    ] {
        assert!(
            total[k].is_number(),
            "total.{k} missing or not a number: {total}"
        );
    }
    // uring:null (NOPs) moves no data: no bandwidth.
    let moves_data = v["device"] != "uring:null";
    assert_eq!(
        total["mib_s"].is_number(),
        moves_data,
        "total.mib_s: {total}"
    );
    for k in ["avg", "min", "max", "p50", "p90", "p99", "p99_9", "p99_99"] {
        assert!(total["lat_us"][k].is_number(), "total.lat_us.{k}: {total}");
    }
    assert!(
        total["ios"].as_u64().unwrap() > 0,
        "no I/O completed: {total}"
    );
    assert_eq!(total["errors"].as_u64(), Some(0));
    let jobs = v["jobs"].as_array().expect("jobs is an array");
    assert!(!jobs.is_empty());
    assert!(jobs[0]["iops"].is_number());
}

#[test]
fn uring_null_json() {
    if support::skip_uring("uring_null_json") {
        return;
    }
    let (code, out, err) = perf(&["-d", "uring:null", "-n", "20000", "-q", "8", "--json"]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("stdout is one JSON document");
    check_run(&v);
    assert_eq!(v["total"]["ios"].as_u64(), Some(20000));
    assert_eq!(v["device"], "uring:null");
}

#[test]
fn uring_file_verify_and_compare() {
    if support::skip_uring("uring_file_verify_and_compare") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mcqio-perf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("dev.img");
    let spec = format!("uring:{},size=4M", file.display());
    let (code, out, err) = perf(&[
        "-d",
        &spec,
        "-w",
        "randrw",
        "-n",
        "4000",
        "-q",
        "16",
        "--verify",
        "--json",
        "--compare",
        "uring:null",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    // --compare with --verify on a null device is refused: verify needs data.
    assert_eq!(code, 2, "stdout: {out} stderr: {err}");
    assert!(
        err.contains("--verify needs a device that stores data"),
        "{err}"
    );

    std::fs::create_dir_all(&dir).unwrap();
    let (code, out, err) = perf(&[
        "-d", &spec, "-w", "randrw", "-n", "4000", "-q", "16", "--verify", "--json",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    assert!(
        v["verify"]["blocks_checked"].as_u64().unwrap() > 0,
        "{}",
        v["verify"]
    );
    assert_eq!(v["verify"]["mismatches"].as_u64(), Some(0));
}

#[test]
fn compare_json_shape() {
    if support::skip_uring("compare_json_shape") {
        return;
    }
    let (code, out, err) = perf(&[
        "-d",
        "uring:null",
        "-n",
        "2000",
        "-q",
        "4",
        "--json",
        "--compare",
        "uring:null",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    // One shape: the base run, with the other run and the ratios under `compare`.
    check_run(&v);
    check_run(&v["compare"]["run"]);
    assert!(v["compare"]["ratio"]["iops"].is_number());
}

#[test]
fn table_output_and_bad_input() {
    if !support::skip_uring("table_output_and_bad_input") {
        let (code, out, err) = perf(&["-d", "uring:null", "-n", "1000", "-L"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("Device Information"), "{out}");
        assert!(out.contains("Total"), "{out}");
        assert!(out.contains("99.99000%"), "{out}");
    }

    let (code, _, err) = perf(&["-d", "nvme:0"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown device kind"), "{err}");
    let (code, _, err) = perf(&["-d", "uring:null", "-o", "1000", "-n", "10"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a multiple"), "{err}");
}

#[test]
fn fake_json_with_dma_counters() {
    let (code, out, err) = perf(&["-d", "fake,size=8M", "-n", "2000", "-q", "16", "--json"]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    assert_eq!(v["total"]["ios"].as_u64(), Some(2000));
    // Premapped buffers: no IOMMU work during the run, and the counters are reported.
    assert_eq!(v["dma"]["maps"].as_u64(), Some(0), "{}", v["dma"]);
    assert!(v["dma"]["mapped_bytes"].as_u64().unwrap() > 0);

    let (code, out, err) = perf(&[
        "-d",
        "fake:null",
        "-n",
        "2000",
        "-q",
        "64",
        "-w",
        "randrw",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    assert!(v["total"]["writes"].as_u64().unwrap() > 0);
}

#[test]
fn fake_verify_passes_clean_and_fails_on_corruption() {
    let (code, out, err) = perf(&[
        "-d",
        "fake,size=4M",
        "-w",
        "randrw",
        "-n",
        "2000",
        "--verify",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(v["verify"]["mismatches"].as_u64(), Some(0));

    let (code, _out, err) = perf(&[
        "-d",
        "fake,size=4M,corrupt=0.05",
        "-w",
        "randread",
        "-n",
        "2000",
        "--verify",
    ]);
    assert_eq!(code, 1, "corrupted reads must fail the run; stderr: {err}");
    assert!(err.contains("verify mismatch"), "{err}");
    assert!(
        err.contains("verify: LBA "),
        "the first failures name the LBA: {err}"
    );
    assert!(err.contains("expected tag"), "{err}");
}

#[test]
fn setup_commands_on_an_empty_system() {
    // A root with empty sys/, proc/ and dev/: no VFIO, no IOMMU, no devices.
    let base = std::env::temp_dir().join(format!("mcqio-perf-root-{}", std::process::id()));
    for d in ["sys/bus/pci/devices", "proc", "dev"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    let root = base.to_str().unwrap();
    let (code, out, err) = perf(&["devices", "--root", root]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no NVMe controllers"), "{out}");
    let (code, out, err) = perf(&["doctor", "--root", root]);
    assert_eq!(code, 1, "doctor must fail without VFIO: {out} {err}");
    assert!(out.contains("[FAIL] vfio"), "{out}");
    assert!(out.contains("fix:"), "{out}");
    assert!(out.contains("not ready"), "{out}");
    let (code, _, err) = perf(&["bind", "not-an-address", "--root", root]);
    assert_eq!(code, 1);
    assert!(err.contains("is not a PCI address"), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn dma_modes_count_iommu_work() {
    let (code, out, err) = perf(&[
        "-d",
        "fake,size=4M",
        "-n",
        "1000",
        "--dma",
        "strict",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    let maps = v["dma"]["maps"].as_u64().unwrap();
    assert!(maps >= 1000, "strict maps once per I/O: {}", v["dma"]);
    assert!(
        v["dma"]["unmap_calls"].as_u64().unwrap() >= 900,
        "{}",
        v["dma"]
    );

    let (code, out, err) = perf(&[
        "-d",
        "fake,size=4M",
        "-n",
        "1000",
        "--dma",
        "lazy",
        "--dma-batch",
        "64",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    let maps = v["dma"]["maps"].as_u64().unwrap();
    let calls = v["dma"]["unmap_calls"].as_u64().unwrap();
    assert!(maps >= 1000, "{}", v["dma"]);
    assert!(calls * 8 < maps, "lazy batches unmaps: {}", v["dma"]);

    // --verify works in every DMA mode (see also perf_traps.rs).
    let (code, _, err) = perf(&[
        "-d",
        "fake,size=1M",
        "-n",
        "10",
        "--dma",
        "lazy",
        "--verify",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = perf(&["-d", "uring:null", "-n", "10", "--dma", "strict"]);
    assert_eq!(code, 2);
    assert!(err.contains("applies to mcqio devices"), "{err}");
}

#[test]
fn io_errors_fail_the_run_and_are_described() {
    let (code, out, err) = perf(&["-d", "fake:null,error=0.05", "-n", "2000", "--json"]);
    assert_eq!(code, 1, "failed I/Os must fail the run; stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["total"]["errors"].as_u64().unwrap() > 0, "{}", v["total"]);
    assert!(err.contains("failed I/O"), "{err}");
    assert!(
        err.contains("failed: NVMe status"),
        "the first failures say what the device returned: {err}"
    );
}

#[test]
fn two_jobs_two_namespaces_merge_into_total() {
    let (code, out, err) = perf(&[
        "-d",
        "fake:null,ns=2",
        "-j",
        "2",
        "-n",
        "1000",
        "-q",
        "8",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    check_run(&v);
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0]["nsid"].as_u64(), Some(1));
    assert_eq!(jobs[1]["nsid"].as_u64(), Some(2));
    assert_eq!(v["total"]["ios"].as_u64(), Some(2000));
    let sum: f64 = jobs.iter().map(|j| j["iops"].as_f64().unwrap()).sum();
    let total = v["total"]["iops"].as_f64().unwrap();
    assert!(
        (sum - total).abs() <= total * 1e-9,
        "total IOPS is the sum of the jobs'"
    );
    let max = jobs
        .iter()
        .map(|j| j["lat_us"]["max"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(v["total"]["lat_us"]["max"].as_f64(), Some(max));
}

#[test]
fn dma_bench_table_json() {
    let (code, out, err) = perf(&[
        "dma-bench",
        "-t",
        "0.05",
        "--threads",
        "1",
        "--batches",
        "32",
        "--json",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().expect("rows");
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["premapped", "strict", "lazy/32"]);
    let row = |m: &str| rows.iter().find(|r| r["mode"] == m).unwrap();
    assert_eq!(
        row("premapped")["maps"].as_u64(),
        Some(0),
        "premapped makes no IOMMU call"
    );
    let strict = row("strict");
    let lazy = row("lazy/32");
    assert!(strict["total_requests"].as_u64().unwrap() > 0);
    assert!(
        lazy["unmap_calls"].as_u64().unwrap() * 16 < lazy["maps"].as_u64().unwrap(),
        "{lazy}"
    );
    for r in rows {
        assert!(r["vs_best_pct"].as_f64().unwrap() <= 0.0);
    }
}

/// 1 MiB I/Os on the default fake (MDTS 128 KiB, no
/// longer raised to the I/O size) go through the engine's split path, at
/// queue depth 1 too, and verify.
#[test]
fn one_mib_ios_split_on_the_default_fake() {
    for q in ["1", "8"] {
        let (code, out, err) = perf(&[
            "-d", "fake", "-o", "1M", "-n", "48", "-q", q, "--rw", "randrw", "--verify", "--json",
        ]);
        assert_eq!(code, 0, "-q {q}: stderr: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        check_run(&v);
        assert_eq!(v["workload"]["io_size"].as_u64(), Some(1 << 20));
        assert_eq!(v["total"]["ios"].as_u64(), Some(48), "-q {q}");
    }
}

/// A run in which nothing completed is not a result. With
/// a 1.5 s device latency and 0.5 s measured, no I/O ends in the measured
/// phase: the run exits non-zero and says why, instead of 0 with 0 IOPS.
#[test]
fn a_run_that_completed_nothing_is_an_error() {
    let (code, out, err) = perf(&["-d", "fake,latency=1500ms", "-q", "1", "-t", "500ms"]);
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("no I/O completed"), "{err}");
    assert!(
        err.contains("latency"),
        "the reason names the device latency: {err}"
    );
    // The bare number that meant seconds is refused before anything runs.
    let (code, _, err) = perf(&["-d", "fake,latency=10", "-t", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a unit"), "{err}");
}

/// `--compare` opens and checks its device before the base run measures:
/// a device that cannot be opened fails the command at once, not after the
/// first device ran its whole `-t` (whose results were then thrown away).
#[test]
fn a_bad_compare_device_fails_before_anything_is_measured() {
    let t = std::time::Instant::now();
    let (code, out, err) = perf(&[
        "-d",
        "fake:null",
        "-t",
        "60",
        "--compare",
        "vfio:0000:99:00.0",
    ]);
    assert_ne!(code, 0, "stdout: {out} stderr: {err}");
    assert!(
        err.contains("0000:99:00.0"),
        "the error names the device: {err}"
    );
    assert!(out.is_empty(), "nothing was reported: {out}");
    // Generous: the 60 s run must not have happened (a slow emulated start
    // still takes seconds, not a minute).
    assert!(
        t.elapsed() < std::time::Duration::from_secs(45),
        "failed only after {:?}: the base run measured first",
        t.elapsed()
    );
}

/// Output into a pipe its reader closed (`mcqio-perf devices | head`)
/// ends the program quietly, as it does a C tool: no panic message.
#[test]
fn a_closed_pipe_on_stdout_ends_quietly() {
    for sub in ["doctor", "devices"] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // Closed before the program starts: its first write fails.
        drop(reader);
        let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
            .arg(sub)
            .stdout(writer)
            .output()
            .expect("mcqio-perf runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{sub}: {err}");
        assert!(
            out.status.code() != Some(101),
            "{sub}: exit {:?}: {err}",
            out.status
        );
    }
}

/// An I/O larger than the fake's namespace is refused with the fix: the
/// largest -o that fits, or a larger fake.
#[test]
fn an_io_larger_than_the_fake_says_how_to_fix_it() {
    let (code, out, err) = perf(&["-o", "100M", "-t", "0.2"]);
    assert_eq!(code, 2, "stdout: {out} stderr: {err}");
    assert!(err.contains("use -o 64 MiB or less"), "{err}");
    assert!(err.contains("fake,size=1G"), "{err}");
    // The fix works.
    let (code, _, err) = perf(&["-d", "fake,size=1G", "-o", "100M", "-n", "20"]);
    assert_eq!(code, 0, "{err}");
}
