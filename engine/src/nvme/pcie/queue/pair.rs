//! [`QueuePair`]: one submission/completion queue pair, owned by one thread.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::{DmaDir, DmaRegion, DmaSpace};

#[path = "split.rs"]
mod split;

use self::split::Splits;
use super::cq::CompQueue;
use super::doorbell::Doorbell;
use super::sq::SubQueue;
use super::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::core::block::{self, BlockQueue, Blocking};
use crate::core::deliver::{self, drain_all};
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::timeout::{
    self, Expired, Outstanding, TimeoutActions, Timeouts, IDLE_CLOCK_INTERVAL,
};
use crate::core::tracker::Trackers;
use crate::nvme::ctrl::{state, Controller, TimeoutPolicy};
use crate::nvme::spec::regs;
use crate::nvme::spec::sqe::{
    Abort, Command, DatasetManagement, DsmRange, Flush, Read, Write, WriteZeroes, DSM_MAX_RANGES,
    MAX_NLB,
};
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::{Cqe, NvmeStatus, Sqe};
use crate::{Error, Result};

/// The largest queue depth (outstanding commands per queue pair).
pub const MAX_DEPTH: u16 = 4096;
/// PRP entries per list page.
const PRP_PER_PAGE: usize = (PAGE_SIZE / 8) as usize;
/// Outstanding commands (this one included) above which SQEs are written
/// with streaming stores (see `SubQueue::push`).
const STREAM_MIN_OUTSTANDING: usize = 4;
/// Empty polls (with commands outstanding) between CSTS health checks.
const HEALTH_CHECK_INTERVAL: u32 = 4096;
/// Most PRP list pages reserved per command slot: 64 pages chain
/// `64 * 511 + 1` entries, enough for 127 MiB per command. A larger
/// per-command limit (`ControllerOptions::max_transfer` on a controller
/// without MDTS) is refused at queue creation instead of reserving (or
/// overflowing the size of) that much DMA memory per slot.
const MAX_PRP_LIST_PAGES: u64 = 64;

/// Options for [`Controller::create_qpair`].
#[derive(Clone, Debug)]
pub struct QpairOptions {
    /// Commands that may be outstanding at once (1..=4096). The rings get
    /// `depth + 1` entries, so neither the SQ nor the CQ can ever overflow.
    pub depth: u16,
    /// Most completions one [`QueuePair::poll`] delivers (0: `depth`).
    pub max_completions_per_poll: usize,
    /// How long blocking calls wait for their completion before returning
    /// [`IoError::TimedOut`].
    pub blocking_timeout: Duration,
    /// Per-command timeout for this queue's I/O (`None`: never time out).
    /// Detected while polling — no timer thread: [`QueuePair::poll`] scans
    /// the outstanding commands once the queue's coarse clock (read once per
    /// poll that completes something, every 64 empty polls while commands
    /// are outstanding, and when a command arrives on an idle queue) has
    /// moved a quarter of the timeout since the last scan, so a command is
    /// acted on about 1 to 1.25 timeouts after submission, as measured on
    /// that clock (and only while the queue is polled). A command is stamped
    /// with the clock's last reading: on a busy queue that is the last poll,
    /// so leave a busy queue unpolled for no longer than the timeout. A
    /// command whose completion is already posted in the CQ (a slow
    /// callback, a small `max`) is never taken for timed out. The admin
    /// queue has its own [`crate::ControllerOptions::admin_timeout`].
    pub io_timeout: Option<Duration>,
    /// What a timeout does; see [`TimeoutPolicy`].
    pub timeout_policy: TimeoutPolicy,
    /// How buffers get their device addresses: premapped [`DmaBuf`]s
    /// ([`Controller::create_qpair`], the default) or application buffers
    /// mapped per I/O in strict or lazy mode
    /// ([`Controller::create_mapped_qpair`]); see [`crate::core::mapped`].
    pub mapping: crate::MappingMode,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            depth: 256,
            max_completions_per_poll: 0,
            blocking_timeout: Duration::from_secs(30),
            io_timeout: Some(Duration::from_secs(30)),
            timeout_policy: TimeoutPolicy::Abort,
            mapping: crate::MappingMode::Premapped,
        }
    }
}

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
    /// Timed-out commands completed as [`IoError::TimedOut`] (aborted).
    pub timed_out: u64,
    /// Controller resets this queue's timeout policy asked for.
    pub resets_requested: u64,
    /// Commands completed with [`IoError::AbortedByReset`].
    pub aborted_by_reset: u64,
    /// Commands completed with [`IoError::ControllerFailed`].
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
/// [`Completion`] with the caller's tag, the first error any child reported
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
/// ([`Controller::leaked_queue_bytes`]).
///
/// Timeouts ([`QpairOptions::io_timeout`]), controller resets and
/// controller failures are handled inside [`poll`](Self::poll): see
/// [`TimeoutPolicy`] and [the controller docs](crate::nvme::ctrl#reset-and-failure).
/// After a reset the queue pair re-creates its queues by itself; commands
/// that were outstanding complete with [`IoError::AbortedByReset`].
pub struct QueuePair<B: IoBuf = DmaBuf> {
    // The rings and the PRP pages are dropped by hand in `Drop` — or
    // leaked, while the device may still access them (`device_may_access`).
    sq: ManuallyDrop<SubQueue>,
    cq: ManuallyDrop<CompQueue>,
    trackers: Trackers<B>,
    /// Transfers split into child commands (`split.rs`).
    splits: Splits<B>,
    prp_ptr: NonNull<u64>,
    prp_iova: u64,
    prp_pages: usize,
    ns: Box<[(u32, NsGeom)]>,
    max_xfer: u64,
    max_per_poll: usize,
    /// Consumed CQEs before the CQ head doorbell is written (see
    /// `CompQueue::flush_lazy`); at most `entries - 1`.
    cq_head_batch: u16,
    oncs: u16,
    space: Arc<DmaSpace>,
    qid: u16,
    failed: Option<Error0>,
    /// Controller state word this queue's rings belong to.
    seen_state: u64,
    /// Timeout policy, coarse clock and scan schedule (the shared core's).
    timeouts: Timeouts,
    rstats: RecoveryStats,
    idle_polls: u32,
    submitted: u64,
    completed: u64,
    blocking_timeout: Duration,
    bounce: Option<DmaBuf>,
    /// How far closing (or dropping) got; see [`Teardown`].
    teardown: Teardown,
    /// A reset removed the queues and they were not re-created (closing).
    queue_absent: bool,
    /// The controller may still read or write the rings, the PRP pages (and
    /// the buffers of commands in flight) although this queue gave up on
    /// them: a failed controller that could not be disabled, or a queue
    /// whose deletion failed. Then they are leaked, never freed.
    device_may_access: bool,
    prp_mem: ManuallyDrop<DmaRegion>,
    ctrl: Arc<Controller>,
    _not_sync: PhantomData<Cell<()>>,
}

impl<B: IoBuf> std::fmt::Debug for QueuePair<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.qid)
            .field("depth", &self.trackers.depth())
            .field("outstanding", &self.trackers.outstanding())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// How far [`QueuePair::close`] (or drop) got. Each step is recorded as
/// soon as it is done, so that a panic in the application's callback
/// leaves a state that `Drop` resumes from: the queues are deleted, the
/// remaining commands end and the queue id is returned all the same.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Teardown {
    /// In use (or a reset removed the queues: `queue_absent`).
    Live,
    /// Delete I/O SQ succeeded; the CQ still exists.
    SqDeleted,
    /// Both queues deleted: the device touches none of the queue's memory.
    Deleted,
    /// Every command ended and the queue id was handled.
    Done,
}

