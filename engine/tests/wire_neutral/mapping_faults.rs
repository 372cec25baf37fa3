//! Issue 27 item 9: the mapped queue pairs and the lazy mapper when an
//! unmap fails or panics, or the application's callback panics. Both wires
//! (the fake NVMe controller and the fake UFS) run every DMA mode through
//! the flaky fake IOMMU (`mcqio_fixtures::iommu`): every I/O ends exactly
//! once, no buffer comes back while it is still mapped, and no memory the
//! IOMMU still maps is freed.

use mcqio_fixtures::testing::engine::ufs as ufs_common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::ufs::{UfsQpairOptions, UfsQueuePair};
use mcqio::vfio::mapping::LazyMapper;
use mcqio::vfio::{
    AppBuffer, Backend, DmaDir, DmaMapper, DmaSpace, HugePages, IoBuffer, Iommu, LazyConfig,
    MapError, Mapped, Returned,
};
use mcqio::{
    Completion, Controller, ControllerOptions, Error, MappedQueuePair, MappedSubmitErrorKind,
    MappingMode, QpairOptions,
};
use mcqio_fixtures::iommu::{
    FakeInterface, FlakyUnmaps, UnmapCall, UnmapFaultKind, UnmapFaultStats,
};
use mcqio_fixtures::{FakeConfig, FakeController, FakeIommu};

const HOUR: Duration = Duration::from_secs(3600);

fn lazy(batch: usize, max_delay: Duration) -> MappingMode {
    MappingMode::Lazy { batch, max_delay }
}

fn nvme(depth: u16, mapping: MappingMode) -> (Arc<FakeIommu>, Arc<Controller>, MappedQueuePair) {
    nvme_with(FakeConfig::sync(), depth, mapping)
}

fn nvme_with(
    cfg: FakeConfig,
    depth: u16,
    mapping: MappingMode,
) -> (Arc<FakeIommu>, Arc<Controller>, MappedQueuePair) {
    let fake = FakeController::new(cfg).unwrap();
    let iommu = Arc::clone(fake.iommu());
    let backend: Arc<dyn Backend> = fake;
    let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
    let qp = ctrl
        .create_mapped_qpair(QpairOptions {
            depth,
            mapping,
            ..QpairOptions::default()
        })
        .unwrap();
    (iommu, ctrl, qp)
}

/// Poll until the device finished everything submitted (lazy: the I/Os
/// may still wait for their flush), handing what is delivered to `f`.
fn device_done<Q: BlockQueue<Buf = Mapped>>(
    qp: &mut MappedQueuePair<Q>,
    mut f: impl FnMut(Completion<AppBuffer>),
) {
    let t0 = Instant::now();
    while qp.queue_pair().is_some_and(|q| q.outstanding() > 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the device never finished"
        );
        qp.poll(64, &mut f).unwrap();
    }
}

fn app_buf(space: &DmaSpace, len: usize, byte: u8) -> AppBuffer {
    let mut b = AppBuffer::for_space(space, len).unwrap();
    b.as_mut_slice().fill(byte);
    b
}

