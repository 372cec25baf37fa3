//! `mcqio-perf` drives UFS like NVMe. Runs the built
//! binary on the fake UFS host controller (short runs; only shapes and
//! exact counts are checked, never speeds).

mod support;

use std::process::Command;

use serde_json::Value;

fn bin(name: &str) -> Command {
    let path = match name {
        "mcqio-perf" => env!("CARGO_BIN_EXE_mcqio-perf"),
        "hello" => env!("CARGO_BIN_EXE_hello"),
        _ => env!("CARGO_BIN_EXE_identify"),
    };
    support::command(path)
}

fn run(name: &str, args: &[&str]) -> (i32, String, String) {
    let out = bin(name).args(args).output().expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn perf(args: &[&str]) -> (i32, String, String) {
    run("mcqio-perf", args)
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A run of `jobs` jobs with verify on the fake UFS in `mode`: every job
/// has a row on LU 0, nothing failed, data was checked.
fn verified_run(mode: &str, jobs: &str) -> Value {
    let dev = format!("fake-ufs,mcq={mode},sync=1,size=4M");
    let (code, out, err) = perf(&[
        "-d", &dev, "-j", jobs, "--force", "-w", "randrw", "-q", "8", "-n", "300", "--verify",
        "--json", "--seed", "7",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    let rows = v["jobs"].as_array().expect("jobs");
    assert_eq!(rows.len(), jobs.parse::<usize>().unwrap());
    for r in rows {
        assert_eq!(r["device"], "fake-ufs");
        assert_eq!(r["lun"], 0, "{r}");
        assert_eq!(r["ios"], 300, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
    }
    assert_eq!(v["total"]["verify_mismatches"], 0);
    assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0, "{v}");
    v
}

#[test]
fn fake_ufs_mcq_with_verify() {
    let v = verified_run("on", "2");
    assert!(
        v["backend"].as_str().unwrap().contains("MCQ"),
        "{}",
        v["backend"]
    );
}

/// Legacy mode has one list: two jobs share it (behind a lock) and each
/// still gets exactly its own completions, which verify checks.
#[test]
fn fake_ufs_legacy_with_verify_shares_the_list() {
    let v = verified_run("off", "2");
    assert!(
        v["backend"]
            .as_str()
            .unwrap()
            .contains("legacy single doorbell"),
        "{}",
        v["backend"]
    );
    let notes = v["notes"].to_string();
    assert!(notes.contains("behind a lock"), "{notes}");
}

#[test]
fn fake_ufs_null_table_has_lu_rows() {
    let (code, out, err) = perf(&["-d", "fake-ufs:null,sync=1", "-n", "200", "--quiet"]);
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(out.contains("fake-ufs:null LU0 from core 0"), "{out}");
    assert!(out.contains("Total"), "{out}");
    // Verify needs data: a null LU stores none.
    let (code, _, err) = perf(&["-d", "fake-ufs:null", "--verify", "-n", "10"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--verify"), "{err}");
    // UFS buffers are premapped; the per-I/O mapping modes are NVMe's.
    let (code, _, err) = perf(&["-d", "fake-ufs", "--dma", "strict", "-n", "10"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--dma strict") && err.contains("fake-ufs"),
        "{err}"
    );
}

/// `-q 128` (the Done-when run) gets 128 slots per MCQ queue on the fake,
/// as on NVMe; the legacy list has 32 and says so.
#[test]
fn deep_queues_on_fake_ufs() {
    let (code, out, err) = perf(&[
        "-d",
        "fake-ufs:null,sync=1",
        "-q",
        "128",
        "-n",
        "500",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    assert!(
        v["backend"].as_str().unwrap().contains("x 128 slots"),
        "{}",
        v["backend"]
    );
    let (code, _, err) = perf(&[
        "-d",
        "fake-ufs:null,mcq=off,sync=1",
        "-q",
        "128",
        "-n",
        "10",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("queue pair (32 slots): use -q 32 or less"),
        "{err}"
    );
}

#[test]
fn compare_across_transports() {
    let (code, out, err) = perf(&[
        "-d",
        "fake-ufs:null,sync=1",
        "--compare",
        "fake:null,sync=1",
        "-n",
        "200",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    assert_eq!(v["jobs"][0]["device"], "fake-ufs:null");
    assert_eq!(v["jobs"][0]["lun"], 0);
    assert_eq!(v["compare"]["run"]["jobs"][0]["device"], "fake:null");
    assert_eq!(v["compare"]["run"]["jobs"][0]["nsid"], 1);
    assert!(v["compare"]["run"]["jobs"][0].get("lun").is_none());
    assert!(v["compare"]["ratio"]["iops"].is_number(), "{v}");
    // The table prints both, each with its own unit.
    let (code, out, err) = perf(&[
        "-d",
        "fake-ufs:null,sync=1",
        "--compare",
        "fake:null,sync=1",
        "-n",
        "100",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("fake-ufs:null LU0 from core 0"), "{out}");
    assert!(out.contains("fake:null ns1 from core 0"), "{out}");
}

#[test]
fn seed_mcq_json_has_the_eight_rows() {
    let (code, out, err) = perf(&[
        "seed",
        "mcq",
        "-d",
        "fake-ufs:null,sync=1",
        "-t",
        "0.05",
        "-q",
        "4",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 8, "{v}");
    let mut seen = Vec::new();
    for r in rows {
        for k in [
            "iops_min",
            "iops_max",
            "iops_avg",
            "mib_s",
            "cpu_usr_pct",
            "cpu_sys_pct",
        ] {
            assert!(r[k].is_number(), "{k} in {r}");
        }
        seen.push((
            r["workload"].as_str().unwrap().to_string(),
            r["jobs"].as_u64().unwrap(),
            r["mode"].as_str().unwrap().to_string(),
        ));
    }
    for w in ["randread", "randwrite"] {
        for j in [1, 8] {
            for m in ["legacy", "mcq"] {
                assert!(
                    seen.contains(&(w.to_string(), j, m.to_string())),
                    "{w} {j} {m} missing: {seen:?}"
                );
            }
        }
    }
    // Not a UFS device: a usage error, not a run.
    let (code, _, err) = perf(&["seed", "mcq", "-d", "fake:null", "-t", "0.05"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a UFS device"), "{err}");
}

/// `--jobs` picks the two job counts (a controller with 4 MCQ queues, as
/// QEMU's in the guest suite, cannot run the seed's 8 jobs, one queue pair
/// each); a bad list is a usage error.
#[test]
fn seed_mcq_takes_the_job_counts() {
    let (code, out, err) = perf(&[
        "seed",
        "mcq",
        "-d",
        "fake-ufs:null,sync=1,queues=4",
        "-t",
        "0.05",
        "-q",
        "4",
        "--jobs",
        "1,4",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    let mut jobs: Vec<u64> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["jobs"].as_u64().unwrap())
        .collect();
    jobs.sort_unstable();
    assert_eq!(jobs, [1, 1, 1, 1, 4, 4, 4, 4], "{v}");
    for bad in ["8,1", "0,2", "2", "1,x", "3,3"] {
        let (code, _, err) = perf(&["seed", "mcq", "--jobs", bad]);
        assert_eq!(code, 2, "--jobs {bad}: {err}");
        assert!(err.contains("--jobs"), "--jobs {bad}: {err}");
    }
}

/// No such PCI function: a clear error naming it, not a panic.
#[test]
fn vfio_without_a_device_is_a_clear_error() {
    let (code, out, err) = perf(&["-d", "vfio:0000:7f:1f.7", "-n", "1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("vfio:0000:7f:1f.7"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, _, err) = perf(&["seed", "mcq", "-d", "vfio:0000:7f:1f.7", "-t", "0.05"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a UFS device"), "{err}");
}

#[test]
fn hello_and_identify_on_fake_ufs() {
    for dev in ["fake-ufs", "fake-ufs,mcq=off,sync=1"] {
        let (code, out, err) = run("hello", &[dev]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("blocking: wrote and read back"), "{out}");
        assert!(out.contains("async: 8 writes + 8 reads"), "{out}");
    }
    let (code, out, err) = run("identify", &["fake-ufs,lus=2,mcq=off,sync=1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("UFS version       0x0400"), "{out}");
    assert!(out.contains("legacy single doorbell"), "{out}");
    assert!(out.contains("LU   1:"), "{out}");
}

/// On the threaded fake in legacy
/// mode, a host UTRLDBR read racing the device thread's move of freshly
/// rung bits out of the doorbell mailbox saw them clear before the
/// command ran, and the engine then read the host's OCS pre-fill (0xF).
/// A race, so the run is long enough to hit it on the old code nearly
/// always; it cannot fail on correct code.
#[test]
fn legacy_threaded_fake_completes_every_io() {
    let (code, out, err) = perf(&["-d", "fake-ufs:null,mcq=off", "-t", "2", "--json"]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    assert_eq!(v["total"]["errors"], 0, "{}", v["failures"]);
}

/// `seed
/// hpb --json` (modelled clock, ranges and device map cache divided by 16)
/// has the six rows with their fields, HPB off falls with the range, HPB on
/// stays within 10 % of its first row, the last row is at least 1.8x, the
/// first within 5 %, and the host map stays within its budget.
#[test]
fn seed_hpb_json_meets_the_issue_criteria() {
    let (code, out, err) = perf(&["seed", "hpb", "--json", "--scale", "16", "-n", "2000"]);
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 6, "{v}");
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    let gib: Vec<f64> = rows.iter().map(|r| f(r, "range_gib")).collect();
    assert_eq!(gib, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0].map(|g| g / 16.0));
    let off: Vec<f64> = rows.iter().map(|r| f(r, "hpb_off_iops")).collect();
    let on: Vec<f64> = rows.iter().map(|r| f(r, "hpb_on_iops")).collect();
    assert!(
        off.windows(2).all(|w| w[1] < w[0]),
        "HPB off falls: {off:?}"
    );
    assert!(
        on.iter().all(|&x| (x - on[0]).abs() <= 0.10 * on[0]),
        "HPB on flat: {on:?}"
    );
    assert!(on[5] >= 1.8 * off[5], "{on:?} vs {off:?}");
    assert!((on[0] - off[0]).abs() <= 0.05 * off[0], "{on:?} vs {off:?}");
    let budget = v["model"]["memory_budget"].as_u64().unwrap();
    let map = v["host_map_bytes"].as_u64().unwrap();
    assert!(map > 0 && map <= budget, "{map} of {budget}");
    assert!(v["host_map_bytes_peak"].as_u64().unwrap() <= budget);
    for k in [
        "off_falls_with_range",
        "on_within_10pct_of_first",
        "last_on_ge_1_8x_off",
        "first_within_5pct",
        "host_map_within_budget",
    ] {
        assert_eq!(v["criteria"][k], true, "{k}: {v}");
    }
    assert!(v["model"]["t_read_us"].as_f64().unwrap() > 0.0);
    assert!(v["hpb"]["hpb_reads"].as_u64().unwrap() > 0);
}

/// `--hpb` on fake-ufs turns on the engine's HPB; the
/// report carries its counters (JSON and table), and reads over a range
/// larger than the device's map cache go out as HPB READ once loaded.
#[test]
fn hpb_flag_reports_counters() {
    let args = [
        "-d",
        "fake-ufs,sync=1,size=256M",
        "--hpb",
        "-q",
        "8",
        "-n",
        "3000",
        "--seed",
        "5",
        "--quiet",
    ];
    let (code, out, err) = perf(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}\n{out}");
    let v = json(&out);
    let h = &v["hpb"][0];
    assert_eq!(h["lun"], 0, "{v}");
    assert_eq!(h["control"], "device");
    let n = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
    assert_eq!(n("hpb_reads") + n("normal_reads"), 3000, "{h}");
    assert!(n("hpb_reads") > 0 && n("map_loads") > 0, "{h}");
    assert!(n("host_map_bytes") <= n("memory_budget"), "{h}");
    assert_eq!(v["total"]["errors"], 0);
    let (code, out, err) = perf(&args);
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(out.contains("HPB LU0 (device control): "), "{out}");
}

/// With a device thread (not `sync=1`) the report says how far apart the
/// job's core and the device thread's core are, before and after the run;
/// a synchronous fake has no such note. The numbers are not checked, and
/// on a busy machine the measurement may give none (never a made-up one).
#[test]
fn the_cores_distance_is_noted_for_threaded_fakes_only() {
    let notes = |dev: &str| -> Vec<String> {
        let (code, out, err) = perf(&["-d", dev, "-n", "2000", "--json"]);
        assert_eq!(code, 0, "{err}\n{out}");
        json(&out)["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .filter_map(|n| n.as_str())
            .filter(|n| n.contains("ns one way"))
            .map(String::from)
            .collect()
    };
    for dev in ["fake-ufs:null,sync=1", "fake:null,sync=1"] {
        assert!(notes(dev).is_empty(), "{dev}: {:?}", notes(dev));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for dev in ["fake-ufs:null", "fake:null"] {
        for n in notes(dev) {
            assert!(cores >= 2, "{dev}: one core, yet {n}");
            let ok = (n.starts_with("cores ") && n.contains("(before the run)"))
                || n.contains("ns one way after the run");
            assert!(ok, "{dev}: {n}");
        }
    }
}

/// `--wait irq` reaches UFS MCQ queue pairs (they sleep on the
/// fake's INTx line, the report counts the sleeps), `--wait poll` never
/// sleeps, and legacy mode polls whatever `--wait` says, with a note.
#[test]
fn wait_irq_sleeps_on_mcq_and_legacy_polls_with_a_note() {
    let sleeps = |mcq: &str, wait: &str| -> (f64, Value) {
        let dev = format!("fake-ufs,mcq={mcq},size=4M");
        let (code, out, err) = perf(&[
            "-d", &dev, "-q", "4", "-n", "2000", "--wait", wait, "--json",
        ]);
        assert_eq!(code, 0, "{err}\n{out}");
        let v = json(&out);
        assert_eq!(v["total"]["ios"], 2000, "{v}");
        assert_eq!(v["workload"]["wait"], wait, "{v}");
        let s = v["total"]["per_io"]["interrupt_sleeps"]
            .as_f64()
            .unwrap_or_else(|| panic!("no interrupt_sleeps: {v}"));
        (s, v)
    };
    let (s, _) = sleeps("on", "irq");
    assert!(s > 0.0, "an MCQ job with --wait irq never slept");
    let (s, _) = sleeps("on", "poll");
    assert_eq!(s, 0.0);
    let (s, v) = sleeps("off", "irq");
    assert_eq!(s, 0.0, "legacy mode polls");
    assert!(
        v["notes"]
            .to_string()
            .contains("legacy single-doorbell mode polls"),
        "{v}"
    );
}
