//! Host controller reset of a UFS controller (issue 13 item 4, the last
//! resort of recovery): `UfsController::reset()` with I/O in flight on
//! several queue pairs, in MCQ and legacy mode, against the fake UFS.
//!
//! Every command in flight ends exactly once: delivered normally if the
//! controller completed it before the reset, otherwise with
//! `IoError::AbortedByReset` and its buffer (the controller confirmed
//! HCE = 0, so it no longer accesses it). The queue pairs re-create their
//! hardware queue at their next poll and read and write correctly after.
//! A controller that ignores HCE = 0 gets its buffers leaked, never handed
//! back.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::ufs::UfsCtrlError;
use mcqio::vfio::DmaDir;
use mcqio::{Completion, DmaBuf, Error, IoError};
use mcqio_fixtures::ufs::{Sense, UfsConfig, UfsFault, UfsFaultKind, LEGACY_QUEUE};

const WRITE10: u8 = 0x2A;

/// Poll until every tag of `want` completed once (bounded); a second
/// completion of any tag fails the test.
fn collect(
    qp: &mut mcqio::ufs::UfsQueuePair<DmaBuf>,
    want: usize,
) -> BTreeMap<u64, Completion<DmaBuf>> {
    let mut done = BTreeMap::new();
    let start = Instant::now();
    while done.len() < want {
        qp.poll(usize::MAX, |c| {
            let tag = c.tag;
            assert!(done.insert(tag, c).is_none(), "tag {tag} completed twice");
        })
        .expect("poll after a reset");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} of {want}",
            done.len()
        );
    }
    for _ in 0..4 {
        qp.poll(64, |c| panic!("tag {} completed twice", c.tag))
            .unwrap();
    }
    done
}

/// On each of `pairs` queue pairs: two writes that complete before the
/// reset (not reaped) and two the device holds (dropped completion); then
/// reset; then check exactly-once, AbortedByReset with buffers, data, and
/// that every pair works afterwards.
fn reset_with_io_in_flight(cfg: UfsConfig, queues: u16, pairs: usize) {
    let mcq = cfg.mcq;
    let quirks = cfg.qemu_quirks;
    let (f, ctrl) = up(cfg, opts(queues));
    let mut qps: Vec<_> = (0..pairs)
        .map(|_| ctrl.create_qpair(Default::default()).unwrap())
        .collect();
    // Move the rings off slot 0 first, so a re-created queue that restarts
    // at the wrong place shows.
    for (p, qp) in qps.iter_mut().enumerate() {
        for k in 0..3 {
            qp.write_blocking(0, (p * 100 + 90 + k) as u64, &pattern(7, 4096))
                .unwrap();
        }
    }
    let base = |p: usize| (p * 100) as u64;
    for (p, qp) in qps.iter_mut().enumerate() {
        for i in 0..4u64 {
            if i >= 2 {
                f.faults()
                    .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
            }
            let lba = base(p) + i;
            let data = pattern(lba, 4096);
            qp.write(0, lba, 1, buf_with(&ctrl, &data), lba).unwrap();
            // One doorbell per command so each fault rule meets its own.
            qp.submit();
        }
    }
    ctrl.reset().expect("reset");
    assert_eq!(ctrl.resets(), 1);
    for (p, qp) in qps.iter_mut().enumerate() {
        let done = collect(qp, 4);
        for i in 0..4u64 {
            let lba = base(p) + i;
            let c = &done[&lba];
            assert!(c.buf.is_some(), "mcq={mcq} quirks={quirks}: buffer back");
            if i < 2 {
                assert_eq!(c.result, Ok(()), "completed before the reset");
            } else {
                assert_eq!(
                    c.result,
                    Err(IoError::AbortedByReset),
                    "mcq={mcq} quirks={quirks} pair {p} lba {lba}"
                );
            }
        }
        assert_eq!(qp.outstanding(), 0);
    }
    // The queue pairs work again: write the aborted blocks, read all back.
    for (p, qp) in qps.iter_mut().enumerate() {
        for i in 0..4u64 {
            let lba = base(p) + i;
            if i >= 2 {
                qp.write_blocking(0, lba, &pattern(lba, 4096)).unwrap();
            }
            let mut back = vec![0u8; 4096];
            qp.read_blocking(0, lba, &mut back).unwrap();
            assert!(
                back == pattern(lba, 4096),
                "mcq={mcq} quirks={quirks}: data of lba {lba}"
            );
        }
        // And with several commands in the ring at once.
        let mut bufs = Vec::new();
        for i in 0..8u64 {
            bufs.push(i);
            qp.read(
                0,
                base(p) + (i % 4),
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                1000 + i,
            )
            .unwrap();
        }
        qp.submit();
        let done = collect(qp, 8);
        assert!(done.values().all(|c| c.result.is_ok()));
    }
    assert_eq!(ctrl.leaked_bytes(), 0);
    drop(qps);
    // The queues went back to the pool in a state a new pair can use.
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut back = vec![0u8; 4096];
    qp.read_blocking(0, 0, &mut back).unwrap();
    assert!(back == pattern(0, 4096));
}

