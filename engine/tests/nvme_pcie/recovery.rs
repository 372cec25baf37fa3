//! Timeouts, abort, controller reset and recovery, controller fatal status
//! and surprise removal: every fault class ends with each command completed
//! exactly once, with the right typed error, and no hang — in both execution
//! modes of the fake controller.

use mcqio_fixtures::testing::engine::nvme as common;

use std::time::{Duration, Instant};

use common::*;
use mcqio::nvme::spec::sqe::Command;
use mcqio::{
    Completion, ControllerOptions, DmaBuf, Error, IoError, QpairOptions, QueuePair,
    SubmitErrorKind, TimeoutPolicy,
};
use mcqio_fixtures::{ExecMode, Fault};

/// Generous bound for "this must happen eventually" loops: far beyond any
/// timeout used here, only hit when the engine hangs.
const HANG: Duration = Duration::from_secs(20);

fn qopts(timeout_ms: u64, policy: TimeoutPolicy) -> QpairOptions {
    QpairOptions {
        depth: 16,
        io_timeout: Some(Duration::from_millis(timeout_ms)),
        timeout_policy: policy,
        ..Default::default()
    }
}

/// Poll until `n` completions arrived (panics on a poll error or a hang).
fn collect(qp: &mut QueuePair, n: usize) -> Vec<Completion<DmaBuf>> {
    collect_with(qp, n, || {})
}

/// [`collect`], calling `tick` before each poll.
fn collect_with(qp: &mut QueuePair, n: usize, tick: impl Fn()) -> Vec<Completion<DmaBuf>> {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n {
        tick();
        qp.poll(usize::MAX, |c| out.push(c)).expect("poll");
        assert!(
            start.elapsed() < HANG,
            "only {} of {n} completions",
            out.len()
        );
        std::thread::yield_now();
    }
    out
}

/// [`collect`] for a command the fake delays: a sync fake posts a delayed
/// completion only when something touches it after the delay (a register,
/// a doorbell or [`FakeController::poll`](mcqio_fixtures::FakeController::poll)),
/// and a queue pair with nothing to submit touches it only in its health
/// check, every few thousand empty polls — which at a loaded machine's
/// `yield_now` can take longer than [`HANG`] (seen: 2 of 40 runs with 8
/// busy loops on 2 cores). So the device's time is driven here, as a
/// device thread would.
fn collect_delayed(
    fake: &mcqio_fixtures::FakeController,
    qp: &mut QueuePair,
    n: usize,
) -> Vec<Completion<DmaBuf>> {
    collect_with(qp, n, || fake.poll())
}

/// Poll until poll fails, collecting what it delivered on the way.
fn collect_until_err(qp: &mut QueuePair) -> (Vec<Completion<DmaBuf>>, Error) {
    let mut out = Vec::new();
    let start = Instant::now();
    loop {
        if let Err(e) = qp.poll(usize::MAX, |c| out.push(c)) {
            return (out, e);
        }
        assert!(start.elapsed() < HANG, "poll never reported the failure");
        std::thread::yield_now();
    }
}

/// The queue pair works: a write and a read back of one block. A command
/// caught by a (spurious, on a loaded machine) timeout reset is resubmitted,
/// as an application would.
fn works(qp: &mut QueuePair, lba: u64, byte: u8) {
    let retry = |e: &Error| {
        matches!(
            e,
            Error::Io(IoError::AbortedByReset) | Error::Io(IoError::TimedOut)
        )
    };
    let mut tries = 0;
    loop {
        tries += 1;
        let mut back = [0u8; 512];
        let r = qp
            .write_blocking(1, lba, &[byte; 512])
            .and_then(|()| qp.read_blocking(1, lba, &mut back));
        match r {
            Ok(()) => {
                assert!(back.iter().all(|&b| b == byte));
                return;
            }
            Err(e) if retry(&e) && tries < 5 => continue,
            Err(e) => panic!("I/O after recovery: {e:?}"),
        }
    }
}

fn write_one(qp: &mut QueuePair, ctrl: &mcqio::Controller, lba: u64, tag: u64) {
    let mut b = buf(ctrl, 512);
    b.fill(tag as u8);
    qp.write(1, lba, 1, b, tag).unwrap();
    qp.submit();
}