/// Item 9 (a): the window is full, `map` flushes synchronously and that
/// unmap fails. The mapper leaks every queued buffer; every I/O that waited
/// for that flush must then be delivered (without its buffer), not wait
/// forever.
#[test]
fn a_failed_flush_in_map_settles_every_io_it_leaked() {
    // 2 MiB reads (16 children of 128 KiB) into a lazy queue that never
    // flushes by batch or time: the 256 MiB window fills after ~128.
    let (iommu, ctrl, mut qp) = nvme(16, lazy(1000, HOUR));
    let base = iommu.mapping_count();
    iommu.fail_nth_unmap(1);
    const IO: usize = 2 << 20;
    let mut delivered = Vec::new();
    let mut submitted = 0u64;
    let refused = loop {
        assert!(submitted < 400, "the window never filled");
        match qp.read(
            1,
            0,
            (IO / 512) as u32,
            app_buf(ctrl.dma(), IO, 0xAA),
            submitted,
        ) {
            Ok(()) => submitted += 1,
            Err(e) => break e,
        }
        qp.submit();
        device_done(&mut qp, |c| delivered.push(c));
    };
    assert!(
        delivered.is_empty(),
        "nothing flushed before the window filled"
    );
    assert!(
        matches!(
            refused.kind,
            MappedSubmitErrorKind::Map(MapError::FlushFailed { leaked, .. }) if leaked as u64 == submitted
        ),
        "{}",
        refused.kind
    );
    assert!(refused.buf.is_some(), "the refused buffer was never mapped");
    // Every queued I/O is settled: the next poll delivers each once, without
    // its (leaked, still mapped) buffer.
    qp.poll(1, |c| delivered.push(c)).unwrap();
    assert_eq!(
        delivered.len() as u64,
        submitted,
        "I/Os left waiting for an unmap that failed"
    );
    assert!(delivered
        .iter()
        .all(|c| c.buf.is_none() && c.result.is_ok()));
    let mut tags: Vec<u64> = delivered.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, (0..submitted).collect::<Vec<_>>());
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(
        iommu.mapping_count(),
        base + submitted as usize,
        "leaked, still mapped"
    );
    assert!(iommu.mapped_but_freed().is_empty());
    // The leaked IOVAs stay taken (the device may still use them), so the
    // window stays full: a further I/O is refused, its buffer handed back.
    let e = qp
        .write(1, 0, 8, app_buf(ctrl.dma(), 4096, 1), 9999)
        .unwrap_err();
    assert!(
        matches!(
            e.kind,
            MappedSubmitErrorKind::Map(MapError::WindowFull { .. })
        ),
        "{}",
        e.kind
    );
    assert!(e.buf.is_some());
    assert_eq!(qp.outstanding(), 0);
    qp.close(|_| panic!("nothing left")).unwrap();
    assert!(iommu.mapped_but_freed().is_empty());
}

/// Item 9 (b): a panicking callback must not lose the slots not yet
/// delivered (strict, 4 writes, panic on the first).
#[test]
fn a_panicking_callback_loses_no_completion() {
    for mode in [MappingMode::Strict, lazy(4, HOUR)] {
        let (iommu, ctrl, mut qp) = nvme(16, mode.clone());
        for i in 0..4u64 {
            qp.write(1, i * 8, 8, app_buf(ctrl.dma(), 4096, i as u8), i)
                .map_err(|e| e.kind)
                .unwrap();
        }
        qp.submit();
        let mut seen = Vec::new();
        let r = catch_unwind(AssertUnwindSafe(|| {
            qp.poll(64, |c| {
                seen.push(c.tag);
                panic!("the application's callback panics");
            })
        }));
        assert!(r.is_err());
        assert_eq!(seen.len(), 1);
        let t0 = Instant::now();
        while seen.len() < 4 && t0.elapsed() < Duration::from_secs(5) {
            qp.poll(64, |c| {
                assert!(c.buf.is_some());
                seen.push(c.tag)
            })
            .unwrap();
        }
        seen.sort();
        assert_eq!(
            seen,
            vec![0, 1, 2, 3],
            "{mode:?}: completions lost to the panic"
        );
        assert_eq!(qp.outstanding(), 0, "{mode:?}");
        drop(qp);
        assert!(iommu.mapped_but_freed().is_empty());
    }
}

fn lazy_mapper_on(
    iommu: &Arc<FakeIommu>,
    cfg: LazyConfig,
) -> (Arc<DmaSpace>, Result<LazyMapper, MapError>) {
    let space = DmaSpace::new(Arc::clone(iommu) as Arc<dyn Iommu>, HugePages::Never);
    let m = LazyMapper::new(&space, 64 << 20, cfg);
    (space, m)
}

