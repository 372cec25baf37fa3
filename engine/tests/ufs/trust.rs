//! What a UFS completion must prove before anything is delivered: an MCQ
//! completion entry names its command by the command descriptor's (UCD)
//! address, and a slot's address changes every time the slot is reused, so
//! a stale or duplicate entry of an earlier command in the same slot — with
//! any OCS, and on the reset path too — is counted as stale and never ends
//! the command now in that slot (nor hands back its buffer).

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::time::{Duration, Instant};

use mcqio::ufs::spec::utrd::Ocs;
use mcqio::vfio::DmaDir;
use mcqio::{Completion, DmaBuf, IoError, UfsError};
use mcqio_fixtures::ufs::UfsFault;

const WRITE10: u8 = 0x2A;
const READ10: u8 = 0x28;

/// Known data at LBA 20, then a write that fails with an error OCS (its
/// completion entry is the one the device will repeat), then a read of LBA
/// 20 placed in the slot the failed write used, which the device holds for
/// `hold` after re-posting the failed write's entry. Returns the read's
/// buffer pattern.
fn failed_write_then_held_read(
    f: &mcqio_fixtures::ufs::FakeUfs,
    ctrl: &mcqio::ufs::UfsController,
    qp: &mut mcqio::ufs::UfsQueuePair<DmaBuf>,
    hold: Duration,
) -> Vec<u8> {
    let data = pattern(20, 4096);
    qp.write_blocking(0, 20, &data).expect("known data");
    f.faults()
        .inject_next(None, Some(WRITE10), UfsFault::Ocs(Ocs::PEER_COMM_FAILURE.0));
    qp.write(0, 30, 1, buf_with(ctrl, &pattern(30, 4096)), 1)
        .unwrap();
    let c = wait_n(qp, 1).pop().unwrap();
    assert_eq!(c.tag, 1);
    assert_eq!(
        c.result,
        Err(IoError::Ufs(UfsError::Transport(Ocs::PEER_COMM_FAILURE))),
        "the write fails with its OCS"
    );
    assert!(c.buf.is_some());
    f.faults()
        .inject_next(None, Some(READ10), UfsFault::StaleErrorCompletion(hold));
    let rb = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    qp.read(0, 20, 1, rb, 2).unwrap();
    assert!(qp.submit());
    data
}

/// The scenario: today the read completes at once with the failed
/// write's error and its buffer, and the device then writes 4 KiB into
/// the returned buffer.
#[test]
fn a_stale_error_entry_never_ends_the_command_now_in_its_slot() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let hold = Duration::from_millis(300);
    let data = failed_write_then_held_read(&f, &ctrl, &mut qp, hold);
    let start = Instant::now();
    let mut done: Vec<Completion<DmaBuf>> = Vec::new();
    while done.is_empty() {
        qp.poll(64, |c| done.push(c)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        std::thread::yield_now();
    }
    let c = done.pop().unwrap();
    assert_eq!(c.tag, 2);
    assert_eq!(
        c.result,
        Ok(()),
        "the read ended by the failed write's stale entry ({} ms after submission)",
        start.elapsed().as_millis()
    );
    assert!(
        start.elapsed() >= hold - Duration::from_millis(50),
        "completed before the device executed it"
    );
    let b = c.buf.expect("buffer");
    assert_eq!(b.to_vec()[..4096], data[..], "the read's own data");
    assert_eq!(
        qp.stats().stale_completions,
        1,
        "the stale entry is counted"
    );
    for _ in 0..5 {
        qp.poll(64, |c| panic!("completed twice: tag {}", c.tag))
            .unwrap();
    }
    assert_eq!(qp.outstanding(), 0);
}

/// The same entry found by a controller reset's "deliver what was already
/// posted": it is counted as stale and the read ends as every other
/// command in flight at a reset does (its buffer back: the controller is
/// disabled).
#[test]
fn a_stale_error_entry_found_after_a_reset_is_stale_too() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    failed_write_then_held_read(&f, &ctrl, &mut qp, Duration::from_secs(30));
    ctrl.reset().expect("reset");
    let done = wait_n(&mut qp, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 2);
    assert_eq!(
        done[0].result,
        Err(IoError::AbortedByReset),
        "the reset's drain took the failed write's stale entry for the read's"
    );
    assert!(done[0].buf.is_some());
    assert_eq!(
        qp.stats().stale_completions,
        1,
        "the stale entry is counted"
    );
    // The queue works after the reset.
    let mut out = vec![0u8; 4096];
    qp.read_blocking(0, 20, &mut out).expect("read after reset");
    assert_eq!(out, pattern(20, 4096));
}

/// A fake with 16 MCQ queues and room for 32 commands on each: asked for
/// 16 queue pairs of depth 32, the engine must not hand out one task tag to
/// two commands outstanding at once (the fake completes an overlapped one
/// with CHECK CONDITION, ABORTED COMMAND, TAGGED OVERLAPPED COMMANDS).
fn many_queues(
    queues: u8,
) -> (
    std::sync::Arc<mcqio_fixtures::ufs::FakeUfs>,
    std::sync::Arc<mcqio::ufs::UfsController>,
) {
    let cfg = mcqio_fixtures::ufs::UfsConfig {
        queues,
        mac: 512,
        ..sync_cfg(true)
    };
    up(
        cfg,
        mcqio::ufs::UfsOptions {
            depth: 32,
            ..opts(u16::from(queues))
        },
    )
}

