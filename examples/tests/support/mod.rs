//! What the tests that run the built example binaries share.

use std::process::Command;

/// A command for the built binary at `path` (`env!("CARGO_BIN_EXE_…")`),
/// under `MCQIO_TEST_RUNNER` when that is set: a cross-built test (aarch64
/// under qemu-user, `.ci/aarch64`) cannot start the target binary itself.
pub fn command(path: &str) -> Command {
    let runner = std::env::var("MCQIO_TEST_RUNNER").unwrap_or_default();
    let mut runner = runner.split_whitespace();
    match runner.next() {
        Some(emulator) => {
            let mut c = Command::new(emulator);
            c.args(runner).arg(path);
            c
        }
        None => Command::new(path),
    }
}

/// Whether to skip a test (or its io_uring half) because `MCQIO_TEST_NO_URING`
/// is set: qemu-user, which runs the aarch64 tests, has no io_uring.
#[allow(dead_code)] // not every test file has io_uring parts
pub fn skip_uring(test: &str) -> bool {
    let skip = std::env::var_os("MCQIO_TEST_NO_URING").is_some();
    if skip {
        eprintln!("{test}: io_uring part skipped (MCQIO_TEST_NO_URING is set)");
    }
    skip
}
