//! Jobs end to end on the fakes: NVMe, UFS (MCQ and the legacy list) and
//! NVMe/TCP.

use super::*;
use crate::spec::{FakeExec, Unit};

/// A bs the device cannot do is refused at setup with
/// the engine's reason (fio only said err=22 at the first I/O).
#[test]
fn block_sizes_must_be_whole_logical_blocks() {
    let f = FileInfo {
        unit: 1,
        lba_shift: 12,
        size: 1 << 20,
    };
    assert!(check_block_sizes(&[f], &["fake"], 4096, 65536).is_ok());
    assert!(check_block_sizes(&[f], &["fake"], 0, 0).is_ok());
    for (min, max, bad) in [(1024, 4096, 1024), (4096, 6144, 6144)] {
        let e = check_block_sizes(&[f], &["fake"], min, max)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "bs {bad} is not a multiple of the device's 4096-byte"
            )) && e.contains("fake_lbs="),
            "{e}"
        );
    }
}
use mcqio_fixtures::ufs::{FakeUfs, Sense, UfsFault};
use mcqio_vfio::HugePages;

fn opts() -> DeviceOptions {
    DeviceOptions {
        huge_pages: HugePages::Never,
        dma_budget: 0,
        qpairs: 4,
        mcq: true,
        shadow_doorbells: false,
        io_timeout: None,
        fake_size: 1 << 20,
        fake_lbs: 512,
        fake_namespaces: 2,
        fake_exec: FakeExec::Sync,
        fake_latency: Duration::ZERO,
        fake_core: None,
        wait: mcqio::WaitPolicy::Poll,
    }
}

fn wait(job: &mut Job, want: usize) -> Vec<Event> {
    let n = job.getevents(want, want, None).unwrap();
    (0..n).map(|i| job.event(i).unwrap()).collect()
}

#[test]
fn write_read_trim_through_the_views() {
    // Tests run in parallel and share the process's fake (same key and
    // options); this one alone uses namespace 2.
    let (mut job, files) = Job::setup(&["fake,ns=2"], &opts(), 4096).unwrap();
    assert_eq!(files[0].unit, 2);
    assert_eq!(files[0].size, 1 << 20);
    assert_eq!(files[0].lba_shift, 9);
    job.init(4).unwrap();
    let base = job.alloc_buffers(8192).unwrap();
    // SAFETY: base points to 8192 bytes of the job's region; nothing is in flight.
    unsafe { std::ptr::write_bytes(base, 0xa5, 4096) };
    let c = files[0].cookie();
    assert_eq!(
        job.queue(c, Op::Write, 4096, base, 4096, 11),
        Queued::Queued
    );
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 11, errno: 0 }]);
    // SAFETY: as above; the read lands in the second half.
    let back = unsafe { base.add(4096) };
    assert_eq!(job.queue(c, Op::Read, 4096, back, 4096, 12), Queued::Queued);
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 12, errno: 0 }]);
    // SAFETY: the read completed; 4096 bytes at `back` are ours.
    let data = unsafe { std::slice::from_raw_parts(back, 4096) };
    assert!(data.iter().all(|&b| b == 0xa5));
    assert_eq!(
        job.queue(c, Op::Trim, 0, std::ptr::null(), 8192, 13),
        Queued::Queued
    );
    assert_eq!(
        job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 14),
        Queued::Queued
    );
    job.commit();
    let mut ev = wait(&mut job, 2);
    ev.sort_by_key(|e| e.tag);
    assert_eq!(
        ev,
        vec![Event { tag: 13, errno: 0 }, Event { tag: 14, errno: 0 }]
    );
    job.close().unwrap();
}

