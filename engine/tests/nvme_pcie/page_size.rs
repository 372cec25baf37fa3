//! Issue 15 item 4: the host page and the IOMMU granule need not be the
//! controller's 4 KiB page. An arm64 SMMU maps 16 KiB or 64 KiB pages (and
//! arm64 kernels run with 16 KiB or 64 KiB pages), while PRP entries stay
//! 4 KiB controller pages. The fake IOMMU reports such a granule here, so
//! this 4 KiB-page machine runs the whole path with it: bring-up, queue
//! creation, I/O through PRP lists, vectored buffers, MDTS splits, and
//! strict and lazy mappings of application buffers — data verified, no
//! IOMMU fault, and nothing left mapped after teardown.

use mcqio_fixtures::testing::engine::nvme as common;

use std::sync::Arc;

use common::*;
use mcqio::{Controller, DmaBuf, QpairOptions, QueuePair};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, FakeIommuConfig};
use mcqio_vfio::{
    AppBuffer, DmaDir, DmaMapper, DmaMode, IoBuffer, Mapped, MapperConfig, QueueMapper, Returned,
    PAGE_SIZE,
};

const GRANULES: [usize; 2] = [16 << 10, 64 << 10];
const OPCODE_WRITE: u8 = 0x01;

fn cfg(granule: usize, exec: ExecMode, mdts: u8) -> FakeConfig {
    FakeConfig {
        iommu: FakeIommuConfig {
            min_page_size: granule,
            ..FakeIommuConfig::default()
        },
        ..config(exec, mdts)
    }
}

fn bring_up(granule: usize, exec: ExecMode, mdts: u8) -> (Arc<FakeController>, Arc<Controller>) {
    let (fake, ctrl) = open(cfg(granule, exec, mdts));
    assert_eq!(
        ctrl.dma().granule(),
        granule,
        "the space takes the IOMMU's granule"
    );
    (fake, ctrl)
}

fn assert_clean(fake: &FakeController, mappings_before: usize, what: &str) {
    assert_eq!(fake.iommu().fault_count(), 0, "{what}: IOMMU faults");
    assert_eq!(
        fake.iommu().mapping_count(),
        mappings_before,
        "{what}: mappings left behind"
    );
}

/// Bring-up (admin queues, identify, shadow doorbells) and I/O queues on a
/// large granule; single-page, two-page and PRP-list transfers, starting on
/// and off a page, round-trip. Today's code failed here: every DMA
/// allocation was 4 KiB-based and the IOMMU refused it.
#[test]
fn io_through_prp_lists_on_large_granules() {
    for granule in GRANULES {
        for exec in modes() {
            let (fake, ctrl) = bring_up(granule, exec, 0);
            let before = fake.iommu().mapping_count();
            let mut qp = ctrl
                .create_qpair(QpairOptions {
                    depth: 8,
                    ..Default::default()
                })
                .unwrap();
            let mut r = rng(granule as u64);
            let mut lba = 0u64;
            for (size, offset) in [
                (512usize, 0usize),
                (PAGE_SIZE, 0),
                (2 * PAGE_SIZE, 512),
                (granule, 0),
                (granule + 3 * PAGE_SIZE, 1024),
                (256 << 10, 0),
                (256 << 10, 3584),
            ] {
                let data = random_bytes(&mut r, size);
                let mut b = buf(&ctrl, size + offset).split_at(offset).unwrap().1;
                b.write_at(0, &data).unwrap();
                let nlb = (size / 512) as u32;
                qp.write(1, lba, nlb, b, 1).unwrap();
                wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
                let rb = buf(&ctrl, size + offset).split_at(offset).unwrap().1;
                qp.read(1, lba, nlb, rb, 2).unwrap();
                let c = wait_n(&mut qp, 1).pop().unwrap();
                c.result.unwrap();
                assert!(
                    c.buf.unwrap().to_vec() == data,
                    "granule {granule}: size {size} offset {offset}"
                );
                lba += nlb as u64;
            }
            drop(qp);
            assert_clean(&fake, before, "queue pair");
        }
    }
}

/// Vectored buffers cut from regions of whole granules: 4 KiB pieces (four
/// or sixteen per IOMMU page), the first starting mid-page; one command, one
/// PRP list of controller pages.
#[test]
fn vectored_buffers_on_large_granules() {
    for granule in GRANULES {
        let (fake, ctrl) = bring_up(granule, ExecMode::Sync, 0);
        let before = fake.iommu().mapping_count();
        let mut qp = ctrl
            .create_qpair_for::<Vec<DmaBuf>>(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        let mut r = rng(7);
        let region = buf(&ctrl, 2 * granule);
        assert_eq!(region.region().len(), 2 * granule);
        let (head, rest) = region.split_at(PAGE_SIZE).unwrap();
        let (_, first) = head.split_at(1024).unwrap();
        let mut segs = vec![first];
        segs.extend(rest.chunks(PAGE_SIZE).unwrap());
        let total: usize = segs.iter().map(|b| b.len()).sum();
        let data = random_bytes(&mut r, total);
        let mut at = 0;
        for s in &mut segs {
            let l = s.len();
            s.write_at(0, &data[at..at + l]).unwrap();
            at += l;
        }
        qp.write(1, 128, (total / 512) as u32, segs, 1).unwrap();
        wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
        let rsegs = buf(&ctrl, total).chunks(3 * PAGE_SIZE).unwrap();
        qp.read(1, 128, (total / 512) as u32, rsegs, 2).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        let got: Vec<u8> = c.buf.unwrap().iter().flat_map(|b| b.to_vec()).collect();
        assert!(got == data, "granule {granule}: vectored data");
        drop(qp);
        assert_clean(&fake, before, "vectored");
    }
}

/// A transfer above MDTS (16 KiB per command here) is split into children
/// whose PRPs are built in controller pages out of one large-granule region.
#[test]
fn mdts_split_on_large_granules() {
    for granule in GRANULES {
        let (fake, ctrl) = bring_up(granule, ExecMode::Sync, 2);
        let before = fake.iommu().mapping_count();
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth: 32,
                ..Default::default()
            })
            .unwrap();
        let size = 256 << 10;
        let data = random_bytes(&mut rng(11), size);
        let mut b = buf(&ctrl, size + 512).split_at(512).unwrap().1;
        b.write_at(0, &data).unwrap();
        let writes = fake.stats().io(OPCODE_WRITE);
        qp.write(1, 0, (size / 512) as u32, b, 1).unwrap();
        wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
        assert!(
            fake.stats().io(OPCODE_WRITE) - writes >= (size / (16 << 10)) as u64,
            "split into children of at most MDTS"
        );
        qp.read(1, 0, (size / 512) as u32, buf(&ctrl, size), 2)
            .unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        assert!(
            c.buf.unwrap().to_vec() == data,
            "granule {granule}: split data"
        );
        drop(qp);
        assert_clean(&fake, before, "split");
    }
}

