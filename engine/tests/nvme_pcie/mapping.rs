//! The engine's I/O path takes buffers mapped by the DMA mapping layer
//! (`mcqio_vfio::mapping`): premapped pools, strict and lazy mappings, all
//! described by IOVA + length. Data must round-trip and the device must never
//! touch memory outside a live mapping (the fake IOMMU counts faults).

use mcqio_fixtures::testing::engine::nvme as common;

use common::*;
use mcqio::{QpairOptions, QueuePair, SubmitErrorKind};
use std::sync::Arc;

use mcqio::{Controller, ControllerOptions};
use mcqio_fixtures::{ExecMode, FakeController};
use mcqio_vfio::{
    AppBuffer, Backend, DmaDir, DmaMapper, DmaMode, DmaSpace, DoorbellHook, HugePages, IoBuffer,
    Iommu, Mapped, MapperConfig, Mmio, QueueMapper, Returned,
};

const LEN: usize = 16 << 10;

fn fill(buf: &mut IoBuffer, data: &[u8]) {
    match buf {
        IoBuffer::App(a) => a.as_mut_slice()[..data.len()].copy_from_slice(data),
        IoBuffer::Pool(p) => p.write_bytes(0, data).unwrap(),
    }
}

fn contents(buf: &IoBuffer, len: usize) -> Vec<u8> {
    match buf {
        IoBuffer::App(a) => a.as_slice()[..len].to_vec(),
        IoBuffer::Pool(p) => {
            let mut v = vec![0; len];
            p.read_bytes(0, &mut v).unwrap();
            v
        }
    }
}

fn roundtrip(mode: DmaMode, exec: ExecMode) {
    let (fake, ctrl) = open(config(exec, 5));
    let mut qp: QueuePair<Mapped> = ctrl
        .create_qpair_for(QpairOptions {
            depth: 16,
            ..Default::default()
        })
        .unwrap();
    let mut mapper = QueueMapper::new(ctrl.dma(), &MapperConfig::with_mode(mode)).unwrap();
    let mut r = rng(mode as u64);
    let new_buf = |mapper: &mut QueueMapper| -> IoBuffer {
        match mapper.pool() {
            Some(p) => p.alloc().unwrap().into(),
            None => AppBuffer::for_space(ctrl.dma(), LEN).unwrap().into(),
        }
    };
    let mut returned: Vec<Returned> = Vec::new();
    let mut written = Vec::new();
    // Writes: 8 buffers in flight at once.
    for i in 0..8u64 {
        let data = random_bytes(&mut r, LEN);
        let mut b = new_buf(&mut mapper);
        fill(&mut b, &data);
        let m = mapper
            .map(b, LEN, DmaDir::ToDevice, i)
            .map_err(|e| e.error)
            .unwrap();
        qp.write(1, i * 64, (LEN / 512) as u32, m, i).unwrap();
        written.push(data);
    }
    for c in wait_n(&mut qp, 8) {
        c.result.unwrap();
        mapper.release(c.buf.unwrap(), &mut returned).unwrap();
    }
    // Read each extent back through a fresh mapping.
    for i in 0..8u64 {
        let b = new_buf(&mut mapper);
        let m = mapper
            .map(b, LEN, DmaDir::FromDevice, 100 + i)
            .map_err(|e| e.error)
            .unwrap();
        qp.read(1, i * 64, (LEN / 512) as u32, m, 100 + i).unwrap();
    }
    let mut read_back = vec![Vec::new(); 8];
    for c in wait_n(&mut qp, 8) {
        c.result.unwrap();
        let mut out = Vec::new();
        mapper.release(c.buf.unwrap(), &mut out).unwrap();
        returned.extend(out);
    }
    mapper.flush(&mut returned).unwrap();
    for ret in returned.drain(..) {
        if ret.tag >= 100 {
            read_back[(ret.tag - 100) as usize] = contents(&ret.buf, LEN);
        }
    }
    for i in 0..8 {
        assert!(read_back[i] == written[i], "{mode}: extent {i} differs");
    }
    assert_eq!(
        fake.iommu().fault_count(),
        0,
        "{mode}: device touched unmapped memory"
    );
}

