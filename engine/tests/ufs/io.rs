//! UFS data path against the fake controller: random data at random LBAs
//! on 1, 2 and 8 queue pairs (threads), transfers up to 1 MiB with
//! multi-entry PRDTs, vectored buffers, flush and unmap, doorbell batching,
//! and every bad input typed with the buffer handed back.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::collections::HashMap;
use std::sync::Arc;

use mcqio::ufs::{UfsController, UfsMode};
use mcqio::vfio::DmaDir;
use mcqio::{DmaBuf, SubmitErrorKind};
use rand::{Rng, SeedableRng};

/// Each thread owns a queue pair and a disjoint LBA range; writes random
/// data at random LBAs, reads it back, compares.
fn random_rw(ctrl: &Arc<UfsController>, threads: usize, rounds: usize) {
    let blocks = ctrl.logical_unit(0).unwrap().blocks;
    let per = blocks / threads as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let ctrl = Arc::clone(ctrl);
            s.spawn(move || {
                let mut qp = ctrl.create_qpair(Default::default()).unwrap();
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64 + 99);
                let base = per * t as u64;
                let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
                for round in 0..rounds {
                    // A batch of writes, one doorbell.
                    let mut batch = Vec::new();
                    for i in 0..8u64 {
                        let nblk = rng.gen_range(1..=4u32);
                        let lba = base + rng.gen_range(0..per - 4);
                        if batch.iter().any(|&(l, n, _): &(u64, u32, u64)| {
                            lba < l + u64::from(n) && l < lba + u64::from(nblk)
                        }) {
                            continue;
                        }
                        let tag = round as u64 * 100 + i;
                        batch.push((lba, nblk, tag));
                    }
                    for &(lba, nblk, tag) in &batch {
                        let data = pattern(tag ^ (t as u64) << 32, nblk as usize * 4096);
                        let b = buf_with(&ctrl, &data);
                        qp.write(0, lba, nblk, b, tag).unwrap();
                        for k in 0..u64::from(nblk) {
                            written.insert(
                                lba + k,
                                data[k as usize * 4096..(k as usize + 1) * 4096].to_vec(),
                            );
                        }
                    }
                    let done = wait_n(&mut qp, batch.len());
                    for c in done {
                        c.result.expect("write");
                        assert!(c.buf.is_some());
                    }
                }
                // Read everything back, several reads in flight.
                let lbas: Vec<u64> = written.keys().copied().collect();
                for chunk in lbas.chunks(16) {
                    for &lba in chunk {
                        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
                        qp.read(0, lba, 1, b, lba).unwrap();
                    }
                    for c in wait_n(&mut qp, chunk.len()) {
                        c.result.expect("read");
                        assert_eq!(c.buf.unwrap().to_vec(), written[&c.tag], "LBA {}", c.tag);
                    }
                }
                let s = qp.stats();
                assert_eq!(s.submitted, s.completed);
                assert_eq!(s.stale_completions, 0);
                qp.close(|_| panic!("nothing left")).unwrap();
            });
        }
    });
}

#[test]
fn random_data_one_queue_pair_mcq() {
    let (_f, ctrl) = up(threaded_cfg(true, 1), opts(1));
    random_rw(&ctrl, 1, 12);
}

#[test]
fn random_data_two_queue_pairs_on_two_threads() {
    let (_f, ctrl) = up(threaded_cfg(true, 2), opts(2));
    assert_eq!(ctrl.mode(), UfsMode::Mcq { queues: 2 });
    random_rw(&ctrl, 2, 8);
}

#[test]
fn random_data_eight_queue_pairs_on_eight_threads() {
    let (_f, ctrl) = up(threaded_cfg(true, 2), opts(8));
    assert_eq!(ctrl.mode(), UfsMode::Mcq { queues: 8 });
    random_rw(&ctrl, 8, 4);
}

#[test]
fn random_data_legacy_single_doorbell() {
    let (_f, ctrl) = up(threaded_cfg(false, 1), opts(1));
    assert_eq!(ctrl.mode(), UfsMode::Legacy);
    random_rw(&ctrl, 1, 8);
}

