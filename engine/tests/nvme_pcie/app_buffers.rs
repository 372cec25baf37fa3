//! Issue 16 item 18: strict and lazy DMA modes through the engine's own API
//! (`QpairOptions::mapping` + `Controller::create_mapped_qpair`). A buffer
//! comes back to the application only after its IOMMU unmap returned (lazy:
//! after the flush): checked against the fake IOMMU's live mappings at the
//! moment each completion is delivered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::vfio::{AppBuffer, Backend};
use mcqio::{
    Completion, Controller, ControllerOptions, Error, MappedQueuePair, MappedSubmitErrorKind,
    MappingMode, QpairOptions, SubmitErrorKind,
};
use mcqio_fixtures::{FakeConfig, FakeController};

fn open() -> (Arc<FakeController>, Arc<Controller>) {
    let fake = FakeController::new(FakeConfig::sync()).unwrap();
    let backend: Arc<dyn Backend> = fake.clone();
    let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
    (fake, ctrl)
}

fn mapped(ctrl: &Arc<Controller>, mapping: MappingMode) -> MappedQueuePair {
    ctrl.create_mapped_qpair(QpairOptions {
        depth: 16,
        mapping,
        ..QpairOptions::default()
    })
    .unwrap()
}

fn lazy(batch: usize, max_delay: Duration) -> MappingMode {
    MappingMode::Lazy { batch, max_delay }
}

fn buf(ctrl: &Controller, byte: u8) -> AppBuffer {
    let mut b = AppBuffer::for_space(ctrl.dma(), 4096).unwrap();
    b.as_mut_slice().fill(byte);
    b
}

/// Poll until `n` completions were delivered (bounded), checking at each
/// delivery that the buffers delivered so far are no longer mapped.
fn poll_n(
    qp: &mut MappedQueuePair,
    fake: &FakeController,
    base: usize,
    n: usize,
) -> Vec<Completion<AppBuffer>> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.len() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "completions missing"
        );
        let still = qp.outstanding();
        let before = out.len();
        let mut check = |c: Completion<AppBuffer>| {
            // The buffer is handed back: its mapping must be gone. At most
            // the I/Os not yet delivered in this call may still be mapped.
            assert!(c.buf.is_some(), "buffer leaked: {:?}", c.result);
            assert!(
                fake.iommu().mapping_count() <= base + still.saturating_sub(out.len() - before + 1),
                "a buffer was handed back while still mapped"
            );
            out.push(c);
        };
        let n = qp.poll(64, &mut check).unwrap();
        let st = qp.stats();
        if n == 0 && st.completed == st.submitted {
            // The device finished everything; the rest waits in a lazy
            // flush queue that is not due yet: force it.
            qp.flush_mappings(&mut check).unwrap();
        }
    }
    out
}

