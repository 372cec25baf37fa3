//! SIGINT/SIGTERM for every subcommand that runs for a while (a run,
//! `seed mcq`, `seed hpb`, `dma-bench`).
//!
//! The first signal sets a flag: a run stops submitting, lets every I/O in
//! flight complete and reports the time measured; a table of rows stops
//! after the row in progress and prints the rows it has, marked as
//! partial. A second signal ends the process at once. The exit code is
//! the shell's for "ended by signal N": 130 for SIGINT, 143 for SIGTERM.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The installed handlers' state.
pub struct Interrupt {
    /// Set by either signal.
    flag: Arc<AtomicBool>,
    /// Which signal came (0: none).
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Install the handlers for SIGINT and SIGTERM.
    pub fn install() -> Result<Self, String> {
        let flag = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let e = |e: std::io::Error| format!("cannot install a handler for signal {sig}: {e}");
            // Registered first, so it sees the flag as the earlier signal left it.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&flag))
                .map_err(e)?;
            signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize).map_err(e)?;
            signal_hook::flag::register(sig, Arc::clone(&flag)).map_err(e)?;
        }
        unblock_stop_signals()?;
        Ok(Interrupt { flag, signal })
    }

    /// The flag a run polls.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    /// The signal that came, if one did.
    pub fn signal(&self) -> Option<i32> {
        if !self.flag.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.signal.load(Ordering::Relaxed) as i32)
    }

    /// The signal's name, if one came.
    pub fn name(&self) -> Option<&'static str> {
        self.signal().map(|s| {
            if s == signal_hook::consts::SIGTERM {
                "SIGTERM"
            } else {
                "SIGINT"
            }
        })
    }

    /// 128 + the signal, if one came.
    pub fn exit_code(&self) -> Option<ExitCode> {
        self.signal()
            .map(|s| ExitCode::from((128 + s).clamp(1, 255) as u8))
    }
}

/// Unblock SIGINT and SIGTERM in this thread (the main thread, before any
/// job thread is spawned, so the jobs inherit it). A parent may start us
/// with them blocked (some launchers do, and the signal tests do on
/// purpose); a stop signal sent before the handlers were installed is then
/// pending, and unblocking delivers it to the handler instead of losing it.
fn unblock_stop_signals() -> Result<(), String> {
    // SAFETY: sigset_t is plain data for which all-zero is a valid value,
    // and sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the calls
    // only write it, and pthread_sigmask reads it and changes this thread's
    // mask (the old mask is not asked for).
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut())
    };
    match rc {
        0 => Ok(()),
        e => Err(format!(
            "cannot unblock SIGINT/SIGTERM: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}