#[test]
fn task_tags_of_two_queue_pairs_never_collide() {
    let (f, ctrl) = many_queues(16);
    let mut qps: Vec<_> = (0..9)
        .map(|_| ctrl.create_qpair(Default::default()).unwrap())
        .collect();
    assert_eq!(qps[8].hw_queue(), Some(8));
    // Queue pair 0's first command stays outstanding at the device.
    f.faults()
        .inject_next(Some(0), Some(READ10), UfsFault::DropCompletion);
    let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    qps[0].read(0, 1, 1, b, 10).unwrap();
    assert!(qps[0].submit());
    // Queue pair 8's first command, while it is.
    let data = pattern(7, 4096);
    qps[0]
        .poll(64, |c| panic!("completed: tag {}", c.tag))
        .unwrap();
    let mut out = vec![0u8; 4096];
    qps[8].write_blocking(0, 7, &data).expect(
        "a command of queue pair 8 while queue pair 0's first one is outstanding \
         (an overlapped task tag is refused by the device)",
    );
    qps[8].read_blocking(0, 7, &mut out).unwrap();
    assert_eq!(out, data);
    // Queue pair 0's command ends through the cleanup at close.
    let mut ended = Vec::new();
    qps.remove(0).close(|c| ended.push(c)).unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].result, Err(IoError::Aborted));
}

/// Every slot of every queue pair busy at once: each task tag is unique
/// (queues × depth fits the 8-bit task tag).
#[test]
fn every_slot_of_every_queue_pair_has_its_own_task_tag() {
    let (f, ctrl) = many_queues(32);
    let n = match ctrl.mode() {
        mcqio::ufs::UfsMode::Mcq { queues } => usize::from(queues),
        m => panic!("{m:?}"),
    };
    assert_eq!(n, 32);
    let depth = usize::from(ctrl.depth());
    let mut qps: Vec<_> = (0..n)
        .map(|_| ctrl.create_qpair(Default::default()).unwrap())
        .collect();
    // Everything stays outstanding for a while, so all of it overlaps.
    f.faults()
        .set_probability(UfsFault::Delay(Duration::from_millis(100)), 1.0);
    for (q, qp) in qps.iter_mut().enumerate() {
        for i in 0..depth {
            let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
            qp.read(0, i as u64, 1, b, (q * 1000 + i) as u64).unwrap();
        }
        assert!(qp.submit());
    }
    for qp in qps.iter_mut() {
        for c in wait_n(qp, depth) {
            assert_eq!(c.result, Ok(()), "tag {}: a task tag used twice", c.tag);
        }
    }
    f.faults().clear();
    assert!(n * depth <= 256, "{n} queues × depth {depth}");
}

/// An entry the previous owner of a hardware queue left unread (here a
/// duplicate the device posted behind the real one) must not complete the
/// next owner's command: the next queue pair's descriptors may sit at the
/// same addresses.
#[test]
fn an_entry_left_on_a_pooled_queue_is_not_the_next_owners() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let data = pattern(40, 4096);
    // Each queue pair below is the only one: its descriptors take the
    // same IOVA, and its first command the same slot and generation.
    ctrl.create_qpair(Default::default())
        .unwrap()
        .write_blocking(0, 40, &data)
        .unwrap();
    {
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::DuplicateCompletion);
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        qp.read(0, 41, 1, b, 1).unwrap();
        qp.submit();
        // Take only the real entry; the duplicate stays in the CQ.
        let mut got = Vec::new();
        let start = Instant::now();
        while got.is_empty() {
            qp.poll(1, |c| got.push(c)).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10));
        }
        assert_eq!(got[0].result, Ok(()));
        qp.close(|c| panic!("nothing left: tag {}", c.tag)).unwrap();
    }
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults().inject_next(
        None,
        Some(READ10),
        UfsFault::Delay(Duration::from_millis(200)),
    );
    let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    qp.read(0, 40, 1, b, 2).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    assert_eq!(c.tag, 2);
    assert_eq!(c.result, Ok(()));
    assert_eq!(
        c.buf.unwrap().to_vec(),
        data,
        "the read completed on the previous owner's leftover entry, before the device ran it"
    );
}

/// An entry of a closed queue pair's command, posted again once the next
/// queue pair owns the hardware queue, must not end the next owner's
/// command: the descriptors (and their generations) stay with the queue.
#[test]
fn a_stale_entry_of_the_previous_owner_is_stale_for_the_next() {
    let (f, ctrl) = up(sync_cfg(true), opts(1));
    let data = pattern(50, 4096);
    ctrl.create_qpair(Default::default())
        .unwrap()
        .write_blocking(0, 50, &data)
        .unwrap();
    {
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        f.faults()
            .inject_next(None, Some(READ10), UfsFault::Ocs(Ocs::PEER_COMM_FAILURE.0));
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        qp.read(0, 50, 1, b, 1).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        assert!(c.result.is_err());
        qp.close(|c| panic!("nothing left: tag {}", c.tag)).unwrap();
    }
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    f.faults().inject_next(
        None,
        Some(READ10),
        UfsFault::StaleErrorCompletion(Duration::from_millis(200)),
    );
    let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    qp.read(0, 50, 1, b, 2).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    assert_eq!(c.tag, 2);
    assert_eq!(
        c.result,
        Ok(()),
        "the previous owner's stale entry ended the read"
    );
    assert_eq!(c.buf.unwrap().to_vec(), data);
    assert_eq!(qp.stats().stale_completions, 1);
}
