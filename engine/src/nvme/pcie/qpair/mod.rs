//! [`QueuePair`]: one submission/completion queue pair, owned by one thread.

use crate::core::qpair::Lifecycle;
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use mcqio_vfio::{DmaRegion, DmaSpace};

mod blocking;
mod create;
mod prp;
mod reap;
mod split;
mod submit;
mod teardown;
mod timeouts;
mod wait;
mod wire;

use self::prp::PrpLists;
use crate::core::error::Result;
use crate::core::io::{DmaBuf, IoBuf, SubmitErrorKind};
use crate::core::qpair::Engine;
use crate::nvme::host::nvm;
use crate::nvme::pcie::controller::Controller;
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::sq::SubQueue;

/// NVMe's record per child being built (the shared parent table's `S`):
/// PRP1, PRP2 (see `split.rs`).
type SplitChild = (u64, u64);

/// The largest queue depth (outstanding commands per queue pair).
pub const MAX_DEPTH: u16 = 4096;
/// Outstanding commands (this one included) above which SQEs are written
/// with streaming stores (see `SubQueue::push`).
const STREAM_MIN_OUTSTANDING: usize = 4;
/// Empty polls (with commands outstanding) between CSTS health checks.
const HEALTH_CHECK_INTERVAL: u32 = 4096;

/// Counters of one queue pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpairStats {
    /// Commands placed in the SQ (each child of a split transfer counts).
    pub submitted: u64,
    /// Completions delivered (one per accepted submission, split or not).
    pub completed: u64,
    /// CQEs that matched no command in flight (duplicate, stale, corrupt CID):
    /// consumed and dropped, never delivered.
    pub stale_completions: u64,
    /// SQ tail doorbell MMIO stores.
    pub sq_doorbell_writes: u64,
    /// SQ tail updates that needed no MMIO store (shadow doorbell, EventIdx).
    pub sq_doorbell_skipped: u64,
    /// CQ head doorbell MMIO stores.
    pub cq_doorbell_writes: u64,
    /// CQ head updates that needed no MMIO store (shadow doorbell).
    pub cq_doorbell_skipped: u64,
    /// Commands found past their timeout by the poll-time scan.
    pub timeouts: u64,
    /// Abort commands sent for timed-out commands.
    pub aborts_sent: u64,
    /// Timed-out commands completed as [`IoError::TimedOut`](crate::core::io::IoError::TimedOut) (aborted).
    pub timed_out: u64,
    /// Controller resets this queue's timeout policy asked for.
    pub resets_requested: u64,
    /// Commands completed with [`IoError::AbortedByReset`](crate::core::io::IoError::AbortedByReset).
    pub aborted_by_reset: u64,
    /// Commands completed with [`IoError::ControllerFailed`](crate::core::io::IoError::ControllerFailed).
    pub failed_by_controller: u64,
    /// Times this queue re-created its queues after a controller reset.
    pub recoveries: u64,
}

#[derive(Copy, Clone, Debug)]
struct NsGeom {
    nsze: u64,
    lba_shift: u32,
    /// Formatted with per-block metadata: data transfers would need
    /// metadata buffers (or larger blocks), which mcqio does not build.
    metadata: bool,
    /// The most blocks one data command moves without a split (at most
    /// `MAX_NLB` and the queue's transfer limit), or 0 with `metadata`:
    /// precomputed once per queue pair, so a submission's one compare of
    /// `nlb - 1` against it stands for the zero-count, metadata and split
    /// checks, which the cold path then makes one by one.
    unsplit: u32,
}