#[test]
fn bad_requests_fail_without_reaching_the_device() {
    let (mut job, files) = Job::setup(&["fake"], &opts(), 4096).unwrap();
    let c = files[0].cookie();
    // Not initialised yet.
    assert_eq!(
        job.queue(c, Op::Read, 0, std::ptr::null(), 512, 1),
        Queued::Failed(libc::EIO)
    );
    job.init(2).unwrap();
    let base = job.alloc_buffers(4096).unwrap();
    // Misaligned offset and length.
    assert_eq!(
        job.queue(c, Op::Read, 100, base, 512, 1),
        Queued::Failed(libc::EINVAL)
    );
    assert_eq!(
        job.queue(c, Op::Read, 0, base, 100, 1),
        Queued::Failed(libc::EINVAL)
    );
    // A buffer outside fio's region is refused, not handed to the device.
    let mut other = [0u8; 512];
    assert_eq!(
        job.queue(c, Op::Read, 0, other.as_mut_ptr(), 512, 1),
        Queued::Failed(libc::EFAULT)
    );
    // SAFETY: pointer arithmetic only; the result is checked, never dereferenced.
    let tail = unsafe { base.add(3584) };
    assert_eq!(
        job.queue(c, Op::Read, 0, tail, 1024, 1),
        Queued::Failed(libc::EFAULT)
    );
    // A cookie setup never made (block shift 200).
    assert_eq!(
        job.queue(200, Op::Read, 0, base, 512, 1),
        Queued::Failed(libc::EINVAL)
    );
    // Past the end of the namespace.
    assert_eq!(
        job.queue(c, Op::Read, 1 << 20, base, 512, 1),
        Queued::Failed(libc::EINVAL)
    );
    // The queue fills at its depth: busy, not an error.
    assert_eq!(job.queue(c, Op::Read, 0, base, 512, 1), Queued::Queued);
    assert_eq!(job.queue(c, Op::Read, 512, base, 512, 2), Queued::Queued);
    assert_eq!(job.queue(c, Op::Read, 1024, base, 512, 3), Queued::Busy);
    job.commit();
    assert_eq!(wait(&mut job, 2).len(), 2);
    // getevents with min 0 returns at once.
    assert_eq!(job.getevents(0, 2, None).unwrap(), 0);
    job.close().unwrap();
}

#[test]
fn freeing_buffers_with_commands_in_flight_closes_the_queue_first() {
    let (mut job, files) = Job::setup(&["fake,ns=1"], &opts(), 4096).unwrap();
    job.init(2).unwrap();
    let base = job.alloc_buffers(4096).unwrap();
    let c = files[0].cookie();
    assert_eq!(job.queue(c, Op::Read, 0, base, 512, 1), Queued::Queued);
    job.free_buffers();
    assert!(job.qp.is_none() && job.bufs.is_none());
    assert!(job.getevents(1, 1, None).is_err());
    job.close().unwrap();
}

#[test]
fn jobs_share_a_controller_and_refuse_other_options() {
    let (a, _) = Job::setup(&["fake"], &opts(), 4096).unwrap();
    let (b, _) = Job::setup(&["fake,ns=2"], &opts(), 4096).unwrap();
    assert!(Arc::ptr_eq(&a.dev, &b.dev));
    let other = DeviceOptions {
        fake_lbs: 4096,
        ..opts()
    };
    assert!(matches!(
        Job::setup(&["fake"], &other, 4096),
        Err(EngineError::OptionsDiffer { .. })
    ));
    assert!(matches!(
        Job::setup(&["fake,ns=3"], &opts(), 4096),
        Err(EngineError::NoNamespace { nsid: 3, .. })
    ));
    assert!(matches!(
        Job::setup(&["fake", "vfio-00.01.0"], &opts(), 4096),
        Err(EngineError::TwoControllers { .. })
    ));
    a.close().unwrap();
    b.close().unwrap();
}

/// Options of every `fake-ufs` test (they share the process's fake UFS,
/// so all must be equal): two 1 MiB LUs in 4 KiB blocks, MCQ, four
/// queues, the device side running synchronously.
fn ufs_opts() -> DeviceOptions {
    DeviceOptions {
        fake_lbs: 4096,
        ..opts()
    }
}

fn fill(p: *mut u8, v: u8, n: usize) {
    // SAFETY: callers pass a range of the job's region with nothing in flight.
    unsafe { std::ptr::write_bytes(p, v, n) };
}

