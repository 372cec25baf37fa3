//! Charts a person wants to look at. Each kind is drawn,
//! checked in its SVG text (readable tick labels, the workload in the
//! title, no colour shared), and rendered to PNG with librsvg's
//! `rsvg-convert` where it is installed, to prove the SVG is a picture.

mod support;

use std::path::{Path, PathBuf};

fn perf(args: &[&str]) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(args)
        .output()
        .expect("mcqio-perf runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mcqio-plots-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The SVG's `<text>` contents.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed SVG");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

fn check(svg_path: &Path, title_has: &[&str]) -> Vec<String> {
    let svg = std::fs::read_to_string(svg_path).unwrap();
    let t = texts(&svg);
    for want in title_has {
        assert!(
            t.iter().any(|x| x.contains(want)),
            "no text with {want:?}: {t:?}"
        );
    }
    // No raw floats as tick labels (`4500000.0`, `100000`).
    for x in &t {
        let digits = x.chars().filter(|c| c.is_ascii_digit()).count();
        assert!(
            !(digits >= 5 && x.chars().all(|c| c.is_ascii_digit() || c == '.')),
            "tick label {x:?} is a raw number"
        );
    }
    // Rendered to PNG where librsvg is installed. Looked up on PATH first:
    // under qemu-user a spawn of a missing program does not fail, the
    // child exits 127 instead.
    let png = svg_path.with_extension("png");
    let rsvg = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("rsvg-convert"))
            .find(|f| f.is_file())
    });
    match rsvg {
        Some(rsvg) => {
            let s = std::process::Command::new(&rsvg)
                .arg("-o")
                .arg(&png)
                .arg(svg_path)
                .status()
                .unwrap_or_else(|e| panic!("{}: {e}", rsvg.display()));
            assert!(s.success(), "rsvg-convert failed on {}", svg_path.display());
            let bytes = std::fs::read(&png).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        }
        None => eprintln!("rsvg-convert not installed: PNG rendering skipped"),
    }
    t
}

#[test]
fn a_run_chart_names_its_workload_and_reads_well() {
    let d = dir();
    let svg = d.join("run.svg");
    perf(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake,latency=100ms",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    check(
        &svg,
        // A device that takes 100 ms per command runs at most 320 IOPS at
        // QD 32, orders of magnitude below fake:null on any machine (also
        // under qemu-user): a log IOPS axis.
        &[
            "randread 4 KiB, QD 32 x 1 job(s) on fake:null vs fake,latency=100ms",
            "IOPS (log)",
        ],
    );
}

#[test]
fn seed_mcq_draws_grouped_bars() {
    let d = dir();
    let svg = d.join("mcq.svg");
    perf(&["seed", "mcq", "-t", "1", "--plot", svg.to_str().unwrap()]);
    let t = check(
        &svg,
        &["4 KiB random, QD 32 per job", "randread, 1 job(s)", "MCQ"],
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    // Bars (a filled rectangle per mode and group, plus one per legend
    // entry), not lines joining jobs=1 to jobs=8.
    for colour in ["#1F77B4", "#FF7F0E"] {
        let bars = s.matches(&format!("fill=\"{colour}\"")).count();
        // Four groups, and one swatch in the legend.
        assert!(bars >= 5, "{colour}: {bars} bars");
        assert!(
            !s.contains(&format!("stroke=\"{colour}\"")),
            "a line in {colour}"
        );
    }
    assert!(t.iter().any(|x| x == "legacy single doorbell"), "{t:?}");
}

#[test]
fn dma_bench_uses_a_log_axis_for_rates_far_apart() {
    let d = dir();
    let svg = d.join("dma.svg");
    perf(&[
        "dma-bench",
        "-t",
        "300ms",
        "--threads",
        "1",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    check(&svg, &["(log)", "4096 B I/Os"]);
}