/// One I/O submission queue and its completion queue.
///
/// `Send` but not `Sync`: create one per thread (see [`crate::core::per_core`]) and
/// keep it there. No locks, atomics, allocations or system calls are made on
/// the I/O path ([`read`](Self::read), [`write`](Self::write), ...,
/// [`submit`](Self::submit), [`poll`](Self::poll)).
///
/// `B` is the buffer type moved through the queue (default [`DmaBuf`]); any
/// [`IoBuf`] works, e.g. `Vec<DmaBuf>` for vectored I/O, or
/// [`mcqio_vfio::Mapped`] from a `DmaMapper` (premapped pool, strict or lazy
/// mapping) created over [`Controller::dma`].
///
/// A queue pair cannot be shared between threads:
///
/// ```compile_fail
/// fn is_sync<T: Sync>() {}
/// is_sync::<mcqio::QueuePair>();
/// ```
///
/// A read or write larger than the controller's MDTS (or
/// [`crate::ControllerOptions::max_transfer`], or 65536 blocks) is split
/// into child commands, one queue slot each, and completes **once**: one
/// [`Completion`](crate::core::io::Completion) with the caller's tag, the first error any child reported
/// (else success), and the buffer, handed back only after every child
/// finished. Splitting is all or nothing: with fewer free slots than
/// children it is refused with [`SubmitErrorKind::QueueFull`] (buffer handed
/// back, nothing sent), and a transfer needing more children than
/// [`depth`](Self::depth) is [`SubmitErrorKind::TransferTooLarge`]. Children
/// count in [`outstanding`](Self::outstanding) and
/// [`QpairStats::submitted`], and each one appears in
/// [`check_timeouts`](Self::check_timeouts) under the caller's tag.
///
/// Dropping a queue pair deletes its SQ then CQ on the controller; buffers of
/// commands still in flight are dropped after the deletion (so the device
/// cannot write to them any more). Use [`QueuePair::close`] to get every
/// outstanding command back as a completion instead. If the deletion fails,
/// or the controller failed and could not be disabled, the device may still
/// access the queue's memory: its rings, PRP list pages and in-flight
/// buffers are then leaked, never freed
/// ([`Controller::leaked_bytes`]).
///
/// Timeouts ([`QpairOptions::io_timeout`](crate::nvme::QpairOptions::io_timeout)), controller resets and
/// controller failures are handled inside [`poll`](Self::poll): see
/// [`TimeoutPolicy`](crate::TimeoutPolicy) and [the controller docs](crate::nvme::pcie::controller#reset-and-failure).
/// After a reset the queue pair re-creates its queues by itself; commands
/// that were outstanding complete with [`IoError::AbortedByReset`](crate::core::io::IoError::AbortedByReset).
pub struct QueuePair<B: IoBuf = DmaBuf> {
    // The rings and the PRP pages are dropped by hand in `Drop` — or
    // leaked, while the device may still access them (`device_may_access`).
    sq: ManuallyDrop<SubQueue>,
    cq: ManuallyDrop<CompQueue>,
    /// The state and lifecycle every wire shares (`core::qpair`).
    eng: Engine<B, SplitChild>,
    /// The PRP list pages of every slot (in `prp_mem`).
    prp: PrpLists,
    ns: Box<[(u32, NsGeom)]>,
    /// `ns[0]`, or NSID 0 (never valid, and `unsplit` 0) without
    /// namespaces: the hot path's namespace, without the table's look-up.
    first_ns: (u32, NsGeom),
    /// Consumed CQEs before the CQ head doorbell is written (see
    /// `CompQueue::flush_lazy`); at most `entries - 1`.
    cq_head_batch: u16,
    /// The CQ head doorbell is written at the next ring, after the SQ tail
    /// doorbell, instead of at the end of the poll that consumed the
    /// entries (see [`create::ring_entries`]).
    cq_head_after_sq: bool,
    oncs: u16,
    space: Arc<DmaSpace>,
    /// `B::space_key(&space)`, for the hot path's buffer check
    /// (`IoBuf::usable_in`).
    space_key: u64,
    qid: u16,
    /// How far closing (or dropping) got; see [`Teardown`].
    teardown: Teardown,
    prp_mem: ManuallyDrop<DmaRegion>,
    ctrl: Arc<Controller>,
    _not_sync: PhantomData<Cell<()>>,
}

impl<B: IoBuf> std::fmt::Debug for QueuePair<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.qid)
            .field("depth", &self.eng.trackers.depth())
            .field("outstanding", &self.eng.trackers.outstanding())
            .field("failed", &self.eng.stopped)
            .finish_non_exhaustive()
    }
}

/// How far deleting the queues got while closing (or dropping). Each step
/// is recorded as soon as it is done, so that a panic in the application's
/// callback leaves a state that `Drop` resumes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Teardown {
    /// In use (or a reset removed the queues: `Engine::queue_absent`).
    Live,
    /// Delete I/O SQ succeeded; the CQ still exists.
    SqDeleted,
    /// Both queues deleted: the device touches none of the queue's memory.
    Deleted,
}