fn bytes(p: *const u8, n: usize) -> Vec<u8> {
    // SAFETY: callers pass a range of the job's region whose commands completed.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

#[test]
fn ufs_job_writes_reads_trims_and_flushes() {
    // This test alone uses LU 1 of the shared fake UFS.
    let (mut job, files) = Job::setup(&["fake-ufs,lun=1"], &ufs_opts(), 8192).unwrap();
    assert!(matches!(job.dev.ctrl(), Ctrl::Ufs(_)));
    assert_eq!(
        files,
        vec![FileInfo {
            unit: 1,
            lba_shift: 12,
            size: 1 << 20
        }]
    );
    job.init(4).unwrap();
    assert!(matches!(job.qp, Some(Qp::Ufs(_))));
    let base = job.alloc_buffers(16384).unwrap();
    // SAFETY: pointer arithmetic inside the 16 KiB region.
    let back = unsafe { base.add(8192) };
    let c = files[0].cookie();
    fill(base, 0xa5, 8192);
    assert_eq!(
        job.queue(c, Op::Write, 8192, base, 8192, 21),
        Queued::Queued
    );
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 21, errno: 0 }]);
    fill(back, 0, 8192);
    assert_eq!(job.queue(c, Op::Read, 8192, back, 8192, 22), Queued::Queued);
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 22, errno: 0 }]);
    assert!(bytes(back, 8192).iter().all(|&b| b == 0xa5));
    // UNMAP the first of the two blocks and SYNCHRONIZE CACHE, in one
    // batch; the unmapped block then reads as zeroes (LBPRZ), the other
    // keeps its data.
    assert_eq!(
        job.queue(c, Op::Trim, 8192, std::ptr::null(), 4096, 23),
        Queued::Queued
    );
    assert_eq!(
        job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 24),
        Queued::Queued
    );
    job.commit();
    let mut ev = wait(&mut job, 2);
    ev.sort_by_key(|e| e.tag);
    assert_eq!(
        ev,
        vec![Event { tag: 23, errno: 0 }, Event { tag: 24, errno: 0 }]
    );
    fill(back, 0x11, 8192);
    assert_eq!(job.queue(c, Op::Read, 8192, back, 8192, 25), Queued::Queued);
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 25, errno: 0 }]);
    let data = bytes(back, 8192);
    assert!(data[..4096].iter().all(|&b| b == 0), "trimmed block");
    assert!(data[4096..].iter().all(|&b| b == 0xa5), "untouched block");
    job.close().unwrap();
}

#[test]
fn ufs_job_limits_are_typed_and_timeouts_return() {
    // No selector: LU 0.
    let (mut job, files) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
    assert_eq!(files[0].unit, 0);
    let c = files[0].cookie();
    assert!(matches!(
        job.getevents(1, 1, Some(Duration::from_millis(1))),
        Err(EngineError::NotInitialised)
    ));
    job.init(2).unwrap();
    let base = job.alloc_buffers(8192).unwrap();
    // Nothing in flight: getevents waits for its timeout and returns none.
    assert_eq!(
        job.getevents(1, 2, Some(Duration::from_millis(1))).unwrap(),
        0
    );
    // Blocks are 4 KiB: 512-byte I/O is misaligned.
    assert_eq!(
        job.queue(c, Op::Read, 512, base, 4096, 1),
        Queued::Failed(libc::EINVAL)
    );
    assert_eq!(
        job.queue(c, Op::Read, 0, base, 512, 1),
        Queued::Failed(libc::EINVAL)
    );
    // A cookie naming a unit no LUN can be (256): refused, not truncated.
    let far = FileInfo {
        unit: 256,
        ..files[0]
    };
    assert_eq!(
        job.queue(far.cookie(), Op::Read, 0, base, 4096, 1),
        Queued::Failed(libc::EINVAL)
    );
    // Past the end of the LU: the queue pair refuses it.
    assert_eq!(
        job.queue(c, Op::Read, 1 << 20, base, 4096, 1),
        Queued::Failed(libc::EINVAL)
    );
    // A LUN the device does not have: refused before reaching it.
    let nolu = FileInfo {
        unit: 9,
        ..files[0]
    };
    assert!(matches!(
        job.queue(nolu.cookie(), Op::Flush, 0, std::ptr::null(), 0, 1),
        Queued::Failed(_)
    ));
    // A buffer outside fio's region.
    let mut other = [0u8; 4096];
    assert_eq!(
        job.queue(c, Op::Write, 0, other.as_mut_ptr(), 4096, 1),
        Queued::Failed(libc::EFAULT)
    );
    // Two in flight, then the completions; getevents with min 0 returns at once.
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
    // SAFETY: pointer arithmetic inside the 8 KiB region.
    let second = unsafe { base.add(4096) };
    assert_eq!(
        job.queue(c, Op::Read, 4096, second, 4096, 2),
        Queued::Queued
    );
    job.commit();
    let mut ev = wait(&mut job, 2);
    ev.sort_by_key(|e| e.tag);
    assert_eq!(
        ev,
        vec![Event { tag: 1, errno: 0 }, Event { tag: 2, errno: 0 }]
    );
    assert_eq!(job.getevents(0, 2, None).unwrap(), 0);
    // Freeing the buffers with a command in flight closes the queue first.
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 3), Queued::Queued);
    job.free_buffers();
    assert!(job.qp.is_none() && job.bufs.is_none());
    job.close().unwrap();
}

