//! The queue-pair lifecycle the core owns (`core::qpair`), one body per
//! property, run over every wire's fake from one table ([`WIRES`]: the
//! NVMe PCIe fake in both execution modes, the UFS fake on MCQ and on the
//! legacy doorbell list, the NVMe/TCP fake target on loopback), checked
//! with the shared counters (`QueueCounters`):
//!
//! - every command ends exactly once, error statuses included, and nothing
//!   else arrives;
//! - a reset with commands in flight ends each of them exactly once,
//!   within every poll's `max`, with its buffer; the queue is re-created
//!   and works;
//! - a command that gets no completion is withdrawn after its timeout
//!   (NVMe Abort; UFS cleanup by nexus or UTRLCLR; on NVMe/TCP the fake
//!   target refuses the Abort, so the association is reset) and ends once
//!   with its buffer; on the wires whose fake answers out of order, its
//!   neighbour is untouched;
//! - `close` with commands in flight ends each of them once;
//! - a transfer above the per-command limit goes out as children (the
//!   core's split planner) and comes back as one completion, data intact;
//! - a short soak (reads and writes with resets among them) reads back,
//!   block by block, the last write acknowledged, and ends every command
//!   once.
//!
//! What is each wire's own stays in its folder (`nvme_pcie/`, `ufs/`,
//! `nvme_tcp/`); the long seeded soaks are there too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::nvme::tcp::{TcpController, TcpOptions, TcpQueuePair};
use mcqio::vfio::DmaDir;
use mcqio::{
    DmaBuf, IoError, QpairOptions, QueuePair, TimeoutPolicy, UfsQpairOptions, UfsQueuePair,
};
use mcqio_fixtures::tcp::{FakeTcpTarget, TcpFault, TcpTargetConfig};
use mcqio_fixtures::testing::engine::nvme as nv;
use mcqio_fixtures::testing::engine::tcp;
use mcqio_fixtures::ufs::{FakeUfs, LuConfig, Sense, UfsConfig, UfsFault};
use mcqio_fixtures::{ExecMode, Fault};

const HANG: Duration = Duration::from_secs(20);
const WRITE10: u8 = 0x2A;
/// NVM Write.
const NVM_WRITE: u8 = 0x01;

/// The wires under test, one row each: every property runs on every row.
const WIRES: [Wire; 5] = [
    Wire::NvmePcie { threaded: false },
    Wire::NvmePcie { threaded: true },
    Wire::Ufs { mcq: true },
    Wire::Ufs { mcq: false },
    Wire::NvmeTcp,
];

/// A row of [`WIRES`]: which fake, and how it runs.
#[derive(Copy, Clone, Debug)]
enum Wire {
    /// The NVMe fake controller, completing in the submitting thread or on
    /// a device thread.
    NvmePcie { threaded: bool },
    /// The UFS fake, MCQ or the legacy single doorbell list.
    Ufs { mcq: bool },
    /// The NVMe/TCP fake target on loopback.
    NvmeTcp,
}

/// A property: one body, generic over the wire's rig.
trait Property {
    fn check<R: Rig>(&self, rig: &R, what: &str);
}

/// Run `p` on every row of [`WIRES`].
fn on_every_wire(p: impl Property) {
    for wire in WIRES {
        let what = format!("{wire:?}");
        match wire {
            Wire::NvmePcie { threaded } => p.check(&nvme_rig(threaded), &what),
            Wire::Ufs { mcq } => p.check(&ufs_rig(mcq), &what),
            Wire::NvmeTcp => p.check(&tcp_rig(), &what),
        }
    }
}

