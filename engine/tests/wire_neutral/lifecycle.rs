//! The queue-pair lifecycle the core owns (`core::qpair`), one body per
//! behaviour over both fakes, checked with the shared counters
//! ([`QueueCounters`]):
//!
//! - a reset with commands in flight ends each of them exactly once,
//!   within every poll's `max`, with its buffer; the queue is re-created
//!   and works;
//! - a command that gets no completion is withdrawn after its timeout
//!   (NVMe Abort; UFS cleanup by nexus or UTRLCLR) and ends once as
//!   `TimedOut` with its buffer; its neighbour is untouched;
//! - a transfer above the per-command limit goes out as children (the
//!   core's split planner) and comes back as one completion, data intact.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::vfio::DmaDir;
use mcqio::{
    DmaBuf, IoError, QpairOptions, QueueCounters, QueuePair, TimeoutPolicy, UfsQpairOptions,
    UfsQueuePair,
};
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
    /// A new queue pair with this I/O timeout and policy.
    fn queue(&self, timeout: Option<Duration>, policy: TimeoutPolicy) -> Self::Q;
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
    fn queue(&self, timeout: Option<Duration>, policy: TimeoutPolicy) -> QueuePair {
        self.ctrl
            .create_qpair(QpairOptions {
                io_timeout: timeout,
                timeout_policy: policy,
                ..QpairOptions::default()
            })
            .unwrap()
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
    fn queue(&self, timeout: Option<Duration>, policy: TimeoutPolicy) -> UfsQueuePair {
        self.ctrl
            .create_qpair(UfsQpairOptions {
                io_timeout: timeout,
                timeout_policy: policy,
                ..UfsQpairOptions::default()
            })
            .unwrap()
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

/// One held write times out and is withdrawn: it ends once as `TimedOut`
/// with its buffer, a plain write beside it completes, and the counters
/// say one timeout, one abort, one timed out, no reset.
fn a_timeout_withdraws_and_ends_once<R: Rig>(rig: &R, what: &str) {
    let mut q = rig.queue(Some(Duration::from_millis(60)), TimeoutPolicy::Abort);
    let bs = 1usize << q.block_shift(rig.at()).unwrap();
    rig.hold_next_write();
    q.write(rig.at(), 0, 1, rig.buf(bs), 1).unwrap();
    q.submit();
    q.write(rig.at(), 1, 1, rig.buf(bs), 2).unwrap();
    q.submit();
    let start = Instant::now();
    let mut done = Vec::new();
    while done.len() < 2 {
        q.poll(16, |c| done.push(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}: {} of 2", done.len());
        std::thread::sleep(Duration::from_millis(1));
    }
    done.sort_by_key(|c| c.tag);
    assert_eq!(done[0].result, Err(IoError::TimedOut), "{what}");
    assert!(done[0].buf.is_some(), "{what}: withdrawn, so handed back");
    assert_eq!(done[1].result, Ok(()), "{what}");
    let c = R::counters(&q);
    assert_eq!(
        (c.timeouts, c.aborts_sent, c.timed_out, c.resets_requested),
        (1, 1, 1, 0),
        "{what}: {c:?}"
    );
    assert_eq!(
        (c.submitted, c.completed, q.outstanding()),
        (2, 2, 0),
        "{what}"
    );
    for _ in 0..50 {
        assert_eq!(q.poll(16, |c| panic!("{what}: extra {c:?}")).unwrap(), 0);
    }
    q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
}

/// A write of four times the per-command limit goes out as four children
/// and completes once with its buffer; the data reads back.
fn a_split_transfer_completes_once<R: Rig>(rig: &R, what: &str) {
    let mut q = rig.queue(None, TimeoutPolicy::Abort);
    let shift = q.block_shift(rig.at()).unwrap();
    let max = q.max_transfer() as usize;
    let len = 4 * max;
    let blocks = (len >> shift) as u32;
    let mut b = rig.buf(len);
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (i / 4096) as u8 ^ 0x5a;
    }
    let want = b.as_slice().to_vec();
    q.write(rig.at(), 8, blocks, b, 7).unwrap();
    q.submit();
    let start = Instant::now();
    let mut done = Vec::new();
    while done.is_empty() {
        q.poll(16, |c| done.push(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}");
    }
    let c = done.pop().unwrap();
    assert_eq!((c.tag, c.result), (7, Ok(())), "{what}");
    assert_eq!(c.buf.as_ref().map(|b| b.len()), Some(len), "{what}");
    let n = R::counters(&q);
    assert_eq!(
        (n.submitted, n.completed),
        (4, 1),
        "{what}: four children, one completion"
    );
    q.read(rig.at(), 8, blocks, rig.buf(len), 8).unwrap();
    q.submit();
    let mut back = None;
    while back.is_none() {
        q.poll(16, |c| back = Some(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}");
    }
    let back = back.unwrap();
    assert_eq!(back.result, Ok(()), "{what}");
    assert!(back.buf.unwrap().as_slice() == &want[..], "{what}: data");
    q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
}

/// The NVMe fake (MDTS 2^5 pages) and its engine controller.
fn nvme_rig(exec: ExecMode) -> Nvme {
    let (fake, ctrl) = nv::open(nv::config(exec, 5));
    Nvme { fake, ctrl }
}

/// The UFS fake (MCQ or legacy, one RAM LU) and its engine controller,
/// with a 64 KiB per-command limit.
fn ufs_rig(mcq: bool) -> Ufs {
    let fake = FakeUfs::new(UfsConfig {
        exec: ExecMode::Sync,
        mcq,
        lus: vec![LuConfig::Ram { blocks: 1024 }],
        ..UfsConfig::default()
    })
    .unwrap();
    let backend: Arc<dyn mcqio::vfio::Backend> = fake.clone();
    let ctrl = mcqio::UfsController::new(
        backend,
        mcqio::UfsOptions {
            max_transfer: 64 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    Ufs { fake, ctrl }
}

#[test]
fn a_timeout_withdraws_and_ends_once_on_both_wires() {
    for exec in nv::modes() {
        a_timeout_withdraws_and_ends_once(&nvme_rig(exec.clone()), &format!("nvme {exec:?}"));
    }
    for mcq in [true, false] {
        a_timeout_withdraws_and_ends_once(&ufs_rig(mcq), &format!("ufs mcq={mcq}"));
    }
}

#[test]
fn a_split_transfer_completes_once_on_both_wires() {
    for exec in nv::modes() {
        a_split_transfer_completes_once(&nvme_rig(exec.clone()), &format!("nvme {exec:?}"));
    }
    for mcq in [true, false] {
        a_split_transfer_completes_once(&ufs_rig(mcq), &format!("ufs mcq={mcq}"));
    }
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
