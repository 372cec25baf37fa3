//! How much of the measured phase each thread of the process spent
//! waiting for a CPU while it was runnable: `/proc/self/task/*/schedstat`
//! (the scheduler's own run time and run-queue wait, in ns, per thread).
//!
//! A busy-polling thread (a job, or a fake's device thread) never sleeps,
//! so any wait there is time the scheduler gave its core to someone else:
//! the run's figures then measure the scheduler. On a
//! kernel without schedstat the snapshot is empty and nothing is judged.

use std::collections::BTreeMap;

/// One thread's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSched {
    /// Time on a CPU, ns.
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub wait_ns: u64,
}

/// Every thread of this process, by thread id: its name and counters.
pub type Snapshot = BTreeMap<u32, (String, ThreadSched)>;

/// Read the counters of every thread (empty where schedstat is missing).
pub fn snapshot() -> Snapshot {
    let mut out = Snapshot::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let p = e.path();
        let Some(s) = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| parse(&s))
        else {
            continue;
        };
        let name = std::fs::read_to_string(p.join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        out.insert(tid, (name, s));
    }
    out
}

/// Parse one schedstat line: run ns, wait ns, time slices.
fn parse(s: &str) -> Option<ThreadSched> {
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some(ThreadSched {
        run_ns: f.next()??,
        wait_ns: f.next()??,
    })
}

/// Per thread alive in both snapshots: name and the wait between them, ns.
pub fn waits(before: &Snapshot, after: &Snapshot) -> Vec<(u32, String, u64)> {
    after
        .iter()
        .filter_map(|(tid, (name, a))| {
            let (_, b) = before.get(tid)?;
            Some((*tid, name.clone(), a.wait_ns.saturating_sub(b.wait_ns)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_line() {
        assert_eq!(
            parse("260877 4537 2\n"),
            Some(ThreadSched {
                run_ns: 260877,
                wait_ns: 4537
            })
        );
        assert_eq!(parse("12"), None);
    }

    /// A spinning thread and this one both show up, and wait only grows.
    #[test]
    fn snapshots_see_this_process_threads() {
        let a = snapshot();
        if a.is_empty() {
            eprintln!("no schedstat on this kernel: skipped");
            return;
        }
        let me = std::process::id();
        let b = snapshot();
        assert!(b.contains_key(&me), "{b:?}");
        for (_, _, w) in waits(&a, &b) {
            assert!(w < 60_000_000_000);
        }
    }
}