/// Item 9 (c): dropping a lazy mapper flushes its queue; if that unmap
/// panics, the buffers it held must leak, not be freed while mapped.
#[test]
fn a_panicking_unmap_in_the_lazy_drop_leaks_its_buffers() {
    for call in [UnmapCall::Single, UnmapCall::Many] {
        let iommu = Arc::new(FakeIommu::default());
        let (space, m) = lazy_mapper_on(
            &iommu,
            LazyConfig {
                batch: 64,
                max_delay: HOUR,
            },
        );
        let mut m = m.unwrap();
        let mut held = Vec::new();
        for i in 0..6u64 {
            let b = app_buf(&space, 4096, 0);
            held.push(
                m.map(IoBuffer::App(b), 4096, DmaDir::FromDevice, i)
                    .unwrap(),
            );
        }
        let mut out: Vec<Returned> = Vec::new();
        // Single: one contiguous run. Many: a gap splits the runs.
        let skip = usize::from(call == UnmapCall::Many);
        let kept: Vec<Mapped> = held.drain(skip..skip + 1).collect();
        for mp in held {
            m.release(mp, &mut out).unwrap();
        }
        assert!(out.is_empty());
        iommu.inject_unmap_fault(call, 1, UnmapFaultKind::Panic);
        let r = catch_unwind(AssertUnwindSafe(move || drop(m)));
        assert!(r.is_err(), "{call:?}: the unmap panicked inside drop");
        assert_eq!(iommu.unmap_fault_stats().panicked, 1);
        assert!(
            iommu.mapped_but_freed().is_empty(),
            "{call:?}: buffers freed while the IOMMU maps them: {:?}",
            iommu.mapped_but_freed()
        );
        // Its own mapper is gone: the kept mapping leaks on drop.
        drop(kept);
    }
}

/// Item 9 (d): "flush on batch only" is `max_delay: Duration::MAX`; it
/// must not overflow the clock.
#[test]
fn lazy_without_a_time_limit_flushes_by_batch_only() {
    for mode in [lazy(3, Duration::MAX), MappingMode::lazy_batch_only(3)] {
        let (iommu, ctrl, mut qp) = nvme(16, mode.clone());
        let base = iommu.mapping_count();
        let mut got = Vec::new();
        for i in 0..2u64 {
            qp.write(1, i * 8, 8, app_buf(ctrl.dma(), 4096, 1), i)
                .map_err(|e| e.kind)
                .unwrap();
            qp.submit();
            device_done(&mut qp, |c| got.push(c));
        }
        std::thread::sleep(Duration::from_millis(20));
        qp.poll(8, |c| got.push(c)).unwrap();
        assert!(got.is_empty(), "{mode:?}: flushed by time");
        assert_eq!(iommu.mapping_count(), base + 2);
        qp.write(1, 16, 8, app_buf(ctrl.dma(), 4096, 1), 2)
            .map_err(|e| e.kind)
            .unwrap();
        qp.submit();
        while got.len() < 3 {
            qp.poll(8, |c| got.push(c)).unwrap();
        }
        assert!(got.iter().all(|c| c.buf.is_some()));
        assert_eq!(qp.mapper_stats().flushes_full, 1);
        assert_eq!(iommu.mapping_count(), base);
    }
}

/// Item 9 (d): a batch no queue can ever reach is refused when the queue
/// pair is made, with a typed error; so is 0.
#[test]
fn lazy_batches_out_of_range_are_refused_at_creation() {
    let fake = FakeController::new(FakeConfig::sync()).unwrap();
    let backend: Arc<dyn Backend> = fake;
    let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
    for batch in [0, mcqio::vfio::mapping::MAX_FLUSH_BATCH + 1, usize::MAX] {
        let r = ctrl.create_mapped_qpair(QpairOptions {
            mapping: lazy(batch, Duration::from_millis(1)),
            ..QpairOptions::default()
        });
        assert!(
            matches!(r, Err(Error::InvalidOption(_))),
            "batch {batch}: {:?}",
            r.err()
        );
    }
    let iommu = Arc::new(FakeIommu::default());
    for batch in [0, mcqio::vfio::mapping::MAX_FLUSH_BATCH + 1, usize::MAX] {
        let (_space, m) = lazy_mapper_on(
            &iommu,
            LazyConfig {
                batch,
                max_delay: HOUR,
            },
        );
        assert!(
            matches!(m, Err(MapError::LazyBatch { batch: b, .. }) if b == batch),
            "batch {batch}: {:?}",
            m.err()
        );
    }
    let (_space, m) = lazy_mapper_on(
        &iommu,
        LazyConfig {
            batch: mcqio::vfio::mapping::MAX_FLUSH_BATCH,
            max_delay: Duration::MAX,
        },
    );
    m.unwrap();
}