/// What the shared bodies need of a wire under test.
trait Rig {
    type Q: BlockQueue<Buf = DmaBuf>;
    /// How many writes the fake can hold at once without holding up the
    /// others (the TCP target answers a connection's commands in order:
    /// a held one holds up those behind it).
    const HOLDS: u64;
    /// Whether an Abort (or the wire's cleanup) withdraws a held command;
    /// if not, the timeout escalates to a reset.
    const ABORT_WITHDRAWS: bool;
    /// A buffer of `len` bytes.
    fn buf(&self, len: usize) -> DmaBuf;
    /// The next write gets no completion until a reset (or, on TCP, for
    /// long enough that a reset comes first).
    fn hold_next_write(&self);
    /// The next write fails with an error status, without executing.
    fn fail_next_write(&self);
    /// Whether the device took every fault injected.
    fn faults_taken(&self) -> bool;
    /// Reset the controller.
    fn reset(&self);
    /// Where to read and write.
    fn at(&self) -> <Self::Q as BlockQueue>::Addr;
    /// A new queue pair with this I/O timeout and policy.
    fn queue(&self, timeout: Option<Duration>, policy: TimeoutPolicy) -> Self::Q;
}

struct Nvme {
    fake: Arc<mcqio_fixtures::FakeController>,
    ctrl: Arc<mcqio::Controller>,
}