/// A job on a private fake UFS (its own options, its fault injector).
fn private_ufs_job(o: &DeviceOptions, depth: u32) -> (Job, u64, Arc<FakeUfs>) {
    let (dev, fake) = Device::private_fake_ufs(o);
    let name = "fake-ufs,lun=0";
    let (mut job, files) =
        Job::on_device(dev, &[Target::parse(name).unwrap()], &[name], 4096).unwrap();
    job.init(depth).unwrap();
    (job, files[0].cookie(), fake)
}

/// `wait=irq`: getevents sleeps on the queue's interrupt
/// (the fake's device thread raises it) instead of spinning; every
/// block's data still comes back.
#[test]
fn wait_irq_getevents_sleeps_on_the_interrupt_and_keeps_the_data() {
    let o = DeviceOptions {
        wait: mcqio::WaitPolicy::Interrupt,
        fake_exec: FakeExec::Thread,
        ..ufs_opts()
    };
    let (mut job, c, _fake) = private_ufs_job(&o, 8);
    assert!(job.waits);
    const BS: usize = 4096;
    let base = job.alloc_buffers(16 * BS).unwrap();
    // SAFETY: pointer arithmetic inside the job's 64 KiB region.
    let at = |i: usize| unsafe { base.add(i * BS) };
    for round in 0..2u8 {
        for i in 0..8 {
            fill(at(i), round * 16 + i as u8, BS);
            let off = (i * BS) as u64;
            assert_eq!(
                job.queue(c, Op::Write, off, at(i), BS as u64, i as u64),
                Queued::Queued
            );
        }
        job.commit();
        assert_eq!(wait(&mut job, 8).len(), 8);
        for i in 0..8 {
            let off = (i * BS) as u64;
            let back = at(8 + i);
            assert_eq!(
                job.queue(c, Op::Read, off, back, BS as u64, 100 + i as u64),
                Queued::Queued
            );
        }
        job.commit();
        let ev = wait(&mut job, 8);
        assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
        for i in 0..8 {
            // SAFETY: the reads completed; each 4 KiB is ours.
            let got = unsafe { std::slice::from_raw_parts(at(8 + i), BS) };
            assert!(got.iter().all(|&b| b == round * 16 + i as u8), "block {i}");
        }
    }
    let Some(Qp::Ufs(q)) = job.qp.as_ref() else {
        panic!("a UFS queue pair")
    };
    assert!(q.counters().interrupt_sleeps > 0, "{:?}", q.counters());
    job.close().unwrap();
}

#[test]
fn ufs_device_errors_and_timeouts_reach_fio_as_errnos() {
    let o = DeviceOptions {
        io_timeout: Some(Duration::from_millis(20)),
        ..ufs_opts()
    };
    let (mut job, c, fake) = private_ufs_job(&o, 4);
    let base = job.alloc_buffers(4096).unwrap();
    // An OCS error (transport) and a CHECK CONDITION (SCSI): EIO.
    fake.faults().inject_next(None, None, UfsFault::Ocs(0x02)); // OCS INVALID_PRDT_ATTR
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
    job.commit();
    assert_eq!(
        wait(&mut job, 1),
        vec![Event {
            tag: 1,
            errno: libc::EIO
        }]
    );
    fake.faults().inject_next(
        None,
        None,
        UfsFault::CheckCondition(Sense::UNRECOVERED_READ),
    );
    assert_eq!(job.queue(c, Op::Write, 0, base, 4096, 2), Queued::Queued);
    job.commit();
    assert_eq!(
        wait(&mut job, 1),
        vec![Event {
            tag: 2,
            errno: libc::EIO
        }]
    );
    // A command the device never completes: aborted after io_timeout,
    // ETIMEDOUT (getevents without a timeout waits for it).
    fake.faults()
        .inject_next(None, None, UfsFault::DropCompletion);
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 3), Queued::Queued);
    job.commit();
    assert_eq!(
        wait(&mut job, 1),
        vec![Event {
            tag: 3,
            errno: libc::ETIMEDOUT
        }]
    );
    // The queue pair still works afterwards.
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 4), Queued::Queued);
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 4, errno: 0 }]);
    job.close().unwrap();
}