// ---------------------------------------------------------------------------
// Every DMA mode of both wires through the flaky IOMMU.
// ---------------------------------------------------------------------------

/// A small seeded generator for the workload (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One queue pair of application buffers on one wire, and its fake IOMMU.
struct Rig<Q: BlockQueue<Buf = Mapped>> {
    name: String,
    iommu: Arc<FakeIommu>,
    space: Arc<DmaSpace>,
    qp: MappedQueuePair<Q>,
    addr: Q::Addr,
    /// Blocks in 4 KiB.
    nlb: u32,
    /// The controller (and its fake), kept alive until the end.
    _keep: Box<dyn std::any::Any>,
}

fn nvme_rig(mapping: MappingMode) -> Rig<mcqio::QueuePair<Mapped>> {
    nvme_rig_with(FakeConfig::sync(), mapping)
}

fn nvme_rig_with(cfg: FakeConfig, mapping: MappingMode) -> Rig<mcqio::QueuePair<Mapped>> {
    let threaded = cfg.exec != mcqio_fixtures::ExecMode::Sync;
    let (iommu, ctrl, qp) = nvme_with(cfg, 16, mapping.clone());
    Rig {
        name: format!("nvme threaded={threaded} {mapping:?}"),
        iommu,
        space: Arc::clone(ctrl.dma()),
        qp,
        addr: 1,
        nlb: 8,
        _keep: Box::new(ctrl),
    }
}

fn ufs_rig(mapping: MappingMode, mcq: bool) -> Rig<UfsQueuePair<Mapped>> {
    ufs_rig_with(ufs_common::sync_cfg(mcq), mapping, mcq)
}

fn ufs_rig_with(
    cfg: mcqio_fixtures::ufs::UfsConfig,
    mapping: MappingMode,
    mcq: bool,
) -> Rig<UfsQueuePair<Mapped>> {
    let (fake, ctrl) = ufs_common::up(cfg, ufs_common::opts(1));
    let qp = ctrl
        .create_mapped_qpair(UfsQpairOptions {
            mapping: mapping.clone(),
            ..Default::default()
        })
        .unwrap();
    Rig {
        name: format!("ufs mcq={mcq} {mapping:?}"),
        iommu: Arc::clone(fake.iommu()),
        space: Arc::clone(ctrl.dma()),
        qp,
        addr: 0,
        nlb: 1,
        _keep: Box::new((ctrl, fake)),
    }
}

/// What a run saw, by tag.
#[derive(Default)]
struct Ledger {
    /// Submitted (accepted) I/Os.
    submitted: BTreeMap<u64, bool>,
    /// Submissions that panicked (an unmap in `map`'s flush, or in the
    /// refusal path): they may end once, or never were.
    maybe: BTreeMap<u64, ()>,
    /// Completions delivered, per tag.
    delivered: BTreeMap<u64, u32>,
    leaked: u64,
    panics: u64,
}

impl Ledger {
    /// The checks made at each delivery: a tag ends once, and a buffer
    /// that comes back is mapped no more.
    fn sink<'a>(
        &'a mut self,
        name: &'a str,
        iommu: &'a FakeIommu,
    ) -> impl FnMut(Completion<AppBuffer>) + 'a {
        move |c| {
            let n = self.delivered.entry(c.tag).or_insert(0);
            *n += 1;
            assert_eq!(*n, 1, "{name}: tag {} ended twice", c.tag);
            assert!(
                self.submitted.contains_key(&c.tag) || self.maybe.contains_key(&c.tag),
                "{name}: tag {} was never submitted",
                c.tag
            );
            match &c.buf {
                Some(b) => assert!(
                    !iommu.maps_host(b.as_ptr(), b.len()),
                    "{name}: tag {} handed back while still mapped",
                    c.tag
                ),
                None => self.leaked += 1,
            }
        }
    }

    fn check(&self, name: &str) {
        for tag in self.submitted.keys() {
            assert_eq!(
                self.delivered.get(tag),
                Some(&1),
                "{name}: tag {tag} did not end exactly once"
            );
        }
    }
}

