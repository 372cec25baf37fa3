//! The live line on stderr (a terminal only): phase, elapsed time, a bar with
//! the ETA, and the last second's IOPS and bandwidth — drawn by `indicatif`.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How a phase's end is known: after a time, or after a number of I/Os.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// The phase lasts this long.
    Time(Duration),
    /// The phase ends after this many I/Os (all jobs together).
    Ios(u64),
}

/// A live progress line, or nothing when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    goal: Goal,
}

impl Progress {
    /// A line for one phase (`warmup`, `run`); hidden unless `enabled` and
    /// stderr is a terminal.
    pub fn new(enabled: bool, phase: &str, goal: Goal) -> Self {
        let len = match goal {
            Goal::Time(t) => t.as_millis().min(u64::MAX as u128) as u64,
            Goal::Ios(n) => n,
        };
        let bar = enabled.then(|| {
            let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix:>6} [{elapsed_precise}] [{bar:30}] {percent:>3}% eta {eta:>4} {msg}",
            )
            .expect("the template is valid")
            .progress_chars("=> ");
            b.set_style(style);
            b.set_prefix(phase.to_string());
            b
        });
        Progress { bar, goal }
    }

    /// Where the phase is: `elapsed` since it began, `ios` completed in it.
    pub fn update(&self, elapsed: Duration, ios: u64) {
        if let Some(b) = &self.bar {
            b.set_position(match self.goal {
                Goal::Time(_) => elapsed.as_millis().min(u64::MAX as u128) as u64,
                Goal::Ios(_) => ios,
            });
        }
    }

    /// The last sample: `ios` completed over `dt` seconds.
    pub fn rate(&self, ios: u64, dt: f64, io_size: u64) {
        if let Some(b) = &self.bar {
            let iops = if dt > 0.0 { ios as f64 / dt } else { 0.0 };
            b.set_message(format!(
                "{iops:>10.0} IOPS {:>9.1} MiB/s",
                iops * io_size as f64 / (1u64 << 20) as f64
            ));
        }
    }

    /// Remove the line.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