fn roundtrip(mapping: MappingMode) {
    let (fake, ctrl) = open();
    let mut qp = mapped(&ctrl, mapping.clone());
    let base = fake.iommu().mapping_count();
    for i in 0..4u64 {
        qp.write(1, i * 8, 8, buf(&ctrl, 0x10 + i as u8), i)
            .unwrap();
    }
    qp.submit();
    let done = poll_n(&mut qp, &fake, base, 4);
    assert!(done.iter().all(|c| c.result.is_ok()), "{mapping:?}");
    for i in 0..4u64 {
        qp.read(1, i * 8, 8, buf(&ctrl, 0), 100 + i).unwrap();
    }
    qp.submit();
    let mut done = poll_n(&mut qp, &fake, base, 4);
    done.sort_by_key(|c| c.tag);
    for (i, c) in done.into_iter().enumerate() {
        assert_eq!(c.tag, 100 + i as u64);
        c.result.unwrap();
        let b = c.buf.unwrap();
        assert!(
            b.as_slice().iter().all(|&x| x == 0x10 + i as u8),
            "{mapping:?} data"
        );
    }
    assert_eq!(fake.iommu().mapping_count(), base);
    assert_eq!(fake.iommu().fault_count(), 0);
    let st = qp.mapper_stats();
    assert_eq!(st.maps, 8, "{mapping:?}");
    assert_eq!(st.unmaps, 8, "{mapping:?}");
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn strict_roundtrip_hands_buffers_back_unmapped() {
    roundtrip(MappingMode::Strict);
}

#[test]
fn lazy_roundtrip_hands_buffers_back_unmapped() {
    roundtrip(lazy(4, Duration::from_secs(3600)));
    roundtrip(lazy(3, Duration::from_secs(3600))); // batches straddle the polls
    roundtrip(MappingMode::lazy());
}

/// Lazy: a finished I/O is not delivered until the flush that unmaps its
/// buffer; then it is, with the buffer unmapped.
#[test]
fn lazy_completion_waits_for_the_flush() {
    let (fake, ctrl) = open();
    let mut qp = mapped(&ctrl, lazy(4, Duration::from_secs(3600)));
    let base = fake.iommu().mapping_count();
    qp.read(1, 0, 8, buf(&ctrl, 0), 1).unwrap();
    qp.submit();
    for _ in 0..100 {
        assert_eq!(
            qp.poll(8, |_| panic!("delivered before its unmap"))
                .unwrap(),
            0
        );
    }
    assert_eq!(qp.stats().completed, 1, "the device finished it");
    assert_eq!(qp.outstanding(), 1);
    assert_eq!(
        fake.iommu().mapping_count(),
        base + 1,
        "still mapped, queued"
    );
    let mut got = Vec::new();
    assert_eq!(
        qp.flush_mappings(|c| {
            assert_eq!(fake.iommu().mapping_count(), base);
            got.push(c)
        })
        .unwrap(),
        1
    );
    assert_eq!(got[0].tag, 1);
    assert!(got[0].buf.is_some());
    assert_eq!(qp.outstanding(), 0);

    // A full batch is flushed and delivered by the poll that completes it.
    for i in 0..4 {
        qp.read(1, i * 8, 8, buf(&ctrl, 0), 10 + i).unwrap();
    }
    qp.submit();
    let done = poll_n(&mut qp, &fake, base, 4);
    assert_eq!(done.len(), 4);
    assert_eq!(qp.mapper_stats().flushes_full, 1);
}

/// Lazy: the time limit delivers without a full batch, as long as the
/// application keeps polling.
#[test]
fn lazy_time_limit_delivers_a_partial_batch() {
    let (fake, ctrl) = open();
    let mut qp = mapped(&ctrl, lazy(256, Duration::from_millis(1)));
    let base = fake.iommu().mapping_count();
    qp.read(1, 0, 8, buf(&ctrl, 0), 5).unwrap();
    qp.submit();
    let mut done = Vec::new();
    let t0 = Instant::now();
    while done.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the time limit never flushed"
        );
        qp.poll(8, |c| {
            assert_eq!(fake.iommu().mapping_count(), base);
            done.push(c)
        })
        .unwrap();
    }
    assert_eq!(done[0].tag, 5);
    assert_eq!(qp.mapper_stats().flushes_timed, 1);
}

