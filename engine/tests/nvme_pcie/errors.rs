//! Every bad input gets its typed error and its buffer back; faults of the
//! device are detected, never delivered to the wrong request.

use mcqio_fixtures::testing::engine::nvme as common;

use std::time::Duration;

use common::*;
use mcqio::{Error, IoError, QpairOptions, SubmitErrorKind};
use mcqio_fixtures::{FakeConfig, Fault};
use mcqio_vfio::{DmaDir, Iova};

#[test]
fn bad_inputs_return_typed_errors_and_the_buffer() {
    let (_fake, ctrl) = open(config(mcqio_fixtures::ExecMode::Sync, 5));
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .unwrap();
    let nsze = ctrl.namespace(1).unwrap().nsze;

    let b = buf(&ctrl, 8192);
    let iova = b.iova();
    let e = qp.read(1, nsze - 1, 2, b, 0).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::LbaOutOfRange {
            slba: nsze - 1,
            nlb: 2,
            nsze
        }
    );
    let b = e.into_buf();
    assert_eq!(b.iova(), iova, "the same buffer comes back");

    let e = qp.read(1, u64::MAX, 1, b, 0).unwrap_err();
    assert!(
        matches!(e.kind, SubmitErrorKind::LbaOutOfRange { .. }),
        "overflowing slba+nlb"
    );
    let e = qp.read(1, 0, 0, e.buf, 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::ZeroLength);
    let e = qp.read(9, 0, 1, e.buf, 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::UnknownNamespace { nsid: 9 });
    let e = qp.read(0, 0, 1, e.buf, 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::UnknownNamespace { nsid: 0 });
    let e = qp.read(1, 0, 17, e.buf, 0).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::BufferTooSmall {
            needed: 17 * 512,
            available: 8192
        }
    );
    // 4 KiB blocks on namespace 2: 3 blocks need 12 KiB.
    let e = qp.write(2, 0, 3, e.buf, 0).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::BufferTooSmall {
            needed: 12288,
            available: 8192
        }
    );
    // MDTS 5 = 128 KiB: split into children, so the buffer must still
    // hold the whole transfer.
    let e = qp.read(1, 0, 257, e.buf, 0).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::BufferTooSmall {
            needed: 257 * 512,
            available: 8192
        }
    );
    // More children than the queue could ever hold.
    let e = qp.read(1, 0, 70000, e.buf, 0).unwrap_err();
    assert!(matches!(e.kind, SubmitErrorKind::TransferTooLarge { .. }));
    // Misaligned: a buffer starting 2 bytes into a page.
    let (_, odd) = e.buf.split_at(2).unwrap();
    let e = qp.read(1, 0, 1, odd, 0).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::Misaligned {
            segment: 0,
            iova: Iova(iova.raw() + 2)
        }
    );

    // Direction: a to-device buffer cannot receive a read.
    let to_dev = ctrl.alloc_buf(4096, DmaDir::ToDevice).unwrap();
    let e = qp.read(1, 0, 1, to_dev, 0).unwrap_err();
    assert!(matches!(
        e.kind,
        SubmitErrorKind::WrongDirection {
            mapped: DmaDir::ToDevice,
            ..
        }
    ));
    assert!(qp.write(1, 0, 1, e.buf, 0).is_ok(), "but it can be written");
    wait_n(&mut qp, 1);

    // Not DMA-mapped for this controller: memory of another device's space.
    let (_other_fake, other) = open(FakeConfig::sync());
    let foreign = buf(&other, 4096);
    let e = qp.write(1, 0, 1, foreign, 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::NotDmaMapped);

    // Vectored misalignment: a middle segment not starting on a page.
    let mut qpv = ctrl
        .create_qpair_for::<Vec<mcqio::DmaBuf>>(QpairOptions {
            depth: 2,
            ..Default::default()
        })
        .unwrap();
    let a = buf(&ctrl, 4096);
    let (_, b) = buf(&ctrl, 8192).split_at(512).unwrap();
    let e = qpv.write(1, 0, 16, vec![a, b], 0).unwrap_err();
    assert!(
        matches!(e.kind, SubmitErrorKind::Misaligned { segment: 1, .. }),
        "{:?}",
        e.kind
    );
    // A first segment that does not end on a page boundary.
    let (a, _) = buf(&ctrl, 4096).split_at(2048).unwrap();
    let b = buf(&ctrl, 4096);
    let e = qpv.write(1, 0, 8, vec![a, b], 0).unwrap_err();
    assert!(
        matches!(e.kind, SubmitErrorKind::Misaligned { segment: 0, .. }),
        "{:?}",
        e.kind
    );
    let e = qpv.write(1, 0, 1, Vec::new(), 0).unwrap_err();
    assert!(matches!(e.kind, SubmitErrorKind::BufferTooSmall { .. }));

    // Commands without data.
    assert_eq!(
        qp.flush(7, 0).unwrap_err().kind,
        SubmitErrorKind::UnknownNamespace { nsid: 7 }
    );
    assert_eq!(
        qp.write_zeroes(1, nsze, 1, 0).unwrap_err().kind,
        SubmitErrorKind::LbaOutOfRange {
            slba: nsze,
            nlb: 1,
            nsze
        }
    );
    assert_eq!(
        qp.deallocate(1, &[], 0).unwrap_err().kind,
        SubmitErrorKind::BadRangeCount { count: 0 }
    );
    assert_eq!(
        qp.deallocate(1, &vec![(0, 1); 257], 0).unwrap_err().kind,
        SubmitErrorKind::BadRangeCount { count: 257 }
    );
    assert!(matches!(
        qp.deallocate(1, &[(0, 1), (nsze, 1)], 0).unwrap_err().kind,
        SubmitErrorKind::LbaOutOfRange { .. }
    ));

    // Blocking API: lengths that are not whole blocks, busy queue.
    let mut v = vec![0u8; 100];
    assert!(matches!(
        qp.read_blocking(1, 0, &mut v),
        Err(Error::Submit(SubmitErrorKind::BufferTooSmall { .. }))
    ));
    assert!(matches!(
        qp.read_blocking(1, 0, &mut []),
        Err(Error::Submit(SubmitErrorKind::ZeroLength))
    ));
    assert!(matches!(
        qp.write_blocking(5, 0, &[0; 512]),
        Err(Error::Submit(SubmitErrorKind::UnknownNamespace { nsid: 5 }))
    ));

    // Nothing was lost or left behind by any rejected submission.
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(qpv.outstanding(), 0);
    assert_eq!(qp.stats().submitted, 1);
}

