//! Data path against the fake: PRPs, transfer sizes, vectored I/O, async API.

use mcqio_fixtures::testing::engine::nvme as common;

use common::*;
use mcqio::{ControllerOptions, DmaBuf, QpairOptions};
use mcqio_fixtures::FakeConfig;
use rand::Rng;

/// Write then read back every size from one block to >= 1 MiB, at page
/// offsets that make PRP1 unaligned, and check the data.
#[test]
fn transfer_sizes_512b_to_2mib() {
    for mode in modes() {
        // MDTS 0 (unlimited): the engine's default cap of 2 MiB applies.
        let (fake, ctrl) = open(config(mode, 0));
        assert_eq!(ctrl.max_transfer(), 2 << 20);
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                ..Default::default()
            })
            .unwrap();
        let mut r = rng(1);
        let sizes = [
            512usize,
            1024,
            4096,
            4608,
            8192,
            12288,
            65536,
            130048,
            1 << 20,
            (1 << 20) + 512,
            2 << 20,
        ];
        let mut lba = 0u64;
        for &size in &sizes {
            for offset in [0usize, 512, 4096 - 512] {
                let data = random_bytes(&mut r, size);
                let region = buf(&ctrl, offset + size);
                let (_, mut wbuf) = region.split_at(offset).unwrap();
                wbuf.write_at(0, &data).unwrap();
                let nlb = (size / 512) as u32;
                qp.write(1, lba, nlb, wbuf, 1).unwrap();
                let c = wait_n(&mut qp, 1).pop().unwrap();
                assert_eq!(c.tag, 1);
                c.result.unwrap();
                let region = buf(&ctrl, offset + size);
                let (_, rbuf) = region.split_at(offset).unwrap();
                qp.read(1, lba, nlb, rbuf, 2).unwrap();
                let c = wait_n(&mut qp, 1).pop().unwrap();
                c.result.unwrap();
                assert_eq!(c.buf.unwrap().to_vec(), data, "size {size} offset {offset}");
                // The fake's own view of the namespace agrees.
                assert_eq!(
                    fake.namespace_bytes(1, lba * 512, 512),
                    data[..512].to_vec()
                );
                lba += nlb as u64;
            }
        }
        assert_eq!(fake.iommu().fault_count(), 0);
        assert_eq!(qp.stats().stale_completions, 0);
    }
}

/// Transfers over 2 MiB need more than one PRP list page (chained lists).
#[test]
fn chained_prp_lists() {
    let (_fake, ctrl) = open_with(
        config(mcqio_fixtures::ExecMode::Sync, 0),
        ControllerOptions {
            max_transfer: 8 << 20,
            ..Default::default()
        },
    );
    assert_eq!(ctrl.max_transfer(), 8 << 20);
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .unwrap();
    let mut r = rng(2);
    for (size, offset) in [
        (4usize << 20, 0usize),
        ((4 << 20) + 4096, 512),
        (8 << 20, 0),
    ] {
        let data = random_bytes(&mut r, size);
        let (_, mut w) = buf(&ctrl, size + offset).split_at(offset).unwrap();
        w.write_at(0, &data).unwrap();
        let nlb = (size / 4096) as u32;
        qp.write(2, 0, nlb, w, 0).unwrap();
        wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
        let (_, rd) = buf(&ctrl, size + offset).split_at(offset).unwrap();
        qp.read(2, 0, nlb, rd, 0).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        assert!(
            c.buf.unwrap().to_vec() == data,
            "size {size} offset {offset}"
        );
    }
}