/// A refused submission hands its buffer back unmapped, in both modes, and
/// leaves no slot taken.
#[test]
fn refused_submissions_hand_the_buffer_back_unmapped() {
    for mode in [MappingMode::Strict, lazy(4, Duration::from_secs(3600))] {
        let (fake, ctrl) = open();
        let mut qp = mapped(&ctrl, mode.clone());
        let base = fake.iommu().mapping_count();
        let nsze = ctrl.namespace(1).unwrap().nsze;
        // Refused by the queue pair after mapping: LBA past the end.
        let e = qp.read(1, nsze, 8, buf(&ctrl, 7), 1).unwrap_err();
        assert!(
            matches!(
                e.kind,
                MappedSubmitErrorKind::Submit(SubmitErrorKind::LbaOutOfRange { .. })
            ),
            "{mode:?}: {e}"
        );
        let b = e.buf.expect("buffer handed back");
        assert!(b.as_slice().iter().all(|&x| x == 7));
        assert_eq!(fake.iommu().mapping_count(), base, "{mode:?}: left mapped");
        // Refused before mapping.
        let e = qp.read(1, 0, 16, b, 2).unwrap_err();
        assert!(matches!(
            e.kind,
            MappedSubmitErrorKind::Submit(SubmitErrorKind::BufferTooSmall { .. })
        ));
        let b = e.buf.unwrap();
        let e = qp.read(9, 0, 8, b, 3).unwrap_err();
        assert!(matches!(
            e.kind,
            MappedSubmitErrorKind::Submit(SubmitErrorKind::UnknownNamespace { nsid: 9 })
        ));
        let e = qp.read(1, 0, 0, e.buf.unwrap(), 4).unwrap_err();
        assert!(matches!(
            e.kind,
            MappedSubmitErrorKind::Submit(SubmitErrorKind::ZeroLength)
        ));
        assert_eq!(qp.outstanding(), 0, "{mode:?}");
        // The queue still works.
        qp.read(1, 0, 8, e.buf.unwrap(), 5).unwrap();
        qp.submit();
        assert_eq!(poll_n(&mut qp, &fake, base, 1)[0].tag, 5);
    }
}

/// Queue full: the depth bounds what is in flight; the buffer comes back.
#[test]
fn a_full_queue_refuses_and_hands_the_buffer_back() {
    let (fake, ctrl) = open();
    let mut qp = ctrl
        .create_mapped_qpair(QpairOptions {
            depth: 2,
            mapping: MappingMode::Strict,
            ..QpairOptions::default()
        })
        .unwrap();
    let base = fake.iommu().mapping_count();
    qp.read(1, 0, 8, buf(&ctrl, 0), 1).unwrap();
    qp.read(1, 8, 8, buf(&ctrl, 0), 2).unwrap();
    let e = qp.read(1, 16, 8, buf(&ctrl, 0), 3).unwrap_err();
    assert!(matches!(
        e.kind,
        MappedSubmitErrorKind::Submit(SubmitErrorKind::QueueFull)
    ));
    assert!(e.buf.is_some());
    assert_eq!(fake.iommu().mapping_count(), base + 2);
    qp.submit();
    poll_n(&mut qp, &fake, base, 2);
}

/// Close delivers every I/O exactly once, lazily queued ones included,
/// with their buffers unmapped.
#[test]
fn close_delivers_everything_once() {
    let (fake, ctrl) = open();
    let mut qp = mapped(&ctrl, lazy(64, Duration::from_secs(3600)));
    let base = fake.iommu().mapping_count();
    for i in 0..3 {
        qp.write(1, i * 8, 8, buf(&ctrl, 1), i).unwrap();
    }
    qp.submit();
    while qp.stats().completed < 3 {
        assert_eq!(qp.poll(8, |_| panic!("no flush yet")).unwrap(), 0);
    }
    let mut tags = Vec::new();
    qp.close(|c| {
        assert!(c.result.is_ok() && c.buf.is_some());
        tags.push(c.tag)
    })
    .unwrap();
    tags.sort_unstable();
    assert_eq!(tags, [0, 1, 2]);
    assert!(
        fake.iommu().mapping_count() < base,
        "queue memory freed too"
    );
}

#[test]
fn the_mode_must_match_the_constructor() {
    let (_fake, ctrl) = open();
    let e = ctrl
        .create_qpair(QpairOptions {
            mapping: MappingMode::Strict,
            ..QpairOptions::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "{e}");
    let e = ctrl
        .create_mapped_qpair(QpairOptions::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "{e}");
    let e = ctrl
        .create_mapped_qpair(QpairOptions {
            mapping: lazy(0, Duration::from_millis(1)),
            ..QpairOptions::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "{e}");
}
