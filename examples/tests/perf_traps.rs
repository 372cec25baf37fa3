//! Traps: each test runs a built example binary the way a new
//! user would and checks that it neither hangs, nor misleads, nor silently
//! ignores what it was told. Every child process runs under a timeout so a
//! regression shows as a failure, not a stuck test run.

mod support;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What a finished child left behind.
struct Out {
    /// Exit code; `None` if killed by a signal or by the timeout.
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The child was still running at the timeout and was killed.
    timed_out: bool,
}

/// Wait for `child` at most `limit`, then kill it.
fn wait(mut child: Child, limit: Duration) -> Out {
    let t0 = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if t0.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Out {
        code: status.code(),
        stdout,
        stderr,
        timed_out,
    }
}

fn spawn(bin: &str, args: &[&str]) -> Child {
    let mut c = support::command(bin);
    support::hold_stop_signals(&mut c)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// Run `mcqio-perf` with a 60 s limit (runs here take a second or two).
fn perf(args: &[&str]) -> Out {
    wait(
        spawn(env!("CARGO_BIN_EXE_mcqio-perf"), args),
        Duration::from_secs(60),
    )
}

fn usage_error(o: &Out, needle: &str) {
    assert!(!o.timed_out, "timed out; stderr: {}", o.stderr);
    assert_eq!(
        o.code,
        Some(2),
        "stdout: {}\nstderr: {}",
        o.stdout,
        o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "stderr should mention `{needle}`: {}",
        o.stderr
    );
}

fn json(o: &Out) -> Value {
    assert!(!o.timed_out, "timed out; stderr: {}", o.stderr);
    serde_json::from_str(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\n{}", o.stdout, o.stderr))
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcqio-traps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

// ---- item 1: more jobs than cores ----------------------------------------

/// Many NOP jobs on few cores: the run ends on time, every time.
#[test]
fn many_uring_jobs_finish() {
    if support::skip_uring("many_uring_jobs_finish") {
        return;
    }
    let o = perf(&[
        "-d",
        "uring:null",
        "-j",
        "200",
        "-t",
        "1",
        "-q",
        "4",
        "--quiet",
    ]);
    assert!(!o.timed_out, "-j 200 -t 1 did not finish: {}", o.stderr);
    assert_eq!(o.code, Some(0), "stderr: {}", o.stderr);
    assert!(o.stdout.contains("Total"), "{}", o.stdout);
}

#[test]
fn busy_polling_jobs_beyond_the_cpus_need_force() {
    // No test machine has 1000 CPUs.
    let o = perf(&["-d", "fake", "-j", "1000", "-t", "1", "--quiet"]);
    usage_error(&o, "--force");
}

#[test]
fn too_many_jobs_for_the_fakes_queues_is_a_queue_count_error() {
    let o = perf(&["-d", "fake", "-j", "1000", "-t", "1", "--force", "--quiet"]);
    usage_error(&o, "I/O queue pairs");
    assert!(!o.stderr.contains("CSTS"), "{}", o.stderr);
    let o = perf(&[
        "-d",
        "fake,qpairs=2",
        "-j",
        "3",
        "-t",
        "1",
        "--force",
        "--quiet",
    ]);
    usage_error(
        &o,
        "3 job(s) need 3 I/O queue pairs but the controller offers 2",
    );
}

#[test]
fn cpus_outside_the_machine_are_an_error() {
    if support::skip_uring("cpus_outside_the_machine_are_an_error") {
        return;
    }
    let o = perf(&["-d", "uring:null", "--cpus", "4000", "-t", "1", "--quiet"]);
    usage_error(&o, "CPU 4000 is not available");
}

// ---- item 2: SIGINT / SIGTERM ---------------------------------------------

fn interrupted_run(sig: i32, code: i32, extra: &[&str]) -> Out {
    let mut args = vec!["-d", "fake", "-t", "60", "--quiet"];
    args.extend_from_slice(extra);
    let child = spawn(env!("CARGO_BIN_EXE_mcqio-perf"), &args);
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0);
    let o = wait(child, Duration::from_secs(30));
    assert!(!o.timed_out, "the run did not stop after the signal");
    assert_eq!(
        o.code,
        Some(code),
        "stdout: {}\nstderr: {}",
        o.stdout,
        o.stderr
    );
    assert!(o.stderr.contains("interrupted"), "{}", o.stderr);
    o
}

#[test]
fn sigint_stops_cleanly_with_a_partial_report() {
    let o = interrupted_run(libc::SIGINT, 130, &[]);
    assert!(o.stdout.contains("Total"), "no report: {}", o.stdout);
    assert!(o.stdout.contains("interrupted by SIGINT"), "{}", o.stdout);
}

#[test]
fn sigterm_stops_cleanly_with_a_json_report() {
    let o = interrupted_run(libc::SIGTERM, 143, &["--json"]);
    let v = json(&o);
    assert_eq!(v["interrupted"], true);
    let elapsed = v["total"]["elapsed_s"].as_f64().unwrap();
    assert!(elapsed < 60.0, "elapsed {elapsed}");
    // Every I/O completed exactly once: nothing failed while draining.
    assert_eq!(v["total"]["errors"], 0);
}

// ---- item 6: one device syntax, one set of defaults -----------------------

fn tool(name: &str, args: &[&str]) -> Out {
    let bin = match name {
        "hello" => env!("CARGO_BIN_EXE_hello"),
        _ => env!("CARGO_BIN_EXE_identify"),
    };
    wait(spawn(bin, args), Duration::from_secs(60))
}

#[test]
fn hello_and_identify_take_fake_options() {
    let o = tool("identify", &["fake,ns=2,lbs=4k,size=8M"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("namespaces        2"), "{}", o.stdout);
    assert!(o.stdout.contains("2048 blocks x  4096 B"), "{}", o.stdout);
    let o = tool("hello", &["fake,lbads=12"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("blocks of 4096 B"), "{}", o.stdout);
    // Options these programs do not use are refused, not ignored.
    let o = tool("hello", &["fake,corrupt=0.5"]);
    assert_ne!(o.code, Some(0));
    assert!(o.stderr.contains("corrupt"), "{}", o.stderr);
}

/// One language for every frontend, so the fio engine's
/// dotted address (`vfio-0000.7f.1f.7`) names the same device in
/// mcqio-perf and hello as `vfio:0000:7f:1f.7` does.
#[test]
fn the_fio_spelling_names_the_same_device() {
    let dotted = perf(&["-d", "vfio-7f.1f.7", "-n", "1"]);
    let colons = perf(&["-d", "vfio:0000:7f:1f.7", "-n", "1"]);
    assert_eq!(dotted.code, colons.code, "{}", dotted.stderr);
    assert_eq!(dotted.stderr, colons.stderr);
    assert!(
        dotted.stderr.contains("vfio:0000:7f:1f.7"),
        "{}",
        dotted.stderr
    );
    let bad = perf(&["-d", "vfio-zz.1f.7", "-n", "1"]);
    usage_error(&bad, "is not a PCI address");
    let hello = tool("hello", &["vfio-7f.1f.7"]);
    assert_ne!(hello.code, Some(0));
    assert!(hello.stderr.contains("0000:7f:1f.7"), "{}", hello.stderr);
}

#[test]
fn every_program_builds_the_same_default_fake() {
    let id = tool("identify", &["fake"]);
    assert_eq!(id.code, Some(0), "{}", id.stderr);
    let hello = tool("hello", &["fake"]);
    assert_eq!(hello.code, Some(0), "{}", hello.stderr);
    let p = perf(&["-d", "fake", "-n", "100", "--json"]);
    let v = json(&p);
    let backend = v["backend"].as_str().unwrap();
    // 1 namespace of 64 MiB in 512 B blocks, everywhere.
    assert!(id.stdout.contains("namespaces        1"), "{}", id.stdout);
    assert!(
        id.stdout.contains("131072 blocks x   512 B"),
        "{}",
        id.stdout
    );
    assert!(
        hello.stdout.contains("131072 blocks of 512 B"),
        "{}",
        hello.stdout
    );
    assert!(
        backend.contains("1 namespace × 64 MiB, 512 B blocks"),
        "{backend}"
    );
}

#[test]
fn lbads_means_log2_as_in_nvme() {
    let v = json(&perf(&["-d", "fake,lbads=12", "-n", "100", "--json"]));
    assert!(
        v["backend"].as_str().unwrap().contains("4096 B blocks"),
        "{v}"
    );
    let o = perf(&["-d", "fake,lbads=4096", "-n", "100"]);
    usage_error(&o, "lbs=");
}

// ---- item 7: smaller traps -------------------------------------------------

#[test]
fn io_size_zero_says_what_is_wrong() {
    let o = perf(&["-o", "0", "-n", "10"]);
    usage_error(&o, "at least one logical block");
}

#[test]
fn queue_depth_limit_is_the_engines() {
    // The parser's maximum is one the engine and the fake accept.
    let o = perf(&["-d", "fake:null", "-q", "4096", "-n", "5000", "--json"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let o = perf(&["-d", "fake:null", "-q", "4097", "-n", "10"]);
    usage_error(&o, "4096");
}

#[test]
fn times_take_units() {
    if support::skip_uring("times_take_units") {
        return;
    }
    let v = json(&perf(&[
        "-d",
        "uring:null",
        "-t",
        "300ms",
        "--warmup",
        "100ms",
        "--json",
    ]));
    assert_eq!(v["workload"]["time_s"], 0.3);
    let o = perf(&["-d", "uring:null", "-t", "soon"]);
    usage_error(&o, "not a duration");
}

#[test]
fn time_and_count_are_both_exit_conditions() {
    let t0 = Instant::now();
    let v = json(&perf(&[
        "-d",
        "fake:null",
        "-n",
        "1000000000000",
        "-t",
        "1",
        "--json",
    ]));
    assert!(t0.elapsed() < Duration::from_secs(50));
    let ios = v["total"]["ios"].as_u64().unwrap();
    assert!(ios > 0 && ios < 1_000_000_000_000, "{ios}");
    assert_eq!(v["workload"]["time_s"], 1.0);
}

#[test]
fn rwmixread_with_a_pure_workload_is_refused() {
    if support::skip_uring("rwmixread_with_a_pure_workload_is_refused") {
        return;
    }
    let o = perf(&["-w", "randread", "-M", "50", "-n", "10"]);
    usage_error(&o, "-M 50");
    let o = perf(&["-d", "uring:null", "-w", "randrw", "-M", "50", "-n", "100"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn the_nop_baseline_has_no_bandwidth_and_no_namespace() {
    if support::skip_uring("the_nop_baseline_has_no_bandwidth_and_no_namespace") {
        return;
    }
    let v = json(&perf(&["-d", "uring:null", "-n", "1000", "--json"]));
    assert!(v["total"]["mib_s"].is_null(), "{}", v["total"]);
    assert!(v["jobs"][0]["nsid"].is_null(), "{}", v["jobs"][0]);
    let o = perf(&["-d", "uring:null", "-n", "1000"]);
    assert!(!o.stdout.contains(" ns1 "), "{}", o.stdout);
}

#[test]
fn compare_json_has_the_single_run_shape() {
    if support::skip_uring("compare_json_has_the_single_run_shape") {
        return;
    }
    let single = json(&perf(&["-d", "uring:null", "-n", "1000", "--json"]));
    let both = json(&perf(&[
        "-d",
        "uring:null",
        "-n",
        "1000",
        "--compare",
        "fake:null",
        "--json",
    ]));
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&single), keys(&both));
    assert_eq!(both["device"], "uring:null");
    assert_eq!(both["compare"]["run"]["device"], "fake:null");
    assert!(both["compare"]["ratio"]["iops"].is_number());
    assert!(single["compare"].is_null());
}

#[test]
fn doctor_does_not_advise_running_itself() {
    let root = temp_path("emptyroot");
    std::fs::create_dir_all(&root).unwrap();
    let root = root.to_str().unwrap();
    let o = perf(&["doctor", "0000:01:00.0", "--root", root]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stdout.contains("no PCI device 0000:01:00.0"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("run `mcqio-perf doctor"), "{}", o.stdout);
}

// ---- item 3: uring paths ----------------------------------------------------

#[test]
fn uring_refuses_a_directory() {
    if support::skip_uring("uring_refuses_a_directory") {
        return;
    }
    let dir = std::env::temp_dir();
    let spec = format!("uring:{}", dir.display());
    let o = perf(&["-d", &spec, "-t", "1", "--quiet"]);
    usage_error(&o, "is a directory");
}

#[test]
fn uring_does_not_create_a_file_unless_asked() {
    if support::skip_uring("uring_does_not_create_a_file_unless_asked") {
        return;
    }
    let path = temp_path("typo-does-not-exist.img");
    let _ = std::fs::remove_file(&path);
    let spec = format!("uring:{}", path.display());
    let o = perf(&["-d", &spec, "-n", "10", "--quiet"]);
    usage_error(&o, "does not exist");
    assert!(!path.exists(), "a mistyped path created {}", path.display());
}

#[test]
fn uring_lays_out_a_file_it_creates() {
    if support::skip_uring("uring_lays_out_a_file_it_creates") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let path = temp_path("laid-out.img");
    let _ = std::fs::remove_file(&path);
    let spec = format!("uring:{},size=2M", path.display());
    let v = json(&perf(&["-d", &spec, "-n", "100", "--json"]));
    assert_eq!(v["total"]["errors"], 0, "{v}");
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), 2 << 20);
    // Written, not sparse: every byte has a block behind it.
    assert!(
        m.blocks() * 512 >= m.len(),
        "{} blocks of 512 B",
        m.blocks()
    );
    let _ = std::fs::remove_file(&path);
}

/// A loop device over a fresh file, with `sector` -byte logical blocks;
/// detached on drop. `None` (and why, on stderr) where this machine gives
/// the test no loop device (not root, no loop driver).
struct Loop(String);

impl Loop {
    fn new(test: &str, file: &std::path::Path, sector: u32) -> Option<Loop> {
        let o = std::process::Command::new("losetup")
            .args(["-f", "--show", "-b", &sector.to_string()])
            .arg(file)
            .output();
        match o {
            Ok(o) if o.status.success() => {
                Some(Loop(String::from_utf8_lossy(&o.stdout).trim().to_string()))
            }
            Ok(o) => {
                eprintln!(
                    "{test}: skipped, no loop device: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("{test}: skipped, no losetup: {e}");
                None
            }
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// A block device is driven in its own logical block size (BLKSSZGET), not
/// the 4 KiB a file gets: 512 B reads of a 512 B-sector device run, and the
/// same reads of a 4 KiB-sector device are refused.
#[test]
fn uring_takes_a_block_devices_logical_block_size() {
    let test = "uring_takes_a_block_devices_logical_block_size";
    if support::skip_uring(test) {
        return;
    }
    let file = temp_path("loop-backing.img");
    std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
    for (sector, runs) in [(512u32, true), (4096, false)] {
        let Some(dev) = Loop::new(test, &file, sector) else {
            return;
        };
        let spec = format!("uring:{}", dev.0);
        let o = perf(&[
            "-d", &spec, "-w", "randread", "-o", "512", "-n", "200", "--json",
        ]);
        if runs {
            let v = json(&o);
            assert_eq!(v["total"]["errors"], 0, "{sector}: {v}");
        } else {
            usage_error(&o, "4096-byte logical block");
        }
    }
    let _ = std::fs::remove_file(&file);
}

// ---- item 4: dma-bench's IOMMU cost and unused options ----------------------

#[test]
fn dma_bench_charges_the_readme_invalidation_cost_by_default() {
    let o = perf(&[
        "dma-bench",
        "-t",
        "200ms",
        "--threads",
        "1",
        "--batches",
        "32",
        "--json",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v = json(&o);
    assert_eq!(v["invalidation_cost_us"], 100.0, "{v}");
    let rows = v["rows"].as_array().unwrap();
    let strict = rows.iter().find(|r| r["mode"] == "strict").unwrap();
    // Each strict request waits out one 100 us invalidation: at most
    // 2000 fit in 0.2 s (a loaded machine only makes it fewer).
    let n = strict["total_requests"].as_u64().unwrap();
    assert!(n > 0 && n <= 3000, "strict did {n} requests in 0.2 s");
    // The option sets it.
    let v = json(&perf(&[
        "dma-bench",
        "-t",
        "50ms",
        "--threads",
        "1",
        "--batches",
        "32",
        "--inval-cost",
        "0",
        "--json",
    ]));
    assert_eq!(v["invalidation_cost_us"], 0.0, "{v}");
}

#[test]
fn dma_bench_refuses_device_options_it_does_not_use() {
    let o = perf(&[
        "dma-bench",
        "-d",
        "fake,latency=1us",
        "-t",
        "50ms",
        "--threads",
        "1",
    ]);
    usage_error(&o, "`latency`");
}

// ---- item 5: --verify in every DMA mode -------------------------------------

#[test]
fn verify_works_in_strict_and_lazy_modes() {
    for mode in ["strict", "lazy"] {
        let v = json(&perf(&[
            "-d",
            "fake,size=4M",
            "--dma",
            mode,
            "--verify",
            "-w",
            "randrw",
            "-n",
            "3000",
            "-q",
            "8",
            "--json",
        ]));
        assert_eq!(v["total"]["errors"], 0, "{mode}: {}", v["failures"]);
        assert_eq!(v["verify"]["mismatches"], 0, "{mode}: {}", v["failures"]);
        assert!(
            v["verify"]["blocks_checked"].as_u64().unwrap() > 0,
            "{mode}"
        );
        assert!(
            v["dma"]["maps"].as_u64().unwrap() > 0,
            "{mode}: {}",
            v["dma"]
        );
        // And it catches what the device corrupts.
        let o = perf(&[
            "-d",
            "fake,size=4M,corrupt=0.05",
            "--dma",
            mode,
            "--verify",
            "-w",
            "randrw",
            "-n",
            "3000",
            "-q",
            "8",
        ]);
        assert_eq!(o.code, Some(1), "{mode}: {}", o.stderr);
        assert!(o.stderr.contains("verify: LBA"), "{mode}: {}", o.stderr);
    }
}
