//! Fault classes of the fake UFS controller end each command exactly once
//! with the right typed result, in MCQ and legacy mode.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use mcqio::ufs::spec::scsi::{sense_key, ScsiStatus, Sense};
use mcqio::ufs::spec::utrd::Ocs;
use mcqio::vfio::DmaDir;
use mcqio::{DmaBuf, Error, IoError, UfsError};
use mcqio_fixtures::ufs::{self as fake, UfsFault};

const WRITE10: u8 = 0x2A;
const READ10: u8 = 0x28;

/// Submit `n` one-block reads (tags 0..n), with a fault armed for the
/// first READ(10); collect exactly `n` completions, then check nothing
/// more arrives.
fn run_with_fault(
    mcq: bool,
    fault: UfsFault,
    n: u64,
) -> (Vec<mcqio::Completion<DmaBuf>>, mcqio::ufs::UfsQpairStats) {
    let (f, ctrl) = up(sync_cfg(mcq), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults().inject_next(None, Some(READ10), fault);
    for i in 0..n {
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        qp.read(0, i, 1, b, i).unwrap();
    }
    let mut done = wait_n(&mut qp, n as usize);
    for _ in 0..5 {
        qp.poll(64, |c| panic!("completed twice: tag {}", c.tag))
            .unwrap();
    }
    done.sort_by_key(|c| c.tag);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(
        tags,
        (0..n).collect::<Vec<_>>(),
        "each command exactly once"
    );
    assert!(done.iter().all(|c| c.buf.is_some()), "buffers handed back");
    (done, qp.stats())
}

#[test]
fn check_condition_is_a_scsi_error_with_sense() {
    for mcq in [true, false] {
        let sense = fake::Sense {
            key: 3,
            asc: 0x11,
            ascq: 0,
        };
        let (done, _) = run_with_fault(mcq, UfsFault::CheckCondition(sense), 4);
        let errs: Vec<_> = done.iter().filter_map(|c| c.result.err()).collect();
        assert_eq!(
            errs,
            vec![IoError::Ufs(UfsError::Scsi {
                status: ScsiStatus::CHECK_CONDITION,
                sense: Some(Sense {
                    key: sense_key::MEDIUM_ERROR,
                    asc: 0x11,
                    ascq: 0
                })
            })],
            "mcq={mcq}"
        );
    }
}

#[test]
fn error_ocs_is_a_transport_error() {
    for mcq in [true, false] {
        let (done, _) = run_with_fault(mcq, UfsFault::Ocs(Ocs::ABORTED.0), 3);
        let errs: Vec<_> = done.iter().filter_map(|c| c.result.err()).collect();
        assert_eq!(
            errs,
            vec![IoError::Ufs(UfsError::Transport(Ocs::ABORTED))],
            "mcq={mcq}"
        );
        let (done, _) = run_with_fault(mcq, UfsFault::Ocs(Ocs::DEVICE_FATAL_ERROR.0), 2);
        assert_eq!(
            done.iter()
                .filter_map(|c| c.result.err())
                .collect::<Vec<_>>(),
            vec![IoError::Ufs(UfsError::Transport(Ocs::DEVICE_FATAL_ERROR))]
        );
    }
}

#[test]
fn iommu_fault_is_an_invalid_prdt_transport_error() {
    for mcq in [true, false] {
        let (done, _) = run_with_fault(mcq, UfsFault::IommuFault, 2);
        assert_eq!(
            done.iter()
                .filter_map(|c| c.result.err())
                .collect::<Vec<_>>(),
            vec![IoError::Ufs(UfsError::Transport(Ocs::INVALID_PRDT_ATTR))]
        );
    }
}

#[test]
fn duplicate_and_stale_completions_are_counted_not_delivered() {
    for fault in [UfsFault::DuplicateCompletion, UfsFault::StaleCompletion] {
        let (f, ctrl) = up(sync_cfg(true), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        // One command first, so a stale entry has an earlier completion to repeat.
        qp.read(
            0,
            9,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            100,
        )
        .unwrap();
        wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
        f.faults().inject_next(None, Some(READ10), fault);
        for i in 0..4 {
            qp.read(
                0,
                i,
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                i,
            )
            .unwrap();
        }
        let mut done = wait_n(&mut qp, 4);
        // The extra entry may trail the real ones; an idle queue does not
        // read CQTP, so a later command's poll finds it.
        qp.read(
            0,
            5,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            5,
        )
        .unwrap();
        done.extend(wait_n(&mut qp, 1));
        done.sort_by_key(|c| c.tag);
        assert_eq!(
            done.iter().map(|c| c.tag).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 5]
        );
        assert!(done.iter().all(|c| c.result.is_ok() && c.buf.is_some()));
        let s = qp.stats();
        assert_eq!(s.stale_completions, 1, "{fault:?}: {s:?}");
        assert_eq!(s.completed, 6);
    }
}

#[test]
fn delayed_completion_arrives_once() {
    for mcq in [true, false] {
        let (done, _) = run_with_fault(
            mcq,
            UfsFault::Delay(std::time::Duration::from_millis(20)),
            3,
        );
        assert!(done.iter().all(|c| c.result.is_ok()));
    }
}

#[test]
fn host_fatal_fails_every_outstanding_command_once() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(WRITE10), UfsFault::HostFatal);
        for i in 0..3u64 {
            qp.write(0, i, 1, buf_with(&ctrl, &pattern(i, 4096)), i)
                .unwrap();
        }
        qp.submit();
        let mut done = Vec::new();
        let mut err = None;
        for _ in 0..10_000 {
            match qp.poll(64, |c| done.push(c)) {
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
        // Whatever completed before the fatal error is Ok; the rest failed.
        assert_eq!(done.len(), 3);
        assert!(done
            .iter()
            .any(|c| c.result == Err(IoError::ControllerFailed)));
        assert!(done.iter().all(|c| c.buf.is_some()));
        assert!(matches!(
            qp.poll(8, |_| panic!("twice")),
            Err(Error::ControllerFatal)
        ));
        let e = qp
            .read(
                0,
                0,
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                9,
            )
            .unwrap_err();
        assert_eq!(e.kind, mcqio::SubmitErrorKind::ControllerFailed);
    }
}