/// `f` on the queue pair; an unmap panic inside it is caught and counted.
fn guarded<T>(ledger: &mut Ledger, f: impl FnOnce(&mut Ledger) -> T) -> Option<T> {
    // The ledger is only appended to; a panic leaves it consistent.
    let mut l = std::mem::take(ledger);
    let r = catch_unwind(AssertUnwindSafe(|| f(&mut l)));
    *ledger = l;
    match r {
        Ok(v) => Some(v),
        Err(_) => {
            ledger.panics += 1;
            None
        }
    }
}

fn poll_round<Q: BlockQueue<Buf = Mapped>>(rig: &mut Rig<Q>, ledger: &mut Ledger, flush: bool) {
    let (qp, name, iommu) = (&mut rig.qp, rig.name.as_str(), &*rig.iommu);
    guarded(ledger, |l| {
        // A failed unmap is reported after the completions were delivered.
        let _ = qp.poll(16, l.sink(name, iommu));
    });
    if flush {
        guarded(ledger, |l| {
            let _ = qp.flush_mappings(l.sink(name, iommu));
        });
    }
}

/// Random reads and writes while unmaps fail or panic at random, then a
/// close (or drop) with I/Os still in flight or queued.
fn run_flaky<Q: BlockQueue<Buf = Mapped>>(
    mut rig: Rig<Q>,
    seed: u64,
    ios: u64,
    close: bool,
) -> UnmapFaultStats {
    let mut rng = Rng::new(seed);
    let mut ledger = Ledger::default();
    rig.iommu.set_flaky_unmaps(Some(FlakyUnmaps {
        seed,
        fail_ppm: 80_000,
        panic_ppm: 50_000,
    }));
    let mut burst = 0;
    for tag in 0..ios {
        // Keep room in the queue: with a device thread, completions lag.
        let t0 = Instant::now();
        while rig.qp.queue_pair().is_some_and(|q| q.outstanding() >= 12) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{}: the device stalled",
                rig.name
            );
            rig.qp.submit();
            poll_round(&mut rig, &mut ledger, false);
        }
        let write = rng.below(2) == 0;
        let lba = rng.below(64) * u64::from(rig.nlb);
        let buf = app_buf(&rig.space, 4096, tag as u8);
        let (qp, addr, nlb) = (&mut rig.qp, rig.addr, rig.nlb);
        let r = guarded(&mut ledger, |_| {
            if write {
                qp.write(addr, lba, nlb, buf, tag)
            } else {
                qp.read(addr, lba, nlb, buf, tag)
            }
        });
        match r {
            Some(Ok(())) => {
                ledger.submitted.insert(tag, write);
            }
            Some(Err(e)) => {
                if let Some(b) = &e.buf {
                    assert!(
                        !rig.iommu.maps_host(b.as_ptr(), b.len()),
                        "{}: refused buffer still mapped",
                        rig.name
                    );
                }
            }
            None => {
                ledger.maybe.insert(tag, ());
            }
        }
        burst += 1;
        if burst > rng.below(8) {
            burst = 0;
            rig.qp.submit();
            poll_round(&mut rig, &mut ledger, rng.below(4) == 0);
            assert!(
                rig.iommu.mapped_but_freed().is_empty(),
                "{}: mapped memory freed",
                rig.name
            );
        }
    }
    rig.qp.submit();
    // Let the device finish; deliver what the flushes let through.
    let t0 = Instant::now();
    while ledger
        .submitted
        .keys()
        .any(|t| !ledger.delivered.contains_key(t))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{}: I/Os never ended",
            rig.name
        );
        poll_round(&mut rig, &mut ledger, true);
    }
    // A few more left in flight (or queued) for close or drop, which must
    // not panic: from here unmaps only fail.
    for tag in ios..ios + 6 {
        let buf = app_buf(&rig.space, 4096, 0);
        if rig.qp.read(rig.addr, 0, rig.nlb, buf, tag).is_ok() {
            ledger.submitted.insert(tag, false);
        }
    }
    rig.qp.submit();
    rig.iommu.set_flaky_unmaps(Some(FlakyUnmaps {
        seed: !seed,
        fail_ppm: 150_000,
        panic_ppm: 0,
    }));
    let Rig {
        name, iommu, qp, ..
    } = rig;
    if close {
        let _ = qp.close(ledger.sink(&name, &iommu));
        ledger.check(&name);
    } else {
        drop(qp); // ends what is left without telling anyone
        for tag in ios..ios + 6 {
            ledger.submitted.remove(&tag);
        }
        ledger.check(&name);
    }
    for (tag, n) in &ledger.delivered {
        assert_eq!(*n, 1, "{name}: tag {tag}");
    }
    assert!(
        iommu.mapped_but_freed().is_empty(),
        "{name}: mapped memory freed: {:?}",
        iommu.mapped_but_freed()
    );
    let st = iommu.unmap_fault_stats();
    iommu.clear_unmap_faults();
    eprintln!(
        "{name} seed {seed}: {} submitted, {} delivered ({} without their buffer), {} panics caught, faults {st:?}",
        ledger.submitted.len(),
        ledger.delivered.len(),
        ledger.leaked,
        ledger.panics
    );
    st
}

