//! `--output` and `--plot` are checked before anything
//! runs. A path that cannot be written used to cost the whole run (and
//! lose its report), then failed with plotters' "Drawing backend error".

mod support;

use std::time::{Duration, Instant};

/// Runs `mcqio-perf`; returns the exit code, stderr and how long it took.
fn perf(args: &[&str]) -> (i32, String, Duration) {
    let t = Instant::now();
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(args)
        .output()
        .expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

/// A directory that does not exist, so nothing can be created in it.
fn missing(file: &str) -> String {
    let dir = std::env::temp_dir().join(format!("mcqio-no-such-dir-{}", std::process::id()));
    assert!(!dir.exists());
    dir.join(file).display().to_string()
}

fn check_refused(args: &[&str], path: &str) {
    let (code, err, took) = perf(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    // The run asked for 20 s (rows of 20 s); refused up front it takes
    // well under that even on a loaded machine.
    assert!(
        took < Duration::from_secs(10),
        "{args:?}: took {took:?}: the run went ahead before the output was checked"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one clean error line: {err}");
    assert!(
        lines[0].starts_with("mcqio-perf: error: cannot write ") && lines[0].contains(path),
        "{args:?}: {err}"
    );
    assert!(!err.contains("backend"), "{args:?}: {err}");
}

#[test]
fn an_unwritable_output_or_plot_fails_before_the_run() {
    let out = missing("report.txt");
    check_refused(&["-d", "fake:null", "-t", "20", "--output", &out], &out);
    let svg = missing("run.svg");
    check_refused(&["-d", "fake:null", "-t", "20", "--plot", &svg], &svg);
}

#[test]
fn dma_bench_and_seed_check_their_plot_first() {
    let svg = missing("dma.svg");
    check_refused(
        &["dma-bench", "-t", "20", "--threads", "1", "--plot", &svg],
        &svg,
    );
    let svg = missing("mcq.svg");
    check_refused(&["seed", "mcq", "-t", "20", "--plot", &svg], &svg);
}

/// A writable `--plot` and `--output` still get their contents.
#[test]
fn writable_outputs_are_written() {
    let dir = std::env::temp_dir().join(format!("mcqio-outputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, svg) = (dir.join("r.json"), dir.join("r.svg"));
    let (code, err, _) = perf(&[
        "-d",
        "fake:null",
        "-t",
        "1",
        "--json",
        "--output",
        out.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).expect("the report");
    assert!(doc["total"]["ios"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}
