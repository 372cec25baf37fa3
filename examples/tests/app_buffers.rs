//! Runs the `app_buffers` example: application buffers
//! through the engine's strict and lazy DMA modes on the fake controller.

mod support;

/// Runs the example, under `MCQIO_TEST_RUNNER` if set (see perf_cli.rs).
fn app_buffers(args: &[&str]) -> (i32, String, String) {
    let bin = env!("CARGO_BIN_EXE_app_buffers");
    let mut cmd = support::command(bin);
    let out = cmd.args(args).output().expect("app_buffers runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn runs_on_the_fake_by_default() {
    let (code, out, err) = app_buffers(&[]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("lazy mode"), "{out}");
    assert!(out.contains("32 ok"), "{out}");
}

#[test]
fn every_mode_and_block_size_round_trips() {
    for (dev, mode, name) in [
        ("fake", "strict", "strict mode"),
        ("fake,lbs=4k", "lazy:1", "lazy mode"),
        ("fake,sync=1", "lazy:64", "lazy mode"),
    ] {
        let (code, out, err) = app_buffers(&[dev, mode]);
        assert_eq!(code, 0, "{dev} {mode}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.contains(name) && out.contains("32 ok"), "{out}");
    }
}

#[test]
fn a_bad_mode_is_refused() {
    let (code, _, err) = app_buffers(&["fake", "lazy:0"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown mode"), "{err}");
}