/// Both kinds of fault struck somewhere in a test's runs.
fn both_kinds(all: &[UnmapFaultStats]) {
    let (failed, panicked) = all
        .iter()
        .fold((0, 0), |(f, p), s| (f + s.failed, p + s.panicked));
    assert!(
        failed > 0 && panicked > 0,
        "failed {failed}, panicked {panicked}"
    );
}

fn mapped_modes() -> Vec<MappingMode> {
    vec![
        MappingMode::Strict,
        lazy(4, HOUR),
        MappingMode::lazy_batch_only(7),
        lazy(3, Duration::from_micros(200)),
    ]
}

#[test]
fn strict_and_lazy_on_nvme_survive_a_flaky_iommu() {
    let mut all = Vec::new();
    for (i, mode) in mapped_modes().into_iter().enumerate() {
        for seed in [1, 2] {
            let rig = nvme_rig(mode.clone());
            all.push(run_flaky(rig, seed * 10 + i as u64, 300, seed == 1));
        }
    }
    both_kinds(&all);
}

/// The same with the fakes' device threads: unmaps race real concurrent
/// DMA (the fake IOMMU's unmap waits for the device's open sections).
#[test]
fn strict_and_lazy_with_device_threads_survive_a_flaky_iommu() {
    let mut all = Vec::new();
    for (i, mode) in mapped_modes().into_iter().enumerate() {
        let cfg = FakeConfig {
            exec: mcqio_fixtures::ExecMode::Threaded {
                workers: 1,
                pin_core: None,
            },
            ..FakeConfig::default()
        };
        let rig = nvme_rig_with(cfg, mode.clone());
        all.push(run_flaky(rig, 30 + i as u64, 150, i % 2 == 0));
        let rig = ufs_rig_with(ufs_common::threaded_cfg(true, 1), mode, true);
        all.push(run_flaky(rig, 40 + i as u64, 150, i % 2 == 1));
    }
    both_kinds(&all);
}

/// Issue 42 item 5: the same through the engine's iommufd code (`Ranged`
/// over the fake's IOAS shape: one unmap call per run, one IOTLB sync per
/// area, iommufd's errnos), on both wires, in every mapped mode.
#[test]
fn strict_and_lazy_through_iommufd_survive_a_flaky_iommu() {
    let mut all = Vec::new();
    for (i, mode) in mapped_modes().into_iter().enumerate() {
        let mut cfg = FakeConfig::sync();
        cfg.iommu.interface = FakeInterface::Iommufd;
        let rig = nvme_rig_with(cfg, mode.clone());
        // The DMA space maps through the wrapper, not the fake itself.
        assert_ne!(
            Arc::as_ptr(rig.space.iommu()) as *const u8,
            Arc::as_ptr(&rig.iommu) as *const u8,
            "not the iommufd path"
        );
        all.push(run_flaky(rig, 50 + i as u64, 300, i % 2 == 0));
        let mut cfg = ufs_common::sync_cfg(true);
        cfg.iommu.interface = FakeInterface::Iommufd;
        all.push(run_flaky(
            ufs_rig_with(cfg, mode, true),
            60 + i as u64,
            300,
            i % 2 == 1,
        ));
    }
    both_kinds(&all);
}