/// A read the device still holds when the controller
/// fails and cannot be disabled comes back without its buffer; the job's
/// region must then stay mapped (never unmapped or reused) and be
/// counted as leaked, on close and on drop alike.
#[test]
fn a_buffer_the_device_may_still_write_keeps_the_region_mapped() {
    for close in [true, false] {
        let (mut job, c, fake) = private_ufs_job(&ufs_opts(), 4);
        let dev = Arc::clone(&job.dev);
        let base = job.alloc_buffers(8192).unwrap();
        let (iova, len) = job.bufs.as_ref().map(|b| (b.iova, b.len)).unwrap();
        fake.set_ignore_disable(true);
        fake.faults().inject_next(None, None, UfsFault::HostFatal);
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 7), Queued::Queued);
        job.commit();
        let ev = wait(&mut job, 1);
        assert_eq!(
            ev,
            vec![Event {
                tag: 7,
                errno: libc::EIO
            }]
        );
        // The region is poisoned: no other buffer of it reaches the device.
        // SAFETY: pointer arithmetic inside the 8 KiB region.
        let second = unsafe { base.add(4096) };
        assert_eq!(
            job.queue(c, Op::Write, 4096, second, 4096, 8),
            Queued::Failed(libc::EIO)
        );
        if close {
            let _ = job.close();
        } else {
            drop(job);
        }
        assert!(
            fake.iommu().is_mapped(iova, len as u64),
            "close={close}: the region was unmapped while the device may write it"
        );
        assert_eq!(dev.leaked_bytes(), len as u64, "close={close}");
    }
}

/// The controller refuses to delete the queue, so
/// the command in flight is withdrawn unconfirmed (no buffer): the
/// region stays mapped and is counted.
#[test]
fn refused_queue_deletion_keeps_the_region_mapped() {
    use mcqio::nvme::spec::opcodes::admin::DELETE_IO_SQ;
    use mcqio_fixtures::Fault;
    let (dev, fake) = Device::private_fake_nvme(&opts());
    let name = "fake,ns=1";
    let (mut job, files) = Job::on_device(
        Arc::clone(&dev),
        &[Target::parse(name).unwrap()],
        &[name],
        4096,
    )
    .unwrap();
    job.init(4).unwrap();
    let c = files[0].cookie();
    let base = job.alloc_buffers(8192).unwrap();
    let (iova, len) = job.bufs.as_ref().map(|b| (b.iova, b.len)).unwrap();
    fake.faults()
        .inject_next(None, None, Fault::Delay(Duration::from_secs(3600)));
    assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
    job.commit();
    assert_eq!(job.getevents(0, 1, None).unwrap(), 0);
    fake.faults().inject_next(
        Some(0),
        Some(DELETE_IO_SQ),
        Fault::Status {
            sct: 1,
            sc: 0x01,
            dnr: true,
        },
    );
    assert!(job.close().is_err(), "the deletion failed");
    assert!(
        fake.iommu().is_mapped(iova, len as u64),
        "the region was unmapped while the device may write it"
    );
    assert_eq!(dev.leaked_bytes(), len as u64);
}

#[test]
fn ufs_legacy_list_job() {
    let o = DeviceOptions {
        mcq: false,
        ..ufs_opts()
    };
    let (mut job, c, _fake) = private_ufs_job(&o, 8);
    let base = job.alloc_buffers(8192).unwrap();
    // SAFETY: pointer arithmetic inside the 8 KiB region.
    let back = unsafe { base.add(4096) };
    fill(base, 0x3c, 4096);
    assert_eq!(
        job.queue(c, Op::Write, 40960, base, 4096, 1),
        Queued::Queued
    );
    assert_eq!(
        job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 2),
        Queued::Queued
    );
    job.commit();
    assert_eq!(wait(&mut job, 2).len(), 2);
    assert_eq!(job.queue(c, Op::Read, 40960, back, 4096, 3), Queued::Queued);
    job.commit();
    assert_eq!(wait(&mut job, 1), vec![Event { tag: 3, errno: 0 }]);
    assert!(bytes(back, 4096).iter().all(|&b| b == 0x3c));
    // Legacy mode has one queue pair: a second job cannot get one.
    let mut second = Job {
        qp: None,
        bufs: None,
        out: BufsOut::default(),
        events: Vec::new(),
        files: Vec::new(),
        dev: job.dev.clone(),
        waits: false,
    };
    assert!(matches!(
        second.init(1),
        Err(EngineError::Qpair { granted: 1, .. })
    ));
    job.close().unwrap();
}