impl Rig for Nvme {
    type Q = QueuePair;
    const HOLDS: u64 = 3;
    const ABORT_WITHDRAWS: bool = true;
    fn buf(&self, len: usize) -> DmaBuf {
        self.ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap()
    }
    fn hold_next_write(&self) {
        self.fake
            .faults()
            .inject_next(None, None, Fault::Delay(Duration::from_secs(3600)));
    }
    fn fail_next_write(&self) {
        let fault = Fault::Status {
            sct: 0,
            sc: 0x06,
            dnr: true,
        };
        self.fake.faults().inject_next(None, Some(NVM_WRITE), fault);
    }
    fn faults_taken(&self) -> bool {
        self.fake.faults().pending() == 0
    }
    fn reset(&self) {
        self.ctrl.reset().unwrap();
    }
    fn at(&self) -> u32 {
        1
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
    const HOLDS: u64 = 3;
    const ABORT_WITHDRAWS: bool = true;
    fn buf(&self, len: usize) -> DmaBuf {
        self.ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap()
    }
    fn hold_next_write(&self) {
        self.fake
            .faults()
            .inject_next(None, Some(WRITE10), UfsFault::DropCompletion);
    }
    fn fail_next_write(&self) {
        // MEDIUM ERROR, write error.
        let sense = Sense::new(0x3, 0x0C, 0x00);
        self.fake
            .faults()
            .inject_next(None, Some(WRITE10), UfsFault::CheckCondition(sense));
    }
    fn faults_taken(&self) -> bool {
        self.fake.faults().pending() == 0
    }
    fn reset(&self) {
        self.ctrl.reset().unwrap();
    }
    fn at(&self) -> u8 {
        0
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

struct Tcp {
    target: FakeTcpTarget,
    ctrl: Arc<TcpController>,
}

impl Rig for Tcp {
    type Q = TcpQueuePair;
    const HOLDS: u64 = 1;
    const ABORT_WITHDRAWS: bool = false;
    fn buf(&self, len: usize) -> DmaBuf {
        self.ctrl.alloc_buf(len, DmaDir::Bidirectional).unwrap()
    }
    fn hold_next_write(&self) {
        // The target's connection sleeps this long before it answers: the
        // reset (or the timeout's) comes first and ends the connection.
        self.target
            .faults()
            .inject_next(None, Some(NVM_WRITE), TcpFault::Delay(HOLD_TCP));
    }
    fn fail_next_write(&self) {
        let fault = TcpFault::Status {
            sct: 0,
            sc: 0x06,
            dnr: true,
        };
        self.target
            .faults()
            .inject_next(None, Some(NVM_WRITE), fault);
    }
    fn faults_taken(&self) -> bool {
        self.target.faults().pending() == 0
    }
    fn reset(&self) {
        self.ctrl.reset().unwrap();
    }
    fn at(&self) -> u32 {
        1
    }
    fn queue(&self, timeout: Option<Duration>, policy: TimeoutPolicy) -> TcpQueuePair {
        self.ctrl
            .create_qpair(QpairOptions {
                // The target's MQES allows 127.
                depth: 64,
                io_timeout: timeout,
                timeout_policy: policy,
                ..QpairOptions::default()
            })
            .unwrap()
    }
}

/// How long the TCP target holds a write: longer than any reset takes on
/// a loaded machine, short enough that the sleeping connection thread is
/// gone soon after the test.
const HOLD_TCP: Duration = Duration::from_secs(4);

/// Poll `q` until `n` completions arrived (each pushed to `done`), within
/// [`HANG`] of `start`.
fn poll_until<Q: BlockQueue<Buf = DmaBuf>>(
    q: &mut Q,
    n: usize,
    done: &mut Vec<mcqio::Completion<DmaBuf>>,
    start: Instant,
    what: &str,
) {
    while done.len() < n {
        q.poll(16, |c| done.push(c)).unwrap();
        assert!(start.elapsed() < HANG, "{what}: {} of {n}", done.len());
        std::thread::yield_now();
    }
}

/// Nothing more arrives on `q`.
fn quiet<Q: BlockQueue<Buf = DmaBuf>>(q: &mut Q, what: &str) {
    for _ in 0..50 {
        assert_eq!(q.poll(16, |c| panic!("{what}: extra {c:?}")).unwrap(), 0);
    }
}

/// A read of one block on `q` completes, then `q` closes with nothing
/// left in flight.
fn works_then_closes<R: Rig>(rig: &R, mut q: R::Q, start: Instant, what: &str) {
    let bs = 1usize << q.block_shift(rig.at()).unwrap();
    q.read(rig.at(), 0, 1, rig.buf(bs), 99).unwrap();
    q.submit();
    let mut back = Vec::new();
    poll_until(&mut q, 1, &mut back, start, what);
    assert_eq!(back[0].result, Ok(()), "{what}");
    q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
}

/// Every command ends exactly once, the ones the device failed with their
/// error, and nothing else arrives: 64 writes, every fourth of them
/// failed by the device, then a read of each block.
struct ExactlyOnce;

impl Property for ExactlyOnce {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
        let mut q = rig.queue(None, TimeoutPolicy::Abort);
        let bs = 1usize << q.block_shift(rig.at()).unwrap();
        let start = Instant::now();
        let (n, failed) = (64u64, 16usize);
        let mut done = Vec::new();
        for i in 0..n {
            if i % 4 == 0 {
                rig.fail_next_write();
                // One injected fault at a time: the next write takes it.
                while !rig.faults_taken() {
                    q.poll(16, |c| done.push(c)).unwrap();
                    assert!(start.elapsed() < HANG, "{what}");
                    if q.outstanding() == 0 {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            while q.is_full() {
                q.poll(16, |c| done.push(c)).unwrap();
                assert!(start.elapsed() < HANG, "{what}");
            }
            q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
            q.submit();
        }
        poll_until(&mut q, n as usize, &mut done, start, what);
        let mut seen = HashMap::new();
        for c in &done {
            *seen.entry(c.tag).or_insert(0) += 1;
            assert!(c.buf.is_some(), "{what}: tag {} without its buffer", c.tag);
        }
        assert_eq!(seen.len(), n as usize, "{what}: every tag");
        assert!(seen.values().all(|&k| k == 1), "{what}: each once");
        let errors = done.iter().filter(|c| c.result.is_err()).count();
        assert_eq!(errors, failed, "{what}: the failed writes, and only they");
        for c in done.iter().filter(|c| c.result.is_err()) {
            assert!(
                matches!(c.result, Err(IoError::Nvme(_) | IoError::Ufs(_))),
                "{what}: {:?}",
                c.result
            );
        }
        quiet(&mut q, what);
        let k = q.counters();
        assert_eq!((k.submitted, k.completed), (n, n), "{what}: {k:?}");
        q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
    }
}

/// `held` writes without a completion and `plain` ones with, then a reset:
/// every command ends once, within `max` per poll, the held ones as
/// `AbortedByReset` with their buffers; then the queue works again.
struct ResetEndsEachOnce {
    max: usize,
}

impl Property for ResetEndsEachOnce {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
        let max = self.max;
        let what = &format!("{what} max {max}");
        let mut q = rig.queue(None, TimeoutPolicy::Abort);
        let (plain, held) = (2u64, R::HOLDS);
        let bs = 1usize << q.block_shift(rig.at()).unwrap();
        let start = Instant::now();
        // The plain writes complete first, so that each hold meets its own
        // write on a threaded fake.
        for i in 0..plain {
            q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
            q.submit();
        }
        let mut early = Vec::new();
        poll_until(&mut q, plain as usize, &mut early, start, what);
        assert!(early.iter().all(|c| c.result.is_ok()), "{what}");
        for i in plain..plain + held {
            rig.hold_next_write();
            q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
            q.submit();
            while !rig.faults_taken() {
                assert_eq!(q.poll(16, |c| panic!("{what}: held {c:?}")).unwrap(), 0);
                assert!(start.elapsed() < HANG, "{what}");
                std::thread::yield_now();
            }
        }
        let before = q.counters();
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
        quiet(&mut q, what);
        let after = q.counters();
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
        works_then_closes(rig, q, start, what);
    }
}

/// One held write times out and is withdrawn: it ends once with its
/// buffer, as `TimedOut` where the Abort withdraws it and `AbortedByReset`
/// where the timeout escalates to a reset; a plain write beside it
/// completes (on the wires that answer out of order); the counters say
/// one timeout and one abort.
struct TimeoutWithdraws;

impl Property for TimeoutWithdraws {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
        let mut q = rig.queue(Some(Duration::from_millis(60)), TimeoutPolicy::Abort);
        let bs = 1usize << q.block_shift(rig.at()).unwrap();
        // A neighbour behind a held command is held up too where the
        // device answers in order.
        let n = if R::HOLDS > 1 { 2 } else { 1 };
        rig.hold_next_write();
        q.write(rig.at(), 0, 1, rig.buf(bs), 1).unwrap();
        q.submit();
        if n == 2 {
            q.write(rig.at(), 1, 1, rig.buf(bs), 2).unwrap();
            q.submit();
        }
        let start = Instant::now();
        let mut done = Vec::new();
        poll_until(&mut q, n, &mut done, start, what);
        done.sort_by_key(|c| c.tag);
        let (want, escalated) = if R::ABORT_WITHDRAWS {
            (IoError::TimedOut, 0)
        } else {
            (IoError::AbortedByReset, 1)
        };
        assert_eq!(done[0].result, Err(want), "{what}");
        assert!(done[0].buf.is_some(), "{what}: withdrawn, so handed back");
        if n == 2 {
            assert_eq!(done[1].result, Ok(()), "{what}");
        }
        let c = q.counters();
        assert_eq!(
            (c.timeouts, c.aborts_sent, c.resets_requested),
            (1, 1, escalated),
            "{what}: {c:?}"
        );
        assert_eq!(
            (c.submitted, c.completed, q.outstanding()),
            (n as u64, n as u64, 0),
            "{what}"
        );
        quiet(&mut q, what);
        // The queue carries on.
        works_then_closes(rig, q, start, what);
    }
}

/// `close` with commands in flight, some of them held by the device, ends
/// each of them exactly once, through `close` or an earlier poll.
struct CloseEndsEachOnce;

impl Property for CloseEndsEachOnce {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
        let mut q = rig.queue(Some(Duration::from_millis(200)), TimeoutPolicy::Abort);
        let bs = 1usize << q.block_shift(rig.at()).unwrap();
        let start = Instant::now();
        let mut ended = HashMap::new();
        let n = 8u64;
        for i in 0..n {
            if i == n - R::HOLDS {
                // The last writes are held: they are in flight at close.
                for j in i..n {
                    rig.hold_next_write();
                    q.write(rig.at(), j, 1, rig.buf(bs), j).unwrap();
                    q.submit();
                    while !rig.faults_taken() {
                        q.poll(16, |c| *ended.entry(c.tag).or_insert(0) += 1)
                            .unwrap();
                        assert!(start.elapsed() < HANG, "{what}");
                        std::thread::yield_now();
                    }
                }
                break;
            }
            q.write(rig.at(), i, 1, rig.buf(bs), i).unwrap();
            q.submit();
        }
        assert!(q.outstanding() >= R::HOLDS as usize, "{what}");
        q.close(|c| *ended.entry(c.tag).or_insert(0) += 1).unwrap();
        assert!(start.elapsed() < HANG, "{what}");
        assert_eq!(ended.len(), n as usize, "{what}: every tag: {ended:?}");
        assert!(ended.values().all(|&k| k == 1), "{what}: each once");
    }
}

/// A write of four times the per-command limit goes out as four children
/// and completes once with its buffer; the data reads back.
struct SplitCompletesOnce;

impl Property for SplitCompletesOnce {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
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
        poll_until(&mut q, 1, &mut done, start, what);
        let c = done.pop().unwrap();
        assert_eq!((c.tag, c.result), (7, Ok(())), "{what}");
        assert_eq!(c.buf.as_ref().map(|b| b.len()), Some(len), "{what}");
        let n = q.counters();
        assert_eq!(
            (n.submitted, n.completed),
            (4, 1),
            "{what}: four children, one completion"
        );
        q.read(rig.at(), 8, blocks, rig.buf(len), 8).unwrap();
        q.submit();
        let mut back = Vec::new();
        poll_until(&mut q, 1, &mut back, start, what);
        let back = back.pop().unwrap();
        assert_eq!(back.result, Ok(()), "{what}");
        assert!(back.buf.unwrap().as_slice() == &want[..], "{what}: data");
        q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
    }
}

/// A short soak: `IOS` reads and writes of one block each over `BLOCKS`
/// blocks, up to `QD` in flight and never two on one block, with a reset
/// every `RESET_EVERY` I/Os while commands are in flight. Every command
/// ends once (with its buffer); a read returns the last write
/// acknowledged for its block, or one a reset ended (the device may or
/// may not have executed it), after which the block is known again.
struct ShortSoak;

impl ShortSoak {
    const IOS: u64 = 1500;
    const BLOCKS: u64 = 48;
    const QD: usize = 12;
    const RESET_EVERY: u64 = 400;
}

/// Block content: the version (the write's tag) in every 8 bytes.
fn versioned(b: &mut DmaBuf, version: u64) {
    for w in b.as_mut_slice().chunks_exact_mut(8) {
        w.copy_from_slice(&version.to_le_bytes());
    }
}

impl Property for ShortSoak {
    fn check<R: Rig>(&self, rig: &R, what: &str) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0x50a1);
        let mut q = rig.queue(None, TimeoutPolicy::Abort);
        let bs = 1usize << q.block_shift(rig.at()).unwrap();
        // Per block: the versions it may hold (0: never written).
        let mut may: Vec<Vec<u64>> = vec![vec![0]; Self::BLOCKS as usize];
        // Per tag in flight: (block, write?).
        let mut flight: HashMap<u64, (u64, bool)> = HashMap::new();
        let mut ended: HashMap<u64, u32> = HashMap::new();
        let start = Instant::now();
        let mut next = 1u64;
        let mut resets = 0;
        let mut handle = |c: mcqio::Completion<DmaBuf>,
                          flight: &mut HashMap<u64, (u64, bool)>,
                          may: &mut Vec<Vec<u64>>| {
            *ended.entry(c.tag).or_insert(0) += 1;
            let (block, write) = flight.remove(&c.tag).expect("a tag in flight");
            let cell = &mut may[block as usize];
            match (write, &c.result) {
                (true, Ok(())) => *cell = vec![c.tag],
                (true, Err(IoError::AbortedByReset)) => cell.push(c.tag),
                (false, Ok(())) => {
                    let b = c.buf.as_ref().expect("a read's buffer");
                    let v = u64::from_le_bytes(b.as_slice()[..8].try_into().unwrap());
                    assert!(
                        cell.contains(&v),
                        "{what}: block {block} read version {v}, may hold {cell:?}"
                    );
                    *cell = vec![v];
                }
                (false, Err(IoError::AbortedByReset)) => {}
                (_, r) => panic!("{what}: tag {} ended {r:?}", c.tag),
            }
            assert!(c.buf.is_some(), "{what}: tag {} without its buffer", c.tag);
        };
        while next <= Self::IOS || !flight.is_empty() {
            assert!(
                start.elapsed() < HANG * 3,
                "{what}: {} in flight",
                flight.len()
            );
            while next <= Self::IOS && flight.len() < Self::QD && !q.is_full() {
                let busy: Vec<u64> = flight.values().map(|&(b, _)| b).collect();
                let block = rng.gen_range(0..Self::BLOCKS);
                if busy.contains(&block) {
                    break;
                }
                let write = rng.gen_bool(0.5);
                let mut b = rig.buf(bs);
                if write {
                    versioned(&mut b, next);
                    q.write(rig.at(), block, 1, b, next).unwrap();
                } else {
                    q.read(rig.at(), block, 1, b, next).unwrap();
                }
                flight.insert(next, (block, write));
                next += 1;
            }
            q.submit();
            if next > (resets + 1) * Self::RESET_EVERY && !flight.is_empty() {
                rig.reset();
                resets += 1;
            }
            let mut got = Vec::new();
            q.poll(16, |c| got.push(c)).unwrap();
            for c in got {
                handle(c, &mut flight, &mut may);
            }
        }
        quiet(&mut q, what);
        assert_eq!(ended.len() as u64, Self::IOS, "{what}: every tag");
        assert!(ended.values().all(|&k| k == 1), "{what}: each once");
        assert!(resets >= 3, "{what}: {resets} resets");
        let k = q.counters();
        assert_eq!(k.completed, Self::IOS, "{what}: {k:?}");
        q.close(|c| panic!("{what}: close found {c:?}")).unwrap();
    }
}