/// Why a queue stopped accepting commands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Error0 {
    Fatal,
    Gone,
    /// The queues could not be re-created after a reset.
    Lost,
}

/// Counters of the cold recovery paths.
#[derive(Copy, Clone, Debug, Default)]
struct RecoveryStats {
    aborted_by_reset: u64,
    failed_by_controller: u64,
    recoveries: u64,
}

/// Status of a command the controller aborted at our request.
const ABORT_REQUESTED: NvmeStatus = NvmeStatus::new(sct::GENERIC, generic::ABORT_REQUESTED);

// SAFETY: every raw pointer in a QueuePair (rings, PRP pages, doorbells)
// points into memory this value owns or keeps alive (its DmaRegions, the BAR
// via `ctrl`); the pair is used through `&mut self` by one thread at a time,
// so moving it to another thread is sound if its buffers can move (`B: Send`).
unsafe impl<B: IoBuf> Send for QueuePair<B> {}

struct PrpWriter {
    list: *mut u64,
    list_iova: u64,
    pages: usize,
    page: usize,
    idx: usize,
    count: usize,
    first: u64,
}

impl PrpWriter {
    #[inline]
    fn push(&mut self, addr: u64) -> Result<(), ()> {
        if self.idx == PRP_PER_PAGE {
            // The page is full: its last slot becomes a pointer to the next
            // list page, and the entry that was there moves to the next page.
            if self.page + 1 >= self.pages {
                return Err(());
            }
            let last_at = self.page * PRP_PER_PAGE + PRP_PER_PAGE - 1;
            let next_at = (self.page + 1) * PRP_PER_PAGE;
            // SAFETY: both indices are inside this slot's `pages` list pages,
            // which are live DMA memory owned by the queue; the device does
            // not read them before the doorbell. Volatile, no reference.
            unsafe {
                let last = self.list.add(last_at).read_volatile();
                self.list.add(next_at).write_volatile(last);
                self.list
                    .add(last_at)
                    .write_volatile(self.list_iova + ((self.page as u64 + 1) << PAGE_SHIFT));
            }
            self.page += 1;
            self.idx = 1;
        }
        // SAFETY: `page < pages` and `idx < PRP_PER_PAGE`: inside the slot's
        // list pages (see above).
        unsafe {
            self.list
                .add(self.page * PRP_PER_PAGE + self.idx)
                .write_volatile(addr)
        };
        if self.count == 0 {
            self.first = addr;
        }
        self.idx += 1;
        self.count += 1;
        Ok(())
    }

    /// PRP2: nothing, the single second page, or the list.
    #[inline]
    fn finish(&self) -> u64 {
        match self.count {
            0 => 0,
            1 => self.first,
            _ => self.list_iova,
        }
    }
}

impl<B: IoBuf> QueuePair<B> {
    pub(crate) fn create(ctrl: &Arc<Controller>, opts: &QpairOptions) -> Result<Self> {
        if opts.depth == 0 || opts.depth > MAX_DEPTH {
            return Err(Error::InvalidOption(format!(
                "queue depth {} is outside 1..={MAX_DEPTH}",
                opts.depth
            )));
        }
        let entries = opts.depth as u32 + 1;
        let mqes = ctrl.cap().max_queue_entries();
        if entries > mqes {
            return Err(Error::InvalidOption(format!(
                "queue depth {} needs {entries} ring entries but the controller supports at most {mqes} (CAP.MQES); use depth <= {}",
                opts.depth,
                mqes - 1
            )));
        }
        let entries = entries as u16;
        let qid = ctrl.alloc_qid()?;
        match Self::create_with_qid(ctrl, opts, qid, entries) {
            Ok(qp) => Ok(qp),
            Err((e, queue_left)) => {
                // A queue the controller may still have keeps its id.
                if !queue_left {
                    ctrl.release_qid(qid);
                }
                Err(e)
            }
        }
    }

