//! One engine, two transports (issue 13 item 1): code written once against
//! `core::block::BlockQueue`, `run_per_core` and the blocking helpers runs
//! on NVMe and UFS queue pairs alike.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::sync::Arc;

use mcqio::core::block::BlockQueue;
use mcqio::ufs::{UfsOptions, UfsQpairOptions};
use mcqio::vfio::{Backend, DmaDir};
use mcqio::{
    run_per_core, Completion, Controller, ControllerOptions, DmaBuf, Error, QpairOptions,
    SubmitErrorKind,
};

/// Write a pattern through `qp` with the asynchronous API, flush,
/// deallocate another range, and read it back — transport-independent.
fn round_trip<Q: BlockQueue<Buf = DmaBuf>>(
    qp: &mut Q,
    at: Q::Addr,
    alloc: impl Fn(usize) -> DmaBuf,
) -> Vec<u8> {
    let shift = qp.block_shift(at).expect("address exists");
    let block = 1usize << shift;
    let data = pattern(42, 4 * block);
    let mut w = alloc(data.len());
    w.write_at(0, &data).unwrap();
    qp.write(at, 8, 4, w, 1).map_err(|e| e.kind).unwrap();
    qp.flush(at, 2).map_err(|e| e.kind).unwrap();
    qp.deallocate(at, 100, 2, 3).map_err(|e| e.kind).unwrap();
    qp.submit();
    let mut done: Vec<Completion<DmaBuf>> = Vec::new();
    while done.len() < 3 {
        qp.poll(8, |c| done.push(c)).unwrap();
    }
    assert!(done.iter().all(|c| c.result.is_ok()));
    let r = alloc(data.len());
    qp.read(at, 8, 4, r, 4).map_err(|e| e.kind).unwrap();
    qp.submit();
    let mut back = None;
    while back.is_none() {
        qp.poll(8, |c| back = Some(c)).unwrap();
    }
    let c = back.unwrap();
    c.result.unwrap();
    let mut out = vec![0u8; data.len()];
    c.buf.unwrap().read_at(0, &mut out).unwrap();
    assert_eq!(out, data);
    assert_eq!(qp.outstanding(), 0);
    out
}

#[test]
fn the_same_generic_code_runs_on_nvme_and_ufs() {
    let backend: Arc<dyn Backend> =
        mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).unwrap();
    let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    let a = round_trip(&mut qp, 1u32, |n| {
        ctrl.alloc_buf(n, DmaDir::Bidirectional).unwrap()
    });
    qp.close(|_| panic!("nothing in flight")).unwrap();

    for mcq in [true, false] {
        let (_f, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let b = round_trip(&mut qp, 0u8, |n| {
            ctrl.alloc_buf(n, DmaDir::Bidirectional).unwrap()
        });
        assert_eq!(b.len(), 4 * 4096);
        BlockQueue::close(qp, |_| panic!("nothing in flight")).unwrap();
    }
    assert_eq!(a.len(), 4 * 512);
}

#[test]
fn run_per_core_drives_ufs_queue_pairs_too() {
    let (_f, ctrl) = up(threaded_cfg(true, 2), opts(2));
    let results = run_per_core(&ctrl, 2, UfsQpairOptions::default(), |i, qp| {
        let data = pattern(i as u64 + 7, 8192);
        let lba = 64 * i as u64;
        qp.write_blocking(0, lba, &data)?;
        let mut back = vec![0u8; data.len()];
        qp.read_blocking(0, lba, &mut back)?;
        Ok::<bool, Error>(back == data)
    })
    .unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert!(r.unwrap());
    }
    // More threads than hardware queues is refused up front.
    assert!(matches!(
        run_per_core(&ctrl, 3, UfsQpairOptions::default(), |_, _| ()),
        Err(Error::NotEnoughQueues {
            requested: 3,
            granted: 2
        })
    ));
}

#[test]
fn ufs_blocking_io_with_a_limit_below_one_block_is_a_typed_error() {
    // A per-command limit smaller than one 4 KiB block: the UFS blocking
    // helpers used to size a zero-byte bounce buffer and fail with a
    // misleading `Error::Dma(ZeroLength)`; now it is the typed error NVMe
    // already returned.
    let (_f, ctrl) = up(
        sync_cfg(true),
        UfsOptions {
            max_transfer: 512,
            ..opts(1)
        },
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut back = vec![0u8; 4096];
    assert!(matches!(
        qp.read_blocking(0, 0, &mut back),
        Err(Error::Submit(SubmitErrorKind::TransferTooLarge { .. }))
    ));
    assert!(matches!(
        qp.write_blocking(0, 0, &back),
        Err(Error::Submit(SubmitErrorKind::TransferTooLarge { .. }))
    ));
}

#[test]
fn strict_and_lazy_mapping_work_on_ufs_queue_pairs() {
    use mcqio::vfio::AppBuffer;
    use mcqio::MappingMode;
    for mode in [MappingMode::Strict, MappingMode::lazy()] {
        for mcq in [true, false] {
            let (_f, ctrl) = up(sync_cfg(mcq), opts(1));
            let mut qp = ctrl
                .create_mapped_qpair(UfsQpairOptions {
                    mapping: mode.clone(),
                    ..Default::default()
                })
                .unwrap();
            let data = pattern(5, 8192);
            let mut w = AppBuffer::for_space(ctrl.dma(), data.len()).unwrap();
            w.as_mut_slice().copy_from_slice(&data);
            qp.write(0, 16, 2, w, 1).map_err(|e| e.kind).unwrap();
            let r = AppBuffer::for_space(ctrl.dma(), data.len()).unwrap();
            qp.submit();
            let mut done = Vec::new();
            while done.is_empty() {
                qp.poll(8, |c| done.push(c)).unwrap();
                qp.flush_mappings(|c| done.push(c)).unwrap();
            }
            assert!(done[0].result.is_ok(), "{mode:?} mcq={mcq}");
            assert!(done[0].buf.is_some(), "unmapped and handed back");
            qp.read(0, 16, 2, r, 2).map_err(|e| e.kind).unwrap();
            qp.submit();
            let mut back = Vec::new();
            while back.is_empty() {
                qp.poll(8, |c| back.push(c)).unwrap();
                qp.flush_mappings(|c| back.push(c)).unwrap();
            }
            let c = back.pop().unwrap();
            c.result.unwrap();
            assert_eq!(c.buf.unwrap().as_slice(), &data[..], "{mode:?} mcq={mcq}");
            // Unknown LU: typed, buffer back.
            let b = AppBuffer::for_space(ctrl.dma(), 4096).unwrap();
            let e = qp.read(9, 0, 1, b, 3).unwrap_err();
            assert!(e.buf.is_some());
            assert!(matches!(
                e.kind,
                mcqio::MappedSubmitErrorKind::Submit(SubmitErrorKind::UnknownLun { lun: 9 })
            ));
            assert!(qp.queue_pair().unwrap().stats().submitted >= 2);
            qp.close(|_| panic!("nothing in flight")).unwrap();
            assert_eq!(ctrl.leaked_bytes(), 0);
        }
    }
}
