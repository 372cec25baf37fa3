//! What a poll costs when nothing new has completed, UFS MCQ vs NVMe.
//!
//! A UFS MCQ completion queue has no phase bit: to learn whether anything
//! arrived, a poll reads the CQTP register (one MMIO read) whenever commands
//! are outstanding, and skips it when none are. An NVMe poll looks at the
//! phase bit of the next completion entry in host memory. Four cases, each
//! a `poll` that finds nothing:
//!
//! - `ufs_mcq/outstanding`: one command held by the fake (its completion
//!   dropped), so every poll reads CQTP;
//! - `ufs_mcq/idle`: nothing outstanding, the CQTP read is skipped;
//! - `nvme/outstanding` and `nvme/idle`: the same on the fake NVMe
//!   controller.
//!
//! `outstanding − idle` is what the completion check costs on each side.
//! On the fakes both registers and entries are host memory, so a CQTP read
//! costs a cached load plus the engine's checks: this bench measures the
//! engine's side. On real hardware the CQTP read is a non-posted PCIe read
//! that stalls the core for a round trip to the controller (typically
//! 0.5–1.5 µs), which is why the engine skips it when nothing is
//! outstanding and why a busy UFS poll loop costs more than an NVMe one.
//!
//! Both fakes run in sync mode (no device thread): a poll that finds
//! nothing does not enter them, except the UFS engine's health check of IS
//! every 1024 empty polls, which runs the sync device once.

use std::sync::Arc;

use criterion::Criterion;
use mcqio::{Controller, ControllerOptions, DmaBuf, QueuePair};
use mcqio::{UfsController, UfsOptions, UfsQueuePair};
use mcqio_fixtures::ufs::{FakeUfs, LuConfig, UfsConfig, UfsFault};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, Fault};
use mcqio_vfio::{Backend, DmaDir};

/// SCSI READ(10).
const READ10: u8 = 0x28;

fn ufs(hold_one: bool) -> (Arc<FakeUfs>, UfsQueuePair<DmaBuf>) {
    let fake = FakeUfs::new(UfsConfig {
        exec: ExecMode::Sync,
        lus: vec![LuConfig::null_bytes(1 << 30)],
        ..UfsConfig::default()
    })
    .expect("fake UFS");
    let backend: Arc<dyn Backend> = fake.clone();
    let ctrl = UfsController::new(
        backend,
        UfsOptions {
            queues: 1,
            ..UfsOptions::default()
        },
    )
    .expect("UFS bring-up");
    let mut qp = ctrl
        .create_qpair(Default::default())
        .expect("UFS queue pair");
    if hold_one {
        fake.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buffer");
        qp.read(0, 0, 1, buf, 1).expect("submit");
        qp.submit();
        assert_eq!(qp.poll(usize::MAX, |_| {}).expect("poll"), 0);
        assert_eq!(qp.outstanding(), 1);
    }
    (fake, qp)
}

fn nvme(hold_one: bool) -> (Arc<FakeController>, QueuePair<DmaBuf>) {
    let fake = FakeController::new(FakeConfig::sync()).expect("fake NVMe");
    let backend: Arc<dyn Backend> = fake.clone();
    let ctrl = Controller::new(backend, ControllerOptions::default()).expect("NVMe bring-up");
    let mut qp = ctrl
        .create_qpair(Default::default())
        .expect("NVMe queue pair");
    if hold_one {
        fake.faults()
            .inject_next(Some(qp.qid()), None, Fault::DropCompletion);
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buffer");
        qp.read(1, 0, 8, buf, 1).expect("submit");
        qp.submit();
        assert_eq!(qp.poll(usize::MAX, |_| {}).expect("poll"), 0);
    }
    (fake, qp)
}

fn empty_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("empty_poll");
    for (name, hold) in [("outstanding", true), ("idle", false)] {
        let (_fake, mut qp) = ufs(hold);
        let reads = qp.stats().completion_reads;
        g.bench_function(format!("ufs_mcq/{name}"), |b| {
            b.iter(|| qp.poll(usize::MAX, |_| {}).expect("poll"))
        });
        // The outstanding case read CQTP on every poll, the idle one never.
        let s = qp.stats();
        assert_eq!(s.completion_reads > reads, hold, "{s:?}");
        drop(qp);
        let (_fake, mut qp) = nvme(hold);
        g.bench_function(format!("nvme/{name}"), |b| {
            b.iter(|| qp.poll(usize::MAX, |_| {}).expect("poll"))
        });
        drop(qp);
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    empty_poll(&mut c);
    c.final_summary();
}