#[test]
fn dropped_completion_abort_refused_then_reset() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(qopts(250, TimeoutPolicy::Abort)).unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::DropCompletion);
        write_one(&mut qp, &ctrl, 0, 1);
        let c = collect(&mut qp, 1).pop().unwrap();
        assert_eq!(c.tag, 1);
        assert_eq!(c.result, Err(IoError::AbortedByReset), "{mode:?}");
        assert!(c.buf.is_some(), "the buffer comes back after the reset");
        let st = qp.stats();
        assert_eq!((st.timeouts, st.aborts_sent), (1, 1));
        assert_eq!(
            (st.resets_requested, st.aborted_by_reset, st.recoveries),
            (1, 1, 1)
        );
        assert_eq!(ctrl.resets(), 1);
        assert_eq!(qp.outstanding(), 0);
        works(&mut qp, 8, 0x3c);
    }
}

#[test]
fn delayed_command_is_aborted_and_completes_timed_out() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(qopts(250, TimeoutPolicy::Abort)).unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            Fault::Delay(Duration::from_secs(3600)),
        );
        write_one(&mut qp, &ctrl, 0, 5);
        let c = collect(&mut qp, 1).pop().unwrap();
        assert_eq!((c.tag, c.result), (5, Err(IoError::TimedOut)), "{mode:?}");
        assert!(
            c.buf.is_some(),
            "the abort's completion proves the device is done"
        );
        let st = qp.stats();
        assert_eq!((st.timeouts, st.aborts_sent, st.timed_out), (1, 1, 1));
        assert_eq!(st.resets_requested, 0);
        assert_eq!(ctrl.resets(), 0, "a successful abort needs no reset");
        works(&mut qp, 0, 0x11);
    }
}

#[test]
fn reset_policy_resets_at_once() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(qopts(250, TimeoutPolicy::Reset)).unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::CorruptCid);
        write_one(&mut qp, &ctrl, 0, 9);
        let c = collect(&mut qp, 1).pop().unwrap();
        assert_eq!((c.tag, c.result), (9, Err(IoError::AbortedByReset)));
        let st = qp.stats();
        assert_eq!((st.aborts_sent, st.resets_requested), (0, 1));
        assert_eq!(st.stale_completions, 1, "the corrupt CQE was not delivered");
        assert_eq!(ctrl.resets(), 1);
        works(&mut qp, 0, 0x22);
    }
}

#[test]
fn report_only_leaves_the_command_to_complete() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl
            .create_qpair(qopts(10, TimeoutPolicy::ReportOnly))
            .unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            // Long enough for the queue pair to see its 10 ms timeout pass
            // even when a loaded machine makes each poll of `collect_delayed`
            // take milliseconds: the coarse clock is read every 64 empty
            // polls (seen at 300 ms: the command completed unreported in
            // 29 of 40 runs with 8 busy loops on 2 cores).
            Fault::Delay(Duration::from_secs(2)),
        );
        write_one(&mut qp, &ctrl, 0, 3);
        let c = collect_delayed(&fake, &mut qp, 1).pop().unwrap();
        assert_eq!((c.tag, c.result), (3, Ok(())), "{mode:?}");
        let st = qp.stats();
        assert_eq!(st.timeouts, 1, "reported once, not on every scan");
        assert_eq!((st.aborts_sent, st.resets_requested), (0, 0));
        assert_eq!(ctrl.resets(), 0);
    }
}

#[test]
fn no_timeout_configured_means_no_action() {
    let (fake, ctrl) = open(config(ExecMode::Sync, 5));
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            io_timeout: None,
            ..Default::default()
        })
        .unwrap();
    fake.faults().inject_next(
        Some(qp.qid()),
        None,
        Fault::Delay(Duration::from_millis(60)),
    );
    write_one(&mut qp, &ctrl, 0, 3);
    let c = collect_delayed(&fake, &mut qp, 1).pop().unwrap();
    assert_eq!(c.result, Ok(()));
    assert_eq!(qp.stats().timeouts, 0);
}

