//! The build profiles the README promises: `cargo run --release` is the quick
//! first build a new user starts with (no fat LTO, parallel codegen), and the
//! measured numbers come from `--profile dist`, which keeps fat LTO and one
//! codegen unit. The README quotes both the build time and the IOPS gap, so a
//! change to either profile has to be a deliberate one.

use std::collections::BTreeMap;

/// The `key = value` lines of each `[section]` of a TOML file, values as
/// written (quotes kept). Enough for the flat `[profile.*]` tables; nested
/// tables and arrays are not needed here.
fn sections(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_string();
            out.entry(current.clone()).or_default();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(current.clone())
                .or_default()
                .insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    out
}

fn root_manifest() -> BTreeMap<String, BTreeMap<String, String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    sections(&std::fs::read_to_string(path).expect("the workspace Cargo.toml is readable"))
}

#[test]
fn release_profile_builds_fast() {
    let m = root_manifest();
    let release = m.get("profile.release").cloned().unwrap_or_default();
    // Fat LTO with one codegen unit made the README's first command compile
    // for about four minutes on a 2-core machine: the whole program is
    // optimised on one thread at the end.
    let lto = release.get("lto").map(String::as_str);
    assert!(
        matches!(lto, None | Some("false") | Some("\"off\"")),
        "profile.release sets lto = {lto:?}: the first build pays for it"
    );
    let cgu = release.get("codegen-units").map(String::as_str);
    assert!(
        cgu.is_none_or(|n| n.parse::<u32>().is_ok_and(|n| n >= 16)),
        "profile.release sets codegen-units = {cgu:?}: the first build runs on one thread"
    );
}

#[test]
fn dist_profile_keeps_the_measured_build() {
    let m = root_manifest();
    let dist = m
        .get("profile.dist")
        .expect("a [profile.dist] for measured numbers");
    assert_eq!(
        dist.get("inherits").map(String::as_str),
        Some("\"release\"")
    );
    assert_eq!(dist.get("lto").map(String::as_str), Some("\"fat\""));
    assert_eq!(dist.get("codegen-units").map(String::as_str), Some("1"));
    // `cargo bench` measures too: same settings as dist.
    let bench = m.get("profile.bench").expect("a [profile.bench]");
    assert_eq!(bench.get("lto").map(String::as_str), Some("\"fat\""));
    assert_eq!(bench.get("codegen-units").map(String::as_str), Some("1"));
}

#[test]
fn readme_names_both_profiles() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md is readable");
    assert!(
        readme.contains("cargo run --release --bin mcqio-perf"),
        "the first command stays the quick one"
    );
    assert!(
        readme.contains("--profile dist"),
        "the README says how the measured numbers are built"
    );
}