// SAFETY: every raw pointer in a QueuePair (rings, PRP pages, doorbells)
// points into memory this value owns or keeps alive (its DmaRegions, the BAR
// via `ctrl`); the pair is used through `&mut self` by one thread at a time,
// so moving it to another thread is sound if its buffers can move (`B: Send`).
unsafe impl<B: IoBuf> Send for QueuePair<B> {}

impl<B: IoBuf> QueuePair<B> {
    /// The queue id (1-based; 0 is the admin queue).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The controller this pair belongs to.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    /// Commands that may be outstanding at once.
    pub fn depth(&self) -> usize {
        self.eng.depth()
    }

    /// Commands submitted and not yet completed (each child of a split
    /// transfer counts).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.eng.outstanding(0)
    }

    /// Whether a submission now would fail with [`SubmitErrorKind::QueueFull`]
    /// (a transfer split into `n` child commands needs `n` free slots).
    #[inline]
    pub fn is_full(&self) -> bool {
        self.eng.trackers.is_full()
    }

    /// Largest transfer per command, in bytes. Larger reads and writes are
    /// split into several commands (see the type's docs).
    pub fn max_transfer(&self) -> u64 {
        self.eng.max_xfer
    }

    /// Counters.
    pub fn stats(&self) -> QpairStats {
        QpairStats {
            submitted: self.eng.submitted,
            completed: self.eng.completed,
            stale_completions: self.eng.trackers.stale,
            sq_doorbell_writes: self.sq.db.mmio_writes,
            sq_doorbell_skipped: self.sq.db.mmio_skipped,
            cq_doorbell_writes: self.cq.db.mmio_writes,
            cq_doorbell_skipped: self.cq.db.mmio_skipped,
            timeouts: self.eng.timeouts.stats.timeouts,
            aborts_sent: self.eng.timeouts.stats.aborts_sent,
            timed_out: self.eng.timeouts.stats.timed_out,
            resets_requested: self.eng.timeouts.stats.resets_requested,
            aborted_by_reset: self.eng.rstats.aborted_by_reset,
            failed_by_controller: self.eng.rstats.failed_by_controller,
            recoveries: self.eng.rstats.recoveries,
        }
    }

    /// The counters every wire keeps, in the type shared with UFS
    /// ([`crate::QueueCounters`]).
    pub fn counters(&self) -> crate::core::qpair::QueueCounters {
        self.all_counters()
    }

    /// Namespaces numbered 1..=n (the usual case) are found at index
    /// `nsid - 1` with one compare; sparse ones by binary search.
    #[inline]
    fn geom(&self, nsid: u32) -> Option<NsGeom> {
        match self.ns.get(nsid.wrapping_sub(1) as usize) {
            Some(&(id, g)) if id == nsid => Some(g),
            _ => self.geom_sparse(nsid),
        }
    }

    #[cold]
    fn geom_sparse(&self, nsid: u32) -> Option<NsGeom> {
        self.ns
            .binary_search_by_key(&nsid, |e| e.0)
            .ok()
            .map(|i| self.ns[i].1)
    }

    /// Validate a command's namespace and LBA range. Every data command
    /// passes here first, so this is also where an idle queue reads the
    /// clock (see [`stamp_if_idle`](Self::stamp_if_idle)).
    #[inline]
    fn check_range(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<NsGeom, SubmitErrorKind> {
        self.stamp_if_idle();
        if self.eng.stopped.is_some() {
            return Err(SubmitErrorKind::ControllerFailed);
        }
        let Some(g) = self.geom(nsid) else {
            return Err(SubmitErrorKind::UnknownNamespace { nsid });
        };
        nvm::check_blocks(slba, nlb, g.nsze).map(|()| g)
    }

    /// The hot submission's check of a read or write: the namespace, a
    /// count of 1 to `unsplit` blocks (no split, no metadata) and the LBA
    /// range; returns the command's byte count. `None` sends the command
    /// to the cold path (`submit_data_cold`), which checks everything one
    /// by one and gives the refusal its reason. The namespace is looked up
    /// by its index only (a sparse NSID takes the cold path) and read in
    /// place: returning its whole geometry copied it through the stack.
    #[inline(always)]
    fn check_unsplit(&mut self, nsid: u32, slba: u64, nlb: u32) -> Option<u64> {
        // The idle queue's clock read is `Engine::reserve`'s, in
        // `submit_one`, after these checks.
        if self.eng.stopped.is_some() {
            return None;
        }
        // The queue's first namespace from its own field (one compare
        // instead of the table's bounds check, load and compare, issue
        // 28); another by its index in the table.
        let g = if nsid == self.first_ns.0 {
            &self.first_ns.1
        } else {
            match self.ns.get(nsid.wrapping_sub(1) as usize) {
                Some((id, g)) if *id == nsid => g,
                _ => return None,
            }
        };
        if nlb.wrapping_sub(1) >= g.unsplit {
            return None;
        }
        // `1 <= nlb <= unsplit <= nsze` (see `unsplit`): no wrap, and
        // `slba + nlb <= nsze` without computing the sum.
        if slba > g.nsze - u64::from(nlb) {
            return None;
        }
        Some(u64::from(nlb) << g.lba_shift)
    }

    /// A command about to be armed: on an idle queue, read the clock (see
    /// `Timeouts::stamp_if_idle`).
    #[inline(always)]
    fn stamp_if_idle(&mut self) {
        self.eng.stamp_if_idle(0);
    }
}

