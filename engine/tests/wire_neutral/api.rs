//! The small pieces of the public API that make it pleasant with `?`:
//! [`SubmitError`] is an error, [`run_per_core`] takes closures whose
//! error is a `Box<dyn Error + Send + Sync>`, and a [`DmaBuf`] in the
//! application's hands can be borrowed as a byte slice.

use std::error::Error;

use mcqio::vfio::DmaDir;
use mcqio::{run_per_core, DmaBuf, QpairOptions, SubmitError, SubmitErrorKind};
use mcqio_fixtures::testing::engine::nvme::{buf, config, open};
use mcqio_fixtures::ExecMode;

type BoxError = Box<dyn Error + Send + Sync>;

#[test]
fn submit_error_is_an_error() {
    fn is_error<E: Error + Send + Sync + 'static>(_: &E) {}
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    let nsze = ctrl.namespace(1).unwrap().nsze;
    let e: SubmitError<DmaBuf> = qp.read(1, nsze, 1, buf(&ctrl, 512), 0).unwrap_err();
    is_error(&e);
    assert!(matches!(e.kind, SubmitErrorKind::LbaOutOfRange { .. }));
    assert_eq!(e.to_string(), e.kind.to_string());
    // `?` boxes it, buffer and all.
    let boxed: BoxError = e.into();
    assert!(boxed.to_string().contains("past the last block"), "{boxed}");
    assert!(boxed.downcast_ref::<SubmitError<DmaBuf>>().is_some());
    // Payloads that are no error themselves do too.
    let unit: SubmitError<()> = SubmitError {
        kind: SubmitErrorKind::QueueFull,
        buf: (),
    };
    let boxed: BoxError = unit.into();
    assert!(boxed.to_string().starts_with("queue full"));
}

#[test]
fn run_per_core_with_boxed_errors() -> Result<(), BoxError> {
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let lba = ctrl.namespace(1).ok_or("no namespace 1")?.lba_size as usize;
    // The closure mixes error types (the engine's, a SubmitError, a
    // string) through `?`; the controller's own refusal boxes too.
    let results = run_per_core(
        &ctrl,
        2,
        QpairOptions::default(),
        |i, qp| -> Result<usize, BoxError> {
            let data = vec![i as u8 + 1; lba];
            qp.write_blocking(1, i as u64, &data)?;
            let mut back = vec![0; lba];
            qp.read_blocking(1, i as u64, &mut back)?;
            if back != data {
                return Err(format!("thread {i}: read back other data").into());
            }
            if i == 1 {
                let b = ctrl.alloc_buf(lba, DmaDir::Bidirectional)?;
                qp.read(1, u64::MAX - 1, 1, b, 0)?;
            }
            Ok(i)
        },
    )?;
    assert_eq!(results.len(), 2);
    assert_eq!(*results[0].as_ref().map_err(|e| e.to_string())?, 0);
    let e = results[1].as_ref().unwrap_err();
    assert!(e.downcast_ref::<SubmitError<DmaBuf>>().is_some(), "{e}");
    Ok(())
}

#[test]
fn dma_buf_views() -> Result<(), BoxError> {
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let mut qp = ctrl.create_qpair(QpairOptions::default())?;
    let mut b = buf(&ctrl, 4 * 512);
    assert_eq!(b.as_slice().len(), 4 * 512);
    assert!(b.as_slice().iter().all(|&x| x == 0), "fresh memory is zero");
    // Writes through the view are what the device reads, and what the
    // copying accessors see.
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let mut head = [0u8; 8];
    b.read_at(0, &mut head)?;
    assert_eq!(head, [0, 1, 2, 3, 4, 5, 6, 7]);
    let want = b.to_vec();
    qp.write(1, 8, 4, b, 1).map_err(|e| e.kind)?;
    qp.submit();
    let mut done = Vec::new();
    while done.is_empty() {
        qp.poll(8, |c| done.push(c))?;
    }
    // What the device wrote, seen in place; views of split pieces are
    // the pieces' own bytes.
    let mut b = done.pop().unwrap().buf.ok_or("leaked")?;
    b.fill(0xEE);
    qp.read(1, 8, 4, b, 2).map_err(|e| e.kind)?;
    qp.submit();
    while done.is_empty() {
        qp.poll(8, |c| done.push(c))?;
    }
    let c = done.pop().unwrap();
    c.result?;
    let b = c.buf.ok_or("leaked")?;
    assert_eq!(b.as_slice(), &want[..]);
    let (mut lo, hi) = b.split_at(512)?;
    assert_eq!(lo.as_slice(), &want[..512]);
    assert_eq!(hi.as_slice(), &want[512..]);
    lo.as_mut_slice().fill(7);
    assert_eq!(hi.as_slice(), &want[512..], "pieces do not overlap");
    let empty = hi.split_at(0)?.0;
    assert!(empty.as_slice().is_empty());
    Ok(())
}