/// Several buffers, one command, one PRP list.
#[test]
fn vectored_io() {
    for mode in modes() {
        let (_fake, ctrl) = open(config(mode, 0));
        let mut qp = ctrl
            .create_qpair_for::<Vec<DmaBuf>>(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        let mut r = rng(3);
        // 4 KiB + 8 KiB + 4 KiB + 64 KiB pieces from different regions; the
        // first starts 1 KiB into a page.
        let lens = [3072usize, 8192, 4096, 65536];
        let total: usize = lens.iter().sum();
        let data = random_bytes(&mut r, total);
        let mut segs = Vec::new();
        let mut at = 0;
        for (i, &l) in lens.iter().enumerate() {
            let mut b = if i == 0 {
                buf(&ctrl, 4096).split_at(1024).unwrap().1
            } else {
                buf(&ctrl, l)
            };
            b.write_at(0, &data[at..at + l]).unwrap();
            at += l;
            segs.push(b);
        }
        qp.write(1, 64, (total / 512) as u32, segs, 5).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        assert_eq!(c.buf.unwrap().len(), 4);
        // Read back into a different split.
        let rsegs = vec![buf(&ctrl, 16384), buf(&ctrl, total - 16384)];
        qp.read(1, 64, (total / 512) as u32, rsegs, 6).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        let got: Vec<u8> = c.buf.unwrap().iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(got, data);
    }
}

/// Many commands in flight, completions matched by tag, buffers handed back.
#[test]
fn async_random_lbas_deep_queue() {
    for mode in modes() {
        let (_fake, ctrl) = open(config(mode, 5));
        let depth = 64;
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth,
                ..Default::default()
            })
            .unwrap();
        let mut r = rng(4);
        let blocks = 8u32;
        let bs = 4096usize * blocks as usize;
        let nsze = ctrl.namespace(2).unwrap().nsze;
        // Distinct random extents.
        let mut lbas: Vec<u64> = (0..nsze / blocks as u64)
            .map(|i| i * blocks as u64)
            .collect();
        for i in (1..lbas.len()).rev() {
            lbas.swap(i, r.gen_range(0..=i));
        }
        lbas.truncate(depth as usize);
        let datas: Vec<Vec<u8>> = lbas.iter().map(|_| random_bytes(&mut r, bs)).collect();
        for (i, (&lba, d)) in lbas.iter().zip(&datas).enumerate() {
            let mut b = buf(&ctrl, bs);
            b.write_at(0, d).unwrap();
            qp.write(2, lba, blocks, b, i as u64).unwrap();
        }
        assert!(qp.submit());
        assert!(!qp.submit(), "nothing left to ring");
        let done = wait_n(&mut qp, lbas.len());
        let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
        tags.sort();
        assert_eq!(tags, (0..lbas.len() as u64).collect::<Vec<_>>());
        assert!(done.iter().all(|c| c.result.is_ok()));
        // Reuse the returned buffers for the reads.
        for c in done {
            let i = c.tag as usize;
            qp.read(2, lbas[i], blocks, c.buf.unwrap(), i as u64)
                .unwrap();
        }
        for c in wait_n(&mut qp, lbas.len()) {
            c.result.unwrap();
            assert!(
                c.buf.unwrap().to_vec() == datas[c.tag as usize],
                "tag {}",
                c.tag
            );
        }
        assert_eq!(qp.outstanding(), 0);
        let s = qp.stats();
        assert_eq!(
            (s.submitted, s.completed),
            (2 * depth as u64, 2 * depth as u64)
        );
    }
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode, 5));
        let mut qp = ctrl
            .create_qpair(QpairOptions {
                depth: 8,
                ..Default::default()
            })
            .unwrap();
        qp.write_blocking(1, 0, &[0xAB; 8192]).unwrap();
        qp.write_zeroes(1, 4, 4, 1).unwrap();
        qp.flush(1, 2).unwrap();
        qp.deallocate(1, &[(8, 4), (12, 4)], 3).unwrap();
        let done = wait_n(&mut qp, 3);
        assert!(
            done.iter().all(|c| c.result.is_ok() && c.buf.is_none()),
            "{done:?}"
        );
        let mut back = vec![0xFF; 8192];
        qp.read_blocking(1, 0, &mut back).unwrap();
        assert!(back[..2048].iter().all(|&b| b == 0xAB));
        assert!(back[2048..4096].iter().all(|&b| b == 0), "write zeroes");
        assert_eq!(fake.namespace_bytes(1, 2048, 2048), vec![0u8; 2048]);
        qp.flush_blocking(1).unwrap();
    }
}

/// The blocking API splits transfers larger than MDTS into several commands.
#[test]
fn blocking_api_splits_above_mdts() {
    let (fake, ctrl) = open(config(mcqio_fixtures::ExecMode::Sync, 2)); // 16 KiB
    assert_eq!(ctrl.max_transfer(), 16 << 10);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let before = fake.stats().io_total();
    let mut r = rng(5);
    let data = random_bytes(&mut r, 100 << 10);
    qp.write_blocking(1, 3, &data).unwrap();
    let mut back = vec![0; data.len()];
    qp.read_blocking(1, 3, &mut back).unwrap();
    assert_eq!(back, data);
    // 100 KiB in 16 KiB pieces = 7 writes + 7 reads.
    assert_eq!(fake.stats().io_total() - before, 14);
}

#[test]
fn many_small_ios_exercise_ring_wrap_and_generations() {
    let (_fake, ctrl) = open(FakeConfig::sync());
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 3,
            ..Default::default()
        })
        .unwrap();
    let mut bufs: Vec<DmaBuf> = buf(&ctrl, 3 * 4096).chunks(4096).unwrap();
    for round in 0..1000u64 {
        for (i, mut b) in bufs.drain(..).enumerate() {
            b.fill(round as u8);
            qp.write(1, i as u64 * 8, 8, b, round).unwrap();
        }
        for c in wait_n(&mut qp, 3) {
            c.result.unwrap();
            bufs.push(c.buf.unwrap());
        }
    }
    assert_eq!(qp.stats().stale_completions, 0);
    let mut back = vec![0; 512];
    qp.read_blocking(1, 8, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == (999u64 as u8)));
}