#[cfg(test)]
mod tests {
    use super::create::CQ_HEAD_BATCH;
    use super::*;
    use crate::nvme::host::QpairOptions;
    use mcqio_vfio::DmaDir;
    use std::time::Duration;

    /// An idle queue pair (nothing outstanding, nothing completed) polled
    /// in a loop must not read the clock on every poll: nothing can time
    /// out, and the clock is read when a command arrives on an idle queue.
    /// It did (an empty poll cost 28 ns idle against 5 ns with a command
    /// outstanding in `benches/benches/ufs_poll.rs`).
    #[test]
    fn an_idle_poll_does_not_read_the_clock() {
        let fake =
            mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
        let backend: Arc<dyn mcqio_vfio::Backend> = fake;
        let ctrl = Controller::new(backend, Default::default()).expect("bring-up");
        let mut qp = ctrl.create_qpair(QpairOptions::default()).expect("qpair");
        let before = qp.eng.timeouts.ticks;
        for _ in 0..1000 {
            assert_eq!(qp.poll(32, |_| {}).expect("poll"), 0);
        }
        assert_eq!(qp.eng.timeouts.ticks, before, "clock reads by idle polls");
        // A completion still reads it (its poll stamps the queue's clock).
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf");
        qp.read(1, 0, 8, buf, 1).expect("read");
        qp.submit();
        let mut n = 0;
        while n == 0 {
            n = qp.poll(32, |c| assert!(c.result.is_ok())).expect("poll");
        }
        assert!(qp.eng.timeouts.ticks > before);
    }

    /// A backend that records every doorbell store's offset before the
    /// fake sees it.
    struct Recorder {
        inner: Arc<mcqio_fixtures::FakeController>,
        hook: Arc<RecordingHook>,
    }

    struct RecordingHook {
        inner: Option<Arc<dyn mcqio_vfio::DoorbellHook>>,
        log: std::sync::Mutex<Vec<usize>>,
    }

    impl mcqio_vfio::DoorbellHook for RecordingHook {
        fn rung(&self, offset: usize, value: u32) {
            self.log.lock().unwrap().push(offset);
            if let Some(h) = &self.inner {
                h.rung(offset, value);
            }
        }
    }

    impl mcqio_vfio::Backend for Recorder {
        fn regs(&self) -> &dyn mcqio_vfio::Mmio {
            self.inner.regs()
        }
        fn dma(&self) -> &Arc<DmaSpace> {
            self.inner.dma()
        }
        fn doorbell_hook(&self) -> Option<Arc<dyn mcqio_vfio::DoorbellHook>> {
            Some(self.hook.clone())
        }
        fn name(&self) -> String {
            "recorder".into()
        }
    }