#[test]
fn reset_aborts_every_queue_once_and_queues_recover() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let aers = ctrl.async_event_requests_posted();
        assert!(aers > 0);
        let opts = QpairOptions {
            io_timeout: None,
            ..qopts(0, TimeoutPolicy::Abort)
        };
        let mut a = ctrl.create_qpair(opts.clone()).unwrap();
        let mut b = ctrl.create_qpair(opts).unwrap();
        // Parked for an hour: outstanding until the reset.
        for (qp, base) in [(&mut a, 0u64), (&mut b, 100)] {
            for i in 0..4 {
                fake.faults().inject_next(
                    Some(qp.qid()),
                    None,
                    Fault::Delay(Duration::from_secs(3600)),
                );
                write_one(qp, &ctrl, base + i, base + i);
            }
            // Let the device fetch them.
            let start = Instant::now();
            while fake.faults().pending() > 0 {
                assert_eq!(qp.poll(16, |_| {}).unwrap(), 0);
                assert!(start.elapsed() < HANG);
                std::thread::yield_now();
            }
            assert_eq!(qp.outstanding(), 4);
        }
        ctrl.reset().unwrap();
        assert_eq!(ctrl.resets(), 1);
        assert_eq!(ctrl.async_event_requests_posted(), aers, "AERs re-posted");
        for (qp, base) in [(&mut a, 0u64), (&mut b, 100)] {
            let mut tags: Vec<u64> = collect(qp, 4)
                .into_iter()
                .map(|c| {
                    assert_eq!(c.result, Err(IoError::AbortedByReset));
                    assert!(c.buf.is_some());
                    c.tag
                })
                .collect();
            tags.sort();
            assert_eq!(tags, (base..base + 4).collect::<Vec<_>>());
            // Nothing more arrives for them.
            for _ in 0..100 {
                assert_eq!(
                    qp.poll(16, |c| panic!("extra completion {}", c.tag))
                        .unwrap(),
                    0
                );
            }
            assert_eq!(qp.stats().recoveries, 1);
            works(qp, base + 50, base as u8 + 1);
        }
        // Events still reach the application after the reset.
        fake.raise_async_event(mcqio::nvme::event_type::NOTICE, 0, 0x04);
        let start = Instant::now();
        let mut evs = Vec::new();
        while evs.is_empty() {
            evs = ctrl.async_events();
            assert!(start.elapsed() < HANG, "the event never arrived");
            std::thread::yield_now();
        }
        assert_eq!(evs[0].event_type, mcqio::nvme::event_type::NOTICE);
        assert_eq!(evs[0].log_page, 0x04);
        // Queue ids and teardown are intact.
        a.close(|_| panic!("nothing outstanding")).unwrap();
        drop(b);
        assert_eq!(ctrl.free_io_queues(), ctrl.granted_io_queues());
    }
}

#[test]
fn commands_submitted_before_the_queue_noticed_a_reset_complete_once() {
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    ctrl.reset().unwrap();
    // Submitted into a queue the controller no longer has.
    write_one(&mut qp, &ctrl, 0, 1);
    let c = collect(&mut qp, 1);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].result, Err(IoError::AbortedByReset));
    works(&mut qp, 0, 7);
}

#[test]
fn admin_timeout_resets_the_controller() {
    for mode in modes() {
        let (fake, ctrl) = open_with(
            config(mode, 5),
            ControllerOptions {
                admin_timeout: Duration::from_millis(100),
                ..Default::default()
            },
        );
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(Some(0), None, Fault::DropCompletion);
        let e = ctrl
            .admin_read(
                mcqio::nvme::spec::sqe::Identify::controller().sqe(),
                "Identify Controller",
            )
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert_eq!(ctrl.resets(), 1);
        works(&mut qp, 0, 9);
        assert_eq!(qp.stats().recoveries, 1);
    }
}