#[test]
fn queue_full_backpressure_hands_the_buffer_back() {
    for mode in modes() {
        let (_fake, ctrl) = open(config(mode, 5));
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        let mut bufs = buf(&ctrl, 5 * 4096).chunks(4096).unwrap();
        for i in 0..4 {
            qp.write(1, i * 8, 8, bufs.remove(0), i).unwrap();
        }
        assert!(qp.is_full());
        let spare = bufs.remove(0);
        let iova = spare.iova();
        let e = qp.write(1, 32, 8, spare, 4).unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::QueueFull);
        assert_eq!(qp.flush(1, 9).unwrap_err().kind, SubmitErrorKind::QueueFull);
        let back = e.into_buf();
        assert_eq!(back.iova(), iova);
        let done = wait_n(&mut qp, 4);
        assert_eq!(done.len(), 4);
        qp.write(1, 32, 8, back, 4).unwrap();
        assert_eq!(wait_n(&mut qp, 1)[0].tag, 4);
    }
}

#[test]
fn not_enough_queues_is_a_typed_error() {
    let (_fake, ctrl) = open(FakeConfig {
        io_queue_pairs: 3,
        ..FakeConfig::sync()
    });
    assert_eq!(ctrl.granted_io_queues(), 3);
    let r = mcqio::run_per_core(&ctrl, 4, QpairOptions::default(), |_, _| ());
    assert!(
        matches!(
            r,
            Err(Error::NotEnoughQueues {
                requested: 4,
                granted: 3
            })
        ),
        "{r:?}"
    );
    assert_eq!(ctrl.free_io_queues(), 3, "nothing was created");
    // Creating queue pairs beyond the grant fails too, and the ids come back.
    let qps: Vec<_> = (0..3)
        .map(|_| ctrl.create_qpair(Default::default()).unwrap())
        .collect();
    assert!(matches!(
        ctrl.create_qpair(Default::default()),
        Err(Error::NoFreeQueue { granted: 3 })
    ));
    let r = mcqio::run_per_core(&ctrl, 1, QpairOptions::default(), |_, _| ());
    assert!(matches!(r, Err(Error::NoFreeQueue { .. })));
    drop(qps);
    assert_eq!(ctrl.free_io_queues(), 3);
    let r = mcqio::run_per_core(&ctrl, 3, QpairOptions::default(), |i, qp| (i, qp.qid())).unwrap();
    assert_eq!(r.len(), 3);
}