    /// `Err((e, true))`: the controller may still have a queue `qid` on
    /// the rings, which were leaked.
    fn create_with_qid(
        ctrl: &Arc<Controller>,
        opts: &QpairOptions,
        qid: u16,
        entries: u16,
    ) -> Result<Self, (Error, bool)> {
        // Errors before the Create commands leave nothing on the controller.
        let none_left = |e: Error| (e, false);
        let dstrd = ctrl.cap().dstrd();
        let bar_len = ctrl.backend().regs().len();
        if regs::cq_head_doorbell(qid, dstrd) + 4 > bar_len {
            return Err(none_left(Error::InvalidOption(format!(
                "queue {qid}'s doorbell lies beyond the {bar_len}-byte BAR; the controller granted more queues than its BAR has doorbells for"
            ))));
        }
        let space = Arc::clone(ctrl.dma());
        let max_xfer = ctrl.max_transfer();
        let prp_pages = prp_pages_per_slot(ctrl, max_xfer).map_err(none_left)?;
        let prp_bytes = prp_region_len(opts.depth, prp_pages, space.granule())
            .ok_or_else(|| {
                Error::InvalidOption(format!(
                    "{} PRP list pages for each of {} commands do not fit in memory",
                    prp_pages, opts.depth
                ))
            })
            .map_err(none_left)?;
        let alloc = |len: usize, dir| space.alloc(len, dir).map_err(|e| none_left(e.into()));
        let cq_mem = alloc(entries as usize * size_of::<Cqe>(), DmaDir::Bidirectional)?;
        let sq_mem = alloc(entries as usize * size_of::<Sqe>(), DmaDir::ToDevice)?;
        let prp_mem = alloc(prp_bytes, DmaDir::ToDevice)?;
        if prp_mem.iova().raw() & PAGE_MASK != 0 {
            return Err(none_left(Error::InvalidOption(format!(
                "the DMA space placed the PRP lists at IOVA {}, not on a {PAGE_SIZE}-byte controller page",
                prp_mem.iova()
            ))));
        }
        let (sq_shadow, cq_shadow) = ctrl.shadow_slots(qid);
        let hook = ctrl.backend().doorbell_hook();
        // SAFETY: doorbell offsets computed from CAP.DSTRD for a granted qid
        // lie inside BAR0, which `ctrl` (kept alive by this queue) maps;
        // shadow slots are inside the controller's shadow pages.
        let (sq_db, cq_db) = unsafe {
            (
                Doorbell::new(
                    ctrl.bar(),
                    regs::sq_tail_doorbell(qid, dstrd),
                    sq_shadow,
                    false,
                    hook.clone(),
                ),
                Doorbell::new(
                    ctrl.bar(),
                    regs::cq_head_doorbell(qid, dstrd),
                    cq_shadow,
                    false,
                    hook,
                ),
            )
        };
        let cq = CompQueue::new(cq_mem, entries, cq_db);
        let sq = SubQueue::new(sq_mem, entries, sq_db);

        let seen_state = match ctrl.create_io_queues(
            qid,
            entries,
            cq.region().iova().raw(),
            sq.region().iova().raw(),
        ) {
            Ok(s) => s,
            Err((e, false)) => return Err((e, false)),
            Err((e, true)) => {
                // The controller may have the queues on these rings.
                let bytes = sq.region().len() + cq.region().len();
                log::error!("queue {qid}: creating the queues failed ({e}) and they may exist on the controller; leaking their {bytes}-byte rings");
                ctrl.note_leak(bytes as u64);
                std::mem::forget(sq);
                std::mem::forget(cq);
                return Err((e, true));
            }
        };

        // Sorted by NSID (as the controller keeps them): NSIDs may be
        // sparse (any value up to FFFFFFFEh), so no table indexed by NSID.
        let ns: Vec<(u32, NsGeom)> = ctrl
            .namespaces()
            .iter()
            .map(|n| {
                (
                    n.id,
                    NsGeom {
                        nsze: n.nsze,
                        lba_shift: n.lba_shift,
                        metadata: n.identify.metadata_size() > 0,
                    },
                )
            })
            .collect();
        let max_per_poll = match opts.max_completions_per_poll {
            0 => opts.depth as usize,
            n => n,
        };
        Ok(QueuePair {
            sq: ManuallyDrop::new(sq),
            cq: ManuallyDrop::new(cq),
            trackers: Trackers::new(opts.depth),
            splits: Splits::new(opts.depth),
            prp_ptr: prp_mem.as_ptr().cast(),
            prp_iova: prp_mem.iova().raw(),
            prp_pages,
            ns: ns.into_boxed_slice(),
            max_xfer,
            max_per_poll,
            cq_head_batch: (opts.depth / 4).clamp(1, 32),
            oncs: ctrl.identify().oncs,
            space,
            qid,
            failed: None,
            seen_state,
            timeouts: Timeouts::new(opts.io_timeout, opts.timeout_policy, opts.depth),
            rstats: RecoveryStats::default(),
            idle_polls: 0,
            submitted: 0,
            completed: 0,
            blocking_timeout: opts.blocking_timeout,
            bounce: None,
            teardown: Teardown::Live,
            queue_absent: false,
            device_may_access: false,
            prp_mem: ManuallyDrop::new(prp_mem),
            ctrl: Arc::clone(ctrl),
            _not_sync: PhantomData,
        })
    }

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
        self.trackers.depth()
    }

    /// Commands submitted and not yet completed (each child of a split
    /// transfer counts).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.trackers.outstanding()
    }

    /// Whether a submission now would fail with [`SubmitErrorKind::QueueFull`]
    /// (a transfer split into `n` child commands needs `n` free slots).
    #[inline]
    pub fn is_full(&self) -> bool {
        self.trackers.is_full()
    }

    /// Largest transfer per command, in bytes. Larger reads and writes are
    /// split into several commands (see the type's docs).
    pub fn max_transfer(&self) -> u64 {
        self.max_xfer
    }

    /// Counters.
    pub fn stats(&self) -> QpairStats {
        QpairStats {
            submitted: self.submitted,
            completed: self.completed,
            stale_completions: self.trackers.stale,
            sq_doorbell_writes: self.sq.db.mmio_writes,
            sq_doorbell_skipped: self.sq.db.mmio_skipped,
            cq_doorbell_writes: self.cq.db.mmio_writes,
            cq_doorbell_skipped: self.cq.db.mmio_skipped,
            timeouts: self.timeouts.stats.timeouts,
            aborts_sent: self.timeouts.stats.aborts_sent,
            timed_out: self.timeouts.stats.timed_out,
            resets_requested: self.timeouts.stats.resets_requested,
            aborted_by_reset: self.rstats.aborted_by_reset,
            failed_by_controller: self.rstats.failed_by_controller,
            recoveries: self.rstats.recoveries,
        }
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
    fn check_lba(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<NsGeom, SubmitErrorKind> {
        self.stamp_if_idle();
        if self.failed.is_some() {
            return Err(SubmitErrorKind::ControllerFailed);
        }
        let Some(g) = self.geom(nsid) else {
            return Err(SubmitErrorKind::UnknownNamespace { nsid });
        };
        if nlb == 0 {
            return Err(SubmitErrorKind::ZeroLength);
        }
        match slba.checked_add(nlb as u64) {
            Some(end) if end <= g.nsze => Ok(g),
            _ => Err(SubmitErrorKind::LbaOutOfRange {
                slba,
                nlb: nlb as u64,
                nsze: g.nsze,
            }),
        }
    }

    /// A command about to be armed: on an idle queue, read the clock (see
    /// `Timeouts::stamp_if_idle`).
    #[inline(always)]
    fn stamp_if_idle(&mut self) {
        self.timeouts.stamp_if_idle(self.trackers.outstanding());
    }

    /// Read `nlb` blocks from `slba` of namespace `nsid` into `buf`.
    ///
    /// The SQE is written to the ring; the doorbell is rung by
    /// [`submit`](Self::submit) or the next [`poll`](Self::poll).
    #[inline]
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        self.submit_read(Read::new(nsid, slba, nlb), buf, tag)
    }

    /// Write `nlb` blocks at `slba` of namespace `nsid` from `buf`.
    #[inline]
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        self.submit_write(Write::new(nsid, slba, nlb), buf, tag)
    }

    /// Submit a [`Read`] built with options (FUA, limited retry).
    #[inline]
    pub fn submit_read(&mut self, cmd: Read, buf: B, tag: u64) -> Result<(), SubmitError<B>> {
        self.submit_data(cmd.sqe(), cmd.nsid(), cmd.slba(), cmd.nlb(), buf, tag, true)
    }

    /// Submit a [`Write`] built with options (FUA, limited retry).
    #[inline]
    pub fn submit_write(&mut self, cmd: Write, buf: B, tag: u64) -> Result<(), SubmitError<B>> {
        self.submit_data(
            cmd.sqe(),
            cmd.nsid(),
            cmd.slba(),
            cmd.nlb(),
            buf,
            tag,
            false,
        )
    }

    // Always inlined into `read`/`write`: the call's register saves are
    // stores, and on a busy queue the submitting core waits on its store
    // buffer (SQE and doorbell lines shared with the device).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn submit_data(
        &mut self,
        sqe: Sqe,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
        device_writes: bool,
    ) -> Result<(), SubmitError<B>> {
        let g = match self.check_lba(nsid, slba, nlb) {
            Ok(g) => g,
            Err(kind) => return Err(SubmitError { kind, buf }),
        };
        if g.metadata {
            return Err(SubmitError {
                kind: SubmitErrorKind::Unsupported(
                    "data transfers on a namespace formatted with metadata",
                ),
                buf,
            });
        }
        if let Err(mapped) = buf.check_dir(device_writes) {
            let needs = if device_writes {
                "write into it (read command)"
            } else {
                "read from it (write command)"
            };
            return Err(SubmitError {
                kind: SubmitErrorKind::WrongDirection { mapped, needs },
                buf,
            });
        }
        if !buf.is_mapped_in(&self.space) {
            return Err(SubmitError {
                kind: SubmitErrorKind::NotDmaMapped,
                buf,
            });
        }
        let bytes = (nlb as u64) << g.lba_shift;
        if nlb > MAX_NLB || bytes > self.max_xfer {
            return self.submit_split(sqe, g.lba_shift, slba, nlb, buf, tag);
        }
        let Some(slot) = self.trackers.alloc() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        };
        let (prp1, prp2) = match self.build_prp(&buf, 0, bytes, slot) {
            Ok(p) => p,
            Err(kind) => {
                self.trackers.unreserve(slot);
                return Err(SubmitError { kind, buf });
            }
        };
        let cid = self.trackers.slot(slot).cid;
        let stream = self.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
        self.sq
            .push_with(sqe.with_cid(cid).with_prp(prp1, prp2), stream);
        self.trackers
            .arm(slot, tag, Some(buf), self.timeouts.now_ms);
        self.submitted += 1;
        Ok(())
    }

    #[inline]
    fn prp_writer(&self, slot: u16) -> PrpWriter {
        let off = slot as usize * self.prp_pages * PRP_PER_PAGE;
        PrpWriter {
            // SAFETY: `slot < depth` and the PRP region holds `depth *
            // prp_pages` pages, so the slot's first list page is inside it.
            list: unsafe { self.prp_ptr.as_ptr().add(off) },
            list_iova: self.prp_iova + ((slot as u64 * self.prp_pages as u64) << PAGE_SHIFT),
            pages: self.prp_pages,
            page: 0,
            idx: 0,
            count: 0,
            first: 0,
        }
    }

    /// PRP1/PRP2 for `bytes` of `buf` starting `off` bytes into it, writing
    /// a PRP list into `slot`'s pages when more than two pages are touched.
    ///
    /// Empty segments are skipped wherever they sit: they describe no
    /// memory, so their IOVA (often the start or end of some other buffer)
    /// must never reach the device. The first segment that carries data may
    /// start at any 4-byte aligned IOVA; every later one must start on a
    /// page, and every one but the last must end on a page.
    #[inline(always)]
    fn build_prp(
        &self,
        buf: &B,
        off: u64,
        bytes: u64,
        slot: u16,
    ) -> Result<(u64, u64), SubmitErrorKind> {
        let nseg = buf.segment_count();
        if nseg == 1 {
            let seg0 = buf.segment(0);
            let len = seg0.len as u64;
            if len < off || len - off < bytes {
                return Err(SubmitErrorKind::BufferTooSmall {
                    needed: off + bytes,
                    available: len,
                });
            }
            let start = seg0.iova.raw() + off;
            if start & 3 != 0 {
                return Err(SubmitErrorKind::Misaligned {
                    segment: 0,
                    iova: seg0.iova,
                });
            }
            let first_room = PAGE_SIZE - (start & PAGE_MASK);
            if bytes <= first_room {
                return Ok((start, 0));
            }
            let next = start + first_room;
            let rest = bytes - first_room;
            if rest <= PAGE_SIZE {
                return Ok((start, next));
            }
            let count = (rest + PAGE_MASK) >> PAGE_SHIFT;
            let mut w = self.prp_writer(slot);
            for i in 0..count {
                w.push(next + (i << PAGE_SHIFT))
                    .map_err(|_| self.too_large(bytes))?;
            }
            return Ok((start, w.finish()));
        }
        self.build_prp_vectored(buf, off, bytes, slot)
    }

    /// [`build_prp`](Self::build_prp) for buffers of several segments.
    fn build_prp_vectored(
        &self,
        buf: &B,
        off: u64,
        bytes: u64,
        slot: u16,
    ) -> Result<(u64, u64), SubmitErrorKind> {
        let mut w = self.prp_writer(slot);
        let mut skip = off;
        let mut remaining = bytes;
        let mut prp1 = None;
        for i in 0..buf.segment_count() {
            if remaining == 0 {
                break;
            }
            let seg = buf.segment(i);
            let len = seg.len as u64;
            // Empty segments (and whole segments before `off`) carry no data.
            if len <= skip {
                skip -= len;
                continue;
            }
            let Some(s) = seg.iova.raw().checked_add(skip) else {
                return Err(SubmitErrorKind::Misaligned {
                    segment: i,
                    iova: seg.iova,
                });
            };
            let avail = len - skip;
            skip = 0;
            let take = avail.min(remaining);
            remaining -= take;
            let misaligned = Err(SubmitErrorKind::Misaligned {
                segment: i,
                iova: seg.iova,
            });
            // A data segment followed by more data must end on a page.
            if remaining > 0 && s.wrapping_add(avail) & PAGE_MASK != 0 {
                return misaligned;
            }
            let mut a = if prp1.is_none() {
                if s & 3 != 0 {
                    return misaligned;
                }
                prp1 = Some(s);
                (s & !PAGE_MASK) + PAGE_SIZE
            } else {
                if s & PAGE_MASK != 0 {
                    return misaligned;
                }
                s
            };
            while a < s + take {
                w.push(a).map_err(|_| self.too_large(bytes))?;
                a += PAGE_SIZE;
            }
        }
        match prp1 {
            Some(p1) if remaining == 0 => Ok((p1, w.finish())),
            _ => Err(SubmitErrorKind::BufferTooSmall {
                needed: off + bytes,
                available: buf.total_len() as u64,
            }),
        }
    }

    #[cold]
    fn too_large(&self, bytes: u64) -> SubmitErrorKind {
        SubmitErrorKind::TransferTooLarge {
            bytes,
            max: self.max_xfer,
        }
    }

    #[inline]
    fn submit_no_data(&mut self, sqe: Sqe, tag: u64) -> Result<(), SubmitError<()>> {
        self.stamp_if_idle();
        let Some(slot) = self.trackers.alloc() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf: (),
            });
        };
        let cid = self.trackers.slot(slot).cid;
        let stream = self.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
        self.sq.push_with(sqe.with_cid(cid), stream);
        self.trackers.arm(slot, tag, None, self.timeouts.now_ms);
        self.submitted += 1;
        Ok(())
    }

    /// Flush the volatile write cache of namespace `nsid`.
    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        if self.failed.is_some() {
            return err(SubmitErrorKind::ControllerFailed);
        }
        if self.geom(nsid).is_none() {
            return err(SubmitErrorKind::UnknownNamespace { nsid });
        }
        self.submit_no_data(Flush::new(nsid).sqe(), tag)
    }

    /// Write zeroes to `nlb` blocks from `slba` (no data buffer).
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        if let Err(k) = self.check_lba(nsid, slba, nlb) {
            return err(k);
        }
        if nlb > MAX_NLB {
            return err(SubmitErrorKind::TransferTooLarge {
                bytes: nlb as u64,
                max: MAX_NLB as u64,
            });
        }
        if self.oncs & crate::nvme::spec::identify::oncs::WRITE_ZEROES == 0 {
            return err(SubmitErrorKind::Unsupported("Write Zeroes (ONCS bit 3)"));
        }
        self.submit_no_data(WriteZeroes::new(nsid, slba, nlb).sqe(), tag)
    }

    /// Deallocate (TRIM) the `(slba, nlb)` ranges with one Dataset
    /// Management command. The range list goes into the command's
    /// pre-allocated page: no buffer needed.
    pub fn deallocate(
        &mut self,
        nsid: u32,
        ranges: &[(u64, u32)],
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        self.stamp_if_idle();
        if self.failed.is_some() {
            return err(SubmitErrorKind::ControllerFailed);
        }
        if self.geom(nsid).is_none() {
            return err(SubmitErrorKind::UnknownNamespace { nsid });
        }
        if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
            return err(SubmitErrorKind::BadRangeCount {
                count: ranges.len(),
            });
        }
        for &(slba, nlb) in ranges {
            if let Err(k) = self.check_lba(nsid, slba, nlb) {
                return err(k);
            }
        }
        if self.oncs & crate::nvme::spec::identify::oncs::DATASET_MANAGEMENT == 0 {
            return err(SubmitErrorKind::Unsupported(
                "Dataset Management (ONCS bit 2)",
            ));
        }
        let Some(slot) = self.trackers.alloc() else {
            return err(SubmitErrorKind::QueueFull);
        };
        let w = self.prp_writer(slot);
        let list = w.list.cast::<DsmRange>();
        for (i, &(slba, nlb)) in ranges.iter().enumerate() {
            // SAFETY: at most 256 ranges of 16 bytes: inside the slot's first
            // 4 KiB list page (live DMA memory owned by the queue, not read
            // by the device before the doorbell).
            unsafe {
                list.add(i).write_volatile(DsmRange {
                    cattr: 0,
                    nlb,
                    slba,
                })
            };
        }
        let cid = self.trackers.slot(slot).cid;
        let sqe = DatasetManagement::new(nsid, ranges.len() as u16)
            .deallocate()
            .sqe()
            .with_cid(cid)
            .with_prp(w.list_iova, 0);
        self.sq.push(sqe);
        self.trackers.arm(slot, tag, None, self.timeouts.now_ms);
        self.submitted += 1;
        Ok(())
    }

    /// Ring the SQ tail doorbell once for every command queued since the
    /// last ring. Returns whether the doorbell was rung: `false` when there
    /// was nothing to ring, when the queue failed, and also when the
    /// controller was reset or failed since this queue last looked — the
    /// reset deleted the queue, so its doorbell must not be written; the
    /// next [`poll`](Self::poll) completes the queued commands (with [`IoError::AbortedByReset`] or
    /// [`IoError::ControllerFailed`]) and re-creates the queue. One relaxed
    /// load per batch. A reset that starts between that load and the
    /// doorbell store is not caught: the store then reaches a controller
    /// that has no such queue (it ignores the store or reports an invalid
    /// doorbell write as an asynchronous event); no command is lost.
    #[inline]
    pub fn submit(&mut self) -> bool {
        if self.ctrl.state() != self.seen_state || self.failed.is_some() {
            return false;
        }
        self.sq.flush()
    }

    /// Ring pending submissions, then deliver up to `max` completions (and at
    /// most the queue's `max_completions_per_poll`) to `f`, then write the CQ
    /// head doorbell once. Returns how many completions were delivered.
    ///
    /// Also where recovery happens (cold paths, off the per-I/O path): a
    /// controller reset since the last poll completes every outstanding
    /// command ([`IoError::AbortedByReset`]) and re-creates the queues; the
    /// timeout scan runs when due ([`QpairOptions::io_timeout`]).
    ///
    /// `max` is honoured on every path, recovery included: `poll(0)`
    /// delivers nothing (it rings pending submissions), and the completions
    /// a reset or failure produces are spread over as many polls as `max`
    /// requires (the queue is re-created once they are all delivered).
    ///
    /// `Err` means the controller failed ([`Error::ControllerFatal`]) or
    /// disappeared ([`Error::DeviceGone`]) — checked from time to time while
    /// commands are outstanding and nothing completes — or this queue could
    /// not be re-created after a reset ([`Error::QueueLost`]). Every
    /// outstanding command has then been completed (with
    /// [`IoError::ControllerFailed`]), and later calls fail the same way
    /// until a successful [`Controller::reset`].
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        let max = max.min(self.max_per_poll);
        if self.ctrl.state() != self.seen_state {
            return self.on_state_change(&mut f, true, max);
        }
        if let Some(e) = self.failed {
            return Err(failed_error(e, self.qid));
        }
        self.sq.flush();
        let mut delivered = 0;
        let mut seen = 0;
        while seen < max {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            self.cq.prefetch_next();
            seen += 1;
            self.sq.head = cqe.sq_head;
            if let Some(c) = self.take_cqe(&cqe) {
                // Counted before the callback runs: it may panic.
                self.completed += 1;
                f(c);
                delivered += 1;
            }
        }
        self.cq.flush_lazy(self.cq_head_batch);
        if seen != 0 {
            self.idle_polls = 0;
            self.timeouts.tick();
        } else if self.trackers.outstanding() > 0 {
            self.idle_polls += 1;
            if self.idle_polls % IDLE_CLOCK_INTERVAL == 0 {
                self.timeouts.tick();
            }
            if self.idle_polls % HEALTH_CHECK_INTERVAL == 0 {
                if let Err(e) = self.check_health() {
                    let _ = self.on_state_change(&mut f, true, max - delivered);
                    return Err(e);
                }
            }
        }
        // Nothing outstanding and nothing seen: nothing can time out, and the
        // next command on this idle queue reads the clock itself.
        if self.timeouts.scan_due() {
            delivered += self.scan_timeouts(&mut f, max - delivered)?;
        }
        Ok(delivered)
    }

    /// Match a CQE to its command: the completion to deliver, or `None` (and
    /// counted) for a CQE that matches nothing in flight.
    #[inline(always)]
    fn take_cqe(&mut self, cqe: &Cqe) -> Option<Completion<B>> {
        match self.trackers.lookup(cqe.cid) {
            Some(slot) if cqe.sq_id == self.qid => {
                let (tag, buf) = self.trackers.complete(slot);
                // After `complete`: the slot keeps its timeout state until
                // it is armed again, and the hot path keeps `complete`
                // right after `lookup` (one bounds check).
                let result = if NvmeStatus::raw_is_success(cqe.status) {
                    Ok(())
                } else {
                    Err(self.error_of(slot, cqe))
                };
                deliver::route(&mut self.splits, slot, tag, buf, result, cqe.dw0)
            }
            _ => {
                self.stale(cqe);
                None
            }
        }
    }

    /// Count and log a CQE that matches no command in flight.
    #[cold]
    #[inline(never)]
    fn stale(&mut self, cqe: &Cqe) {
        self.trackers.stale += 1;
        log::warn!(
            "queue {}: dropped stale/duplicate completion (cid {:#06x}, sq {}, status {:#06x})",
            self.qid,
            cqe.cid,
            cqe.sq_id,
            cqe.status
        );
    }

    /// The error of a failed completion (of the command just completed in
    /// `slot`): a command we aborted because it timed out reports
    /// [`IoError::TimedOut`].
    #[cold]
    fn error_of(&mut self, slot: u16, cqe: &Cqe) -> IoError {
        let st = cqe.nvme_status();
        if st == ABORT_REQUESTED && self.timeouts.was_aborted(&self.trackers, slot) {
            IoError::TimedOut
        } else {
            IoError::Nvme(st)
        }
    }

    /// Deliver up to `budget` CQEs the controller left in the ring (it can
    /// post no more: the queue is deleted or the controller disabled). No
    /// doorbell. Returns how many were delivered and whether the ring is
    /// now empty (`false`: the budget ran out first; call again).
    fn deliver_posted<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        budget: usize,
    ) -> (usize, bool) {
        let mut n = 0;
        for _ in 0..self.sq.entries() {
            let Some(cqe) = self.cq.peek() else {
                return (n, true);
            };
            if n == budget {
                return (n, false);
            }
            self.cq.advance();
            if let Some(c) = self.take_cqe(&cqe) {
                self.completed += 1;
                n += 1;
                f(c);
            }
        }
        (n, true)
    }

    /// Complete up to `budget` of the commands still outstanding with
    /// `err`; buffers are handed back only if `safe` (the device can no
    /// longer access them), otherwise leaked (and counted at the
    /// controller, [`Controller::leaked_queue_bytes`]).
    fn fail_outstanding<F: FnMut(Completion<B>)>(
        &mut self,
        err: IoError,
        safe: bool,
        f: &mut F,
        budget: usize,
    ) -> usize {
        let (ctrl, rstats, completed) = (&self.ctrl, &mut self.rstats, &mut self.completed);
        drain_all(
            &mut self.trackers,
            &mut self.splits,
            budget,
            |tag, buf, first| {
                let buf = if safe {
                    buf
                } else {
                    leak(ctrl, buf);
                    None
                };
                match err {
                    IoError::AbortedByReset => rstats.aborted_by_reset += 1,
                    _ => rstats.failed_by_controller += 1,
                }
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(Completion {
                    tag,
                    result: Err(first.unwrap_or(err)),
                    buf,
                    dw0: 0,
                });
            },
        )
    }

    /// The controller was reset, failed, or disappeared since this queue
    /// last looked (see the controller's state word). Cold.
    ///
    /// Delivers at most `budget` completions. When that is not enough, it
    /// returns `Ok` with the state left unacknowledged, and the next call
    /// (the next poll) carries on where this one stopped; each step is
    /// recorded before the callback runs, so a panicking callback leaves a
    /// state this resumes from too.
    ///
    /// With `recreate` false (the queue is being closed or dropped) the
    /// queues are not re-created after a reset; `queue_absent` says so.
    #[cold]
    #[inline(never)]
    fn on_state_change<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        recreate: bool,
        budget: usize,
    ) -> Result<usize> {
        let mut n = 0;
        loop {
            let now = self.ctrl.state();
            if now == self.seen_state {
                return match self.failed {
                    Some(e) => Err(failed_error(e, self.qid)),
                    None => Ok(n),
                };
            }
            if state::epoch(now) == state::epoch(self.seen_state) {
                // Failed, and the controller could not be disabled: the
                // device may still access the rings, the PRP pages and the
                // buffers; leak them.
                self.device_may_access = true;
                let (d, empty) = self.deliver_posted(f, budget - n);
                n += d;
                if !empty {
                    return Ok(n);
                }
                n += self.fail_outstanding(IoError::ControllerFailed, false, f, budget - n);
                if self.trackers.outstanding() > 0 {
                    return Ok(n);
                }
                self.failed = Some(failure_of(now));
                self.seen_state = now;
                continue;
            }
            // New epoch: the controller was disabled (or is gone), so it
            // dropped this queue and accesses none of its memory. Deliver
            // what it completed before, wait for a running reset to finish,
            // and fail or abort the rest.
            let (d, empty) = self.deliver_posted(f, budget - n);
            n += d;
            if !empty {
                return Ok(n);
            }
            let settled = self.ctrl.settled_state();
            let failed = state::failure(settled) != state::OK;
            let err = if failed {
                IoError::ControllerFailed
            } else {
                IoError::AbortedByReset
            };
            n += self.fail_outstanding(err, true, f, budget - n);
            if self.trackers.outstanding() > 0 {
                return Ok(n);
            }
            self.sq.reset();
            self.cq.reset();
            self.device_may_access = false;
            self.seen_state = settled;
            if failed {
                self.failed = Some(failure_of(settled));
                continue;
            }
            if !recreate {
                self.queue_absent = true;
                return Ok(n);
            }
            match self.ctrl.create_io_queues(
                self.qid,
                self.sq.entries(),
                self.cq.region().iova().raw(),
                self.sq.region().iova().raw(),
            ) {
                Ok(s) => {
                    self.seen_state = s;
                    self.failed = None;
                    self.rstats.recoveries += 1;
                    self.idle_polls = 0;
                }
                Err((e, queue_left)) => {
                    if self.ctrl.state() != settled {
                        continue; // reset again meanwhile: retry
                    }
                    // The controller may have the queue on our rings.
                    self.device_may_access |= queue_left;
                    log::error!(
                        "queue {}: re-creating the queue after a reset failed: {e}",
                        self.qid
                    );
                    self.failed = Some(Error0::Lost);
                    return Err(Error::QueueLost { qid: self.qid });
                }
            }
        }
    }

    /// Act on commands past their timeout (see [`TimeoutPolicy`]). Cold.
    #[cold]
    #[inline(never)]
    fn scan_timeouts<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        budget: usize,
    ) -> Result<usize> {
        self.timeouts.begin_scan();
        // A command whose completion is already posted in the CQ (not yet
        // consumed: a slow consumer, or `poll` with a small `max`) was
        // answered in time: it is not a timeout. Mark those slots first.
        let (timeouts, trackers) = (&mut self.timeouts, &self.trackers);
        self.cq.posted_cids(|cid| {
            if let Some(slot) = trackers.lookup(cid) {
                timeouts.mark_posted(slot);
            }
        });
        let mut scan = NvmeTimeouts {
            qp: self,
            reset: false,
        };
        timeout::scan(&mut scan);
        let reset = scan.reset;
        if reset && self.ctrl.state() == self.seen_state {
            self.timeouts.stats.resets_requested += 1;
            if let Err(e) = self.ctrl.reset_if(self.seen_state) {
                log::error!(
                    "queue {}: controller reset after a timeout failed: {e}",
                    self.qid
                );
            }
        }
        if self.ctrl.state() != self.seen_state {
            return self.on_state_change(f, true, budget);
        }
        Ok(0)
    }

    /// Read CSTS; if the controller is fatal or gone, record that at the
    /// controller (a fatal controller is disabled so no DMA stays in
    /// flight) and return the error. The next [`poll`](Self::poll)
    /// completes the outstanding commands with [`IoError::ControllerFailed`].
    pub fn check_health(&mut self) -> Result<()> {
        if let Some(e) = self.failed {
            return Err(failed_error(e, self.qid));
        }
        match self.ctrl.health() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.ctrl.note_failure(self.seen_state, &e);
                Err(e)
            }
        }
    }

    /// Report every command outstanding for longer than `timeout`.
    ///
    /// Reporting only, independent of [`QpairOptions::io_timeout`] (which
    /// acts by itself inside [`poll`](Self::poll)). Ages use the queue's
    /// coarse clock, refreshed here.
    pub fn check_timeouts(&mut self, timeout: Duration, f: impl FnMut(Outstanding)) -> usize {
        self.timeouts
            .report_overdue(&self.trackers, timeout, |_| true, |_, cid| cid, f)
    }

    /// Ask the controller to abort the command with `cid` (from
    /// [`check_timeouts`](Self::check_timeouts)). Returns `true` if the
    /// controller reports it aborted the command, which then completes
    /// through [`poll`](Self::poll) with "abort requested"; `false` if it
    /// could not (the command may still complete normally, or never).
    /// Goes through the admin queue: never on the I/O path.
    pub fn abort_command(&self, cid: u16) -> Result<bool> {
        let cqe = self
            .ctrl
            .admin_cmd(Abort::new(self.qid, cid).sqe(), "Abort")?;
        // Dword 0 bit 0 clear: the command was aborted.
        Ok(cqe.dw0 & 1 == 0)
    }

    /// Delete the queues on the controller, deliver every completion the
    /// controller still posts, and complete every remaining command with
    /// [`IoError::Aborted`]: each submitted command completes exactly once.
    ///
    /// After a controller reset or failure the queues are already gone on
    /// the device: the commands complete as [`poll`](Self::poll) would
    /// complete them, and a failed controller is reported as `Err` (after
    /// every command was delivered).
    ///
    /// If deleting a queue fails (an error status, or an admin timeout
    /// under [`TimeoutPolicy::ReportOnly`]), the controller still owns the
    /// queue: the remaining commands complete with [`IoError::Aborted`] but
    /// without their buffers, which are leaked like the rings and PRP pages
    /// ([`Controller::leaked_queue_bytes`]), and the queue id is not reused;
    /// the error is returned.
    ///
    /// A panic in `f` does not skip any of this: dropping the queue pair
    /// (as unwinding does) carries on from where `close` stopped, with the
    /// remaining completions dropped.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shut_down(&mut f)
    }

    /// Close or drop: resumable (see [`Teardown`]).
    fn shut_down<F: FnMut(Completion<B>)>(&mut self, f: &mut F) -> Result<()> {
        loop {
            match self.teardown {
                Teardown::Done => return Ok(()),
                Teardown::Live => {
                    if self.ctrl.state() != self.seen_state {
                        let _ = self.on_state_change(f, false, usize::MAX);
                    }
                    if self.failed.is_some() || self.queue_absent {
                        return self.shut_down_gone();
                    }
                    // Report every consumed CQE first: deleting the SQ may
                    // make the controller post completions for what it
                    // aborts, and they must find room (the lazy head could
                    // otherwise leave too little).
                    self.cq.flush();
                    match self.ctrl.delete_sq(self.qid) {
                        Ok(()) => self.teardown = Teardown::SqDeleted,
                        Err(e) => return self.delete_failed(f, e),
                    }
                }
                Teardown::SqDeleted => {
                    // The controller posts completions (often "aborted: SQ
                    // deletion") for what it fetched before deleting the SQ.
                    self.deliver_posted(f, usize::MAX);
                    match self.ctrl.delete_cq(self.qid) {
                        Ok(()) => self.teardown = Teardown::Deleted,
                        Err(e) => return self.delete_failed(f, e),
                    }
                }
                Teardown::Deleted => {
                    // Both queues are gone: the device no longer accesses
                    // the buffers of what it never completed.
                    let completed = &mut self.completed;
                    drain_all(
                        &mut self.trackers,
                        &mut self.splits,
                        usize::MAX,
                        |tag, buf, first| {
                            *completed += 1;
                            f(Completion {
                                tag,
                                result: Err(first.unwrap_or(IoError::Aborted)),
                                buf,
                                dw0: 0,
                            })
                        },
                    );
                    self.teardown = Teardown::Done;
                    self.ctrl.release_qid(self.qid);
                    return Ok(());
                }
            }
        }
    }

    /// A reset or failure already removed the queues (`on_state_change`
    /// completed, or leaked, every command).
    fn shut_down_gone(&mut self) -> Result<()> {
        self.teardown = Teardown::Done;
        // Free again even after a failure without a disable: the controller
        // must be reset before any queue can be created, and a reset deletes
        // every queue. Not when re-creating the queue after a reset may have
        // left it on the controller.
        if !(self.failed == Some(Error0::Lost) && self.device_may_access) {
            self.ctrl.release_qid(self.qid);
        }
        match self.failed {
            Some(e) => Err(failed_error(e, self.qid)),
            None => Ok(()),
        }
    }

    /// Deleting a queue failed with `e`.
    #[cold]
    fn delete_failed<F: FnMut(Completion<B>)>(&mut self, f: &mut F, e: Error) -> Result<()> {
        // The deletion may have failed because the controller was reset or
        // failed meanwhile: then complete as poll would.
        if self.ctrl.state() != self.seen_state {
            let _ = self.on_state_change(f, false, usize::MAX);
            if self.failed.is_some() || self.queue_absent {
                return self.shut_down_gone();
            }
        }
        // The controller still has the queue: it may fetch from the SQ ring
        // and PRP pages, transfer into the buffers, and post into the CQ
        // ring. None of it may be freed or reused: leak it all (the rings
        // and PRP pages in `Drop`), and keep the queue id out of use.
        self.device_may_access = true;
        self.teardown = Teardown::Done;
        log::error!(
            "queue {}: deleting the queues failed ({e}); leaking its rings, PRP pages and {} in-flight buffers so the device cannot write into reused memory",
            self.qid,
            self.trackers.outstanding()
        );
        let (ctrl, completed) = (&self.ctrl, &mut self.completed);
        drain_all(
            &mut self.trackers,
            &mut self.splits,
            usize::MAX,
            |tag, buf, _| {
                leak(ctrl, buf);
                *completed += 1;
                f(Completion {
                    tag,
                    result: Err(IoError::Aborted),
                    buf: None,
                    dw0: 0,
                })
            },
        );
        Err(e)
    }
}