/// Issue 23: a buffer exposes its host memory as well as its IOVAs, so a
/// wire that copies (a socket) can take the same buffers: each segment's
/// host address is that of the bytes its IOVA maps (a `DmaBuf` chunk, a
/// vectored `Vec<DmaBuf>`).
#[test]
fn buffers_expose_their_host_memory_per_segment() -> Result<(), BoxError> {
    use mcqio::IoBuf;
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let mut parts = buf(&ctrl, 3 * 4096).chunks(4096)?;
    for (i, p) in parts.iter_mut().enumerate() {
        p.as_mut_slice().fill(i as u8 + 1);
    }
    for p in &parts {
        let host = p.segment_host(0).expect("a DmaBuf has host memory");
        assert_eq!(host.as_ptr().cast_const(), p.as_slice().as_ptr());
    }
    let v: Vec<DmaBuf> = parts;
    for i in 0..v.segment_count() {
        let host = v.segment_host(i).expect("each element's");
        // SAFETY: the buffer is not submitted; the pointer covers its
        // segment's `len` bytes.
        let first = unsafe { host.as_ptr().read() };
        assert_eq!(first, i as u8 + 1, "segment {i}");
        assert_eq!(v.segment(i).iova, v[i].iova());
    }
    assert!(v.segment_host(v.segment_count()).is_none());
    Ok(())
}

/// Issue 23: one API shape on both wires — the same constructor names and
/// result types (`create_qpair(opts)` for `DmaBuf`, `create_qpair_for` for
/// any buffer type), the same view of namespaces and logical units
/// (`BlockDevice::units`), the same counters type, and an unknown address
/// refused in the wire's own words.
#[test]
fn both_wires_have_the_same_shape() -> Result<(), BoxError> {
    use mcqio::{BlockDevice, BlockUnit, QueueCounters, UfsQpairOptions};
    use mcqio_fixtures::ufs::{FakeUfs, LuConfig, UfsConfig};
    fn units(d: &dyn BlockDevice) -> Vec<(u32, u64, u32)> {
        d.units()
            .iter()
            .map(|u: &BlockUnit| (u.id, u.blocks, u.block_size))
            .collect()
    }
    let (_fake, nvme) = open(config(ExecMode::Sync, 5));
    assert_eq!(units(&*nvme), [(1, 131072, 512), (2, 4096, 4096)]);
    let mut q = nvme.create_qpair(QpairOptions::default())?;
    let _typed: mcqio::QueuePair<Vec<DmaBuf>> = nvme.create_qpair_for(QpairOptions::default())?;
    let e = q.read(9, 0, 1, buf(&nvme, 512), 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::UnknownNamespace { nsid: 9 });
    // Nothing was submitted or rung. (The refused read still read the
    // coarse clock, as every data command on an idle queue does first.)
    let none = |c: QueueCounters| QueueCounters {
        system_clock_reads: 0,
        ..c
    };
    assert_eq!(none(q.counters()), QueueCounters::default());

    let fake = FakeUfs::new(UfsConfig {
        exec: ExecMode::Sync,
        lus: vec![LuConfig::Ram { blocks: 1024 }],
        ..UfsConfig::default()
    })?;
    let backend: std::sync::Arc<dyn mcqio::vfio::Backend> = fake;
    let ufs = mcqio::UfsController::new(backend, Default::default())?;
    let lu = ufs.unit(0).expect("LU 0");
    assert_eq!((lu.id, lu.blocks), (0, 1024));
    assert_eq!(lu.bytes(), 1024 * u64::from(lu.block_size));
    let mut u = ufs.create_qpair(UfsQpairOptions::default())?;
    let _typed: mcqio::UfsQueuePair<Vec<DmaBuf>> =
        ufs.create_qpair_for(UfsQpairOptions::default())?;
    let b = ufs.alloc_buf(4096, DmaDir::Bidirectional)?;
    let e = u.read(9, 0, 1, b, 0).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::UnknownLun { lun: 9 });
    assert!(e.to_string().contains("LUN 9"), "{e}");
    assert_eq!(none(u.counters()), QueueCounters::default());
    Ok(())
}
