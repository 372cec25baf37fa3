//! The shared timeout policy on UFS queue pairs (issue 13 item 1):
//! `ReportOnly` counts, `Abort` withdraws the command through the UFS abort
//! machinery (MCQ cleanup by nexus, legacy UTRLCLR) and completes it as
//! `IoError::TimedOut` only once the controller gave it up, `Reset`
//! resets the host controller (or, when it cannot be disabled, ends the
//! command without its buffer). Every command still ends
//! exactly once, and a buffer the device may still own is never handed back.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::time::{Duration, Instant};

use mcqio::ufs::{UfsController, UfsQpairOptions, UfsQueuePair};
use mcqio::vfio::DmaDir;
use mcqio::{Completion, DmaBuf, IoError, TimeoutPolicy};
use mcqio_fixtures::ufs::UfsFault;

const READ10: u8 = 0x28;
const TIMEOUT: Duration = Duration::from_millis(20);

fn qpair(ctrl: &std::sync::Arc<UfsController>, policy: TimeoutPolicy) -> UfsQueuePair<DmaBuf> {
    ctrl.create_qpair_for::<DmaBuf>(UfsQpairOptions {
        io_timeout: Some(TIMEOUT),
        timeout_policy: policy,
        ..Default::default()
    })
    .unwrap()
}

fn read(ctrl: &UfsController, qp: &mut UfsQueuePair<DmaBuf>, lba: u64, tag: u64) {
    let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    qp.read(0, lba, 1, b, tag).unwrap();
}

/// Poll until `done(qp, completions)` holds (bounded by a generous limit:
/// no timing assertion, only a guard against a hang).
fn poll_until(
    qp: &mut UfsQueuePair<DmaBuf>,
    out: &mut Vec<Completion<DmaBuf>>,
    mut done: impl FnMut(&UfsQueuePair<DmaBuf>, &[Completion<DmaBuf>]) -> bool,
) {
    qp.submit();
    let start = Instant::now();
    while !done(qp, out) {
        qp.poll(64, |c| out.push(c)).expect("poll");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "condition not reached; {} completions, stats {:?}",
            out.len(),
            qp.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn no_more(qp: &mut UfsQueuePair<DmaBuf>) {
    for _ in 0..5 {
        qp.poll(64, |c| panic!("completed twice: tag {}", c.tag))
            .unwrap();
    }
}

fn still_works(qp: &mut UfsQueuePair<DmaBuf>) {
    let data = pattern(11, 4096);
    qp.write_blocking(0, 20, &data).unwrap();
    let mut back = vec![0u8; 4096];
    qp.read_blocking(0, 20, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn report_only_counts_a_dropped_completion_and_leaves_the_command_alone() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = qpair(&ctrl, TimeoutPolicy::ReportOnly);
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        read(&ctrl, &mut qp, 0, 1);
        read(&ctrl, &mut qp, 1, 2);
        let mut done = Vec::new();
        poll_until(&mut qp, &mut done, |qp, _| qp.stats().timeouts >= 1);
        assert_eq!(qp.stats().timeouts, 1, "mcq={mcq}: counted once");
        assert_eq!(done.len(), 1, "mcq={mcq}: only the answered command ended");
        assert_eq!(done[0].tag, 2);
        assert_eq!(qp.outstanding(), 1, "mcq={mcq}: the held command stays");
        // Further scans do not count it again.
        let t = Instant::now();
        while t.elapsed() < 3 * TIMEOUT {
            qp.poll(64, |c| panic!("ReportOnly ended tag {}", c.tag))
                .unwrap();
        }
        assert_eq!(qp.stats().timeouts, 1, "mcq={mcq}");
        // Close withdraws it as before.
        let mut rest = Vec::new();
        qp.close(|c| rest.push(c)).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].tag, 1);
        assert_eq!(rest[0].result, Err(IoError::Aborted));
        assert!(rest[0].buf.is_some());
        assert_eq!(ctrl.leaked_bytes(), 0);
    }
}

#[test]
fn abort_policy_ends_a_dropped_command_once_as_timed_out_with_its_buffer() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = qpair(&ctrl, TimeoutPolicy::Abort);
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        read(&ctrl, &mut qp, 0, 1);
        read(&ctrl, &mut qp, 1, 2);
        let mut done = Vec::new();
        poll_until(&mut qp, &mut done, |_, out| out.len() >= 2);
        done.sort_by_key(|c| c.tag);
        assert_eq!(done[0].tag, 1);
        assert_eq!(done[0].result, Err(IoError::TimedOut), "mcq={mcq}");
        assert!(
            done[0].buf.is_some(),
            "mcq={mcq}: the controller gave it up, so its buffer comes back"
        );
        assert_eq!(done[1].tag, 2);
        assert!(done[1].result.is_ok());
        let s = qp.stats();
        assert_eq!(
            (s.timeouts, s.aborts_sent, s.timed_out),
            (1, 1, 1),
            "mcq={mcq}"
        );
        assert_eq!(s.resets_requested, 0);
        no_more(&mut qp);
        assert_eq!(qp.outstanding(), 0);
        still_works(&mut qp);
        assert_eq!(ctrl.leaked_bytes(), 0);
    }
}