#[test]
fn surprise_removal_fails_outstanding_commands_once() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::SurpriseRemoval);
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        qp.read(0, 0, 1, b, 1).unwrap();
        qp.submit();
        let mut done = Vec::new();
        let mut err = None;
        for _ in 0..10_000 {
            if let Err(e) = qp.poll(64, |c| done.push(c)) {
                err = Some(e);
                break;
            }
        }
        assert!(matches!(err, Some(Error::DeviceGone)), "mcq={mcq}: {err:?}");
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].result, Err(IoError::ControllerFailed));
    }
}

#[test]
fn dropped_completion_is_withdrawn_at_close() {
    // Legacy: UTRLCLR withdraws the slot, so the buffer comes back.
    let (f, ctrl) = up(sync_cfg(false), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::DropCompletion);
    qp.read(
        0,
        0,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        1,
    )
    .unwrap();
    qp.read(
        0,
        1,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        2,
    )
    .unwrap();
    let mut done = Vec::new();
    qp.close(|c| done.push(c)).unwrap();
    done.sort_by_key(|c| c.tag);
    assert_eq!(done.len(), 2);
    assert!(done[1].result.is_ok());
    assert_eq!(done[0].result, Err(IoError::Aborted));
    assert!(done[0].buf.is_some(), "withdrawn by UTRLCLR: buffer back");
    // The list is free again.
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 0, &pattern(1, 4096)).unwrap();
    assert_eq!(ctrl.leaked_bytes(), 0);

    // MCQ: SQ stop + cleanup by nexus; the controller completes the held
    // command with OCS ABORTED, so its buffer comes back too.
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::DropCompletion);
    qp.read(
        0,
        0,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        1,
    )
    .unwrap();
    qp.read(
        0,
        1,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        2,
    )
    .unwrap();
    let mut done = Vec::new();
    qp.close(|c| done.push(c)).unwrap();
    done.sort_by_key(|c| c.tag);
    assert_eq!(done.len(), 2);
    assert_eq!(done[0].result, Err(IoError::Aborted));
    assert!(done[0].buf.is_some(), "cleaned up: buffer back");
    assert!(done[1].result.is_ok());
    assert_eq!(ctrl.leaked_bytes(), 0);
    // The queue is usable again by a new queue pair.
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 0, &pattern(2, 4096)).unwrap();
}

#[test]
fn dropping_a_queue_pair_with_a_held_command_ends_it_and_frees_the_queue() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults()
        .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
    qp.write(0, 3, 1, buf_with(&ctrl, &pattern(3, 4096)), 1)
        .unwrap();
    qp.submit();
    drop(qp);
    assert_eq!(ctrl.leaked_bytes(), 0);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut back = vec![0u8; 4096];
    qp.read_blocking(0, 3, &mut back).unwrap();
}