/// An iodepth above the UFS queue pair's slots: a job fio may answer
/// busy gets it (and busy answers once the queue is full); a job whose
/// verify replays write seeds in log order is refused, since fio
/// reorders that log on a busy answer (see `Job::init_with`).
#[test]
fn only_an_ordered_verify_job_is_refused_an_iodepth_deeper_than_the_ufs_queue() {
    let (mut job, _) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
    let depth = match job.init_with(4096, true) {
        Err(EngineError::UfsDepth { iodepth, depth }) => {
            assert_eq!(iodepth, 4096);
            assert!((1..4096).contains(&depth), "depth {depth}");
            depth
        }
        r => panic!("expected UfsDepth, got {r:?}"),
    };
    let over = u32::try_from(depth + 1).unwrap();
    assert!(matches!(
        job.init_with(over, true),
        Err(EngineError::UfsDepth { .. })
    ));
    // The queue's own depth works for it.
    job.init_with(u32::try_from(depth).unwrap(), true).unwrap();
    job.close().unwrap();
    // Any other job may go deeper than the queue.
    let (mut job, _) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
    job.init_with(over, false).unwrap();
    job.close().unwrap();
}

/// The busy path keeps every block's data: three queues' worth of
/// writes of distinct data, each busy one queued again after a reap
/// (as fio requeues it), then every block read back the same way.
#[test]
fn busy_answers_and_requeues_keep_every_blocks_data() {
    // A fake of its own (other options, other key): no other test
    // writes these blocks.
    let o = DeviceOptions {
        fake_size: 2 << 20,
        qpairs: 8,
        ..ufs_opts()
    };
    let (mut job, files) = Job::setup(&["fake-ufs"], &o, 4096).unwrap();
    let c = files[0].cookie();
    job.init(255).unwrap();
    const BS: usize = 4096;
    let blocks = (2 << 20) / BS;
    let base = job.alloc_buffers(blocks * BS).unwrap();
    let buf = |i: usize| {
        // SAFETY: pointer arithmetic inside the job's region.
        unsafe { base.add(i * BS) }
    };
    let pattern = |i: usize| -> Vec<u8> {
        (0..BS)
            .map(|k| (i as u8) ^ (k as u8).wrapping_mul(31) ^ 0x5A)
            .collect()
    };
    // Run every block through `op`, answering busy as fio does: keep
    // the refused ones and queue them again after a reap.
    let run_all = |job: &mut Job, op: Op| -> usize {
        let mut pending: Vec<usize> = (0..blocks).rev().collect();
        let mut outstanding = 0usize;
        let mut busy = 0usize;
        while !pending.is_empty() || outstanding > 0 {
            while let Some(i) = pending.pop() {
                match job.queue(c, op, (i * BS) as u64, buf(i), BS as u64, i as u64) {
                    Queued::Queued => outstanding += 1,
                    Queued::Busy => {
                        busy += 1;
                        pending.push(i);
                        break;
                    }
                    Queued::Failed(e) => panic!("block {i}: errno {e}"),
                }
            }
            job.commit();
            let n = job.getevents(1, 255, None).unwrap();
            for k in 0..n {
                let e = job.event(k).unwrap();
                assert_eq!(e.errno, 0, "block {}", e.tag);
            }
            outstanding -= n;
        }
        busy
    };
    for i in 0..blocks {
        let p = pattern(i);
        // SAFETY: the block's buffer, nothing in flight.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), buf(i), BS) };
    }
    let busy_w = run_all(&mut job, Op::Write);
    fill(base, 0, blocks * BS);
    let busy_r = run_all(&mut job, Op::Read);
    assert!(
        busy_w > 0 && busy_r > 0,
        "the queue never filled: {busy_w} {busy_r}"
    );
    for i in 0..blocks {
        assert!(
            bytes(buf(i), BS) == pattern(i),
            "block {i} holds other data"
        );
    }
    job.close().unwrap();
}