/// The NVMe fake (MDTS 2^5 pages) and its engine controller.
fn nvme_rig(threaded: bool) -> Nvme {
    let exec = nv::modes()[threaded as usize].clone();
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

/// The NVMe/TCP fake target (namespace 1: 2048 blocks of 512 B in RAM,
/// MDTS 2^5 pages) and the engine's controller connected to it.
fn tcp_rig() -> Tcp {
    let target = tcp::start(TcpTargetConfig::default());
    let ctrl = tcp::connect(&target, TcpOptions::default());
    Tcp { target, ctrl }
}

#[test]
fn every_command_ends_exactly_once_on_every_wire() {
    on_every_wire(ExactlyOnce);
}

#[test]
fn a_reset_ends_each_command_once_within_max_on_every_wire() {
    for max in [1usize, 2, 16] {
        on_every_wire(ResetEndsEachOnce { max });
    }
}

#[test]
fn a_timeout_withdraws_and_ends_once_on_every_wire() {
    on_every_wire(TimeoutWithdraws);
}

#[test]
fn close_ends_each_command_in_flight_once_on_every_wire() {
    on_every_wire(CloseEndsEachOnce);
}

#[test]
fn a_split_transfer_completes_once_on_every_wire() {
    on_every_wire(SplitCompletesOnce);
}

#[test]
fn a_short_soak_with_resets_reads_back_what_was_acknowledged_on_every_wire() {
    on_every_wire(ShortSoak);
}