fn transfer_sizes(mcq: bool) {
    let (fake, ctrl) = up(sync_cfg(mcq), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut lba = 0u64;
    for (i, kib) in [4usize, 8, 64, 252, 256, 260, 512, 768, 1024]
        .into_iter()
        .enumerate()
    {
        let len = kib * 1024;
        let data = pattern(i as u64 + 7, len);
        let blocks = (len / 4096) as u32;
        qp.write(0, lba, blocks, buf_with(&ctrl, &data), 1).unwrap();
        wait_n(&mut qp, 1).pop().unwrap().result.unwrap();
        assert_eq!(fake.lu_bytes(0, lba * 4096, len), data, "{kib} KiB");
        let b = ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap();
        qp.read(0, lba, blocks, b, 2).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        assert_eq!(c.buf.unwrap().to_vec(), data, "{kib} KiB read back");
        lba += blocks as u64;
    }
}

#[test]
fn transfers_from_4k_to_1m_mcq() {
    transfer_sizes(true);
}

#[test]
fn transfers_from_4k_to_1m_legacy() {
    transfer_sizes(false);
}

#[test]
fn vectored_buffers_one_prdt_entry_per_segment() {
    let (fake, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl
        .create_qpair_for::<Vec<DmaBuf>>(Default::default())
        .unwrap();
    // 1 MiB in 256 separate 4 KiB buffers, with empty segments mixed in.
    let data = pattern(11, 1 << 20);
    let mut segs = Vec::new();
    for (i, part) in data.chunks(4096).enumerate() {
        segs.push(buf_with(&ctrl, part));
        if i % 64 == 0 {
            let whole = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
            let (empty, _) = whole.split_at(0).unwrap();
            segs.push(empty);
        }
    }
    qp.write(0, 1000, 256, segs, 5).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    c.result.unwrap();
    assert_eq!(fake.lu_bytes(0, 1000 * 4096, 1 << 20), data);
    // Read into three odd-sized (dword multiple) pieces.
    let pieces = vec![
        ctrl.alloc_buf(4096 + 12, DmaDir::Bidirectional).unwrap(),
        ctrl.alloc_buf(100, DmaDir::Bidirectional).unwrap(),
        ctrl.alloc_buf(3 * 4096, DmaDir::Bidirectional).unwrap(),
    ];
    qp.read(0, 1000, 4, pieces, 6).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    c.result.unwrap();
    let got: Vec<u8> = c.buf.unwrap().iter().flat_map(|b| b.to_vec()).collect();
    assert_eq!(&got[..4 * 4096], &data[..4 * 4096]);
}

#[test]
fn flush_and_unmap() {
    for mcq in [true, false] {
        let (fake, ctrl) = up(sync_cfg(mcq), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 20, &pattern(3, 4 * 4096)).unwrap();
        qp.flush(0, 1).unwrap();
        qp.unmap(0, 21, 2, 2).unwrap();
        let mut done = wait_n(&mut qp, 2);
        done.sort_by_key(|c| c.tag);
        for c in &done {
            assert!(c.buf.is_none());
            c.result.expect("flush / unmap");
        }
        assert_eq!(
            fake.lu_bytes(0, 21 * 4096, 2 * 4096),
            vec![0u8; 8192],
            "unmapped blocks read zero"
        );
        assert_eq!(
            fake.lu_bytes(0, 20 * 4096, 4096),
            pattern(3, 4 * 4096)[..4096].to_vec()
        );
    }
}

#[test]
fn one_doorbell_per_batch_and_no_cqtp_read_when_idle() {
    let (_f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..8 {
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        qp.read(0, i, 1, b, i).unwrap();
    }
    assert_eq!(qp.stats().doorbell_writes, 0, "nothing rung before submit");
    assert!(qp.submit());
    assert!(!qp.submit(), "nothing new to ring");
    assert_eq!(qp.stats().doorbell_writes, 1);
    let done = wait_n(&mut qp, 8);
    assert_eq!(done.len(), 8);
    let s = qp.stats();
    let reads = s.completion_reads;
    for _ in 0..10 {
        assert_eq!(qp.poll(8, |_| panic!("no command")).unwrap(), 0);
    }
    let s2 = qp.stats();
    assert_eq!(s2.completion_reads, reads, "an idle poll reads no register");
    assert_eq!(s2.completion_reads_skipped, s.completion_reads_skipped + 10);
}

/// Issue 28: CQHP is stored once 32 consumed entries have piled up (fewer
/// where the ring has no room for that many over the depth), not after
/// every poll that consumed something — one store per I/O at QD1. However
/// deep the queue, the lag never lets the controller find the CQ full (the
/// fake counts the fetches it cut short for want of a CQ slot).
#[test]
fn the_cq_head_is_stored_once_per_batch_and_the_cq_never_fills() {
    const ENTRIES: u64 = 257;
    for depth in [1u16, 16, 225, 240, 255] {
        let cfg = mcqio_fixtures::ufs::UfsConfig {
            mac: 256,
            queue_depth: 255,
            ..sync_cfg(true)
        };
        let (fake, ctrl) = up(cfg, mcqio::ufs::UfsOptions { depth, ..opts(1) });
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        assert_eq!(qp.depth(), usize::from(depth));
        let mut free: Vec<DmaBuf> = (0..depth)
            .map(|_| ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap())
            .collect();
        let total = 3 * ENTRIES + 10;
        let (mut sent, mut done) = (0u64, 0u64);
        let start = std::time::Instant::now();
        while done < total {
            while sent < total {
                let Some(b) = free.pop() else { break };
                qp.read(0, sent % 4096, 1, b, sent).unwrap();
                sent += 1;
            }
            qp.submit();
            // One to three completions a poll, resubmitted at once.
            let max = 1 + (done % 3) as usize;
            qp.poll(max, |c| {
                assert!(c.result.is_ok(), "{:?}", c.result);
                free.push(c.buf.expect("buffer back"));
                done += 1;
            })
            .unwrap();
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "depth {depth}: stalled after {done} of {total} completions"
            );
        }
        assert_eq!(
            fake.stats().cq_full,
            0,
            "depth {depth}: the CQ was found full"
        );
        let batch = 32.min(ENTRIES - u64::from(depth));
        let writes = qp.stats().cq_head_writes;
        // A poll consumes up to 3, so a store releases batch..batch + 2.
        assert!(
            writes <= total / batch && writes >= total / (batch + 2) - 1,
            "depth {depth}: {writes} CQHP stores for {total} completions (batch {batch})"
        );
    }
}

#[test]
fn bad_inputs_are_typed_and_hand_the_buffer_back() {
    for mcq in [true, false] {
        let (_f, ctrl) = up(sync_cfg(mcq), opts(1));
        let (_f2, other) = up(sync_cfg(true), opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let buf = || ctrl.alloc_buf(8192, DmaDir::Bidirectional).unwrap();
        let kind = |r: Result<(), mcqio::SubmitError<DmaBuf>>| {
            let e = r.unwrap_err();
            assert_eq!(e.buf.len(), e.buf.len(), "buffer handed back");
            e.kind
        };
        assert_eq!(
            kind(qp.read(3, 0, 1, buf(), 0)),
            SubmitErrorKind::UnknownLun { lun: 3 }
        );
        assert_eq!(
            kind(qp.read(0, 0, 0, buf(), 0)),
            SubmitErrorKind::ZeroLength
        );
        assert_eq!(
            kind(qp.read(0, 4095, 2, buf(), 0)),
            SubmitErrorKind::LbaOutOfRange {
                slba: 4095,
                nlb: 2,
                nsze: 4096
            }
        );
        assert_eq!(
            kind(qp.read(0, u64::MAX, 1, buf(), 0)),
            SubmitErrorKind::LbaOutOfRange {
                slba: u64::MAX,
                nlb: 1,
                nsze: 4096
            }
        );
        assert!(matches!(
            kind(qp.read(0, 0, 3, buf(), 0)),
            SubmitErrorKind::BufferTooSmall {
                needed: 12288,
                available: 8192
            }
        ));
        let to_dev = ctrl.alloc_buf(4096, DmaDir::ToDevice).unwrap();
        assert!(matches!(
            kind(qp.read(0, 0, 1, to_dev, 0)),
            SubmitErrorKind::WrongDirection { .. }
        ));
        let from_dev = ctrl.alloc_buf(4096, DmaDir::FromDevice).unwrap();
        assert!(matches!(
            kind(qp.write(0, 0, 1, from_dev, 0)),
            SubmitErrorKind::WrongDirection { .. }
        ));
        let foreign = other.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        assert_eq!(
            kind(qp.write(0, 0, 1, foreign, 0)),
            SubmitErrorKind::NotDmaMapped
        );
        // A segment that does not start on a dword.
        let (_, odd) = buf().split_at(2).unwrap();
        assert!(matches!(
            kind(qp.write(0, 0, 1, odd, 0)),
            SubmitErrorKind::Misaligned { segment: 0, .. }
        ));
        // Queue full at the depth; the rejected buffer comes back.
        for i in 0..qp.depth() as u64 {
            qp.read(0, i, 1, buf(), i).unwrap();
        }
        assert!(qp.is_full());
        assert_eq!(
            kind(qp.read(0, 0, 1, buf(), 99)),
            SubmitErrorKind::QueueFull
        );
        assert_eq!(qp.flush(0, 1).unwrap_err().kind, SubmitErrorKind::QueueFull);
        let n = qp.depth();
        let done = wait_n(&mut qp, n);
        assert!(done.iter().all(|c| c.result.is_ok() && c.buf.is_some()));
        assert_eq!(qp.outstanding(), 0);
        // Nothing rejected reached the device or left a slot taken.
        assert_eq!(qp.stats().submitted, n as u64);
        assert_eq!(
            qp.flush(7, 1).unwrap_err().kind,
            SubmitErrorKind::UnknownLun { lun: 7 }
        );
        assert_eq!(
            qp.unmap(0, 4096, 1, 1).unwrap_err().kind,
            SubmitErrorKind::LbaOutOfRange {
                slba: 4096,
                nlb: 1,
                nsze: 4096
            }
        );
        // Blocking helpers.
        assert!(matches!(
            qp.read_blocking(0, 0, &mut [0u8; 100]),
            Err(mcqio::Error::Submit(SubmitErrorKind::BufferTooSmall { .. }))
        ));
        assert!(matches!(
            qp.write_blocking(0, 0, &[]),
            Err(mcqio::Error::Submit(SubmitErrorKind::ZeroLength))
        ));
    }
}

fn split_opts() -> mcqio::ufs::UfsOptions {
    mcqio::ufs::UfsOptions {
        depth: 8,
        max_transfer: 64 << 10,
        ..opts(1)
    }
}

#[test]
fn transfers_above_the_limit_are_split_and_complete_once() {
    for mcq in [true, false] {
        let (fake, ctrl) = up(sync_cfg(mcq), split_opts());
        let mut qp = ctrl
            .create_qpair_for::<Vec<DmaBuf>>(Default::default())
            .unwrap();
        assert_eq!(qp.max_transfer(), 64 << 10);
        // 448 KiB = 7 children of 64 KiB, in 3 odd-sized segments, so child
        // boundaries fall inside segments.
        let data = pattern(21, 448 << 10);
        let cuts = [0usize, 100 << 10, 300 << 10, 448 << 10];
        let segs: Vec<DmaBuf> = cuts
            .windows(2)
            .map(|w| buf_with(&ctrl, &data[w[0]..w[1]]))
            .collect();
        qp.write(0, 50, 112, segs, 1).unwrap();
        let s = qp.stats();
        assert_eq!(s.submitted, 7, "seven child commands");
        let c = wait_n(&mut qp, 1).pop().unwrap();
        assert_eq!(c.tag, 1);
        c.result.unwrap();
        assert_eq!(c.buf.unwrap().len(), 3, "the whole buffer comes back");
        for _ in 0..3 {
            qp.poll(8, |c| panic!("completed twice: {}", c.tag))
                .unwrap();
        }
        assert_eq!(fake.lu_bytes(0, 50 * 4096, 448 << 10), data, "mcq={mcq}");
        assert_eq!(qp.outstanding(), 0);
        // Read it back in one submission (split again).
        let back = vec![ctrl.alloc_buf(448 << 10, DmaDir::Bidirectional).unwrap()];
        qp.read(0, 50, 112, back, 2).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        c.result.unwrap();
        assert_eq!(c.buf.unwrap()[0].to_vec(), data);
        assert_eq!(qp.stats().completed, 2);
    }
}

#[test]
fn a_split_that_cannot_fit_is_typed_and_nothing_is_sent() {
    let (fake, ctrl) = up(sync_cfg(true), split_opts());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let before = fake.stats().commands;
    // 9 children > depth 8.
    let big = ctrl.alloc_buf(576 << 10, DmaDir::Bidirectional).unwrap();
    let e = qp.write(0, 0, 144, big, 1).unwrap_err();
    assert_eq!(
        e.kind,
        SubmitErrorKind::TransferTooLarge {
            bytes: 576 << 10,
            max: 512 << 10
        }
    );
    assert_eq!(e.buf.len(), 576 << 10);
    // Fewer free slots than children: QueueFull, all or nothing.
    for i in 0..5 {
        qp.read(
            0,
            i,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            10 + i,
        )
        .unwrap();
    }
    let four = ctrl.alloc_buf(256 << 10, DmaDir::Bidirectional).unwrap();
    let e = qp.write(0, 100, 64, four, 2).unwrap_err();
    assert_eq!(e.kind, SubmitErrorKind::QueueFull);
    assert_eq!(qp.outstanding(), 5);
    // A child range breaking the PRDT rules rejects the whole transfer.
    let whole = ctrl
        .alloc_buf((192 << 10) + 4, DmaDir::Bidirectional)
        .unwrap();
    let (_, odd) = whole.split_at(2).unwrap();
    let e = qp.write(0, 100, 48, odd, 3).unwrap_err();
    assert!(
        matches!(e.kind, SubmitErrorKind::Misaligned { .. }),
        "{:?}",
        e.kind
    );
    let small = ctrl.alloc_buf(64 << 10, DmaDir::Bidirectional).unwrap();
    let e = qp.write(0, 100, 48, small, 4).unwrap_err();
    assert!(matches!(e.kind, SubmitErrorKind::BufferTooSmall { .. }));
    assert_eq!(qp.outstanding(), 5);
    let done = wait_n(&mut qp, 5);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(
        fake.stats().commands,
        before + 5,
        "nothing rejected reached the device"
    );
}

#[test]
fn a_failing_child_fails_the_parent_once_after_all_children() {
    use mcqio_fixtures::ufs::UfsFault;
    for mcq in [true, false] {
        let (fake, ctrl) = up(sync_cfg(mcq), split_opts());
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        // The third child fails with a CHECK CONDITION.
        for _ in 0..2 {
            fake.faults()
                .inject_next(None, Some(0x2A), UfsFault::Delay(std::time::Duration::ZERO));
        }
        fake.faults().inject_next(
            None,
            Some(0x2A),
            UfsFault::CheckCondition(mcqio_fixtures::ufs::Sense {
                key: 4,
                asc: 0x44,
                ascq: 0,
            }),
        );
        let b = buf_with(&ctrl, &pattern(8, 256 << 10));
        qp.write(0, 0, 64, b, 9).unwrap();
        let done = wait_n(&mut qp, 1);
        assert_eq!(done.len(), 1);
        assert!(
            matches!(
                done[0].result,
                Err(mcqio::IoError::Ufs(mcqio::UfsError::Scsi { .. }))
            ),
            "{:?}",
            done[0].result
        );
        assert!(done[0].buf.is_some());
        assert_eq!(qp.outstanding(), 0);
        for _ in 0..3 {
            qp.poll(8, |c| panic!("completed twice: {}", c.tag))
                .unwrap();
        }
    }
}

#[test]
fn closing_with_a_split_in_flight_ends_the_parent_once() {
    use mcqio_fixtures::ufs::UfsFault;
    for mcq in [true, false] {
        let (fake, ctrl) = up(sync_cfg(mcq), split_opts());
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.faults()
            .inject_next(None, Some(0x28), UfsFault::DropCompletion);
        let b = ctrl.alloc_buf(256 << 10, DmaDir::Bidirectional).unwrap();
        qp.read(0, 0, 64, b, 5).unwrap();
        let mut ended = Vec::new();
        qp.close(|c| ended.push((c.tag, c.result, c.buf.is_some())))
            .unwrap();
        assert_eq!(
            ended,
            vec![(5, Err(mcqio::IoError::Aborted), true)],
            "mcq={mcq}"
        );
    }
}