/// Outstanding commands parked in the device, then `fail` strikes.
fn failure_case(mode: ExecMode, fail: impl Fn(&mcqio_fixtures::FakeController), gone: bool) {
    let (fake, ctrl) = open(config(mode.clone(), 5));
    let mut qp = ctrl
        .create_qpair(qopts(60_000, TimeoutPolicy::Abort))
        .unwrap();
    let mut other = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..3 {
        fake.faults().inject_next(
            Some(qp.qid()),
            None,
            Fault::Delay(Duration::from_secs(3600)),
        );
        write_one(&mut qp, &ctrl, i, i);
    }
    let start = Instant::now();
    while fake.faults().pending() > 0 {
        qp.poll(16, |_| {}).unwrap();
        assert!(start.elapsed() < HANG);
        std::thread::yield_now();
    }
    fail(&fake);
    let (done, err) = collect_until_err(&mut qp);
    let expect_err = |e: &Error| {
        if gone {
            matches!(e, Error::DeviceGone)
        } else {
            matches!(e, Error::ControllerFatal)
        }
    };
    assert!(expect_err(&err), "{mode:?}: {err:?}");
    let mut tags: Vec<u64> = done
        .into_iter()
        .map(|c| {
            assert_eq!(c.result, Err(IoError::ControllerFailed));
            assert!(
                c.buf.is_some(),
                "the device is disabled or gone: buffers are safe"
            );
            c.tag
        })
        .collect();
    tags.sort();
    assert_eq!(tags, vec![0, 1, 2], "each outstanding command failed once");
    assert_eq!(qp.stats().failed_by_controller, 3);
    // Later calls fail fast with the same error.
    let start = Instant::now();
    for _ in 0..1000 {
        assert!(expect_err(
            &qp.poll(16, |_| panic!("nothing left")).unwrap_err()
        ));
    }
    assert_eq!(
        qp.write(1, 0, 1, buf(&ctrl, 512), 9).unwrap_err().kind,
        SubmitErrorKind::ControllerFailed
    );
    assert!(expect_err(
        &qp.read_blocking(1, 0, &mut [0; 512]).unwrap_err()
    ));
    assert!(expect_err(&ctrl.health().unwrap_err()));
    assert!(expect_err(
        &ctrl
            .admin_read(
                mcqio::nvme::spec::sqe::Identify::controller().sqe(),
                "Identify"
            )
            .unwrap_err()
    ));
    // The other queue pair (idle) learns it at its next poll.
    assert!(expect_err(&other.poll(16, |_| {}).unwrap_err()));
    assert!(start.elapsed() < Duration::from_secs(5), "fail fast");
    assert!(expect_err(&other.close(|_| {}).unwrap_err()));
    if gone {
        assert!(matches!(ctrl.reset(), Err(Error::DeviceGone)));
        drop(qp);
        drop(ctrl);
    } else {
        // A fatal controller comes back with a reset; the queue recovers.
        ctrl.reset().unwrap();
        works(&mut qp, 0, 0x42);
        drop(qp);
        assert_eq!(ctrl.free_io_queues(), ctrl.granted_io_queues());
    }
}

#[test]
fn controller_fatal_fails_everything_once_then_reset_recovers() {
    for mode in modes() {
        failure_case(mode, |f| f.set_fatal(), false);
    }
}

#[test]
fn controller_fatal_fault_while_fetching() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::ControllerFatal);
        write_one(&mut qp, &ctrl, 0, 4);
        let (done, err) = collect_until_err(&mut qp);
        assert!(matches!(err, Error::ControllerFatal), "{mode:?} {err:?}");
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].result, Err(IoError::ControllerFailed));
        // Drop everything without a reset: no hang.
        drop(qp);
        drop(ctrl);
    }
}

#[test]
fn surprise_removal_fails_everything_once() {
    for mode in modes() {
        failure_case(mode, |f| f.surprise_remove(), true);
    }
}

#[test]
fn surprise_removal_fault_while_fetching_then_drop() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::SurpriseRemoval);
        write_one(&mut qp, &ctrl, 0, 4);
        let (done, err) = collect_until_err(&mut qp);
        assert!(matches!(err, Error::DeviceGone), "{mode:?} {err:?}");
        assert_eq!(done.len(), 1);
        let start = Instant::now();
        drop(qp);
        drop(ctrl);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn iommu_fault_is_a_data_transfer_error_and_the_queue_goes_on() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::IommuFault);
        write_one(&mut qp, &ctrl, 0, 6);
        let c = collect(&mut qp, 1).pop().unwrap();
        match c.result {
            Err(IoError::Nvme(st)) => assert_eq!((st.sct, st.sc), (0, 0x04), "{mode:?}"),
            r => panic!("expected Data Transfer Error, got {r:?}"),
        }
        assert!(c.buf.is_some());
        assert_eq!(ctrl.resets(), 0);
        works(&mut qp, 0, 0x66);
    }
}

#[test]
fn close_and_drop_after_an_unnoticed_reset() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode.clone(), 5));
        let mut a = ctrl.create_qpair(Default::default()).unwrap();
        let b = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(Some(a.qid()), None, Fault::Delay(Duration::from_secs(3600)));
        write_one(&mut a, &ctrl, 0, 1);
        let start = Instant::now();
        while fake.faults().pending() > 0 {
            a.poll(16, |_| {}).unwrap();
            assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        ctrl.reset().unwrap();
        let mut got = Vec::new();
        a.close(|c| got.push((c.tag, c.result, c.buf.is_some())))
            .unwrap();
        assert_eq!(
            got,
            vec![(1, Err(IoError::AbortedByReset), true)],
            "{mode:?}"
        );
        drop(b);
        assert_eq!(ctrl.free_io_queues(), ctrl.granted_io_queues());
        // The ids are usable again.
        let mut c = ctrl.create_qpair(Default::default()).unwrap();
        works(&mut c, 0, 1);
    }
}