    /// The CQ head a poll consumed is written after the SQ tail
    /// of the commands queued next, so a resubmission reaches the
    /// controller one doorbell store sooner. In a QEMU TCG guest the store
    /// between a completion and the next submission took a median 3 µs of
    /// the 7 µs from the CQ head doorbell to the next SQ tail doorbell at
    /// QD1 (trace of QEMU's NVMe model), where libvfn's perf stores the
    /// tail right after the head. Before, the poll stored the head itself.
    #[test]
    fn a_resubmission_rings_the_sq_tail_before_the_cq_head() {
        use mcqio_vfio::Backend as _;
        let fake =
            mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
        let hook = Arc::new(RecordingHook {
            inner: fake.doorbell_hook(),
            log: std::sync::Mutex::new(Vec::new()),
        });
        let backend: Arc<dyn mcqio_vfio::Backend> = Arc::new(Recorder {
            inner: fake.clone(),
            hook: hook.clone(),
        });
        let ctrl = Controller::new(backend, Default::default()).expect("bring-up");
        let opts = QpairOptions {
            depth: 1,
            ..QpairOptions::default()
        };
        let mut qp = ctrl.create_qpair(opts).expect("qpair");
        let (sq_tail, cq_head) = (
            fake.doorbell_offset(qp.qid, false),
            fake.doorbell_offset(qp.qid, true),
        );
        let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf"));
        let mut order = Vec::new();
        for i in 0..100u64 {
            hook.log.lock().unwrap().clear();
            qp.read(1, i * 8, 8, buf.take().expect("buffer back"), i)
                .expect("read");
            qp.submit();
            while qp.poll(1, |c| buf = c.buf).expect("poll") == 0 {}
            order.push(
                hook.log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|&&o| o == sq_tail || o == cq_head)
                    .map(|&o| if o == sq_tail { "sq" } else { "cq" })
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        // Every I/O: its tail; after each 32nd completion, the next I/O's
        // tail and then the head of the 32 consumed before it; never a head
        // inside the poll (nor before a tail).
        for (i, o) in order.iter().enumerate() {
            let want = if i > 0 && i % usize::from(CQ_HEAD_BATCH) == 0 {
                "sq cq"
            } else {
                "sq"
            };
            assert_eq!(o, want, "I/O {i}: {order:?}");
        }
        assert_eq!(fake.stats().cq_full, 0);
    }

    /// The CQ head doorbell is written lazily (once
    /// `cq_head_batch` entries were consumed), so up to `cq_head_batch - 1`
    /// consumed entries stay unreleased. On rings of `depth + 1` entries a
    /// controller then found the CQ full whenever the host resubmitted
    /// what it had just reaped — and held the new commands back until a
    /// later poll wrote the head. The rings now have room for both.
    #[test]
    fn the_controller_never_finds_the_cq_full() {
        for depth in [1u16, 2, 4, 16, 31, 32, 128] {
            let fake = mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync())
                .expect("fake");
            let backend: Arc<dyn mcqio_vfio::Backend> = fake.clone();
            let ctrl = Controller::new(backend, Default::default()).expect("bring-up");
            let opts = QpairOptions {
                depth,
                ..QpairOptions::default()
            };
            let mut qp = ctrl.create_qpair(opts).expect("qpair");
            let mut free: Vec<DmaBuf> = (0..depth)
                .map(|_| ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf"))
                .collect();
            // Keep the queue full, reaping one or a few completions per poll
            // and resubmitting them at once.
            for i in 0..40 * usize::from(depth) {
                while let Some(b) = free.pop() {
                    qp.read(1, (i % 64) as u64 * 8, 8, b, 1).expect("read");
                }
                qp.submit();
                qp.poll(1 + i % 3, |c| free.push(c.buf.expect("buffer back")))
                    .expect("poll");
            }
            while qp.outstanding() > 0 {
                qp.poll(usize::MAX, |_| {}).expect("poll");
            }
            assert_eq!(
                fake.stats().cq_full,
                0,
                "depth {depth}: the CQ was found full"
            );
        }
    }

    /// The shared counters carry the wire's doorbell stores and
    /// the I/O path's register loads (NVMe: only the CSTS health look every
    /// `HEALTH_CHECK_INTERVAL` empty polls), so a tool can report them per
    /// I/O on any wire.
    #[test]
    fn the_counters_carry_doorbells_and_register_reads() {
        let fake =
            mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
        let backend: Arc<dyn mcqio_vfio::Backend> = fake.clone();
        let ctrl = Controller::new(backend, Default::default()).expect("bring-up");
        let opts = QpairOptions {
            depth: 1,
            ..QpairOptions::default()
        };
        let mut qp = ctrl.create_qpair(opts).expect("qpair");
        let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf"));
        // `n` reads one after the other (QD1).
        let mut reads = |qp: &mut QueuePair, n: usize| {
            for _ in 0..n {
                qp.read(1, 0, 8, buf.take().expect("buf back"), 1)
                    .expect("read");
                while qp.poll(1, |c| buf = c.buf).expect("poll") == 0 {}
            }
        };
        reads(&mut qp, 10);
        qp.poll(1, |_| {}).expect("poll");
        let c = qp.counters();
        let s = qp.stats();
        assert_eq!(
            c.doorbell_writes,
            s.sq_doorbell_writes + s.cq_doorbell_writes
        );
        // QD1: one SQ tail store per I/O; the CQ head waits for 32
        // consumed entries.
        assert_eq!((s.sq_doorbell_writes, s.cq_doorbell_writes), (10, 0));
        reads(&mut qp, 30);
        // The 32nd consumed entry's head goes out at the next ring.
        qp.poll(1, |_| {}).expect("poll");
        let s = qp.stats();
        assert_eq!((s.sq_doorbell_writes, s.cq_doorbell_writes), (40, 1));
        assert_eq!(c.register_reads, 0, "no register load on the I/O path");
        // A command the device holds back: empty polls look at CSTS once
        // per HEALTH_CHECK_INTERVAL.
        let mut qp2 = ctrl.create_qpair(QpairOptions::default()).expect("qpair");
        let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf");
        fake.faults().inject_next(
            Some(qp2.qid()),
            None,
            mcqio_fixtures::Fault::Delay(Duration::from_secs(3600)),
        );
        qp2.read(1, 0, 8, b, 2).expect("read");
        qp2.submit();
        for _ in 0..3 * HEALTH_CHECK_INTERVAL + 5 {
            assert_eq!(qp2.poll(1, |_| {}).expect("poll"), 0);
        }
        assert_eq!(qp2.counters().register_reads, 3);
    }

    /// Every poll that completed something read the coarse clock
    /// with a system-clock call (`Instant`) — at QD1 one per I/O, a real
    /// system call in a guest without a trusted TSC. Once the CPU counter
    /// is calibrated, a busy queue calls the system clock at most about
    /// twice per millisecond however many polls complete something.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn a_busy_queue_calls_the_system_clock_at_most_twice_a_millisecond() {
        let fake =
            mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig::sync()).expect("fake");
        let backend: Arc<dyn mcqio_vfio::Backend> = fake;
        let ctrl = Controller::new(backend, Default::default()).expect("bring-up");
        let mut qp = ctrl.create_qpair(QpairOptions::default()).expect("qpair");
        let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf"));
        let mut one = |qp: &mut QueuePair| {
            qp.read(1, 0, 8, buf.take().expect("buf back"), 1)
                .expect("read");
            while qp.poll(1, |c| buf = c.buf).expect("poll") == 0 {}
        };
        // Past the calibration (system-clock time, however slow the machine).
        let t = std::time::Instant::now();
        while t.elapsed() < crate::core::clock::CALIBRATION + Duration::from_millis(2) {
            one(&mut qp);
        }
        let (reads, ticks, t) = (
            qp.counters().system_clock_reads,
            qp.eng.timeouts.ticks,
            std::time::Instant::now(),
        );
        for _ in 0..20_000 {
            one(&mut qp);
        }
        let ms = t.elapsed().as_millis() as u64;
        let ticks = qp.eng.timeouts.ticks - ticks;
        let reads = qp.counters().system_clock_reads - reads;
        assert!(
            ticks >= 20_000,
            "each completing poll reads the coarse clock ({ticks})"
        );
        assert!(
            reads <= 2 * ms + 2,
            "{reads} system-clock calls in {ms} ms of {ticks} clock readings"
        );
    }
}