#[test]
fn invalid_queue_options() {
    let (_fake, ctrl) = open(FakeConfig {
        mqes: 63,
        ..FakeConfig::sync()
    });
    assert!(matches!(
        ctrl.create_qpair(QpairOptions {
            depth: 0,
            ..Default::default()
        }),
        Err(Error::InvalidOption(_))
    ));
    assert!(
        matches!(
            ctrl.create_qpair(QpairOptions {
                depth: 64,
                ..Default::default()
            }),
            Err(Error::InvalidOption(_))
        ),
        "64 + 1 entries > MQES"
    );
    assert!(ctrl
        .create_qpair(QpairOptions {
            depth: 63,
            ..Default::default()
        })
        .is_ok());
    assert_eq!(
        ctrl.free_io_queues(),
        8,
        "failed creations return their ids"
    );
}

#[test]
fn duplicate_cqe_is_detected_not_delivered() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode, 5));
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                ..Default::default()
            })
            .unwrap();
        fake.faults().inject_next(
            Some(qp.qid()),
            Some(mcqio::nvme::spec::opcodes::nvm::WRITE),
            Fault::DuplicateCqe,
        );
        let b = buf(&ctrl, 4096);
        qp.write(1, 0, 8, b, 42).unwrap();
        let c = wait_n(&mut qp, 1);
        assert_eq!(c[0].tag, 42);
        // Follow-up commands reuse the slot; the duplicate must never be taken for them.
        let mut delivered = vec![];
        let mut b = c.into_iter().next().unwrap().buf;
        for i in 0..20u64 {
            qp.read(1, 0, 8, b.take().unwrap(), 100 + i).unwrap();
            let c = wait_n(&mut qp, 1).pop().unwrap();
            delivered.push(c.tag);
            b = c.buf;
        }
        assert_eq!(delivered, (100..120).collect::<Vec<_>>());
        assert_eq!(qp.stats().stale_completions, 1, "the duplicate was counted");
        assert_eq!(qp.stats().completed, 21);
    }
}

#[test]
fn corrupt_cid_is_detected_and_the_command_times_out() {
    let (fake, ctrl) = open(config(mcqio_fixtures::ExecMode::Sync, 5));
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 8,
            blocking_timeout: Duration::from_millis(200),
            ..Default::default()
        })
        .unwrap();
    fake.faults()
        .inject_next(Some(qp.qid()), None, Fault::CorruptCid);
    let err = qp.write_blocking(1, 0, &[1; 512]).unwrap_err();
    assert!(matches!(err, Error::Io(IoError::TimedOut)), "{err:?}");
    assert_eq!(qp.stats().stale_completions, 1);
    assert_eq!(
        qp.outstanding(),
        1,
        "the command is still owned by the device"
    );
    let mut old = vec![];
    assert_eq!(
        qp.check_timeouts(Duration::from_millis(100), |o| old.push(o)),
        1
    );
    assert_eq!(old[0].tag, u64::MAX);
    // Blocking calls refuse to run on a queue with a lost command.
    assert!(matches!(
        qp.write_blocking(1, 0, &[1; 512]),
        Err(Error::QueueBusy { outstanding: 1 })
    ));
    // Closing the queue completes it exactly once, as aborted.
    let mut closed = vec![];
    qp.close(|c| closed.push((c.tag, c.result))).unwrap();
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].0, u64::MAX);
}