#[test]
fn abort_policy_leaves_a_late_but_answered_command_alone() {
    // A command whose completion the device already posted is not timed
    // out, even if the application reaps it late (a small `max`).
    for mcq in [true, false] {
        let (_f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = qpair(&ctrl, TimeoutPolicy::Abort);
        for i in 0..4 {
            read(&ctrl, &mut qp, i, i);
        }
        qp.submit();
        // The fake completes at the doorbell; nobody reaps for a while.
        std::thread::sleep(3 * TIMEOUT);
        let mut done = Vec::new();
        while done.len() < 4 {
            qp.poll(1, |c| done.push(c)).unwrap();
        }
        assert!(done.iter().all(|c| c.result.is_ok()), "mcq={mcq}");
        let s = qp.stats();
        assert_eq!((s.timeouts, s.aborts_sent), (0, 0), "mcq={mcq}");
    }
}

#[test]
fn abort_policy_times_out_a_delayed_command_in_the_device() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = qpair(&ctrl, TimeoutPolicy::Abort);
    f.faults().inject_next(
        None,
        Some(READ10),
        UfsFault::Delay(Duration::from_secs(3600)),
    );
    read(&ctrl, &mut qp, 0, 1);
    let mut done = Vec::new();
    poll_until(&mut qp, &mut done, |_, out| !out.is_empty());
    assert_eq!(done[0].result, Err(IoError::TimedOut));
    assert!(done[0].buf.is_some());
    no_more(&mut qp);
    still_works(&mut qp);
}

#[test]
fn reset_policy_resets_the_controller_and_ends_a_dropped_command_once_with_its_buffer() {
    // `Reset` runs the host controller reset (`UfsController::reset`): once
    // HCE = 0 confirmed the controller stopped, the command the device held
    // ends once as `AbortedByReset` with its buffer, and the queue pair
    // carries on with all its slots.
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = qpair(&ctrl, TimeoutPolicy::Reset);
        let depth = qp.depth();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        read(&ctrl, &mut qp, 0, 1);
        read(&ctrl, &mut qp, 1, 2);
        let mut done = Vec::new();
        poll_until(&mut qp, &mut done, |_, out| out.len() >= 2);
        done.sort_by_key(|c| c.tag);
        assert_eq!(done[0].tag, 1);
        assert_eq!(done[0].result, Err(IoError::AbortedByReset), "mcq={mcq}");
        assert!(
            done[0].buf.is_some(),
            "mcq={mcq}: the controller was disabled"
        );
        assert!(done[1].result.is_ok());
        assert_eq!(ctrl.leaked_bytes(), 0, "mcq={mcq}");
        assert_eq!(ctrl.resets(), 1, "mcq={mcq}");
        let s = qp.stats();
        assert_eq!((s.timeouts, s.resets_requested), (1, 1), "mcq={mcq}");
        no_more(&mut qp);
        assert_eq!(qp.outstanding(), 0);
        assert_eq!(qp.depth(), depth, "mcq={mcq}: no slot retired");
        still_works(&mut qp);
    }
}

#[test]
fn reset_policy_on_a_controller_that_cannot_be_disabled_never_hands_back_the_buffer() {
    // The reset fails (HCE keeps reading 1): the device may still hold the
    // command, so it ends once as `TimedOut` with its buffer leaked, and
    // the queue pair then reports the failed controller.
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = qpair(&ctrl, TimeoutPolicy::Reset);
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        f.set_ignore_disable(true);
        read(&ctrl, &mut qp, 0, 1);
        qp.submit();
        let mut done = Vec::new();
        let start = Instant::now();
        while done.is_empty() {
            let _ = qp.poll(64, |c| done.push(c));
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "mcq={mcq}: no completion"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(done.len(), 1, "mcq={mcq}");
        assert_eq!(done[0].tag, 1);
        assert_eq!(done[0].result, Err(IoError::TimedOut), "mcq={mcq}");
        assert!(
            done[0].buf.is_none(),
            "mcq={mcq}: the device still holds it: never hand the buffer back"
        );
        assert_eq!(ctrl.leaked_bytes(), 4096, "mcq={mcq}");
        assert_eq!(qp.stats().resets_requested, 1, "mcq={mcq}");
        for _ in 0..5 {
            let r = qp.poll(64, |c| panic!("completed twice: tag {}", c.tag));
            assert!(r.is_err(), "mcq={mcq}: the controller failed");
        }
        f.set_ignore_disable(false);
    }
}