#[test]
fn reset_with_io_in_flight_mcq_several_queue_pairs() {
    reset_with_io_in_flight(sync_cfg(true), 3, 3);
}

#[test]
fn reset_with_io_in_flight_mcq_qemu_quirks() {
    // QEMU keeps queues enabled and their pointers across HCE = 0.
    let cfg = UfsConfig {
        qemu_quirks: true,
        ..sync_cfg(true)
    };
    reset_with_io_in_flight(cfg, 3, 3);
}

#[test]
fn reset_with_io_in_flight_legacy() {
    reset_with_io_in_flight(sync_cfg(false), 1, 1);
}

#[test]
fn reset_with_a_pooled_queue_and_a_second_reset() {
    // Two hardware queues, one in use: the pooled one must work after the
    // reset too, and a second reset recovers the same pairs again.
    let (_f, ctrl) = up(sync_cfg(true), opts(2));
    let mut a = ctrl.create_qpair(Default::default()).unwrap();
    a.write_blocking(0, 1, &pattern(1, 4096)).unwrap();
    ctrl.reset().unwrap();
    let mut b = ctrl.create_qpair(Default::default()).unwrap();
    let mut back = vec![0u8; 4096];
    b.read_blocking(0, 1, &mut back).unwrap();
    assert!(back == pattern(1, 4096));
    ctrl.reset().unwrap();
    a.read_blocking(0, 1, &mut back).unwrap();
    b.write_blocking(0, 2, &pattern(2, 4096)).unwrap();
    a.read_blocking(0, 2, &mut back).unwrap();
    assert!(back == pattern(2, 4096));
    assert_eq!(ctrl.resets(), 2);
}

#[test]
fn no_doorbell_while_a_reset_is_pending() {
    for mcq in [true, false] {
        let (_f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 5, &pattern(5, 4096)).unwrap();
        ctrl.reset().unwrap();
        // Queued after the reset, before this pair noticed it: the old
        // ring is not the controller's any more, so no doorbell.
        let rung = qp.stats().doorbell_writes;
        qp.read(
            0,
            5,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            1,
        )
        .unwrap();
        assert!(!qp.submit(), "mcq={mcq}: doorbell rung on a stale queue");
        assert_eq!(qp.stats().doorbell_writes, rung);
        let done = collect(&mut qp, 1);
        assert_eq!(done[&1].result, Err(IoError::AbortedByReset));
        assert!(done[&1].buf.is_some());
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, 5, &mut back).unwrap();
        assert!(back == pattern(5, 4096));
    }
}

#[test]
fn reset_brings_back_a_fatal_controller() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(WRITE10), UfsFault::HostFatal);
        qp.write(0, 0, 1, buf_with(&ctrl, &pattern(0, 4096)), 1)
            .unwrap();
        qp.submit();
        let start = Instant::now();
        let mut done = Vec::new();
        loop {
            match qp.poll(8, |c| done.push(c)) {
                Err(Error::ControllerFatal) => break,
                Err(e) => panic!("mcq={mcq}: {e}"),
                Ok(_) => assert!(start.elapsed() < Duration::from_secs(10)),
            }
        }
        assert_eq!(done.len(), 1);
        assert!(done[0].buf.is_some());
        ctrl.reset().expect("reset clears the fatal state");
        qp.write_blocking(0, 0, &pattern(9, 4096)).unwrap();
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, 0, &mut back).unwrap();
        assert!(back == pattern(9, 4096), "mcq={mcq}");
    }
}

