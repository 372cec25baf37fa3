//! The queue-pair lifecycle the core owns (`core::qpair`), one body over
//! both fakes: a reset with commands in flight ends each of them exactly
//! once, within every poll's `max`, with its buffer; the queue is
//! re-created and works; the shared counters ([`QueueCounters`]) say the
//! same on NVMe and on UFS.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::vfio::DmaDir;
use mcqio::{DmaBuf, IoError, QueueCounters, QueuePair, UfsQueuePair};
use mcqio_fixtures::testing::engine::nvme as nv;
use mcqio_fixtures::ufs::{FakeUfs, LuConfig, UfsConfig, UfsFault};
use mcqio_fixtures::{ExecMode, Fault};

const HANG: Duration = Duration::from_secs(20);
const WRITE10: u8 = 0x2A;

/// What the shared body needs of a wire under test.
trait Rig {
    type Q: BlockQueue<Buf = DmaBuf>;
    /// A buffer of `len` bytes.
    fn buf(&self, len: usize) -> DmaBuf;
    /// The next write gets no completion until a reset.
    fn hold_next_write(&self);
    /// Whether the device took every held fault.
    fn holds_taken(&self) -> bool;
    /// Reset the controller.
    fn reset(&self);
    /// Where to write.
    fn at(&self) -> <Self::Q as BlockQueue>::Addr;
    /// The shared counters of `q`.
    fn counters(q: &Self::Q) -> QueueCounters;
}

struct Nvme {
    fake: Arc<mcqio_fixtures::FakeController>,
    ctrl: Arc<mcqio::Controller>,
}

impl Rig for Nvme {
    type Q = QueuePair;
    fn buf(&self, len: usize) -> DmaBuf {
        self.ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap()
    }
    fn hold_next_write(&self) {
        self.fake
            .faults()
            .inject_next(None, None, Fault::Delay(Duration::from_secs(3600)));
    }
    fn holds_taken(&self) -> bool {
        self.fake.faults().pending() == 0
    }
    fn reset(&self) {
        self.ctrl.reset().unwrap();
    }
    fn at(&self) -> u32 {
        1
    }
    fn counters(q: &QueuePair) -> QueueCounters {
        q.counters()
    }
}

struct Ufs {
    fake: Arc<FakeUfs>,
    ctrl: Arc<mcqio::UfsController>,
}

impl Rig for Ufs {
    type Q = UfsQueuePair;
    fn buf(&self, len: usize) -> DmaBuf {
        self.ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap()
    }
    fn hold_next_write(&self) {
        self.fake
            .faults()
            .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
    }
    fn holds_taken(&self) -> bool {
        self.fake.faults().pending() == 0
    }
    fn reset(&self) {
        self.ctrl.reset().unwrap();
    }
    fn at(&self) -> u8 {
        0
    }
    fn counters(q: &UfsQueuePair) -> QueueCounters {
        q.counters()
    }
}

/// `held` writes without a completion and `plain` ones with, then a reset:
/// every command ends once, within `max` per poll, the held ones as
/// `AbortedByReset` with their buffers; then the queue works again.
fn reset_ends_each_once_within_max<R: Rig>(rig: &R, mut q: R::Q, max: usize, what: &str) {
    let (plain, held) = (2u64, 3u64);
    let bs = 1usize << q.block_shift(rig.at()).unwrap();
    let start = Instant::now();
    // The plain writes complete first, so that each hold meets its own
    // write on a threaded fake.
    for i in 0..plain {
        q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
        q.submit();
    }
    let mut early = Vec::new();
    while early.len() < plain as usize {
        q.poll(16, |c| early.push(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}");
        std::thread::yield_now();
    }
    assert!(early.iter().all(|c| c.result.is_ok()), "{what}");
    for i in plain..plain + held {
        rig.hold_next_write();
        q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
        q.submit();
        while !rig.holds_taken() {
            assert_eq!(q.poll(16, |c| panic!("{what}: held {c:?}")).unwrap(), 0);
            assert!(start.elapsed() < HANG, "{what}");
            std::thread::yield_now();
        }
    }
    let before = R::counters(&q);
    rig.reset();
    let mut done = Vec::new();
    while done.len() < held as usize {
        let mut got = 0;
        let n = q
            .poll(max, |c| {
                got += 1;
                done.push(c)
            })
            .unwrap();
        assert_eq!(n, got, "{what}");
        assert!(got <= max, "{what}: max {max}, delivered {got}");
        assert_eq!(q.outstanding(), held as usize - done.len(), "{what}");
        assert!(start.elapsed() < HANG, "{what}");
    }
    let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, (plain..plain + held).collect::<Vec<_>>(), "{what}");
    for c in &done {
        assert_eq!(c.result, Err(IoError::AbortedByReset), "{what}");
        assert!(c.buf.is_some(), "{what}: a reset hands buffers back");
    }
    // Nothing more arrives.
    for _ in 0..100 {
        assert_eq!(q.poll(16, |c| panic!("{what}: extra {c:?}")).unwrap(), 0);
    }
    let after = R::counters(&q);
    assert_eq!(
        (
            after.submitted - before.submitted,
            after.completed - before.completed,
            after.aborted_by_reset - before.aborted_by_reset,
            after.recoveries - before.recoveries,
            after.failed_by_controller,
        ),
        (0, held, held, 1, 0),
        "{what}: {after:?}"
    );
    assert_eq!(after.completed, plain + held, "{what}");
    // The queue was re-created: it works.
    q.read(rig.at(), 0, 1, rig.buf(bs), 99).unwrap();
    q.submit();
    let mut back = None;
    while back.is_none() {
        q.poll(16, |c| back = Some(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}");
    }
    assert_eq!(back.unwrap().result, Ok(()), "{what}");
    q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
}

#[test]
fn a_reset_ends_each_command_once_within_max_on_both_wires() {
    for max in [1usize, 2, 16] {
        for exec in nv::modes() {
            let (fake, ctrl) = nv::open(nv::config(exec.clone(), 5));
            let q = ctrl.create_qpair(Default::default()).unwrap();
            let rig = Nvme { fake, ctrl };
            reset_ends_each_once_within_max(&rig, q, max, &format!("nvme {exec:?} max {max}"));
        }
        for mcq in [true, false] {
            let fake = FakeUfs::new(UfsConfig {
                exec: ExecMode::Sync,
                mcq,
                lus: vec![LuConfig::Ram { blocks: 1024 }],
                ..UfsConfig::default()
            })
            .unwrap();
            let backend: Arc<dyn mcqio::vfio::Backend> = fake.clone();
            let ctrl = mcqio::UfsController::new(backend, Default::default()).unwrap();
            let q = ctrl.create_qpair(Default::default()).unwrap();
            let rig = Ufs { fake, ctrl };
            reset_ends_each_once_within_max(&rig, q, max, &format!("ufs mcq={mcq} max {max}"));
        }
    }
}
