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

/// Start the child with SIGINT and SIGTERM blocked, so a stop signal the
/// test sends before the program has installed its handlers (a slow start
/// under qemu-user on a loaded machine) stays pending instead of killing
/// it; `mcqio-perf` unblocks both once its handlers are in place, and the
/// pending signal then reaches the handler.
#[allow(dead_code)] // only the signal tests hold signals
pub fn hold_stop_signals(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls sigemptyset/sigaddset/pthread_sigmask, which are
    // async-signal-safe and touch nothing but the local set.
    unsafe {
        c.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            match libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(e)),
            }
        })
    }
}

/// Wait until no signal `sig` is pending for process `pid` (it reached a
/// handler), at most `limit`; false on timeout. A hang guard for tests
/// that must send a second signal only after the first was taken.
#[allow(dead_code)]
pub fn signal_taken(pid: u32, sig: i32, limit: std::time::Duration) -> bool {
    let t = std::time::Instant::now();
    let bit = 1u64 << (sig - 1);
    loop {
        let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(s) => s,
            Err(_) => return true, // gone: nothing is pending any more
        };
        let pending = status
            .lines()
            .filter(|l| l.starts_with("ShdPnd:") || l.starts_with("SigPnd:"))
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
            .any(|m| m & bit != 0);
        if !pending {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Wait until process `pid` has a thread whose name starts with `prefix`
/// (a fake device's thread shows that its run has begun), at most `limit`;
/// false on timeout or if the process ended first.
#[allow(dead_code)]
pub fn thread_started(pid: u32, prefix: &str, limit: std::time::Duration) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        let found = tasks.flatten().any(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix))
        });
        if found {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}