#[test]
fn a_controller_that_ignores_disable_leaks_the_buffers() {
    for mcq in [true, false] {
        // The wait for HCE = 0 runs out every time: keep it short.
        let o = mcqio::ufs::UfsOptions {
            init_timeout: Duration::from_millis(100),
            ..opts(2)
        };
        let (f, ctrl) = up(sync_cfg(mcq), o);
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write(0, 0, 1, buf_with(&ctrl, &pattern(0, 4096)), 1)
            .unwrap();
        qp.submit();
        f.faults()
            .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
        qp.write(0, 1, 1, buf_with(&ctrl, &pattern(1, 4096)), 2)
            .unwrap();
        qp.submit();
        f.set_ignore_disable(true);
        let e = ctrl.reset().unwrap_err();
        assert!(
            matches!(e, UfsCtrlError::Timeout { .. }),
            "mcq={mcq}: {e:?}"
        );
        let mut done = BTreeMap::new();
        let mut err = None;
        for _ in 0..100 {
            match qp.poll(64, |c| {
                assert!(done.insert(c.tag, c).is_none(), "twice");
            }) {
                Ok(_) => {}
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(
            matches!(err, Some(Error::ControllerFatal)),
            "mcq={mcq}: {err:?}"
        );
        assert_eq!(done.len(), 2);
        // Completed before: delivered with its buffer.
        assert_eq!(done[&1].result, Ok(()));
        assert!(done[&1].buf.is_some());
        // Held by a controller that may still write it: never handed back.
        assert_eq!(done[&2].result, Err(IoError::ControllerFailed));
        assert!(done[&2].buf.is_none(), "mcq={mcq}: buffer handed back");
        assert!(ctrl.leaked_bytes() >= 4096, "mcq={mcq}");
        assert!(matches!(
            qp.poll(8, |_| panic!("twice")),
            Err(Error::ControllerFatal)
        ));
        drop(qp);
    }
}

#[test]
fn reset_while_threads_keep_io_in_flight() {
    // Threaded device with a latency, so commands are really in flight;
    // two threads, one queue pair each, writing and verifying their own
    // blocks while the main thread resets twice.
    for mcq in [true, false] {
        let pairs = if mcq { 2 } else { 1 };
        let cfg = UfsConfig {
            latency: Duration::from_micros(200),
            ..threaded_cfg(mcq, 2)
        };
        let (_f, ctrl) = up(cfg, opts(pairs as u16));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for p in 0..pairs {
            let ctrl = Arc::clone(&ctrl);
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                let mut qp = ctrl.create_qpair(Default::default()).unwrap();
                let (mut ok, mut aborted, mut seq) = (0u64, 0u64, 0u64);
                // The value each block must hold (only this pair writes
                // it); a write that ended AbortedByReset may or may not have
                // reached the medium, so the block is forgotten.
                let mut expect: BTreeMap<u64, u64> = BTreeMap::new();
                // Blocks with a command in flight: never two at once.
                let mut busy: Vec<u64> = Vec::new();
                while !stop.load(Ordering::Relaxed) || qp.outstanding() > 0 {
                    while !stop.load(Ordering::Relaxed) && qp.outstanding() < 8 {
                        seq += 1;
                        let lba = (p * 1000) as u64 + seq % 16;
                        if busy.contains(&lba) {
                            continue;
                        }
                        busy.push(lba);
                        if seq % 2 == 0 {
                            if let Some(&v) = expect.get(&lba) {
                                let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
                                qp.read(0, lba, 1, b, v << 32 | lba).unwrap();
                                continue;
                            }
                        }
                        let b = buf_with(&ctrl, &pattern(seq, 4096));
                        qp.write(0, lba, 1, b, 1 << 63 | seq << 16 | lba).unwrap();
                    }
                    qp.submit();
                    qp.poll(usize::MAX, |c| {
                        let lba = c.tag & 0xFFFF;
                        let write = c.tag >> 63 == 1;
                        busy.retain(|&l| l != lba);
                        match c.result {
                            Ok(()) => {
                                ok += 1;
                                if write {
                                    expect.insert(lba, (c.tag >> 16) & 0x7FFF_FFFF_FFFF);
                                } else {
                                    let v = c.tag >> 32;
                                    let mut back = vec![0u8; 4096];
                                    c.buf.as_ref().unwrap().read_at(0, &mut back).unwrap();
                                    assert!(back == pattern(v, 4096), "lba {lba} data");
                                }
                            }
                            Err(IoError::AbortedByReset) => {
                                aborted += 1;
                                assert!(c.buf.is_some());
                                if write {
                                    // Unknown whether it reached the medium.
                                    expect.remove(&lba);
                                }
                            }
                            Err(e) => panic!("unexpected {e}"),
                        }
                    })
                    .expect("poll");
                }
                (ok, aborted)
            }));
        }
        std::thread::sleep(Duration::from_millis(30));
        ctrl.reset().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        ctrl.reset().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            let (ok, _aborted) = t.join().unwrap();
            assert!(ok > 0, "mcq={mcq}");
        }
        assert_eq!(ctrl.resets(), 2);
        assert_eq!(ctrl.leaked_bytes(), 0);
    }
}