#[test]
fn reset_with_shadow_doorbells_reconfigures_them() {
    for mode in modes() {
        let mut cfg = config(mode.clone(), 5);
        cfg.shadow_doorbells = true;
        let (_fake, ctrl) = open(cfg);
        assert!(ctrl.shadow_doorbells());
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        works(&mut qp, 0, 1);
        for round in 0..3u8 {
            ctrl.reset().unwrap();
            works(&mut qp, round as u64, round + 2);
        }
        assert_eq!(qp.stats().recoveries, 3);
        assert!(qp.stats().sq_doorbell_skipped > 0 || qp.stats().sq_doorbell_writes > 0);
    }
}

/// With shadow doorbells the host skips the MMIO doorbell unless the new
/// tail passes the device's EventIdx. A queue that starts over at index 0
/// (re-created after a reset, or a new queue on a recycled id) must not be
/// judged against the EventIdx its predecessor left behind: real
/// controllers (QEMU) only look at a queue when its MMIO doorbell is
/// written, so a skipped first doorbell is a hang.
#[test]
fn a_restarted_queue_rings_its_first_doorbell() {
    let mut cfg = config(ExecMode::Sync, 5);
    cfg.shadow_doorbells = true;
    let (_fake, ctrl) = open(cfg);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..6 {
        qp.write_blocking(1, i, &[1; 512]).unwrap();
    }
    ctrl.reset().unwrap();
    let before = qp.stats().sq_doorbell_writes;
    qp.write_blocking(1, 0, &[2; 512]).unwrap();
    assert!(
        qp.stats().sq_doorbell_writes > before,
        "first doorbell after the reset was skipped: {:?}",
        qp.stats()
    );
    // A new queue pair on the recycled queue id.
    let qid = qp.qid();
    drop(qp);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    assert_eq!(qp.qid(), qid);
    qp.write_blocking(1, 0, &[3; 512]).unwrap();
    assert!(qp.stats().sq_doorbell_writes > 0, "{:?}", qp.stats());
}

/// `poll(max, ..)` delivers at most `max` also when a reset or a failure
/// ends many commands at once, and `outstanding()` counts what is still to
/// come (the `BlockQueue::poll` contract; UFS has the same test in
/// `ufs/reset.rs`).
#[test]
fn poll_after_a_reset_or_failure_delivers_at_most_max() {
    for mode in modes() {
        for max in [1usize, 2] {
            let (fake, ctrl) = open(config(mode.clone(), 5));
            let opts = QpairOptions {
                io_timeout: None,
                ..qopts(0, TimeoutPolicy::Abort)
            };
            let mut qp = ctrl.create_qpair(opts).unwrap();
            let round = |qp: &mut QueuePair, fail: bool| {
                for i in 0..5u64 {
                    fake.faults()
                        .inject_next(None, None, Fault::Delay(Duration::from_secs(3600)));
                    write_one(qp, &ctrl, i, 10 * u64::from(fail) + i);
                }
                let start = Instant::now();
                while fake.faults().pending() > 0 {
                    assert_eq!(qp.poll(16, |_| {}).unwrap(), 0);
                    assert!(start.elapsed() < HANG);
                    std::thread::yield_now();
                }
                if fail {
                    fake.set_fatal();
                } else {
                    ctrl.reset().unwrap();
                }
                let mut done = Vec::new();
                let start = Instant::now();
                while done.len() < 5 {
                    let mut got = 0;
                    let r = qp.poll(max, |c| {
                        got += 1;
                        done.push(c);
                    });
                    assert!(got <= max, "mode {mode:?}: max {max}, delivered {got}");
                    if let Ok(n) = r {
                        assert_eq!(n, got);
                    }
                    assert_eq!(qp.outstanding(), 5 - done.len());
                    assert!(start.elapsed() < HANG, "{} of 5", done.len());
                }
                let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
                tags.sort_unstable();
                tags.dedup();
                assert_eq!(tags.len(), 5, "each once");
                assert!(done.iter().all(|c| c.result.is_err()));
            };
            round(&mut qp, false);
            works(&mut qp, 7, 0x5a);
            round(&mut qp, true);
        }
    }
}
