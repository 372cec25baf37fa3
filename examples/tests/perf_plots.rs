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

/// The `<text>` elements with their anchor position (x, y) and contents.
fn placed_texts(svg_path: &Path) -> Vec<(f64, f64, String)> {
    let svg = std::fs::read_to_string(svg_path).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed SVG");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| {
            let x = n.attribute("x")?.parse().ok()?;
            let y = n.attribute("y")?.parse().ok()?;
            Some((x, y, n.text()?.trim().to_string()))
        })
        .collect()
}

/// Reads an SI tick label back: `200k` is 200000.
fn si_value(t: &str) -> Option<f64> {
    let (num, mult) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1e3),
        'M' => (&t[..t.len() - 1], 1e6),
        'G' => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    Some(num.parse::<f64>().ok()? * mult)
}

/// Devices 10 to 100 times apart get a log IOPS axis spanning one to two
/// decades, where plotters' own ticks named the decade twice (`100k` at
/// two heights). Every tick label of the IOPS axis is distinct and sits
/// higher the larger it is; the latency axis is in percentiles (nines).
#[test]
fn the_iops_axis_names_each_tick_once_and_latency_is_in_nines() {
    let d = dir();
    let svg = d.join("ticks.svg");
    perf(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--compare",
        "fake,latency=1ms",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let t = placed_texts(&svg);
    // The left panel's y tick labels: right-aligned in its label area.
    let mut ticks: Vec<(f64, f64)> = t
        .iter()
        .filter(|(x, _, _)| *x > 30.0 && *x < 80.0)
        .filter_map(|(_, y, s)| Some((*y, si_value(s)?)))
        .collect();
    assert!(ticks.len() >= 2, "IOPS ticks: {t:?}");
    ticks.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in ticks.windows(2) {
        // SVG y grows downwards: a lower tick has a larger y and a smaller value.
        assert!(
            w[0].1 > w[1].1,
            "IOPS ticks not distinct and increasing upwards: {ticks:?}"
        );
    }
    let labels: Vec<&str> = t.iter().map(|(_, _, s)| s.as_str()).collect();
    for want in ["90%", "99%", "99.9%"] {
        assert!(
            labels.contains(&want),
            "no percentile tick {want}: {labels:?}"
        );
    }
    assert!(
        labels.iter().any(|l| l.contains("percentile")),
        "{labels:?}"
    );
}

/// `dma-bench` over 1 and 2 threads: whole thread counts on the x axis
/// (no 1.1, 1.2 ...), the legend right of every tick (outside the
/// plotting area), and the invalidation cost the fake IOMMU modelled in
/// the title.
#[test]
fn dma_bench_chart_has_whole_threads_a_clear_legend_and_its_cost() {
    let d = dir();
    let svg = d.join("dma-threads.svg");
    perf(&[
        "dma-bench",
        "-t",
        "100ms",
        "--threads",
        "1,2",
        "--inval-cost",
        "20us",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let t = placed_texts(&svg);
    let labels: Vec<&str> = t.iter().map(|(_, _, s)| s.as_str()).collect();
    assert!(
        labels
            .iter()
            .any(|l| l.contains("20 us per IOTLB invalidation")),
        "the title omits the invalidation cost: {labels:?}"
    );
    // The x tick labels: the lowest row of numbers.
    let bottom = t
        .iter()
        .filter(|(_, _, s)| s.parse::<f64>().is_ok())
        .map(|(_, y, _)| *y)
        .fold(f64::NEG_INFINITY, f64::max);
    let xticks: Vec<&(f64, f64, String)> = t
        .iter()
        .filter(|(_, y, s)| *y == bottom && s.parse::<f64>().is_ok())
        .collect();
    assert!(!xticks.is_empty(), "{t:?}");
    for (_, _, s) in &xticks {
        assert!(!s.contains('.'), "thread tick {s:?}: {xticks:?}");
    }
    let right_edge = xticks.iter().map(|x| x.0).fold(0.0, f64::max);
    for mode in ["premapped", "strict"] {
        let (x, _, _) = t
            .iter()
            .find(|(_, _, s)| s == mode)
            .unwrap_or_else(|| panic!("no legend entry {mode}: {labels:?}"));
        assert!(
            *x > right_edge,
            "legend entry {mode} at x {x} inside the plot (last tick at {right_edge})"
        );
    }
}