#[test]
fn a_shallower_owner_after_a_deeper_one_on_qemu() {
    // QEMU keeps SQHP/SQTP/CQHP/CQTP across HCE = 0 and a queue's
    // re-enable: a controller brought up with depth 1 after one with depth
    // 32 found the pointers past its 2-slot rings and failed (mcqio-perf at
    // QD 1 after the guest's other steps: "SQHP after enable: 0xa0").
    let cfg = UfsConfig {
        qemu_quirks: true,
        ..sync_cfg(true)
    };
    let (f, ctrl) = up(cfg, opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..5u64 {
        qp.write_blocking(0, i, &pattern(i, 4096)).unwrap();
    }
    drop(qp);
    drop(ctrl);
    let backend: Arc<dyn mcqio::vfio::Backend> = f.clone();
    let o = mcqio::ufs::UfsOptions {
        depth: 1,
        ..opts(1)
    };
    let ctrl = mcqio::ufs::UfsController::new(backend, o).expect("bring-up after a deeper owner");
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut back = vec![0u8; 4096];
    for i in 0..5u64 {
        qp.read_blocking(0, i, &mut back).unwrap();
        assert!(back == pattern(i, 4096));
    }
}

/// A different device behind the controller after a reset (here: LU 0
/// reports another capacity, as after a reformat by someone else) is the
/// typed `DeviceChanged`, not a generic bad value: the application must
/// re-open the controller, its LBAs may mean something else now. The
/// controller stays failed; commands in flight end once with their
/// buffers (it was disabled), new ones are refused.
#[test]
fn a_different_device_after_a_reset_is_device_changed() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let blocks = f.config().lus[0].blocks();
        f.set_reported_capacity(0, Some(blocks / 2));
        qp.read(
            0,
            0,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            1,
        )
        .unwrap();
        let e = ctrl.reset().expect_err("the LU changed");
        assert!(
            matches!(e, UfsCtrlError::DeviceChanged(ref why) if why.contains("LU 0")),
            "mcq={mcq}: {e}"
        );
        let mut done = Vec::new();
        let r = qp.poll(8, |c| done.push(c));
        assert!(r.is_err(), "mcq={mcq}: {r:?}");
        assert_eq!(done.len(), 1);
        assert!(done[0].buf.is_some());
        assert!(qp
            .read(
                0,
                0,
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                2,
            )
            .is_err());
        // The same device again: a reset brings it back.
        f.set_reported_capacity(0, None);
        ctrl.reset().expect("the original device again");
        qp.write_blocking(0, 0, &pattern(3, 4096)).unwrap();
    }
}

