//! The fio / spdk_nvme_perf features, end to end on
//! the built `mcqio-perf` (short runs on the in-process fake).

mod support;

use serde_json::Value;

/// Runs `mcqio-perf` (under `MCQIO_TEST_RUNNER` when cross-built, as in perf_cli).
fn perf(args: &[&str]) -> (i32, String, String) {
    let bin = env!("CARGO_BIN_EXE_mcqio-perf");
    let mut cmd = support::command(bin);
    let out = cmd
        .args(args)
        .arg("--quiet")
        .output()
        .expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, out, err) = perf(&a);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn usage_error(args: &[&str], needle: &str) {
    let (code, _, err) = perf(args);
    assert_eq!(code, 2, "{args:?} should be refused: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in: {err}");
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcqio-perf-features-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A mixed workload reports reads and writes apart, per
/// job and in the total, and they add up.
#[test]
fn mixed_workloads_report_reads_and_writes_apart() {
    let v = json(&["-w", "randrw", "-M", "70", "-n", "3000", "-j", "1"]);
    for row in [&v["total"], &v["jobs"][0]] {
        let (r, w) = (&row["read"], &row["write"]);
        let (ri, wi) = (r["ios"].as_u64().unwrap(), w["ios"].as_u64().unwrap());
        assert_eq!(ri + wi, row["ios"].as_u64().unwrap(), "{row}");
        assert!(ri > wi && wi > 0, "70 % reads: {ri} {wi}");
        for d in [r, w] {
            for k in ["iops", "mib_s"] {
                assert!(d[k].as_f64().unwrap() > 0.0, "{k}: {d}");
            }
            assert!(d["lat_us"]["p99"].is_number(), "{d}");
        }
    }
    let v = json(&["-w", "randread", "-n", "500"]);
    assert!(v["total"]["write"].is_null());
    assert_eq!(v["total"]["read"]["ios"], 500);
    let (code, out, _) = perf(&["-w", "rw", "-n", "500"]);
    assert_eq!(code, 0);
    assert!(out.contains("  read ") && out.contains("  write "), "{out}");
}

/// A chosen percentile list, and -LL's bucketed histogram.
#[test]
fn chosen_percentiles_and_the_latency_histogram() {
    let v = json(&["-n", "2000", "--percentiles", "50,99.9", "-LL"]);
    let lat = &v["total"]["lat_us"];
    let ps: Vec<f64> = lat["percentiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["p"].as_f64().unwrap())
        .collect();
    assert_eq!(ps, vec![50.0, 99.9]);
    let b = lat["buckets"].as_array().unwrap();
    let n: u64 = b.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(n, 2000);
    assert_eq!(b.last().unwrap()["cumulative_pct"], 100.0);
    let (code, out, _) = perf(&["-n", "500", "-LL", "--percentiles", "12.5"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("12.50000%") && out.contains("Range in us"),
        "{out}"
    );
    usage_error(&["--percentiles", "50,101"], "outside");
}

/// Distributions by name, seeded, bad ones refused.
#[test]
fn random_distributions_are_selectable() {
    for d in ["zipf:1.2", "pareto:0.2", "normal:5", "uniform"] {
        let v = json(&["-n", "500", "--seed", "7", "--random-distribution", d]);
        assert_eq!(v["workload"]["distribution"], d);
        assert_eq!(v["workload"]["seed"], 7);
        assert_eq!(v["total"]["errors"], 0);
    }
    usage_error(&["--random-distribution", "zipf:1"], "θ ≠ 1");
    usage_error(&["--random-distribution", "gauss"], "not a distribution");
}

/// The region under test, checked against the namespace.
#[test]
fn offset_and_size_of_the_region() {
    let v = json(&[
        "--offset", "1M", "--size", "1M", "-n", "300", "--verify", "-w", "randrw",
    ]);
    assert_eq!(v["workload"]["offset"], 1 << 20);
    assert_eq!(v["workload"]["size"], 1 << 20);
    // --verify prefills the whole region, and only it: 1 MiB of 512 B blocks.
    assert_eq!(v["verify"]["prefill_blocks"], 2048);
    usage_error(&["--offset", "63M", "--size", "2M"], "does not fit");
    usage_error(&["--range", "1000"], "multiple of the logical block size");
    usage_error(&["--offset", "64M"], "does not fit");
}

/// -N picks namespaces.
#[test]
fn namespaces_are_selectable() {
    let v = json(&["-d", "fake,ns=3", "-N", "2,3", "-j", "2", "-n", "100"]);
    let ns: Vec<u64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["nsid"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, vec![2, 3]);
    usage_error(&["-N", "2"], "has no namespace 2");
    usage_error(&["-N", "0"], "NSIDs start at 1");
}

/// A size-based run moves exactly the bytes asked for; a
/// rate limit caps the IOPS.
#[test]
fn size_based_runs_and_rate_limits() {
    let v = json(&["--bytes", "1M", "-o", "4k", "-d", "fake,lbs=4k", "-j", "2"]);
    assert_eq!(v["total"]["ios"], 256);
    assert_eq!(v["jobs"][0]["ios"], 128);
    assert_eq!(v["workload"]["bytes"], 1 << 20);
    usage_error(&["--bytes", "1M", "-n", "5"], "cannot be used with");
    usage_error(&["--bytes", "0"], "moves nothing");
    // Three jobs share 10 I/Os exactly: 4 + 3 + 3.
    let v = json(&[
        "--bytes",
        "40k",
        "-o",
        "4k",
        "-d",
        "fake:null",
        "-j",
        "3",
        "--force",
    ]);
    assert_eq!(v["total"]["ios"], 10);
    let per_job: Vec<u64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["ios"].as_u64().unwrap())
        .collect();
    assert_eq!(per_job, [4, 3, 3]);
    let v = json(&["--rate-iops", "400", "-t", "1"]);
    let iops = v["total"]["iops"].as_f64().unwrap();
    // An upper bound only: a loaded machine can be slower, never faster.
    assert!(iops > 0.0 && iops <= 440.0, "{iops}");
    assert_eq!(v["workload"]["rate_iops"], 400);
}

/// --output writes the report to a file; the JSON holds
/// a per-second series with IOPS, MiB/s and latency percentiles.
#[test]
fn output_file_and_time_series() {
    let f = temp("report.json");
    let (code, out, err) = perf(&["-t", "2", "--json", "--output", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "the report goes to the file: {out}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let ts = v["time_series"].as_array().unwrap();
    assert!(!ts.is_empty(), "{v}");
    for s in ts {
        assert!(s["iops"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["mib_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["t_s"].as_f64().unwrap() > 0.5, "{s}");
        let p = s["lat_us"].as_array().unwrap();
        assert_eq!(p.len(), 5, "{s}");
        assert!(p[0]["us"].as_f64().unwrap() > 0.0, "{s}");
    }
    let t = temp("report.txt");
    let (code, out, _) = perf(&["-n", "100", "--output", t.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.is_empty());
    assert!(std::fs::read_to_string(&t).unwrap().contains("Total"));
    usage_error(
        &["-n", "10", "--output", "/nonexistent-dir/x"],
        "cannot write",
    );
}

/// The `<text>` contents of an SVG, after checking it parses as XML.
fn svg_texts(path: &std::path::Path) -> (Vec<String>, usize) {
    let s = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&s).unwrap_or_else(|e| panic!("not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect();
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    (texts, lines)
}

/// --plot writes an SVG with both charts and a series per run.
#[test]
fn plot_writes_an_svg_with_the_series() {
    let f = temp("run.svg");
    let (code, _, err) = perf(&[
        "-t",
        "1",
        "-d",
        "fake:null",
        "--compare",
        "fake",
        "--plot",
        f.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (texts, lines) = svg_texts(&f);
    for want in [
        "IOPS over time",
        "Latency distribution",
        "fake:null IOPS",
        "fake IOPS",
        "fake:null latency",
        "fake latency",
    ] {
        assert!(texts.iter().any(|t| t == want), "`{want}` not in {texts:?}");
    }
    assert!(lines >= 4, "{lines} lines");
    let d = temp("dma.svg");
    let (code, _, err) = perf_dma(&[
        "-t",
        "50ms",
        "--threads",
        "1,2",
        "--batches",
        "4",
        "--inval-cost",
        "0",
        "--plot",
        d.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (texts, lines) = svg_texts(&d);
    for want in ["premapped", "strict", "lazy/4"] {
        assert!(texts.iter().any(|t| t == want), "`{want}` not in {texts:?}");
    }
    assert!(lines >= 3);
}

fn perf_dma(args: &[&str]) -> (i32, String, String) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .arg("dma-bench")
        .args(args)
        .output()
        .expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `devices` lists UFS host controllers beside NVMe ones,
/// with the transport each speaks (a fake sysfs tree under `--root`).
#[test]
fn devices_lists_ufs_host_controllers() {
    let base = temp("root");
    for (bdf, class, dev) in [
        ("0000:00:03.0", "0x010802", "0x0010"),
        ("0000:00:04.0", "0x010901", "0x0013"),
        ("0000:00:05.0", "0x020000", "0x1533"),
    ] {
        let d = base.join("sys/bus/pci/devices").join(bdf);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), "0x1b36\n").unwrap();
        std::fs::write(d.join("device"), format!("{dev}\n")).unwrap();
        std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
    }
    for d in ["proc", "dev"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    std::fs::write(base.join("proc/mounts"), "").unwrap();
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(["devices", "--root", base.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |bdf: &str| {
        text.lines()
            .find(|l| l.starts_with(bdf))
            .map(str::to_string)
    };
    assert!(line("0000:00:03.0").unwrap().contains("NVMe"), "{text}");
    let ufs = line("0000:00:04.0").unwrap_or_else(|| panic!("UFS missing: {text}"));
    assert!(ufs.contains("UFS") && ufs.contains("1b36:0013"), "{ufs}");
    assert!(line("0000:00:05.0").is_none(), "{text}");
}

/// Issue 42: `devices` says which IOMMU interfaces the kernel offers (and
/// why one is missing), and for each device on vfio-pci which one
/// `vfio:<BDF>` opens it through.
#[test]
fn devices_say_which_iommu_interface_opens_each_device() {
    use std::os::unix::fs::symlink;
    let base = temp("root-iommufd");
    let real = base.join("sys/devices/pci0000:00/0000:00:03.0");
    std::fs::create_dir_all(&real).unwrap();
    for (f, v) in [
        ("vendor", "0x1b36"),
        ("device", "0x0010"),
        ("class", "0x010802"),
    ] {
        std::fs::write(real.join(f), format!("{v}\n")).unwrap();
    }
    for d in [
        "sys/bus/pci/devices",
        "sys/bus/pci/drivers/vfio-pci",
        "sys/kernel/iommu_groups/3/devices",
        "sys/module/vfio_iommu_type1",
        "proc",
        "dev/vfio/devices",
    ] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    symlink(&real, base.join("sys/bus/pci/devices/0000:00:03.0")).unwrap();
    symlink(
        base.join("sys/bus/pci/drivers/vfio-pci"),
        real.join("driver"),
    )
    .unwrap();
    symlink(
        base.join("sys/kernel/iommu_groups/3"),
        real.join("iommu_group"),
    )
    .unwrap();
    symlink(
        &real,
        base.join("sys/kernel/iommu_groups/3/devices/0000:00:03.0"),
    )
    .unwrap();
    for f in ["proc/mounts", "dev/vfio/vfio", "dev/vfio/3"] {
        std::fs::write(base.join(f), "").unwrap();
    }
    let devices = || {
        let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
            .args(["devices", "--root", base.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let opens = |text: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with("0000:00:03.0"))
            .unwrap();
        line.split_whitespace().nth(6).unwrap().to_string()
    };

    // A Debian kernel: the container only.
    let text = devices();
    assert!(text.contains("type1 yes, "), "{text}");
    assert!(
        text.contains("iommufd no: ") && text.contains("CONFIG_IOMMUFD is off"),
        "{text}"
    );
    assert_eq!(opens(&text), "type1", "{text}");

    // /dev/iommu and the cdev class, but this device has no cdev yet.
    std::fs::write(base.join("dev/iommu"), "").unwrap();
    std::fs::create_dir_all(base.join("sys/class/vfio-dev/vfio0")).unwrap();
    let text = devices();
    assert!(text.contains("iommufd yes, "), "{text}");
    assert_eq!(opens(&text), "type1", "{text}");
    assert!(
        text.contains("no iommufd: ") && text.contains("vfio-dev is missing"),
        "{text}"
    );

    // The device's cdev: auto takes iommufd.
    std::fs::create_dir_all(real.join("vfio-dev/vfio0")).unwrap();
    std::fs::write(base.join("dev/vfio/devices/vfio0"), "").unwrap();
    let text = devices();
    assert_eq!(opens(&text), "iommufd", "{text}");
    assert!(!text.contains("no iommufd"), "{text}");
}

/// With `-N` left out every namespace is driven, as
/// spdk_nvme_perf associates workers with namespaces (max(jobs,
/// namespaces) rows, row r on job r mod jobs and namespace r mod
/// namespaces): one job drives all three namespaces, each on its own queue
/// pair at the full queue depth; two jobs on one namespace share it.
#[test]
fn every_namespace_is_driven_from_the_jobs_there_are() {
    let v = json(&["-d", "fake:null,ns=3", "-n", "200", "-q", "4"]);
    let rows: Vec<(u64, u64, u64)> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["nsid"].as_u64().unwrap(),
                j["core"].as_u64().unwrap(),
                j["ios"].as_u64().unwrap(),
            )
        })
        .collect();
    let core = rows[0].1;
    assert_eq!(rows, [(1, core, 200), (2, core, 200), (3, core, 200)]);
    assert_eq!(v["total"]["ios"], 600);
    // The thread's CPU is counted once, not once per namespace (a timed
    // run: a thread's CPU clock moves in scheduler ticks, too coarse for
    // a run of a few hundred I/Os).
    let v = json(&["-d", "fake:null,ns=3", "-t", "1", "-q", "4"]);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 3);
    let cpu =
        v["total"]["cpu_usr_pct"].as_f64().unwrap() + v["total"]["cpu_sys_pct"].as_f64().unwrap();
    assert!(cpu <= 105.0, "one busy-polling thread: {cpu}% of a core");
    // -N still picks.
    let v = json(&["-d", "fake:null,ns=3", "-n", "200", "-N", "2"]);
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["nsid"], 2);
    // More jobs than namespaces: both jobs on the one namespace, as before.
    let v = json(&["-d", "fake:null", "-j", "2", "-n", "100"]);
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|j| j["nsid"] == 1));
    assert_ne!(jobs[0]["core"], jobs[1]["core"]);
    // The text report has a row per namespace and core.
    let (code, out, err) = perf(&["-d", "fake:null,ns=2", "-n", "100"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("fake:null ns1 from core") && out.contains("fake:null ns2 from core"),
        "{out}"
    );
}

/// Several devices in one run, a row per device,
/// namespace and core; the total adds them up.
#[test]
fn several_devices_in_one_run() {
    let v = json(&["-d", "fake,ns=2", "-d", "fake:null", "-j", "2", "-n", "300"]);
    assert_eq!(v["device"], "fake,ns=2 + fake:null");
    let rows: Vec<(String, u64)> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["device"].as_str().unwrap().to_string(),
                j["nsid"].as_u64().unwrap(),
            )
        })
        .collect();
    // The first device's thread drives both its namespaces.
    assert_eq!(
        rows,
        [
            ("fake".to_string(), 1),
            ("fake".to_string(), 2),
            ("fake:null".to_string(), 1)
        ]
    );
    assert_eq!(v["total"]["ios"], 900);
    let (code, out, _) = perf(&["-d", "fake", "-d", "fake:null", "-j", "2", "-n", "100"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("fake ns1 from core 0") && out.contains("fake:null ns1 from core 1"),
        "{out}"
    );
    usage_error(
        &["-d", "fake", "-d", "fake:null", "-j", "1"],
        "2 devices need at least 2 jobs",
    );
}