#[test]
fn bad_lun_and_wrong_selector_are_typed_errors() {
    let (job, _) = Job::setup(&["fake-ufs,lun=0"], &ufs_opts(), 4096).unwrap();
    match Job::setup(&["fake-ufs,lun=0", "fake-ufs,lun=5"], &ufs_opts(), 4096) {
        Err(EngineError::NoLogicalUnit { file, lun, have }) => {
            assert_eq!((file.as_str(), lun), ("fake-ufs,lun=5", 5));
            assert_eq!(have, vec![0, 1]);
        }
        r => panic!("expected NoLogicalUnit, got {r:?}"),
    }
    // A namespace selector on a UFS controller (a vfio- device's
    // filename may carry either; the controller decides).
    assert!(matches!(
        file_info(&job.dev, Unit::Ns(1), "vfio-01.00.0,ns=1"),
        Err(EngineError::WrongSelector { .. })
    ));
    let (nvme, _) = Job::setup(&["fake"], &opts(), 4096).unwrap();
    assert!(matches!(
        file_info(&nvme.dev, Unit::Lun(0), "vfio-01.00.0,lun=0"),
        Err(EngineError::WrongSelector { .. })
    ));
    // NVMe and UFS files in one job are two controllers.
    assert!(matches!(
        Job::setup(&["fake-ufs", "fake"], &ufs_opts(), 4096),
        Err(EngineError::TwoControllers { .. })
    ));
    // A block size above what the shared controller was opened for.
    assert!(matches!(
        Job::setup(&["fake-ufs"], &ufs_opts(), 64 << 20),
        Err(EngineError::TooLarge { .. })
    ));
    job.close().unwrap();
    nvme.close().unwrap();
}

/// A fake NVMe/TCP target of this test's own: namespace 1 RAM in
/// 512-byte blocks, 1 MiB; namespace 2 RAM in 4 KiB blocks. 8 KiB in
/// a capsule, MAXH2CDATA 32 KiB (the engine's bound per command), R2Ts
/// of 16 KiB, C2HData of 4 KiB: a 32 KiB write takes two R2Ts, a read
/// many C2HData.
fn tcp_target() -> mcqio_fixtures::tcp::FakeTcpTarget {
    use mcqio_fixtures::tcp::{FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig};
    FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![
            TcpNamespace {
                blocks: 2048,
                lba_shift: 9,
                backing: TcpBacking::Ram,
            },
            TcpNamespace {
                blocks: 256,
                lba_shift: 12,
                backing: TcpBacking::Ram,
            },
        ],
        maxh2cdata: 32 << 10,
        ..TcpTargetConfig::default()
    })
    .expect("fake target")
}

/// Write every size class (in the capsule, one R2T, several R2Ts)
/// from fio's region, read it back into another part of it (one and
/// many C2HData), and check the bytes; with and without digests.
#[test]
fn tcp_job_writes_and_reads_back_every_size_class() {
    use mcqio_fixtures::tcp::TcpTargetStats;
    for digests in ["", ",hdgst,ddgst"] {
        let t = tcp_target();
        let name = format!("tcp:{}/{}{digests},ns=2", t.addr(), t.subnqn());
        let (mut job, files) = Job::setup(&[&name], &opts(), 32 << 10).unwrap();
        assert_eq!(files[0].unit, 2);
        assert_eq!(files[0].lba_shift, 12);
        assert_eq!(files[0].size, 256 * 4096);
        job.init(8).unwrap();
        const HALF: usize = 128 << 10;
        let base = job.alloc_buffers(2 * HALF).unwrap();
        let c = files[0].cookie();
        // (offset in the buffer and on the device, length)
        let ios = [(0usize, 4096usize), (4096, 12288), (16384, 32768)];
        let pattern: Vec<u8> = (0..HALF)
            .map(|k| (k as u8).wrapping_mul(13) ^ (k >> 12) as u8 ^ digests.len() as u8)
            .collect();
        // SAFETY: the first half of the job's region; nothing in flight.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), base, HALF) };
        for (i, &(at, len)) in ios.iter().enumerate() {
            // SAFETY: pointer arithmetic inside the job's region.
            let b = unsafe { base.add(at) };
            let q = job.queue(c, Op::Write, at as u64, b, len as u64, i as u64);
            assert_eq!(q, Queued::Queued, "write {i}");
        }
        job.commit();
        let ev = wait(&mut job, ios.len());
        assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
        fill(base, 0, HALF);
        for (i, &(at, len)) in ios.iter().enumerate() {
            // SAFETY: pointer arithmetic inside the job's region.
            let b = unsafe { base.add(HALF + at) };
            let q = job.queue(c, Op::Read, at as u64, b, len as u64, 10 + i as u64);
            assert_eq!(q, Queued::Queued, "read {i}");
        }
        assert_eq!(
            job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 20),
            Queued::Queued
        );
        job.commit();
        let mut ev = wait(&mut job, ios.len() + 1);
        ev.sort_by_key(|e| e.tag);
        assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
        assert_eq!(ev.last().map(|e| e.tag), Some(20));
        // SAFETY: pointer arithmetic inside the job's region.
        let back = unsafe { base.add(HALF) };
        assert!(
            bytes(back, 49152) == pattern[..49152],
            "{digests}: the data read back differs from what was written"
        );
        let s = t.stats();
        assert!(TcpTargetStats::get(&s.in_capsule_writes) >= 1);
        assert!(TcpTargetStats::get(&s.r2ts) >= 3, "{digests}");
        assert!(TcpTargetStats::get(&s.c2h_data) >= 12, "{digests}");
        assert_eq!(TcpTargetStats::get(&s.io_connects), 1);
        job.close().unwrap();
    }
}