/// Poll with a small `max` until `want` completions arrived: no call may
/// deliver more than `max` (nor report another count than it delivered),
/// and `outstanding()` counts what is still to be delivered. Returns them
/// by tag, and the first error a poll returned.
fn collect_by(
    qp: &mut mcqio::ufs::UfsQueuePair<DmaBuf>,
    max: usize,
    want: usize,
) -> (BTreeMap<u64, Completion<DmaBuf>>, Option<Error>) {
    let mut done = BTreeMap::new();
    let mut first_err = None;
    let start = Instant::now();
    while done.len() < want {
        let mut got = 0;
        let r = qp.poll(max, |c| {
            got += 1;
            let tag = c.tag;
            assert!(done.insert(tag, c).is_none(), "tag {tag} completed twice");
        });
        assert!(got <= max, "one poll with max {max} delivered {got}");
        match r {
            Ok(n) => assert_eq!(n, got, "poll's count vs what it delivered"),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        assert_eq!(
            qp.outstanding(),
            want - done.len(),
            "outstanding() after {} of {want}",
            done.len()
        );
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    (done, first_err)
}

/// `poll(max, ..)` delivers at most `max` completions also when a reset or
/// a failure ends many commands at once (the `BlockQueue::poll` contract,
/// which the fio engine's `getevents` relies on for its events array): the
/// rest wait for the next polls, each exactly once.
#[test]
fn poll_after_a_reset_delivers_at_most_max() {
    for mcq in [true, false] {
        for max in [1, 2] {
            let (f, ctrl) = up(sync_cfg(mcq), opts(1));
            let mut qp = ctrl.create_qpair(Default::default()).unwrap();
            for i in 0..6u64 {
                if i >= 3 {
                    f.faults()
                        .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
                }
                qp.write(0, i, 1, buf_with(&ctrl, &pattern(i, 4096)), i)
                    .unwrap();
                qp.submit();
            }
            ctrl.reset().expect("reset");
            let (done, err) = collect_by(&mut qp, max, 6);
            assert!(err.is_none(), "mcq={mcq}: {err:?}");
            for i in 0..6u64 {
                let c = &done[&i];
                assert!(c.buf.is_some());
                let want = if i < 3 {
                    Ok(())
                } else {
                    Err(IoError::AbortedByReset)
                };
                assert_eq!(c.result, want, "mcq={mcq} max={max} tag {i}");
            }
            // Working again afterwards.
            let mut back = vec![0u8; 4096];
            qp.read_blocking(0, 1, &mut back).unwrap();
            assert!(back == pattern(1, 4096), "mcq={mcq}");

            // A fatal controller ends the rest the same way.
            for i in 0..5u64 {
                let fault = if i == 4 {
                    UfsFault::HostFatal
                } else {
                    UfsFault::DropCompletion
                };
                f.faults().inject_next(None, Some(WRITE10), fault);
                qp.write(0, i, 1, buf_with(&ctrl, &pattern(i, 4096)), 10 + i)
                    .unwrap();
                qp.submit();
            }
            let (done, err) = collect_by(&mut qp, max, 5);
            assert!(
                matches!(err, Some(Error::ControllerFatal)),
                "mcq={mcq}: {err:?}"
            );
            assert!(done.values().all(|c| c.result.is_err()));
        }
    }
}

// A reset brings the device up again through the same device commands as
// the first bring-up (on the legacy list, so faults aimed at
// `LEGACY_QUEUE` hit them): a transient failure of one of them must not
// fail the reset.

const TEST_UNIT_READY: u8 = 0x00;
const READ_CAPACITY_16: u8 = 0x9E;
const REPORT_LUNS: u8 = 0xA0;

#[test]
fn one_transport_error_on_test_unit_ready_does_not_fail_a_reset() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 5, &pattern(3, 4096)).unwrap();
        f.faults().inject_next(
            Some(LEGACY_QUEUE),
            Some(TEST_UNIT_READY),
            UfsFault::Ocs(0x5),
        );
        ctrl.reset()
            .unwrap_or_else(|e| panic!("mcq={mcq}: one OCS error failed the reset: {e}"));
        assert_eq!(f.faults().count(UfsFaultKind::Ocs), 1, "mcq={mcq}");
        assert_eq!(ctrl.resets(), 1);
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, 5, &mut back).unwrap();
        assert!(back == pattern(3, 4096), "mcq={mcq}");
    }
}

#[test]
fn transient_failures_during_a_reset_are_retried() {
    let o = mcqio::ufs::UfsOptions {
        init_timeout: Duration::from_secs(1),
        ..opts(1)
    };
    let (f, ctrl) = up(sync_cfg(true), o);
    let faults = f.faults();
    faults.inject_next(Some(LEGACY_QUEUE), Some(REPORT_LUNS), UfsFault::Ocs(0x5));
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(TEST_UNIT_READY),
        UfsFault::DropCompletion,
    );
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(READ_CAPACITY_16),
        UfsFault::CheckCondition(Sense::new(0x2, 0x04, 0x01)),
    );
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(READ_CAPACITY_16),
        UfsFault::IommuFault,
    );
    ctrl.reset().unwrap_or_else(|e| panic!("reset: {e}"));
    assert_eq!(faults.count(UfsFaultKind::Ocs), 1);
    assert_eq!(faults.count(UfsFaultKind::DropCompletion), 1);
    assert_eq!(faults.count(UfsFaultKind::CheckCondition), 1);
    assert_eq!(faults.count(UfsFaultKind::IommuFault), 1);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 1, &pattern(4, 4096)).unwrap();
}

#[test]
fn a_reset_against_a_device_that_fails_every_time_ends_in_a_typed_error() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    for _ in 0..64 {
        f.faults().inject_next(
            Some(LEGACY_QUEUE),
            Some(TEST_UNIT_READY),
            UfsFault::Ocs(0x5),
        );
    }
    let start = Instant::now();
    let e = ctrl.reset().expect_err("TEST UNIT READY never succeeds");
    let took = start.elapsed();
    assert!(
        matches!(
            e,
            UfsCtrlError::Scsi {
                what: "TEST UNIT READY",
                lun: 0,
                err: mcqio::ufs::UfsError::Transport(_),
            }
        ),
        "{e}"
    );
    let n = f.faults().count(UfsFaultKind::Ocs);
    assert!((2..=5).contains(&n), "{n} attempts");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(ctrl.resets(), 0);
    // Once the device behaves, a reset brings the controller back.
    f.faults().clear();
    ctrl.reset().expect("reset after the faults stop");
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 2, &pattern(5, 4096)).unwrap();
}
