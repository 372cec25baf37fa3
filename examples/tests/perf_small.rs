//! The smaller things a new user trips on first.

mod support;

fn perf(args: &[&str]) -> (i32, String, String) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(args)
        .output()
        .expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The region message read "at offset 100 of to the end bytes".
#[test]
fn the_offset_message_reads_as_english() {
    let (code, _, err) = perf(&["--offset", "100", "-t", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("of to the end bytes"), "{err}");
    assert!(
        err.contains("the region at offset 100 (to the end)"),
        "{err}"
    );
    let (_, _, err) = perf(&["--offset", "0", "--size", "100", "-t", "1"]);
    assert!(err.contains("the region at offset 0 of 100 bytes"), "{err}");
}

/// `--rate-iops 0` answered with the whole u64 range.
#[test]
fn rate_iops_zero_is_explained() {
    let (code, _, err) = perf(&["--rate-iops", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("18446744073709551615"), "{err}");
    assert!(err.contains("leave --rate-iops out for no limit"), "{err}");
}

/// fio's spellings pointed at the wrong flag (`--output-format=json` at
/// `--output`, `--direct=1` at `--quiet`).
#[test]
fn fio_spellings_point_to_the_right_flag() {
    for (arg, want) in [
        ("--output-format=json", "use --json"),
        ("--direct=1", "always direct"),
        ("--bs=4k", "-o/--io-size"),
        ("--iodepth=32", "-q/--qd"),
        ("--numjobs=2", "-j/--jobs"),
        ("--runtime=5", "-t/--time"),
    ] {
        let (code, _, err) = perf(&[arg]);
        assert_eq!(code, 2, "{arg}: {err}");
        assert!(err.contains(want), "{arg}: {err}");
        assert!(!err.contains("a similar argument exists"), "{arg}: {err}");
    }
}

/// spdk_nvme_perf's `-c <hex core mask>` is accepted as --cpus.
#[test]
fn spdk_core_mask_selects_the_cores() {
    let (code, out, err) = perf(&["-c", "0x1", "-d", "fake:null", "-t", "1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["jobs"][0]["core"], 0, "{v}");
    let (code, _, err) = perf(&["-c", "0x0"]);
    assert_eq!(code, 2);
    assert!(err.contains("no core"), "{err}");
}

/// The help says NVMe and UFS, and lists every fake-ufs option.
#[test]
fn help_names_nvme_and_ufs() {
    let (_, out, _) = perf(&["--help"]);
    assert!(
        out.lines().next().unwrap().contains("NVMe and UFS"),
        "{out}"
    );
    for k in ["tr=", "tprog=", "dies="] {
        assert!(out.contains(k), "-d help lacks {k}");
    }
    assert!(out.contains("-c"), "{out}");
    let (_, out, _) = perf(&["bind", "--help"]);
    assert!(out.contains("NVMe or UFS"), "{out}");
}

/// UFS `-q 4096` was explained as "the queue offers 255 slots of 4096
/// bytes; the job needs 4096 of 4096": it is a depth limit.
#[test]
fn a_too_deep_queue_is_explained_as_a_depth_limit() {
    let (code, _, err) = perf(&["-d", "fake-ufs", "-q", "4096", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("queue depth 4096 is deeper than this device's queue pair (255 slots): use -q 255 or less"),
        "{err}"
    );
    let (_, out, _) = perf(&["--help"]);
    assert!(out.contains("255 with MCQ, 32 on"), "{out}");
}

/// `--compare` printed a p99 ratio under tables that show no p99 (a
/// histogram is recorded for `--plot` too, without `-L`).
#[test]
fn compare_ratios_only_figures_the_tables_show() {
    let svg = std::env::temp_dir().join(format!("mcqio-ratio-{}.svg", std::process::id()));
    let svg = svg.to_str().unwrap();
    let ratio = |args: &[&str]| {
        let (code, out, err) = perf(args);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .find(|l| l.contains(" vs ") && l.contains("IOPS"))
            .unwrap_or_else(|| panic!("no ratio line: {out}"))
            .to_string()
    };
    let plain = ratio(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake:null,ns=2",
        "--plot",
        svg,
    ]);
    assert!(!plain.contains("p99"), "{plain}");
    let _ = std::fs::remove_file(svg);
    let with_l = ratio(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake:null,ns=2",
        "-L",
    ]);
    assert!(with_l.contains("p99 latency"), "{with_l}");
}