/// NVMe's side of the shared timeout scan: log, send an Abort admin
/// command, and note that the controller must be reset (once, after the
/// scan).
struct NvmeTimeouts<'a, B: IoBuf> {
    qp: &'a mut QueuePair<B>,
    reset: bool,
}

impl<B: IoBuf> TimeoutActions for NvmeTimeouts<'_, B> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.timeouts, &mut self.qp.trackers)
    }

    fn report(&mut self, e: &Expired) {
        log::warn!(
            "queue {}: command cid {:#06x} tag {} has no completion after {} ms",
            self.qp.qid,
            e.cid,
            e.tag,
            e.age_ms
        );
    }

    fn abort(&mut self, e: &Expired) -> bool {
        let qid = self.qp.qid;
        let r = self
            .qp
            .ctrl
            .admin_cmd(Abort::new(qid, e.cid).sqe(), "Abort");
        // Dword 0 bit 0 clear: the controller aborted it.
        match r {
            Ok(c) => c.dw0 & 1 == 0,
            Err(err) => {
                log::warn!("queue {qid}: Abort of cid {:#06x} failed: {err}", e.cid);
                false
            }
        }
    }

    fn reset(&mut self, _: &Expired) -> bool {
        self.reset = true;
        false
    }

    fn stop(&self) -> bool {
        self.qp.ctrl.state() != self.qp.seen_state
    }
}

