//! One queue pair per thread: write random data at random LBAs, read it back.

use mcqio_fixtures::testing::engine::nvme as common;

use common::*;
use mcqio::{DmaBuf, QpairOptions, QueuePair};
use rand::Rng;

/// Each worker owns a disjoint LBA partition of namespace `nsid`, keeps
/// `qd` commands in flight, writes `ios` random extents then verifies them.
fn worker(
    qp: &mut QueuePair<DmaBuf>,
    index: usize,
    threads: usize,
    nsid: u32,
    ios: usize,
) -> usize {
    let ctrl = qp.controller().clone();
    let ns = ctrl.namespace(nsid).unwrap().clone();
    let bs = ns.lba_size as usize;
    let part = ns.nsze / threads as u64;
    let base = part * index as u64;
    let mut r = rng(0x5eed + index as u64);
    let max_blocks = (16384 / bs).max(1) as u64;
    // Random extents inside the partition, non-overlapping (one per slot of max_blocks).
    let slots = part / max_blocks;
    let mut picks: Vec<u64> = (0..slots).collect();
    for i in (1..picks.len()).rev() {
        picks.swap(i, r.gen_range(0..=i));
    }
    picks.truncate(ios);
    let extents: Vec<(u64, u32, Vec<u8>)> = picks
        .iter()
        .map(|&p| {
            let nlb = r.gen_range(1..=max_blocks) as u32;
            let data = random_bytes(&mut r, nlb as usize * bs);
            (base + p * max_blocks, nlb, data)
        })
        .collect();
    let qd = 16;
    let mut pool: Vec<DmaBuf> = buf(&ctrl, qd * 16384).chunks(16384).unwrap();
    // Writes.
    let mut next = 0;
    let mut done = 0;
    while done < extents.len() {
        while next < extents.len() {
            let Some(mut b) = pool.pop() else { break };
            let (lba, nlb, data) = &extents[next];
            b.write_at(0, data).unwrap();
            qp.write(nsid, *lba, *nlb, b, next as u64).unwrap();
            next += 1;
        }
        qp.poll(usize::MAX, |c| {
            c.result.expect("write");
            pool.push(c.buf.unwrap());
            done += 1;
        })
        .unwrap();
        std::thread::yield_now();
    }
    // Reads and verification.
    let mut next = 0;
    let mut verified = 0;
    while verified < extents.len() {
        while next < extents.len() {
            let Some(b) = pool.pop() else { break };
            let (lba, nlb, _) = &extents[next];
            qp.read(nsid, *lba, *nlb, b, next as u64).unwrap();
            next += 1;
        }
        qp.poll(usize::MAX, |c| {
            c.result.expect("read");
            let b = c.buf.unwrap();
            let (_, _, data) = &extents[c.tag as usize];
            let mut got = vec![0; data.len()];
            b.read_at(0, &mut got).unwrap();
            assert!(got == *data, "thread {index}: extent {} differs", c.tag);
            pool.push(b);
            verified += 1;
        })
        .unwrap();
        std::thread::yield_now();
    }
    assert_eq!(qp.stats().stale_completions, 0);
    verified
}

fn run(threads: usize) {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode, 5));
        for nsid in [1, 2] {
            let ios = 100; // fits the smallest partition (16 MiB / 8 threads / 16 KiB extents = 128)
            let res = mcqio::run_per_core(
                &ctrl,
                threads,
                QpairOptions {
                    depth: 32,
                    ..Default::default()
                },
                |i, qp| worker(qp, i, threads, nsid, ios),
            )
            .unwrap();
            assert_eq!(res, vec![ios; threads]);
        }
        assert_eq!(fake.iommu().fault_count(), 0);
        assert_eq!(
            ctrl.free_io_queues(),
            8,
            "queue pairs deleted when workers finish"
        );
    }
}

#[test]
fn one_queue_pair() {
    run(1);
}

#[test]
fn two_queue_pairs() {
    run(2);
}

#[test]
fn eight_queue_pairs() {
    run(8);
}

#[test]
fn queue_pairs_are_send_not_sync() {
    fn is_send<T: Send>() {}
    fn is_sync<T: Sync>() {}
    is_send::<QueuePair>();
    is_sync::<mcqio::Controller>();
    is_send::<mcqio::Controller>();
    // `QueuePair: !Sync` is enforced by PhantomData<Cell<()>>; a compile-fail
    // check would need trybuild, so the doc test on QueuePair covers it.
}