fn io_buffer_bytes(b: &IoBuffer, len: usize) -> Vec<u8> {
    match b {
        IoBuffer::App(a) => a.as_slice()[..len].to_vec(),
        IoBuffer::Pool(p) => {
            let mut v = vec![0; len];
            p.read_bytes(0, &mut v).unwrap();
            v
        }
    }
}

/// Strict, lazy (and premapped) mappings of application buffers on a large
/// granule: transfers shorter than, equal to and longer than a granule, not
/// ending on one, are mapped over whole granules, carry the data both ways,
/// and leave no mapping once released and flushed.
#[test]
fn strict_and_lazy_mappings_on_large_granules() {
    for granule in GRANULES {
        for mode in [DmaMode::Strict, DmaMode::Lazy, DmaMode::Premapped] {
            let (fake, ctrl) = bring_up(granule, ExecMode::Sync, 0);
            let before = fake.iommu().mapping_count();
            let mut qp: QueuePair<Mapped> = ctrl
                .create_qpair_for(QpairOptions {
                    depth: 16,
                    ..Default::default()
                })
                .unwrap();
            let qp_mappings = fake.iommu().mapping_count();
            let mut mapper = QueueMapper::new(ctrl.dma(), &MapperConfig::with_mode(mode)).unwrap();
            let pool_mappings = fake.iommu().mapping_count();
            let mut r = rng(granule as u64 + mode as u64);
            let sizes = [512usize, PAGE_SIZE, granule - 512, granule + 4608, 96 << 10];
            let mut written = Vec::new();
            let mut lba = 0u64;
            let mut returned: Vec<Returned> = Vec::new();
            for (i, &size) in sizes.iter().enumerate() {
                let data = random_bytes(&mut r, size);
                let mut b: IoBuffer = match mapper.pool() {
                    Some(p) => p.alloc().unwrap().into(),
                    None => AppBuffer::for_space(ctrl.dma(), size).unwrap().into(),
                };
                match &mut b {
                    IoBuffer::App(a) => a.as_mut_slice()[..size].copy_from_slice(&data),
                    IoBuffer::Pool(p) => p.write_bytes(0, &data).unwrap(),
                }
                let m = mapper
                    .map(b, size, DmaDir::ToDevice, i as u64)
                    .map_err(|e| e.error)
                    .unwrap_or_else(|e| panic!("{mode}, granule {granule}, {size} bytes: {e}"));
                qp.write(1, lba, (size / 512) as u32, m, i as u64).unwrap();
                written.push((lba, data));
                lba += (size / 512) as u64;
            }
            for c in wait_n(&mut qp, sizes.len()) {
                c.result.unwrap();
                mapper.release(c.buf.unwrap(), &mut returned).unwrap();
            }
            for (i, (lba, data)) in written.iter().enumerate() {
                let size = data.len();
                let b: IoBuffer = match mapper.pool() {
                    Some(p) => p.alloc().unwrap().into(),
                    None => AppBuffer::for_space(ctrl.dma(), size).unwrap().into(),
                };
                let tag = 100 + i as u64;
                let m = mapper
                    .map(b, size, DmaDir::FromDevice, tag)
                    .map_err(|e| e.error)
                    .unwrap();
                qp.read(1, *lba, (size / 512) as u32, m, tag).unwrap();
            }
            for c in wait_n(&mut qp, sizes.len()) {
                c.result.unwrap();
                mapper.release(c.buf.unwrap(), &mut returned).unwrap();
            }
            mapper.flush(&mut returned).unwrap();
            let mut seen = 0;
            for ret in returned.drain(..) {
                if ret.tag >= 100 {
                    let data = &written[(ret.tag - 100) as usize].1;
                    assert!(
                        io_buffer_bytes(&ret.buf, data.len()) == *data,
                        "{mode}, granule {granule}: read back {}",
                        ret.tag - 100
                    );
                    seen += 1;
                }
            }
            assert_eq!(seen, sizes.len());
            assert_eq!(
                fake.iommu().mapping_count(),
                pool_mappings,
                "{mode}: per-I/O mappings left after the flush"
            );
            drop(mapper);
            assert_eq!(fake.iommu().mapping_count(), qp_mappings, "{mode}: pool");
            drop(qp);
            assert_clean(&fake, before, mode.name());
        }
    }
}