/// Leak a buffer the device may still access (counted at the controller).
fn leak<B: IoBuf>(ctrl: &Controller, buf: Option<B>) {
    let n = deliver::leak(buf);
    if n != 0 {
        ctrl.note_leak(n);
    }
}

/// PRP list pages each command slot needs: one entry per page of the
/// largest command after PRP1, chained across list pages. The largest
/// command is the smaller of `max_xfer` and `MAX_NLB` blocks of the largest
/// block size of any namespace (a command never moves more).
fn prp_pages_per_slot(ctrl: &Controller, max_xfer: u64) -> Result<usize> {
    let max_lba_shift = ctrl
        .namespaces()
        .iter()
        .map(|n| n.lba_shift)
        .max()
        .unwrap_or(PAGE_SHIFT);
    let most_blocks = 1u64
        .checked_shl(max_lba_shift)
        .and_then(|lba| lba.checked_mul(MAX_NLB as u64))
        .unwrap_or(u64::MAX);
    let per_cmd = max_xfer.min(most_blocks);
    // Entries after PRP1: at most one per page of the transfer, plus one
    // for a buffer that does not start on a page boundary.
    let entries = (per_cmd >> PAGE_SHIFT) + 1;
    let per_page = PRP_PER_PAGE as u64;
    let pages = if entries <= per_page {
        1
    } else {
        (entries - 1).div_ceil(per_page - 1)
    };
    if pages > MAX_PRP_LIST_PAGES {
        return Err(Error::InvalidOption(format!(
            "a transfer limit of {per_cmd} bytes per command would need {pages} PRP list pages per queue slot (at most {MAX_PRP_LIST_PAGES}); set ControllerOptions::max_transfer to at most {} bytes",
            (MAX_PRP_LIST_PAGES * (per_page - 1)) << PAGE_SHIFT
        )));
    }
    Ok(pages as usize)
}