#[test]
fn no_timeout_when_io_timeout_is_none() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl
        .create_qpair_for::<DmaBuf>(UfsQpairOptions {
            io_timeout: None,
            timeout_policy: TimeoutPolicy::Abort,
            ..Default::default()
        })
        .unwrap();
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::DropCompletion);
    read(&ctrl, &mut qp, 0, 1);
    qp.submit();
    let t = Instant::now();
    while t.elapsed() < 3 * TIMEOUT {
        qp.poll(64, |c| {
            panic!("no timeout configured, yet tag {} ended", c.tag)
        })
        .unwrap();
    }
    assert_eq!(qp.stats().timeouts, 0);
    assert_eq!(qp.outstanding(), 1);
}

#[test]
fn reset_policy_on_a_split_transfer_ends_the_parent_once_with_its_buffer() {
    // 16 KiB over a limit of 8 KiB: two children. The device holds the
    // first; the reset ends it, and the parent ends once, after both
    // children, with its buffer (the controller was disabled).
    for mcq in [true, false] {
        let (f, ctrl) = up(
            sync_cfg(mcq),
            mcqio::ufs::UfsOptions {
                max_transfer: 8192,
                ..opts(1)
            },
        );
        let mut qp = qpair(&ctrl, TimeoutPolicy::Reset);
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        let b = ctrl.alloc_buf(16384, DmaDir::Bidirectional).unwrap();
        qp.read(0, 0, 4, b, 9).unwrap();
        let mut done = Vec::new();
        poll_until(&mut qp, &mut done, |_, out| !out.is_empty());
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].tag, 9);
        assert_eq!(done[0].result, Err(IoError::AbortedByReset), "mcq={mcq}");
        assert_eq!(
            done[0].buf.as_ref().map(|b| b.len()),
            Some(16384),
            "mcq={mcq}"
        );
        assert_eq!(ctrl.leaked_bytes(), 0, "mcq={mcq}");
        assert_eq!(qp.stats().completed, 1);
        no_more(&mut qp);
        still_works(&mut qp);
    }
}

#[test]
fn a_timed_out_command_withdrawn_before_a_reset_is_still_timed_out() {
    // Abort withdrew the command (its ABORTED completion is posted, not yet
    // reaped), then the controller is reset: the recovery delivers that
    // completion as the timeout it is, as `poll` would have — it reported
    // the raw transport status before.
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = qpair(&ctrl, TimeoutPolicy::Abort);
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::DropCompletion);
    read(&ctrl, &mut qp, 0, 1);
    let mut done = Vec::new();
    poll_until(&mut qp, &mut done, |qp, _| qp.stats().aborts_sent >= 1);
    assert!(done.is_empty(), "withdrawn, not yet reaped");
    ctrl.reset().expect("reset");
    poll_until(&mut qp, &mut done, |_, out| !out.is_empty());
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 1);
    assert_eq!(done[0].result, Err(IoError::TimedOut));
    assert!(done[0].buf.is_some());
    no_more(&mut qp);
    still_works(&mut qp);
}

/// `check_timeouts` (as on NVMe): lists the application's commands older
/// than the limit given, with their tag, wire id (task tag) and age, and
/// changes nothing: the command stays in flight and can still be aborted.
#[test]
fn check_timeouts_lists_overdue_commands_and_leaves_them_alone() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl
            .create_qpair_for::<DmaBuf>(UfsQpairOptions {
                io_timeout: None,
                ..Default::default()
            })
            .unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        read(&ctrl, &mut qp, 0, 1);
        read(&ctrl, &mut qp, 1, 2);
        let mut done = Vec::new();
        poll_until(&mut qp, &mut done, |_, d| d.len() == 1);
        assert_eq!(done[0].tag, 2, "mcq={mcq}");
        let mut seen = Vec::new();
        assert_eq!(
            qp.check_timeouts(Duration::from_secs(3600), |o| seen.push(o)),
            0
        );
        std::thread::sleep(2 * TIMEOUT);
        assert_eq!(qp.check_timeouts(TIMEOUT, |o| seen.push(o)), 1, "mcq={mcq}");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].tag, 1);
        assert!(seen[0].age >= TIMEOUT, "{:?}", seen[0]);
        assert_eq!(qp.outstanding(), 1, "reporting must not end the command");
        no_more(&mut qp);
        assert!(
            qp.abort(1).unwrap(),
            "mcq={mcq}: the listed command can be aborted"
        );
        poll_until(&mut qp, &mut done, |_, d| d.len() == 2);
        assert_eq!(done[1].tag, 1);
        assert!(done[1].buf.is_some());
        assert_eq!(qp.check_timeouts(Duration::ZERO, |o| seen.push(o)), 0);
        still_works(&mut qp);
    }
}