/// The job's queue pair holds what the target's queues do (CAP.MQES):
/// a deeper iodepth is answered busy and every block keeps its data;
/// an ordered-verify job is refused that iodepth, typed.
#[test]
fn tcp_job_deeper_than_the_target_queue_is_answered_busy() {
    let t = tcp_target();
    let name = format!("tcp:{}/{},ns=1", t.addr(), t.subnqn());
    let (mut deep, _) = Job::setup(&[&name], &opts(), 4096).unwrap();
    assert!(matches!(
        deep.init_with(200, true),
        Err(EngineError::TcpDepth { iodepth: 200, .. })
    ));
    let (mut job, files) = Job::setup(&[&name], &opts(), 4096).unwrap();
    let c = files[0].cookie();
    job.init(200).unwrap();
    const BS: usize = 512;
    let blocks = 2048;
    let base = job.alloc_buffers(blocks * BS).unwrap();
    let buf = |i: usize| {
        // SAFETY: pointer arithmetic inside the job's region.
        unsafe { base.add(i * BS) }
    };
    let run_all = |job: &mut Job, op: Op| -> usize {
        let mut pending: Vec<usize> = (0..blocks).rev().collect();
        let (mut outstanding, mut busy) = (0usize, 0usize);
        while !pending.is_empty() || outstanding > 0 {
            while let Some(i) = pending.pop() {
                match job.queue(c, op, (i * BS) as u64, buf(i), BS as u64, i as u64) {
                    Queued::Queued => outstanding += 1,
                    Queued::Busy => {
                        busy += 1;
                        pending.push(i);
                        break;
                    }
                    Queued::Failed(e) => panic!("block {i}: errno {e}"),
                }
            }
            job.commit();
            let n = job.getevents(1, 200, None).unwrap();
            for k in 0..n {
                let e = job.event(k).unwrap();
                assert_eq!(e.errno, 0, "block {}", e.tag);
            }
            outstanding -= n;
        }
        busy
    };
    for i in 0..blocks {
        fill(buf(i), (i as u8) ^ 0x3C, BS);
    }
    let busy_w = run_all(&mut job, Op::Write);
    fill(base, 0, blocks * BS);
    let busy_r = run_all(&mut job, Op::Read);
    assert!(busy_w > 0 && busy_r > 0, "never full: {busy_w} {busy_r}");
    for i in 0..blocks {
        assert!(
            bytes(buf(i), BS).iter().all(|&b| b == (i as u8) ^ 0x3C),
            "block {i} holds other data"
        );
    }
    job.close().unwrap();
    drop(deep);
}

/// `tcp:` filenames: the selector and the device options are told
/// apart; jobs on one target must agree on its options.
#[test]
fn tcp_filenames_and_shared_targets() {
    let t = tcp_target();
    let plain = format!("tcp:{}/{}", t.addr(), t.subnqn());
    let (a, fa) = Job::setup(&[&plain], &opts(), 4096).unwrap();
    let (b, fb) = Job::setup(&[&format!("{plain},ns=2")], &opts(), 4096).unwrap();
    assert!(Arc::ptr_eq(&a.dev, &b.dev));
    assert_eq!((fa[0].unit, fb[0].unit), (1, 2));
    assert!(matches!(
        Job::setup(&[&format!("{plain},hdgst")], &opts(), 4096),
        Err(EngineError::OptionsDiffer { .. })
    ));
    assert!(matches!(
        Job::setup(&[&format!("{plain},ns=3")], &opts(), 4096),
        Err(EngineError::NoNamespace { nsid: 3, .. })
    ));
    for bad in [",lun=0", ",ns=0", ",lbs=4k"] {
        let r = Job::setup(&[&format!("{plain}{bad}")], &opts(), 4096);
        assert!(matches!(r, Err(EngineError::Spec(_))), "{bad}: {r:?}");
    }
    a.close().unwrap();
    b.close().unwrap();
}