/// Bytes of a queue's PRP-list region: `prp_pages` controller pages per
/// slot, rounded up to whole granules of the DMA space (the largest of the
/// host page and the IOMMU page: the unit of every allocation, map and
/// unmap; a 64 KiB-granule IOMMU refuses a 4 KiB mapping). List entries and
/// list pages stay 4 KiB controller pages whatever the granule.
fn prp_region_len(depth: u16, prp_pages: usize, granule: usize) -> Option<usize> {
    let granule = granule.max(PAGE_SIZE as usize);
    (depth as usize)
        .checked_mul(prp_pages)?
        .checked_mul(PAGE_SIZE as usize)?
        .checked_next_multiple_of(granule)
}

fn failed_error(e: Error0, qid: u16) -> Error {
    match e {
        Error0::Fatal => Error::ControllerFatal,
        Error0::Gone => Error::DeviceGone,
        Error0::Lost => Error::QueueLost { qid },
    }
}

fn failure_of(s: u64) -> Error0 {
    if state::failure(s) == state::GONE {
        Error0::Gone
    } else {
        Error0::Fatal
    }
}

impl<B: IoBuf> Drop for QueuePair<B> {
    /// Delete the queues (completions of commands still in flight are
    /// dropped), then free the rings and PRP pages — or leak them if the
    /// device may still access them (see [`QueuePair::close`]).
    fn drop(&mut self) {
        if self.teardown != Teardown::Done {
            let _ = self.shut_down(&mut |c: Completion<B>| drop(c));
        }
        let ring_bytes = self.sq.region().len() + self.cq.region().len() + self.prp_mem.len();
        if self.device_may_access {
            log::error!(
                "queue {}: the controller may still access its rings and PRP pages; leaking {ring_bytes} bytes",
                self.qid
            );
            self.ctrl.note_leak(ring_bytes as u64);
            return;
        }
        // SAFETY: each field is dropped exactly once, here, and `self` is
        // not used afterwards. The device no longer accesses this memory:
        // the queues were deleted, or the controller was disabled since (a
        // new epoch) or removed.
        unsafe {
            ManuallyDrop::drop(&mut self.sq);
            ManuallyDrop::drop(&mut self.cq);
            ManuallyDrop::drop(&mut self.prp_mem);
        }
    }
}