#[test]
fn dropped_completion_gives_a_timeout_not_a_hang() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode, 5));
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                blocking_timeout: Duration::from_millis(100),
                ..Default::default()
            })
            .unwrap();
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::DropCompletion);
        let mut v = vec![0; 4096];
        assert!(matches!(
            qp.read_blocking(1, 0, &mut v),
            Err(Error::Io(IoError::TimedOut))
        ));
    }
}

#[test]
fn error_status_is_decoded() {
    let (fake, ctrl) = open(FakeConfig::sync());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    fake.faults()
        .inject_next(Some(qp.qid()), None, Fault::UNRECOVERED_READ_ERROR);
    let mut v = vec![0; 512];
    match qp.read_blocking(1, 0, &mut v) {
        Err(Error::Io(IoError::Nvme(st))) => {
            assert_eq!((st.sct, st.sc), (2, 0x81));
            assert_eq!(st.name(), Some("unrecovered read error"));
        }
        r => panic!("expected a media error, got {r:?}"),
    }
    // The queue keeps working and the bounce buffer survived.
    qp.read_blocking(1, 0, &mut v).unwrap();
}

#[test]
fn controller_fatal_is_reported_from_poll() {
    let (fake, ctrl) = open(FakeConfig::sync());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    fake.faults()
        .inject_next(Some(qp.qid()), None, Fault::ControllerFatal);
    qp.write(1, 0, 1, buf(&ctrl, 4096), 0).unwrap();
    let mut err = None;
    for _ in 0..100_000 {
        if let Err(e) = qp.poll(16, |_| {}) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(Error::ControllerFatal)), "{err:?}");
    assert!(
        matches!(qp.poll(16, |_| {}), Err(Error::ControllerFatal)),
        "sticky"
    );
    assert_eq!(
        qp.write(1, 0, 1, buf(&ctrl, 4096), 0).unwrap_err().kind,
        SubmitErrorKind::ControllerFailed
    );
    assert!(matches!(ctrl.health(), Err(Error::ControllerFatal)));
    // Dropping everything does not hang: queue deletion fails fast.
    drop(qp);
    drop(ctrl);
}

#[test]
fn surprise_removal_is_reported() {
    let (fake, ctrl) = open(FakeConfig::sync());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write(1, 0, 1, buf(&ctrl, 4096), 0).unwrap();
    fake.surprise_remove();
    let mut err = None;
    for _ in 0..100_000 {
        if let Err(e) = qp.poll(16, |_| {}) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(Error::DeviceGone)), "{err:?}");
    assert!(matches!(ctrl.health(), Err(Error::DeviceGone)));
}

#[test]
fn timed_out_command_can_be_aborted() {
    let (fake, ctrl) = open(FakeConfig::sync());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    fake.faults().inject_next(
        Some(qp.qid()),
        None,
        Fault::Delay(Duration::from_secs(3600)),
    );
    qp.write(1, 0, 8, buf(&ctrl, 4096), 77).unwrap();
    qp.submit();
    for _ in 0..1000 {
        assert_eq!(qp.poll(16, |_| {}).unwrap(), 0);
    }
    let mut late = vec![];
    assert_eq!(qp.check_timeouts(Duration::ZERO, |o| late.push(o)), 1);
    assert_eq!(late[0].tag, 77);
    let aborted = qp.abort_command(late[0].cid).unwrap();
    assert!(aborted, "the fake aborts a parked command");
    let c = wait_n(&mut qp, 1).pop().unwrap();
    assert_eq!(c.tag, 77);
    match c.result {
        Err(IoError::Nvme(st)) => assert_eq!((st.sct, st.sc), (0, 0x07), "abort requested"),
        r => panic!("expected an aborted status, got {r:?}"),
    }
    assert!(c.buf.is_some(), "the buffer comes back");
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn oversized_dma_buf_is_refused_before_allocating() {
    let (_fake, ctrl) = open(FakeConfig::sync());
    let too_big = mcqio::core::io::DMA_BUF_MAX_REGION + 1;
    assert!(mcqio::DmaBuf::alloc(ctrl.dma(), too_big, DmaDir::Bidirectional).is_err());
    assert!(ctrl.alloc_buf(too_big, DmaDir::Bidirectional).is_err());
}