#[test]
fn premapped_strict_lazy_roundtrip() {
    for mode in [DmaMode::Premapped, DmaMode::Strict, DmaMode::Lazy] {
        for exec in modes() {
            roundtrip(mode, exec);
        }
    }
}

#[test]
fn mapping_from_another_space_is_rejected() {
    let (_fake, ctrl) = open(config(ExecMode::Sync, 5));
    let (_other_fake, other) = open(config(ExecMode::Sync, 5));
    let mut qp: QueuePair<Mapped> = ctrl.create_qpair_for(Default::default()).unwrap();
    let mut mapper =
        QueueMapper::new(other.dma(), &MapperConfig::with_mode(DmaMode::Strict)).unwrap();
    let b = AppBuffer::for_space(other.dma(), 4096).unwrap();
    let m = mapper
        .map(b.into(), 4096, DmaDir::ToDevice, 1)
        .map_err(|e| e.error)
        .unwrap();
    let e = qp.write(1, 0, 8, m, 1).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::NotDmaMapped);
    let mut out = Vec::new();
    mapper.release(e.into_buf(), &mut out).unwrap();
    mapper.flush(&mut out).unwrap();
    assert_eq!(out.len(), 1, "the buffer is handed back, not lost");
}

/// A fake controller whose engine-side DMA space is one the test chose (over
/// the fake's own IOMMU), so the test controls where that space sits in memory.
struct OnSpace {
    fake: Arc<FakeController>,
    dma: Arc<DmaSpace>,
}

impl Backend for OnSpace {
    fn regs(&self) -> &dyn Mmio {
        self.fake.regs()
    }
    fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }
    fn doorbell_hook(&self) -> Option<Arc<dyn DoorbellHook>> {
        self.fake.doorbell_hook()
    }
    fn name(&self) -> String {
        "fake-on-space".into()
    }
}

/// Issue 12 item 4: a strict mapping kept from controller A, after A (and its
/// DMA space) is gone, must not be accepted by a controller B whose DMA space
/// sits at the address A's did: B's IOMMU has nothing (or something else) at
/// that IOVA.
#[test]
fn mapping_of_a_dropped_controller_is_rejected_by_one_at_the_same_address() {
    let (fake_a, ctrl_a) = open(config(ExecMode::Sync, 5));
    let fake_b = FakeController::new(config(ExecMode::Sync, 5)).unwrap();
    let addr_a = Arc::as_ptr(ctrl_a.dma()) as usize;
    let mut mapper =
        QueueMapper::new(ctrl_a.dma(), &MapperConfig::with_mode(DmaMode::Strict)).unwrap();
    let b = AppBuffer::for_space(ctrl_a.dma(), 4096).unwrap();
    let m = mapper
        .map(b.into(), 4096, DmaDir::ToDevice, 1)
        .map_err(|e| e.error)
        .unwrap();
    let weak_a = Arc::downgrade(ctrl_a.dma());
    drop(mapper);
    drop(ctrl_a);
    drop(fake_a);
    assert_eq!(weak_a.strong_count(), 0, "A's DMA space is gone");
    drop(weak_a);
    // Make spaces over B's IOMMU (keeping each, so the next gets a new
    // address) until one reuses the address of A's.
    let mut kept = Vec::new();
    let space_b = loop {
        assert!(
            kept.len() < 256,
            "the allocator never reused the address of A's DMA space"
        );
        let s = DmaSpace::new(
            Arc::clone(fake_b.iommu()) as Arc<dyn Iommu>,
            HugePages::Never,
        );
        if Arc::as_ptr(&s) as usize == addr_a {
            break s;
        }
        kept.push(s);
    };
    let backend: Arc<dyn Backend> = Arc::new(OnSpace {
        fake: Arc::clone(&fake_b),
        dma: space_b,
    });
    let ctrl_b = Controller::new(backend, ControllerOptions::default()).unwrap();
    assert_eq!(Arc::as_ptr(ctrl_b.dma()) as usize, addr_a);
    let mut qp: QueuePair<Mapped> = ctrl_b.create_qpair_for(Default::default()).unwrap();
    let e = qp.write(1, 0, 8, m, 1).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::NotDmaMapped);
    assert!(fake_b.iommu().faults().is_empty());
    // A's mapper is gone: the mapping (and its buffer) leak on drop, by design.
    drop(e);
}