/// The blocking convenience API, on the default buffer type. It bounces
/// through one DMA buffer the queue pair keeps (allocated on first use) and
/// splits requests larger than the per-command limit.
impl QueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        block::flush_blocking(self, nsid)
    }
}

/// The block operations shared with the UFS transport: each is the
/// inherent method of the same name (no extra work per I/O).
impl<B: IoBuf> BlockQueue for QueuePair<B> {
    type Addr = u32;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        QueuePair::read(self, nsid, lba, blocks, buf, tag)
    }

    #[inline]
    fn write(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        QueuePair::write(self, nsid, lba, blocks, buf, tag)
    }

    fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError<()>> {
        QueuePair::flush(self, nsid, tag)
    }

    fn deallocate(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        QueuePair::deallocate(self, nsid, &[(lba, blocks)], tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        QueuePair::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, f: F) -> Result<usize> {
        QueuePair::poll(self, max, f)
    }

    #[inline]
    fn depth(&self) -> usize {
        QueuePair::depth(self)
    }

    #[inline]
    fn outstanding(&self) -> usize {
        QueuePair::outstanding(self)
    }

    #[inline]
    fn is_full(&self) -> bool {
        QueuePair::is_full(self)
    }

    fn max_transfer(&self) -> u64 {
        QueuePair::max_transfer(self)
    }

    fn block_shift(&self, nsid: u32) -> Option<u32> {
        self.geom(nsid).map(|g| g.lba_shift)
    }

    fn close<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        QueuePair::close(self, f)
    }
}