#[test]
fn strict_and_lazy_on_ufs_survive_a_flaky_iommu() {
    let mut all = Vec::new();
    for (i, mode) in mapped_modes().into_iter().enumerate() {
        for mcq in [true, false] {
            for seed in [1, 2] {
                let rig = ufs_rig(mode.clone(), mcq);
                all.push(run_flaky(rig, seed * 10 + i as u64, 300, seed == 1));
            }
        }
    }
    both_kinds(&all);
}

/// Premapped: no unmap per I/O, so the faults strike when the application
/// drops its buffers and when the queue pair's own memory goes at close.
fn run_premapped<Q: BlockQueue<Buf = mcqio::DmaBuf>>(
    name: &str,
    iommu: &FakeIommu,
    mut qp: Q,
    alloc: impl Fn() -> mcqio::DmaBuf,
    addr: Q::Addr,
    nlb: u32,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    iommu.set_flaky_unmaps(Some(FlakyUnmaps {
        seed,
        fail_ppm: 100_000,
        panic_ppm: 100_000,
    }));
    let mut submitted = BTreeMap::new();
    let mut delivered: BTreeMap<u64, u32> = BTreeMap::new();
    let on_done = |c: Completion<mcqio::DmaBuf>, delivered: &mut BTreeMap<u64, u32>| {
        *delivered.entry(c.tag).or_insert(0) += 1;
        if let Some(b) = c.buf {
            // Premapped buffers stay mapped: they belong to the pool's region.
            assert!(
                iommu.is_mapped(b.iova(), b.len() as u64),
                "{name}: premapped buffer unmapped"
            );
            // Dropping it unmaps its region: that may fail (leak) or panic.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
        }
    };
    for tag in 0..200u64 {
        let buf = alloc();
        let lba = rng.below(64) * u64::from(nlb);
        let r = if rng.below(2) == 0 {
            qp.write(addr, lba, nlb, buf, tag)
        } else {
            qp.read(addr, lba, nlb, buf, tag)
        };
        if r.is_ok() {
            submitted.insert(tag, ());
        }
        if rng.below(4) == 0 {
            qp.submit();
            qp.poll(16, |c| on_done(c, &mut delivered)).unwrap();
        }
    }
    qp.submit();
    let t0 = Instant::now();
    while qp.outstanding() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{name}: I/Os never ended"
        );
        qp.poll(16, |c| on_done(c, &mut delivered)).unwrap();
    }
    for tag in 200..206u64 {
        if qp.read(addr, 0, nlb, alloc(), tag).is_ok() {
            submitted.insert(tag, ());
        }
    }
    qp.submit();
    iommu.set_flaky_unmaps(Some(FlakyUnmaps {
        seed: !seed,
        fail_ppm: 150_000,
        panic_ppm: 0,
    }));
    let _ = qp.close(|c| on_done(c, &mut delivered));
    for tag in submitted.keys() {
        assert_eq!(
            delivered.get(tag),
            Some(&1),
            "{name}: tag {tag} did not end exactly once"
        );
    }
    assert_eq!(
        delivered.len(),
        submitted.len(),
        "{name}: unknown tags delivered"
    );
    assert!(
        iommu.mapped_but_freed().is_empty(),
        "{name}: mapped memory freed"
    );
    let st = iommu.unmap_fault_stats();
    assert!(
        st.failed > 0 && st.panicked > 0,
        "{name}: no fault was injected: {st:?}"
    );
    iommu.clear_unmap_faults();
}

#[test]
fn premapped_on_both_wires_survives_a_flaky_iommu() {
    for seed in [3, 4] {
        let fake = FakeController::new(FakeConfig::sync()).unwrap();
        let iommu = Arc::clone(fake.iommu());
        let backend: Arc<dyn Backend> = fake;
        let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 16,
                ..QpairOptions::default()
            })
            .unwrap();
        run_premapped(
            "nvme premapped",
            &iommu,
            qp,
            || ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            1,
            8,
            seed,
        );
        for mcq in [true, false] {
            let (fake, ctrl) = ufs_common::up(ufs_common::sync_cfg(mcq), ufs_common::opts(1));
            let qp = ctrl.create_qpair(Default::default()).unwrap();
            run_premapped(
                &format!("ufs mcq={mcq} premapped"),
                fake.iommu(),
                qp,
                || ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                0,
                1,
                seed,
            );
        }
    }
}