#[test]
fn abort_of_a_held_command_completes_it_once_with_aborted() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        qp.read(
            0,
            0,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            7,
        )
        .unwrap();
        qp.read(
            0,
            1,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            8,
        )
        .unwrap();
        let mut done = wait_n(&mut qp, 1);
        assert_eq!(done[0].tag, 8);
        assert!(!qp.abort(8).unwrap(), "tag 8 is no longer in flight");
        assert!(qp.abort(7).unwrap(), "mcq={mcq}");
        done.extend(wait_n(&mut qp, 1));
        assert_eq!(done[1].tag, 7);
        assert_eq!(
            done[1].result,
            Err(IoError::Ufs(UfsError::Transport(Ocs::ABORTED))),
            "mcq={mcq}"
        );
        assert!(done[1].buf.is_some());
        for _ in 0..5 {
            qp.poll(8, |c| panic!("completed twice: {}", c.tag))
                .unwrap();
        }
        assert!(!qp.abort(7).unwrap());
        // The queue keeps working.
        let data = pattern(9, 4096);
        qp.write_blocking(0, 2, &data).unwrap();
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, 2, &mut back).unwrap();
        assert_eq!(back, data);
    }
}

#[test]
fn abort_of_a_delayed_command_in_the_device() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults().inject_next(
        None,
        Some(WRITE10),
        UfsFault::Delay(std::time::Duration::from_secs(3600)),
    );
    qp.write(0, 5, 1, buf_with(&ctrl, &pattern(5, 4096)), 1)
        .unwrap();
    qp.submit();
    assert!(qp.abort(1).unwrap());
    let c = wait_n(&mut qp, 1).pop().unwrap();
    assert_eq!(
        c.result,
        Err(IoError::Ufs(UfsError::Transport(Ocs::ABORTED)))
    );
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn a_fatal_controller_seen_by_one_queue_pair_fails_the_others() {
    let (f, ctrl) = up(threaded_cfg(true, 1), opts(2));
    let mut a = ctrl.create_qpair(Default::default()).unwrap();
    let mut b = ctrl.create_qpair(Default::default()).unwrap();
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::DropCompletion);
    b.read(
        0,
        0,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        1,
    )
    .unwrap();
    b.submit();
    f.set_fatal();
    let mut err = None;
    for _ in 0..100_000 {
        a.read(
            0,
            1,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            2,
        )
        .ok();
        if let Err(e) = a.poll(8, |_| {}) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(Error::ControllerFatal)), "{err:?}");
    let mut done = Vec::new();
    assert!(matches!(
        b.poll(8, |c| done.push(c)),
        Err(Error::ControllerFatal)
    ));
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Err(IoError::ControllerFailed));
}

/// `check_health` (as on NVMe): an application that is not polling can ask
/// whether the controller is still alive; a fatal one is reported (and
/// disabled), and the next poll ends every outstanding command once with
/// its buffer.
#[test]
fn check_health_reports_a_fatal_controller_before_the_next_poll() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.check_health().expect("a healthy controller");
        f.faults()
            .inject_next(None, Some(WRITE10), UfsFault::HostFatal);
        for i in 0..3u64 {
            qp.write(0, i, 1, buf_with(&ctrl, &pattern(i, 4096)), i)
                .unwrap();
        }
        qp.submit();
        assert!(
            matches!(qp.check_health(), Err(Error::ControllerFatal)),
            "mcq={mcq}"
        );
        let mut done = Vec::new();
        let r = qp.poll(64, |c| done.push(c));
        assert!(matches!(r, Err(Error::ControllerFatal)), "mcq={mcq}: {r:?}");
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|c| c.buf.is_some()));
        assert!(done
            .iter()
            .any(|c| c.result == Err(IoError::ControllerFailed)));
        assert!(matches!(qp.check_health(), Err(Error::ControllerFatal)));
    }
}

/// Every committed fault is counted, in MCQ and in legacy mode alike (the
/// counts are what `mcqio-perf` reports as "the fake injected …").
#[test]
fn committed_faults_are_counted_in_both_modes() {
    for mcq in [true, false] {
        let (f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::Ocs(Ocs::ABORTED.0));
        let mut back = vec![0u8; 4096];
        assert!(qp.read_blocking(0, 0, &mut back).is_err(), "mcq={mcq}");
        assert_eq!(f.faults().pending(), 0, "mcq={mcq}");
        assert_eq!(
            f.faults().count(fake::UfsFaultKind::Ocs),
            1,
            "mcq={mcq}: {:?}",
            f.faults().counts()
        );
    }
}