impl<B: IoBuf> Blocking for QueuePair<B> {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn blocking_timeout(&self) -> Duration {
        self.blocking_timeout
    }

    fn command_limit(&self, shift: u32) -> u64 {
        self.max_xfer.min(u64::from(MAX_NLB) << shift)
    }

    /// Blocking calls first catch up with a reset or failure (nothing is
    /// outstanding, so nothing is lost) so they never submit into a queue
    /// the controller already dropped.
    fn blocking_sync(&mut self) -> Result<()> {
        if self.ctrl.state() != self.seen_state {
            self.on_state_change(&mut |c: Completion<B>| drop(c), true, usize::MAX)?;
        }
        match self.failed {
            Some(e) => Err(failed_error(e, self.qid)),
            None => Ok(()),
        }
    }

    fn unknown(nsid: u32) -> SubmitErrorKind {
        SubmitErrorKind::UnknownNamespace { nsid }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let before = qp.timeouts.ticks;
        for _ in 0..1000 {
            assert_eq!(qp.poll(32, |_| {}).expect("poll"), 0);
        }
        assert_eq!(qp.timeouts.ticks, before, "clock reads by idle polls");
        // A completion still reads it (its poll stamps the queue's clock).
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).expect("buf");
        qp.read(1, 0, 8, buf, 1).expect("read");
        qp.submit();
        let mut n = 0;
        while n == 0 {
            n = qp.poll(32, |c| assert!(c.result.is_ok())).expect("poll");
        }
        assert!(qp.timeouts.ticks > before);
    }

    /// Walk a PRP list the way a controller does: the last entry of a list
    /// page points to the next page when more than one entry remains.
    fn walk(mem: &[u64], list_iova: u64, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let (mut page, mut idx) = (0usize, 0usize);
        while out.len() < n {
            let v = mem[page * PRP_PER_PAGE + idx];
            if idx == PRP_PER_PAGE - 1 && n - out.len() > 1 {
                assert_eq!(v, list_iova + ((page as u64 + 1) << PAGE_SHIFT));
                page += 1;
                idx = 0;
                continue;
            }
            out.push(v);
            idx += 1;
        }
        out
    }

    /// Issue 12 item 10: the PRP-list region is a whole number of IOMMU
    /// pages (and at least the controller pages the slots need).
    #[test]
    fn prp_region_is_whole_iommu_pages() {
        assert_eq!(prp_region_len(3, 1, 4096).unwrap(), 3 * 4096);
        assert_eq!(
            prp_region_len(3, 1, 1024).unwrap(),
            3 * 4096,
            "never below a controller page"
        );
        assert_eq!(prp_region_len(3, 1, 64 << 10).unwrap(), 64 << 10);
        assert_eq!(prp_region_len(17, 1, 64 << 10).unwrap(), 128 << 10);
        assert_eq!(prp_region_len(16, 2, 64 << 10).unwrap(), 128 << 10);
    }

    /// The PRP writer's raw-pointer arithmetic (also run under Miri, over
    /// ordinary memory): chained list pages, exact capacity, overflow.
    #[test]
    fn prp_writer_chains_list_pages() {
        let pages = 3;
        let cap = pages * (PRP_PER_PAGE - 1) + 1;
        for n in [
            0,
            1,
            2,
            3,
            PRP_PER_PAGE - 1,
            PRP_PER_PAGE,
            PRP_PER_PAGE + 1,
            cap,
        ] {
            let mut mem = vec![0u64; pages * PRP_PER_PAGE];
            let list_iova = 0x10_0000;
            let mut w = PrpWriter {
                list: mem.as_mut_ptr(),
                list_iova,
                pages,
                page: 0,
                idx: 0,
                count: 0,
                first: 0,
            };
            let want: Vec<u64> = (0..n as u64)
                .map(|i| 0x4000_0000 + (i << PAGE_SHIFT))
                .collect();
            for &a in &want {
                w.push(a).expect("within capacity");
            }
            let prp2 = w.finish();
            match n {
                0 => assert_eq!(prp2, 0),
                1 => assert_eq!(prp2, want[0]),
                _ => {
                    assert_eq!(prp2, list_iova);
                    assert_eq!(walk(&mem, list_iova, n), want, "{n} entries");
                }
            }
            if n == cap {
                assert!(w.push(0).is_err(), "one past capacity is refused");
            }
        }
    }
}