/// Targeted: the next unmap panics inside a lazy queue pair's flush
/// (`flush_mappings`). The I/Os it covered are delivered once, by the next
/// call, without their buffers; none is freed. (The `unmap_many` path is
/// `a_panicking_unmap_in_the_lazy_drop_leaks_its_buffers`.)
#[test]
fn a_panicking_unmap_in_a_lazy_flush_leaks_and_settles() {
    let mut rig = nvme_rig(lazy(64, HOUR));
    let mut ledger = Ledger::default();
    for tag in 0..6u64 {
        let buf = app_buf(&rig.space, 4096, 0);
        rig.qp
            .write(1, tag * 8, 8, buf, tag)
            .map_err(|e| e.kind)
            .unwrap();
        ledger.submitted.insert(tag, true);
    }
    rig.qp.submit();
    device_done(&mut rig.qp, |_| panic!("nothing is due before the flush"));
    rig.iommu
        .inject_unmap_fault(UnmapCall::Any, 1, UnmapFaultKind::Panic);
    let (qp, name, iommu) = (&mut rig.qp, rig.name.clone(), Arc::clone(&rig.iommu));
    let r = guarded(&mut ledger, |l| qp.flush_mappings(l.sink(&name, &iommu)));
    assert!(r.is_none(), "the flush's unmap panicked");
    assert!(iommu.mapped_but_freed().is_empty());
    // The next call settles them: each once, without its buffer.
    rig.qp.poll(16, ledger.sink(&name, &iommu)).unwrap();
    ledger.check(&name);
    assert_eq!(ledger.leaked, 6);
    assert_eq!(rig.qp.outstanding(), 0);
    rig.qp.close(|_| panic!("nothing left")).unwrap();
    assert!(iommu.mapped_but_freed().is_empty());
}

/// Strict: the Nth unmap fails; exactly that I/O comes back without its
/// buffer, and poll reports the failure after delivering.
#[test]
fn the_nth_strict_unmap_failing_leaks_exactly_that_buffer() {
    for ufs in [false, true] {
        let iommu;
        let mut ledger = Ledger::default();
        let name;
        if ufs {
            let mut rig = ufs_rig(MappingMode::Strict, true);
            iommu = Arc::clone(&rig.iommu);
            name = rig.name.clone();
            strict_nth(&mut rig, &mut ledger);
        } else {
            let mut rig = nvme_rig(MappingMode::Strict);
            iommu = Arc::clone(&rig.iommu);
            name = rig.name.clone();
            strict_nth(&mut rig, &mut ledger);
        }
        ledger.check(&name);
        assert_eq!(ledger.leaked, 1, "{name}");
        assert!(iommu.mapped_but_freed().is_empty());
    }
}

fn strict_nth<Q: BlockQueue<Buf = Mapped>>(rig: &mut Rig<Q>, ledger: &mut Ledger) {
    let base = rig.iommu.mapping_count();
    rig.iommu.fail_nth_unmap(3);
    for tag in 0..5u64 {
        let buf = app_buf(&rig.space, 4096, tag as u8);
        rig.qp
            .write(rig.addr, tag * u64::from(rig.nlb), rig.nlb, buf, tag)
            .map_err(|e| e.kind)
            .unwrap();
        ledger.submitted.insert(tag, true);
    }
    rig.qp.submit();
    let mut errs = 0;
    let t0 = Instant::now();
    while ledger.delivered.len() < 5 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        if let Err(e) = rig.qp.poll(16, ledger.sink(&rig.name, &rig.iommu)) {
            assert!(matches!(e, Error::Mapping(_)), "{e}");
            errs += 1;
        }
    }
    assert_eq!(errs, 1);
    assert_eq!(
        rig.iommu.mapping_count(),
        base + 1,
        "the leaked one stays mapped"
    );
}
