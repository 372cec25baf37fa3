//! [`UfsQueuePair`]: the application's per-thread UFS I/O object, with the
//! same block operations and semantics as NVMe's [`crate::QueuePair`]:
//! buffers move in at submission and come back in exactly one
//! [`Completion`] (or in the [`SubmitError`] of a refused submission),
//! [`submit`](UfsQueuePair::submit) rings one doorbell per batch,
//! [`poll`](UfsQueuePair::poll) reaps.
//!
//! A read or write above the per-command limit is split into child commands
//! (the shared `core/split.rs`) and still completes once, with its buffer after every child
//! finished.
//!
//! The transport (an MCQ queue pair or the legacy list) is an enum resolved
//! once per queue pair; nothing is dispatched dynamically per I/O.
//!
//! What is UFS-specific here: the command descriptors (`ucd.rs`), the
//! UTRD, the SCSI CDBs and the decoding of OCS and SCSI status. The
//! tracking of tags (slot + generation, `crate::core::tracker`) and the
//! completion delivery rules are the engine's, shared with NVMe.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio_vfio::{DmaDir, DmaSpace, Mapped};

use super::ctrl::{health, state, Pool, UfsController, UfsMode, TASK_TAGS};
use super::hpb::qp::{HpbQp, Overdue, DEV_INFO_HPB};
use super::mcq::{McqQueue, Reaped};
use super::sdb::{SdbQueue, SdbReaped};
use super::spec::regs::sq_op;
use super::spec::scsi;
use super::spec::status::{io_result, UfsError};
use super::spec::utrd::{DataDir, Ocs, PrdtEntry, Ucd, Utrd};
use super::ucd::{UcdSlice, MAX_PRDT_ENTRIES, SLOT_BYTES};
use crate::core::block::{self, BlockQueue, Blocking};
use crate::core::deliver::{self, drain_all, Held};
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::mapped::{MappedQueuePair, MappingMode};
use crate::core::split::{Routed, Splits};
use crate::core::timeout::{
    self, Expired, Outstanding, TimeoutActions, TimeoutPolicy, Timeouts, IDLE_CLOCK_INTERVAL,
};
use crate::core::tracker::Trackers;
use crate::{Error, Result};

// Recovery after a host controller reset (`UfsController::reset`).
#[path = "reset.rs"]
mod reset;

/// Empty polls (with commands outstanding) between IS health checks.
const HEALTH_CHECK_INTERVAL: u32 = 1024;

/// Geometry of a logical unit as the hot path needs it.
#[derive(Copy, Clone, Debug)]
struct LuGeom {
    blocks: u64,
    shift: u32,
    /// HPB has a map of this LU: only then can a read become an HPB READ
    /// (the HPB call is skipped for the others).
    hpb: bool,
}

/// The wire a queue pair uses, chosen once at creation.
// One per queue pair, built once and never moved on the I/O path: boxing the
// larger variant would only add a pointer chase to every submit and poll.
#[allow(clippy::large_enum_variant)]
enum Transport {
    Mcq(McqQueue),
    Sdb(SdbQueue),
}

impl Transport {
    #[inline(always)]
    fn post(&mut self, slot: u16, utrd: Utrd) {
        match self {
            Transport::Mcq(q) => q.post(utrd),
            Transport::Sdb(q) => q.post(slot, utrd),
        }
    }

    #[inline]
    fn flush(&mut self) -> bool {
        match self {
            Transport::Mcq(q) => q.flush(),
            Transport::Sdb(q) => q.flush(),
        }
    }
}

/// Options of one [`UfsQueuePair`]
/// ([`UfsController::create_qpair_with`]).
#[derive(Clone, Debug)]
pub struct UfsQpairOptions {
    /// Per-command timeout (`None`: never time out), as for NVMe's
    /// [`crate::QpairOptions::io_timeout`]: detected while polling, on the
    /// queue's coarse clock; a command is acted on about 1 to 1.25 timeouts
    /// after its submission. A command whose completion the controller
    /// already posted is never taken for timed out (the scan runs only
    /// after a poll that reaped everything posted). The same timeout bounds
    /// HPB's internal commands, which have their own handling (withdrawn,
    /// never a controller reset, never in [`UfsQpairStats`]; see
    /// [`super::hpb`]).
    pub io_timeout: Option<Duration>,
    /// What a timeout does ([`TimeoutPolicy`]): `ReportOnly` counts it
    /// ([`UfsQpairStats::timeouts`]); `Abort` withdraws the command (MCQ:
    /// SQ stop and cleanup by nexus; legacy: UTRLCLR) and, once the
    /// controller gave it up, completes it as [`IoError::TimedOut`] with
    /// its buffer — a refused or unanswered abort escalates to `Reset`;
    /// `Reset` asks for a host controller reset (see [`UfsQueuePair`]).
    pub timeout_policy: TimeoutPolicy,
}

impl Default for UfsQpairOptions {
    /// The NVMe defaults: 30 s, [`TimeoutPolicy::Abort`].
    fn default() -> Self {
        UfsQpairOptions {
            io_timeout: Some(Duration::from_secs(30)),
            timeout_policy: TimeoutPolicy::Abort,
        }
    }
}

/// Counters of a [`UfsQueuePair`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct UfsQpairStats {
    /// Commands accepted (each child of a split transfer counts).
    pub submitted: u64,
    /// Completions delivered (a split transfer delivers one).
    pub completed: u64,
    /// Completion entries that did not prove a command in flight — a
    /// stale or duplicate entry of an earlier command in the slot (its UCD
    /// address names an earlier use of the slot), one of no command in
    /// flight, a bogus UCD address — whatever their OCS, also when a reset
    /// delivers what was already posted: counted, nothing delivered.
    pub stale_completions: u64,
    /// Doorbell stores: SQTP (MCQ) or UTRLDBR (legacy), one per batch.
    pub doorbell_writes: u64,
    /// CQHP stores (MCQ), one per poll that consumed entries.
    pub cq_head_writes: u64,
    /// Register reads to find completions: CQTP (MCQ) or UTRLDBR (legacy),
    /// one per poll with commands outstanding.
    pub completion_reads: u64,
    /// Polls that skipped that read because nothing was outstanding (MCQ).
    pub completion_reads_skipped: u64,
    /// CQTP values outside the ring (ignored).
    pub bad_tails: u64,
    /// Commands found past [`UfsQpairOptions::io_timeout`] (once each).
    pub timeouts: u64,
    /// Aborts (MCQ cleanups, UTRLCLR withdrawals) sent for them.
    pub aborts_sent: u64,
    /// Commands completed as [`IoError::TimedOut`].
    pub timed_out: u64,
    /// Host controller resets the timeout policy asked for.
    pub resets_requested: u64,
}

/// One UFS queue pair, owned by one thread (`Send`, not `Sync`).
///
/// # Timeouts and the controller-reset hook
///
/// [`UfsQpairOptions::io_timeout`] and [`TimeoutPolicy`] work as for NVMe
/// (the policy, the clock and the scan are the shared core's,
/// `core/timeout.rs`). Where NVMe resets the controller, UFS escalates
/// through one hook, `UfsController::reset_for_timeout` (in this file),
/// which runs the host controller reset ([`UfsController::reset`]): every
/// command in flight then ends as after any reset, with
/// [`IoError::AbortedByReset`] and its buffer. Only if that reset fails
/// (the controller cannot be disabled) is a command that needs one ended
/// the safe way the code uses for a device that may still hold it: once,
/// as [`IoError::TimedOut`], **without its buffer** (leaked, counted in
/// [`UfsController::leaked_bytes`]); its slot and command descriptor are
/// retired (never reused until a later reset succeeds) and the queue's
/// memory is leaked when the queue pair is dropped.
pub struct UfsQueuePair<B: IoBuf = DmaBuf> {
    ctrl: Arc<UfsController>,
    // Dropped by hand: returned to the controller, or leaked while the
    // device may still access them.
    transport: ManuallyDrop<Transport>,
    ucds: ManuallyDrop<UcdSlice>,
    trackers: Trackers<B>,
    /// Reads and writes above `max_xfer` as child commands; per child being
    /// built: slot, PRDT entries, LBA, blocks.
    splits: Splits<B, (u16, u16, u64, u32)>,
    /// Task tag of slot 0: tags are `tag_base + slot`, hardware queue `i`
    /// has `i * depth ..`, unique device-wide because the controller bounds
    /// queues × depth to the 256 task tags (`UfsOptions::depth`).
    tag_base: u8,
    lus: Vec<Option<LuGeom>>,
    max_xfer: u64,
    space: Arc<DmaSpace>,
    submitted: u64,
    completed: u64,
    empty_polls: u32,
    /// Timeout policy, coarse clock and scan schedule (the shared core's).
    timeouts: Timeouts,
    /// The controller failed; the error polls report.
    failed: Option<u8>,
    /// The controller's state word as of this pair's last look (see
    /// `ctrl::state`); a different value means a reset or a failure.
    seen_state: u64,
    /// Controller resets this pair recovered from.
    recoveries: u64,
    /// Queue memory the device may still access: leak it on drop.
    leak: bool,
    closed: bool,
    bounce: Option<DmaBuf>,
    /// HPB: the read/write hooks and internal map loads (`super::hpb`).
    hpb: HpbQp,
    /// Ended by a recovery beyond its poll's `max`; the next polls hand
    /// them out first.
    held: Held<B>,
    _not_sync: PhantomData<Cell<()>>,
}

impl UfsController {
    /// Create a queue pair with the default [`UfsQpairOptions`]: in MCQ
    /// mode one of the hardware queues set up at bring-up, in legacy mode
    /// the one list. [`Error::NoFreeQueue`] when every queue is taken by a
    /// live queue pair.
    pub fn create_qpair<B: IoBuf>(self: &Arc<Self>) -> Result<UfsQueuePair<B>> {
        self.create_qpair_with(UfsQpairOptions::default())
    }

    /// Create a queue pair for application buffers mapped per I/O in
    /// `mapping` mode (strict or lazy): the same [`MappedQueuePair`] as
    /// NVMe's, over a UFS queue pair (see [`crate::core::mapped`]).
    pub fn create_mapped_qpair(
        self: &Arc<Self>,
        opts: UfsQpairOptions,
        mapping: MappingMode,
    ) -> Result<MappedQueuePair<UfsQueuePair<Mapped>>> {
        MappedQueuePair::<UfsQueuePair<Mapped>>::check_mode(&mapping)?;
        let qp = self.create_qpair_with::<Mapped>(opts)?;
        let max = qp.max_transfer();
        MappedQueuePair::new(qp, self.dma(), max, &mapping)
    }

    /// Create a queue pair with `opts` (see [`create_qpair`](Self::create_qpair)).
    pub fn create_qpair_with<B: IoBuf>(
        self: &Arc<Self>,
        opts: UfsQpairOptions,
    ) -> Result<UfsQueuePair<B>> {
        let depth = self.depth();
        // No reset between taking the queue and noting the state.
        let reset_guard = self.lock_reset();
        let seen_state = self.state();
        let mut pool = self.lock_pool();
        let hook = self.backend().doorbell_hook();
        let (transport, tag_base, pooled) = match (&mut *pool, self.mode()) {
            (Pool::Mcq(rings), UfsMode::Mcq { queues }) => {
                let Some(mut r) = rings.iter_mut().find_map(|r| r.take()) else {
                    return Err(Error::NoFreeQueue {
                        granted: usize::from(queues),
                    });
                };
                // Bring-up bounded queues × depth to the tag space; a queue
                // whose tags would not fit is refused rather than share them.
                let end = (u32::from(r.index) + 1) * u32::from(depth);
                let Some(base) = (end <= u32::from(TASK_TAGS))
                    .then(|| u8::try_from(end - u32::from(depth)).ok())
                    .flatten()
                else {
                    let index = r.index;
                    rings[usize::from(index)] = Some(r);
                    return Err(Error::InvalidOption(format!(
                        "UFS queue {index} at depth {depth} would need task tags past {}",
                        TASK_TAGS - 1
                    )));
                };
                let pooled = r.ucds.take();
                (Transport::Mcq(McqQueue::new(r, hook)), base, pooled)
            }
            (Pool::Legacy(list), _) => {
                let Some(l) = list.take() else {
                    return Err(Error::NoFreeQueue { granted: 1 });
                };
                (
                    Transport::Sdb(SdbQueue::new(
                        Arc::clone(self.backend()),
                        l,
                        u32::from(depth),
                    )),
                    0,
                    None,
                )
            }
            // The pool always matches the mode.
            _ => return Err(Error::NoFreeQueue { granted: 0 }),
        };
        drop(pool);
        drop(reset_guard);
        // MCQ: the descriptors of the queue's previous owner, if any (their
        // generations go on); else new ones.
        let ucds = match pooled {
            Some(u) if u.slots() == usize::from(depth) => u,
            _ => {
                let ucd_mem = match self
                    .dma()
                    .alloc(usize::from(depth) * SLOT_BYTES, DmaDir::Bidirectional)
                {
                    Ok(m) => m,
                    Err(e) => {
                        self.give_back(transport, None);
                        return Err(e.into());
                    }
                };
                if ucd_mem.iova().raw() % Ucd::ALIGN != 0 || ucd_mem.iova().raw() == 0 {
                    self.give_back(transport, None);
                    return Err(Error::InvalidOption(format!(
                        "the DMA space gave command descriptors at IOVA {:#x}: UFSHCI needs {}-byte alignment, \
                         and address 0 is what a consumed completion entry is cleared to",
                        ucd_mem.iova().raw(),
                        Ucd::ALIGN
                    )));
                }
                UcdSlice::new(ucd_mem, usize::from(depth))
            }
        };
        let mut lus = Vec::new();
        for l in self.logical_units() {
            let i = usize::from(l.lun);
            if lus.len() <= i {
                lus.resize(i + 1, None);
            }
            lus[i] = Some(LuGeom {
                blocks: l.blocks,
                shift: l.block_shift(),
                hpb: self.hpb_maps().get(i).is_some_and(Option::is_some),
            });
        }
        let max_xfer = u64::from(self.options().max_transfer)
            .min(MAX_PRDT_ENTRIES as u64 * u64::from(PrdtEntry::MAX_BYTES));
        let hpb = match HpbQp::new(self.hpb_maps(), self.dma(), usize::from(depth)) {
            Ok(h) => h,
            Err(e) => {
                self.give_back(transport, Some(ucds));
                return Err(e);
            }
        };
        Ok(UfsQueuePair {
            ctrl: Arc::clone(self),
            transport: ManuallyDrop::new(transport),
            ucds: ManuallyDrop::new(ucds),
            trackers: Trackers::new(depth),
            splits: Splits::new(depth),
            tag_base,
            lus,
            max_xfer,
            space: Arc::clone(self.dma()),
            submitted: 0,
            completed: 0,
            empty_polls: 0,
            timeouts: Timeouts::new(opts.io_timeout, opts.timeout_policy, depth),
            failed: match state::failure(seen_state) {
                health::OK => None,
                f => Some(f),
            },
            seen_state,
            recoveries: 0,
            leak: false,
            closed: false,
            bounce: None,
            hpb,
            held: Held::default(),
            _not_sync: PhantomData,
        })
    }

    /// The timeout policy's escalation hook: reset the host controller
    /// because a command did not complete and could not be withdrawn
    /// (policy [`TimeoutPolicy::Reset`], or an abort that was refused or
    /// not answered). Returns whether a reset happened — it then ends every
    /// command in flight, on every queue pair, the way any reset does.
    ///
    /// When the reset fails (a controller that cannot be disabled), the
    /// queue pair ends the command without its buffer (see
    /// [`UfsQueuePair`]).
    #[cold]
    pub(crate) fn reset_for_timeout(&self) -> bool {
        match self.reset() {
            Ok(()) => true,
            Err(e) => {
                log::error!(
                    "{}: reset after a command timeout failed: {e}",
                    self.backend().name()
                );
                false
            }
        }
    }

    /// Return a queue's memory to the pool (nothing outstanding on it),
    /// with the command descriptors used on it (MCQ: they stay with the
    /// queue; legacy: freed).
    fn give_back(&self, t: Transport, ucds: Option<UcdSlice>) {
        let mut pool = self.lock_pool();
        match (&mut *pool, t) {
            (Pool::Mcq(rings), Transport::Mcq(q)) => {
                let mut r = q.into_rings();
                r.ucds = ucds;
                let i = usize::from(r.index);
                rings[i] = Some(r);
            }
            (Pool::Legacy(list), Transport::Sdb(q)) => *list = Some(q.into_list()),
            _ => {}
        }
    }
}

fn submit_err<T>(kind: SubmitErrorKind, buf: T) -> SubmitError<T> {
    SubmitError { kind, buf }
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// The controller.
    pub fn controller(&self) -> &Arc<UfsController> {
        &self.ctrl
    }

    /// Commands that may be outstanding at once.
    pub fn depth(&self) -> usize {
        self.trackers.depth()
    }

    /// Commands submitted and not yet completed (the application's; HPB
    /// map loads in flight are not counted).
    pub fn outstanding(&self) -> usize {
        // Internal commands are in the trackers' count and in `inflight`
        // until the same moment; saturating all the same: never a wrap.
        self.trackers
            .outstanding()
            .saturating_sub(self.hpb.inflight())
            + self.held.len()
    }

    /// Whether a submission now would fail with `QueueFull`.
    pub fn is_full(&self) -> bool {
        self.trackers.is_full()
    }

    /// Largest transfer per command, in bytes.
    pub fn max_transfer(&self) -> u64 {
        self.max_xfer
    }

    /// The MCQ hardware queue this pair uses (`None` in legacy mode).
    pub fn hw_queue(&self) -> Option<u16> {
        match &*self.transport {
            Transport::Mcq(q) => Some(q.index()),
            Transport::Sdb(_) => None,
        }
    }

    /// Counters.
    pub fn stats(&self) -> UfsQpairStats {
        let mut s = UfsQpairStats {
            submitted: self.submitted,
            completed: self.completed,
            stale_completions: self.trackers.stale,
            timeouts: self.timeouts.stats.timeouts,
            aborts_sent: self.timeouts.stats.aborts_sent,
            timed_out: self.timeouts.stats.timed_out,
            resets_requested: self.timeouts.stats.resets_requested,
            ..Default::default()
        };
        match &*self.transport {
            Transport::Mcq(q) => {
                s.doorbell_writes = q.stats.sq_doorbell_writes;
                s.cq_head_writes = q.stats.cq_doorbell_writes;
                s.completion_reads = q.stats.cqtp_reads;
                s.completion_reads_skipped = q.stats.cqtp_reads_skipped;
                s.bad_tails = q.stats.bad_tails;
            }
            Transport::Sdb(q) => {
                s.doorbell_writes = q.stats.doorbell_writes;
                s.completion_reads = q.stats.doorbell_reads;
            }
        }
        s
    }

    /// Reserve a free slot for a new command and move its command
    /// descriptor to the slot's next base, so that no completion entry of
    /// an earlier command in the slot names this one (`UcdSlice::begin`).
    /// Every command takes its slot here.
    #[inline(always)]
    fn alloc_slot(&mut self) -> Option<u16> {
        let slot = self.trackers.alloc()?;
        self.ucds.begin(slot);
        Some(slot)
    }

    /// Every command passes here first, so this is also where an idle
    /// queue reads the clock (`Timeouts::stamp_if_idle`).
    #[inline]
    fn check_range(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
    ) -> std::result::Result<LuGeom, SubmitErrorKind> {
        // Only this pair's own flag (no load through the controller per
        // I/O): a failure another pair found is picked up by the next poll,
        // which then ends whatever was submitted meanwhile.
        if self.timeouts.enabled() {
            // Idle for the application even with map loads in flight.
            // `inflight <= outstanding` always; a wrap would only skip a
            // clock read.
            self.timeouts.stamp_if_idle(
                self.trackers
                    .outstanding()
                    .wrapping_sub(self.hpb.inflight()),
            );
        }
        if self.failed.is_some() {
            return Err(SubmitErrorKind::ControllerFailed);
        }
        let Some(Some(g)) = self.lus.get(usize::from(lun)).copied() else {
            // A UFS LUN is the namespace of this engine's vocabulary.
            return Err(SubmitErrorKind::UnknownNamespace {
                nsid: u32::from(lun),
            });
        };
        if blocks == 0 {
            return Err(SubmitErrorKind::ZeroLength);
        }
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= g.blocks => Ok(g),
            _ => Err(SubmitErrorKind::LbaOutOfRange {
                slba: lba,
                nlb: u64::from(blocks),
                nsze: g.blocks,
            }),
        }
    }

    /// Read `blocks` logical blocks from `lba` of LU `lun` into `buf`. The
    /// request goes into the ring; [`submit`](Self::submit) or the next
    /// [`poll`](Self::poll) rings the doorbell.
    #[inline]
    pub fn read(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_data(lun, lba, blocks, buf, tag, true)
    }

    /// Write `blocks` logical blocks at `lba` of LU `lun` from `buf`.
    #[inline]
    pub fn write(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_data(lun, lba, blocks, buf, tag, false)
    }

    #[inline(always)]
    fn submit_data(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let g = match self.check_range(lun, lba, blocks) {
            Ok(g) => g,
            Err(k) => return Err(submit_err(k, buf)),
        };
        let bytes = u64::from(blocks) << g.shift;
        if let Err(mapped) = buf.check_dir(read) {
            let needs = if read {
                "write into it (read command)"
            } else {
                "read from it (write command)"
            };
            return Err(submit_err(
                SubmitErrorKind::WrongDirection { mapped, needs },
                buf,
            ));
        }
        if !buf.is_mapped_in(&self.space) {
            return Err(submit_err(SubmitErrorKind::NotDmaMapped, buf));
        }
        if bytes > self.max_xfer {
            return self.submit_split(lun, lba, blocks, g.shift, buf, tag, read);
        }
        let Some(slot) = self.alloc_slot() else {
            return Err(submit_err(SubmitErrorKind::QueueFull, buf));
        };
        let prdt = match self.ucds.build_prdt(slot, &buf, 0, bytes) {
            Ok(n) => n,
            Err(k) => {
                self.trackers.unreserve(slot);
                return Err(submit_err(k, buf));
            }
        };
        let task_tag = self.tag_base.wrapping_add(slot as u8);
        // `bytes <= max_xfer <= 16 MiB`: fits the 32-bit length field.
        // An HPB READ when the host map holds this block's entry; else the
        // plain READ/WRITE, built straight into the descriptor.
        match (read && g.hpb)
            .then(|| self.hpb.read_cdb(slot, lun, lba, blocks))
            .flatten()
        {
            Some(cdb) => self
                .ucds
                .write_command(slot, lun, task_tag, cdb, bytes as u32, true),
            None => self
                .ucds
                .write_rw(slot, lun, task_tag, lba, blocks, bytes as u32, read),
        }
        let dir = if read {
            DataDir::FromDevice
        } else {
            // HPB: dirtied before the doorbell, and again when it ends.
            self.hpb.dirty_write(slot, lun, lba, blocks);
            DataDir::ToDevice
        };
        self.transport
            .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
        self.trackers
            .arm(slot, tag, Some(buf), self.timeouts.now_ms);
        self.submitted += 1;
        Ok(())
    }

    /// A read or write above `max_xfer`: children of at most `max_xfer`
    /// bytes (whole blocks), all or nothing (see `split.rs`).
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn submit_split(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        shift: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let bytes = u64::from(blocks) << shift;
        let per = (self.max_xfer >> shift).min(u64::from(u32::MAX)) as u32;
        let depth = self.trackers.depth();
        let too_large = |max: u64| SubmitErrorKind::TransferTooLarge { bytes, max };
        if per == 0 {
            // One block is larger than the per-command limit.
            return Err(submit_err(too_large(self.max_xfer), buf));
        }
        let children = blocks.div_ceil(per);
        if children as usize > depth {
            return Err(submit_err(
                too_large((depth as u64 * u64::from(per)) << shift),
                buf,
            ));
        }
        let available = buf.total_len() as u64;
        if available < bytes {
            return Err(submit_err(
                SubmitErrorKind::BufferTooSmall {
                    needed: bytes,
                    available,
                },
                buf,
            ));
        }
        if depth - self.trackers.outstanding() < children as usize {
            return Err(submit_err(SubmitErrorKind::QueueFull, buf));
        }
        // Reserve every child's slot and build its PRDT before anything is
        // posted, so a rejection leaves nothing behind.
        let mut scratch = std::mem::take(&mut self.splits.scratch);
        scratch.clear();
        let mut err = None;
        for i in 0..children {
            let first = u64::from(i) * u64::from(per);
            let n = per.min(blocks - i * per);
            let Some(slot) = self.alloc_slot() else {
                err = Some(SubmitErrorKind::QueueFull);
                break;
            };
            match self
                .ucds
                .build_prdt(slot, &buf, first << shift, u64::from(n) << shift)
            {
                Ok(prdt) => scratch.push((slot, prdt, lba + first, n)),
                Err(k) => {
                    self.trackers.unreserve(slot);
                    err = Some(k);
                    break;
                }
            }
        }
        if let Some(k) = err {
            for &(slot, ..) in scratch.iter().rev() {
                self.trackers.unreserve(slot);
            }
            self.splits.scratch = scratch;
            return Err(submit_err(k, buf));
        }
        let parent = match self.splits.start(tag, buf, children) {
            Ok(p) => p,
            Err(buf) => {
                // Not expected (a parent is free whenever slots are):
                // refuse rather than lose track.
                for &(slot, ..) in scratch.iter().rev() {
                    self.trackers.unreserve(slot);
                }
                self.splits.scratch = scratch;
                return Err(submit_err(SubmitErrorKind::QueueFull, buf));
            }
        };
        let dir = if read {
            DataDir::FromDevice
        } else {
            self.hpb.dirty(lun, lba, blocks);
            DataDir::ToDevice
        };
        for &(slot, prdt, clba, n) in &scratch {
            let cdb = if read {
                scsi::read(clba, n, false)
            } else {
                scsi::write(clba, n, false)
            };
            let task_tag = self.tag_base.wrapping_add(slot as u8);
            self.ucds.write_command(
                slot,
                lun,
                task_tag,
                cdb,
                (u64::from(n) << shift) as u32,
                read,
            );
            self.transport
                .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
            self.trackers.arm(slot, tag, None, self.timeouts.now_ms);
            if !read {
                self.hpb.note_write(slot, lun, clba, n);
            }
            self.splits.link(slot, parent);
            self.submitted += 1;
        }
        self.splits.scratch = scratch;
        Ok(())
    }

    /// A command without a data buffer (or with a parameter list carried in
    /// its own command descriptor).
    /// Returns the slot it went into.
    fn submit_nodata(
        &mut self,
        lun: u8,
        cdb: scsi::Cdb,
        param: Option<&[u8]>,
        tag: u64,
    ) -> std::result::Result<u16, SubmitError<()>> {
        let Some(slot) = self.alloc_slot() else {
            return Err(submit_err(SubmitErrorKind::QueueFull, ()));
        };
        let task_tag = self.tag_base.wrapping_add(slot as u8);
        let (dir, prdt, bytes) = match param {
            Some(p) => {
                let iova = self.ucds.write_param(slot, p);
                let n = self.ucds.param_prdt(slot, iova, p.len() as u32);
                (DataDir::ToDevice, n, p.len() as u32)
            }
            None => (DataDir::None, 0, 0),
        };
        self.ucds
            .write_command(slot, lun, task_tag, cdb, bytes, false);
        self.transport
            .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
        self.trackers.arm(slot, tag, None, self.timeouts.now_ms);
        self.submitted += 1;
        Ok(slot)
    }

    /// SYNCHRONIZE CACHE(10) of LU `lun`.
    pub fn flush(&mut self, lun: u8, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        if let Err(k) = self.check_range(lun, 0, 1) {
            return Err(submit_err(k, ()));
        }
        self.submit_nodata(lun, scsi::synchronize_cache(), None, tag)
            .map(|_| ())
    }

    /// UNMAP `blocks` blocks from `lba` of LU `lun` (the UFS form of
    /// NVMe's deallocate). The parameter list travels in the command's own
    /// descriptor: no buffer.
    pub fn unmap(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        if let Err(k) = self.check_range(lun, lba, blocks) {
            return Err(submit_err(k, ()));
        }
        self.hpb.dirty(lun, lba, blocks);
        let list = scsi::unmap_list(lba, blocks);
        let slot = self.submit_nodata(lun, scsi::unmap(list.len() as u16), Some(&list), tag)?;
        self.hpb.note_write(slot, lun, lba, blocks);
        Ok(())
    }

    /// Ring the doorbell once for everything queued since the last ring.
    /// Returns whether a doorbell was written.
    #[inline]
    pub fn submit(&mut self) -> bool {
        // One relaxed load per batch: no doorbell once a reset began, until
        // the next poll re-created the queue.
        if self.failed.is_some() || self.ctrl.state() != self.seen_state {
            return false;
        }
        self.transport.flush()
    }

    /// Deliver up to `max` completions to `f`; returns how many. Rings a
    /// pending doorbell first. When the controller failed or disappeared,
    /// every outstanding command completes with
    /// [`IoError::ControllerFailed`] and the poll returns
    /// [`Error::ControllerFatal`] / [`Error::DeviceGone`].
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        // One relaxed load: a reset, or another queue pair that saw the
        // controller fail.
        if self.failed.is_some() || !self.held.is_empty() || self.ctrl.state() != self.seen_state {
            return self.poll_cold(max, &mut f);
        }
        self.transport.flush();
        let outstanding = self.trackers.outstanding();
        let UfsQueuePair {
            ctrl,
            transport,
            trackers,
            splits,
            ucds,
            tag_base,
            completed,
            timeouts,
            seen_state,
            hpb,
            ..
        } = self;
        let tag_base = *tag_base;
        let ucds_ref: &UcdSlice = ucds;
        // Asked after the completion register was read: a reset begins by
        // marking the state word before it disables the controller, so an
        // unchanged word means the register was read before the disable
        // (MMIO accesses stay in program order with these loads).
        let (ctrl, seen) = (&*ctrl, *seen_state);
        let live = || ctrl.state() == seen;
        // `slot` is proven to be the command the completion is for, or past
        // the depth: MCQ, the entry's UCD address is exactly the current
        // UCD of a slot (`UcdSlice::command_of`: an earlier command in the
        // slot had another); legacy, a doorbell bit we set cleared (it
        // clears once per ring). Whatever the OCS, an unproven one is
        // counted as stale and hands back nothing. A proven command's
        // malformed RESPONSE is its own error (`failed_result`).
        let mut deliver = |slot: u16, ocs: Ocs| {
            if usize::from(slot) >= trackers.slots() || !trackers.slot(slot).busy {
                trackers.stale += 1;
                return;
            }
            let task_tag = tag_base.wrapping_add(slot as u8);
            let head = ucds_ref.response_head(slot);
            let result = if ocs == Ocs::SUCCESS && head.is_good(task_tag) {
                Ok(())
            } else {
                let timed_out = timeouts.was_aborted(trackers, slot);
                failed_result(ocs, ucds_ref, slot, task_tag, timed_out)
            };
            if head.dev_info & DEV_INFO_HPB != 0 && result.is_ok() {
                hpb.note(slot, head.dev_info, &ucds_ref.response(slot));
            }
            let (tag, buf) = trackers.complete(slot);
            if end_internal(hpb, ucds_ref, slot, &result) {
                return;
            }
            if let Some(c) = deliver::route(splits, slot, tag, buf, result, 0) {
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(c);
            }
        };
        let (mut n, bad) = match &mut **transport {
            // A UCD address that is not the current one of a slot maps to
            // an impossible slot, which `deliver` counts as stale.
            Transport::Mcq(q) => match q.reap(max, outstanding, live, |ucd, ocs| {
                deliver(ucds_ref.command_of(ucd), ocs)
            }) {
                Reaped::Entries(n) => (n, false),
                Reaped::BadTail => (0, true),
            },
            Transport::Sdb(q) => match q.reap(max, live, &mut deliver) {
                SdbReaped::Entries(n) => (n, false),
                SdbReaped::AllOnes => (0, true),
            },
        };
        if n == 0 && self.trackers.outstanding() > 0 {
            self.empty_polls = self.empty_polls.wrapping_add(1);
            if (bad || self.empty_polls % HEALTH_CHECK_INTERVAL == 0)
                && self.ctrl.check_health() != self.seen_state
            {
                return self.poll_cold(max, &mut f);
            }
            if self.empty_polls % IDLE_CLOCK_INTERVAL == 0 && self.timeouts.enabled() {
                self.timeouts.tick();
            }
        } else {
            self.empty_polls = 0;
            if n != 0 && self.timeouts.enabled() {
                self.timeouts.tick();
            }
        }
        // Only after a poll that reaped everything the controller had
        // posted (fewer than `max`): a command whose completion waits in
        // the CQ is not a timeout.
        if self.timeouts.scan_due() && n < max && !bad {
            // What the scan ends counts against `max` too; the rest is held.
            let mut held = std::mem::take(&mut self.held);
            let ((), k) = held.budgeted(max - n, &mut f, |mut g| self.scan_timeouts(&mut g));
            self.held = held;
            n += k;
        }
        // No new map loads once the queue pair is closing.
        if self.hpb.pass_due() && !self.closed {
            self.hpb_pass();
        }
        Ok(n)
    }

    /// An HPB policy pass, then post the internal commands it prepared
    /// (map loads, inactivations) into free slots and ring once.
    #[cold]
    fn hpb_pass(&mut self) {
        self.hpb
            .pass(self.trackers.depth() - self.trackers.outstanding());
        let mut posted = false;
        // Internal commands are stamped with their own submission time
        // (the clock may not have been read for a while on a quiet queue).
        let mut stamped = !self.timeouts.enabled();
        while let Some(cmd) = self.hpb.next_cmd() {
            if !stamped {
                self.timeouts.tick();
                stamped = true;
            }
            let Some(slot) = self.alloc_slot() else {
                self.hpb.refused(cmd);
                continue;
            };
            let (dir, prdt, bytes) = match cmd.data {
                Some((iova, len)) => (
                    DataDir::FromDevice,
                    self.ucds.param_prdt(slot, iova, len),
                    len,
                ),
                None => (DataDir::None, 0, 0),
            };
            let task_tag = self.tag_base.wrapping_add(slot as u8);
            self.ucds
                .write_command(slot, cmd.lun, task_tag, cmd.cdb, bytes, bytes > 0);
            self.transport
                .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
            self.trackers
                .arm(slot, u64::MAX, None, self.timeouts.now_ms);
            self.hpb.posted(slot, cmd);
            posted = true;
        }
        if posted {
            self.transport.flush();
        }
    }

    /// Act on commands past their timeout (see [`TimeoutPolicy`]): the
    /// core finds them and decides, the UFS abort machinery acts. Cold.
    #[cold]
    #[inline(never)]
    fn scan_timeouts(&mut self, f: &mut impl FnMut(Completion<B>)) {
        // Nothing is marked posted: the scan runs only after a poll that
        // reaped everything posted.
        self.timeouts.begin_scan();
        // HPB's internal commands are not the application's: its policy and
        // statistics never see them; they have their own handling below.
        if self.hpb.inflight() > 0 {
            for slot in 0..self.trackers.slots() as u16 {
                if self.hpb.is_internal(slot) {
                    self.timeouts.exclude(slot);
                }
            }
        }
        timeout::scan(&mut UfsTimeouts { qp: self, f });
        if self.failed.is_none() && self.ctrl.state() == self.seen_state {
            self.scan_internal_timeouts();
        }
    }

    /// HPB's internal commands past the I/O timeout: withdrawn (MCQ cleanup
    /// by nexus, UTRLCLR) once, whatever the application's policy, so that
    /// its ABORTED completion ends it as a failed command inside the queue
    /// pair; given up (slot retired until a controller reset, buffer never
    /// reused) if the controller refuses, or does not give it back within
    /// another timeout. Never a controller reset, never in
    /// [`UfsQpairStats`]: counted in [`HpbStats`](super::HpbStats).
    #[cold]
    fn scan_internal_timeouts(&mut self) {
        if self.hpb.inflight() == 0 {
            return;
        }
        let (now, limit, scan) = (
            self.timeouts.now_ms,
            self.timeouts.timeout_ms(),
            self.timeouts.scan_interval_ms(),
        );
        for slot in 0..self.trackers.slots() as u16 {
            let s = self.trackers.slot(slot);
            if !s.busy {
                continue;
            }
            match self
                .hpb
                .timeout_step(slot, s.submitted_ms, now, limit, scan)
            {
                None => continue,
                Some(Overdue::Withdraw) => {
                    log::warn!(
                        "UFS queue pair (tag base {}): HPB command in slot {slot} has no completion after {} ms; withdrawing it",
                        self.tag_base,
                        now.wrapping_sub(s.submitted_ms)
                    );
                    let accepted = self.withdraw(slot).unwrap_or(false);
                    self.hpb.withdrawn(slot, now, accepted);
                }
                Some(Overdue::GiveUp) => self.give_up_internal(slot),
            }
            if self.failed.is_some() || self.ctrl.state() != self.seen_state {
                return;
            }
        }
    }

    /// End the internal command in busy `slot` that the controller may
    /// still hold: its slot is retired (never reused until a controller
    /// reset succeeds), and the queue's memory leaked at drop. No
    /// completion: it is not the application's.
    #[cold]
    fn give_up_internal(&mut self, slot: u16) {
        log::warn!(
            "UFS queue pair (tag base {}): giving up the HPB command in slot {slot}",
            self.tag_base
        );
        self.leak = true;
        let _ = self.trackers.retire(slot);
        self.hpb.give_up(slot);
    }

    /// A command needs a host controller reset (policy `Reset`, or an abort
    /// that was refused or not answered). Escalates through
    /// `UfsController::reset_for_timeout`; when that reset fails, ends the
    /// command once as [`IoError::TimedOut`] without its buffer and retires
    /// its slot (see [`UfsQueuePair`]). Returns whether the controller was
    /// reset.
    #[cold]
    fn reset_for_timeout(&mut self, slot: u16, f: &mut impl FnMut(Completion<B>)) -> bool {
        if self.hpb.is_internal(slot) {
            // Not the application's (the scan excludes them): never a reset
            // or a completion for it.
            self.give_up_internal(slot);
            return false;
        }
        self.timeouts.stats.resets_requested += 1;
        if self.ctrl.reset_for_timeout() {
            // The reset ends every command in flight (the next poll sees it).
            return true;
        }
        // The device may still hold the command: never hand back its
        // buffer, never reuse its slot or command descriptor, and leak the
        // queue's memory at drop.
        self.leak = true;
        self.splits.poison(slot);
        let (tag, buf) = self.trackers.retire(slot);
        self.hpb.write_ended(slot);
        let mut leaked = deliver::leak(buf);
        let routed = self.splits.finish(slot, Err(IoError::TimedOut));
        leaked += self.splits.take_leaked();
        self.ctrl.add_leaked(leaked);
        let (tag, result) = match routed {
            Routed::NotChild => (tag, Err(IoError::TimedOut)),
            Routed::Pending => return false,
            Routed::Done(tag, result, _) => (tag, result),
        };
        self.timeouts.stats.timed_out += 1;
        self.completed += 1;
        f(Completion {
            tag,
            result,
            buf: None,
            dw0: 0,
        });
        false
    }

    /// End every command in flight with `err` (the device no longer owns
    /// them, or `keep_bufs` is false and their buffers are leaked), children
    /// of a split through their parent (the shared `core::deliver`).
    /// Returns the bytes leaked.
    #[cold]
    fn end_all(&mut self, err: IoError, keep_bufs: bool, f: &mut impl FnMut(Completion<B>)) -> u64 {
        let mut leaked = 0u64;
        self.hpb.all_writes_ended();
        // Internal commands (HPB map loads) are the HPB state's, not the
        // application's: they end there, without a completion.
        if self.hpb.inflight() > 0 {
            let hpb = &self.hpb;
            let internal: Vec<u16> = self
                .trackers
                .busy()
                .map(|(slot, ..)| slot)
                .filter(|&slot| hpb.is_internal(slot))
                .collect();
            for slot in internal {
                self.trackers.complete(slot);
                self.hpb.abandon(slot, keep_bufs);
            }
        }
        let completed = &mut self.completed;
        drain_all(
            &mut self.trackers,
            &mut self.splits,
            usize::MAX,
            |tag, buf, first| {
                let buf = if keep_bufs {
                    buf
                } else {
                    leaked += deliver::leak(buf);
                    None
                };
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(Completion {
                    tag,
                    result: Err(first.unwrap_or(err)),
                    buf,
                    dw0: 0,
                });
            },
        );
        leaked + self.splits.take_leaked()
    }

    /// Finish the queue pair: wait (up to `UfsOptions::close_timeout`) for
    /// commands in flight, then withdraw what is left (MCQ: SQ stop and
    /// cleanup by nexus; legacy: UTRLCLR). Every command ends exactly once
    /// through `f`: withdrawn ones with [`IoError::Aborted`] — with their
    /// buffer if the controller confirmed the withdrawal, without it
    /// (leaked, with the queue's memory) if not.
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f);
        Ok(())
    }

    fn shutdown(&mut self, f: &mut impl FnMut(Completion<B>)) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.held.deliver(usize::MAX, f);
        let limit = self.ctrl.options().close_timeout;
        let start = Instant::now();
        while self.trackers.outstanding() > 0 && self.failed.is_none() && start.elapsed() < limit {
            if matches!(self.poll(usize::MAX, &mut *f), Ok(0)) {
                std::thread::yield_now();
            }
        }
        if self.trackers.outstanding() == 0 {
            return;
        }
        // Still in flight: withdraw.
        let withdrawn = match &mut *self.transport {
            Transport::Sdb(q) => {
                let bits = q.clear_outstanding();
                let t = Instant::now();
                let mut left = q.still_set(bits);
                while left != 0 && t.elapsed() < limit {
                    std::thread::yield_now();
                    left = q.still_set(bits);
                }
                q.forget_outstanding();
                left == 0
            }
            Transport::Mcq(_) => {
                self.mcq_cleanup(limit, f);
                self.trackers.outstanding() == 0
            }
        };
        let leaked = self.end_all(IoError::Aborted, withdrawn, f);
        if !withdrawn {
            self.leak = true;
            self.ctrl.add_leaked(leaked);
        }
    }
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// The MCQ cleanup sequence for `slots`: stop the SQ, clean up each
    /// command by its nexus (LUN, task tag) — the controller completes it
    /// with OCS ABORTED, whether still queued or held — and restart the SQ.
    /// Returns how many the controller confirmed (cleanup error code 0), or
    /// `None` if the SQ did not stop within `limit`.
    #[cold]
    fn mcq_cleanup_slots(&mut self, slots: &[u16], limit: std::time::Duration) -> Option<usize> {
        let Transport::Mcq(q) = &*self.transport else {
            return None;
        };
        let regs = self.ctrl.backend().regs();
        let r = q.regs();
        let (rtc, cti, rts) = (r.sqrtc.offset(), r.sqcti.offset(), r.sqrts.offset());
        let wait = |mask: u32, want: u32| {
            let t = Instant::now();
            loop {
                let v = regs.read32(rts);
                if v != u32::MAX && v & mask == want {
                    return Some(v);
                }
                if t.elapsed() > limit {
                    return None;
                }
                std::thread::yield_now();
            }
        };
        regs.write32(rtc, sq_op::RTC_STOP);
        wait(sq_op::RTS_STOPPED, sq_op::RTS_STOPPED)?;
        let mut ok = 0;
        for &slot in slots {
            let lun = self.ucds.command_lun(slot);
            let tag = self.tag_base.wrapping_add(slot as u8);
            regs.write32(cti, sq_op::cleanup_target(lun, tag));
            regs.write32(rtc, sq_op::RTC_STOP | sq_op::RTC_ICU);
            match wait(sq_op::RTS_CLEANUP_DONE, sq_op::RTS_CLEANUP_DONE) {
                Some(v) if sq_op::cleanup_error(v) == 0 => ok += 1,
                v => log::warn!("UFS SQ cleanup of task tag {tag} failed (SQRTS {v:?})"),
            }
        }
        regs.write32(rtc, sq_op::RTC_START);
        if wait(sq_op::RTS_STOPPED, 0).is_none() {
            log::warn!("UFS SQ {} did not restart", q.index());
        }
        Some(ok)
    }

    /// Close's MCQ path: clean up every command in flight, then reap the
    /// ABORTED completions (delivered as [`IoError::Aborted`]). Whatever the
    /// controller does not give back stays outstanding.
    #[cold]
    fn mcq_cleanup(&mut self, limit: std::time::Duration, f: &mut impl FnMut(Completion<B>)) {
        let slots: Vec<u16> = self.trackers.busy().map(|(slot, ..)| slot).collect();
        if self.mcq_cleanup_slots(&slots, limit).is_none() {
            return;
        }
        let start = Instant::now();
        let mut aborted = |mut c: Completion<B>| {
            if c.result == Err(IoError::Ufs(UfsError::Transport(Ocs::ABORTED))) {
                c.result = Err(IoError::Aborted);
            }
            f(c)
        };
        while self.trackers.outstanding() > 0 && self.failed.is_none() && start.elapsed() < limit {
            if matches!(self.poll(usize::MAX, &mut aborted), Ok(0)) {
                std::thread::yield_now();
            }
        }
    }

    /// Report every application command outstanding for longer than
    /// `timeout` (`cid` is its task tag), as
    /// [`QueuePair::check_timeouts`](crate::QueuePair::check_timeouts) does
    /// on NVMe.
    ///
    /// Reporting only, independent of [`UfsQpairOptions::io_timeout`]
    /// (which acts by itself inside [`poll`](Self::poll)); pass a reported
    /// `tag` to [`abort`](Self::abort) to withdraw the command. HPB's own
    /// map loads are not listed. Ages use the queue's coarse clock,
    /// refreshed here.
    pub fn check_timeouts(&mut self, timeout: Duration, f: impl FnMut(Outstanding)) -> usize {
        let (hpb, tag_base) = (&self.hpb, self.tag_base);
        self.timeouts.report_overdue(
            &self.trackers,
            timeout,
            |slot| !hpb.is_internal(slot),
            |slot, _| u16::from(tag_base.wrapping_add(slot as u8)),
            f,
        )
    }

    /// Read IS; if the host controller reports a fatal error or is gone,
    /// record that at the controller (a fatal controller is disabled, so no
    /// DMA stays in flight) and return the error. The next
    /// [`poll`](Self::poll) ends the outstanding commands with
    /// [`IoError::ControllerFailed`], as on NVMe
    /// ([`QueuePair::check_health`](crate::QueuePair::check_health)). For an
    /// application that waits without polling; a polling one learns the same
    /// from `poll`. A reset in progress or finished is not a failure.
    pub fn check_health(&mut self) -> Result<()> {
        if let Some(h) = self.failed {
            return Err(health_error(h));
        }
        match state::failure(self.ctrl.check_health()) {
            health::OK => Ok(()),
            h => Err(health_error(h)),
        }
    }

    /// Abort the command in flight with `tag` (the first, if several share
    /// it). MCQ: SQ stop, cleanup by nexus (a still-queued entry or one the
    /// device holds), SQ restart; legacy: UTRLCLR of its slot. The command
    /// then completes once, through [`poll`](Self::poll), with
    /// `IoError::Ufs(UfsError::Transport(Ocs::ABORTED))` and its buffer —
    /// or normally, if it finished first. Returns `Ok(false)` when no
    /// command with `tag` is in flight or the controller refused the
    /// cleanup; [`Error::Timeout`] when the SQ did not stop.
    pub fn abort(&mut self, tag: u64) -> Result<bool> {
        if let Some(h) = self.failed {
            return Err(health_error(h));
        }
        self.transport.flush();
        let hpb = &self.hpb;
        let Some((slot, ..)) = self
            .trackers
            .busy()
            .find(|&(slot, _, t, _)| t == tag && !hpb.is_internal(slot))
        else {
            return Ok(false);
        };
        self.withdraw(slot)
    }

    /// Ask the controller to give up the command in busy `slot` (the
    /// doorbell already rung): MCQ cleanup by nexus, or UTRLCLR. It then
    /// completes through `poll` with OCS ABORTED. `Ok(false)`: refused.
    #[cold]
    fn withdraw(&mut self, slot: u16) -> Result<bool> {
        let limit = self.ctrl.options().init_timeout;
        match &mut *self.transport {
            Transport::Sdb(q) => Ok(q.withdraw(1 << slot)),
            Transport::Mcq(_) => match self.mcq_cleanup_slots(&[slot], limit) {
                Some(n) => Ok(n == 1),
                None => Err(Error::Timeout {
                    what: "stop the UFS submission queue (SQRTS.STS)",
                    timeout_ms: limit.as_millis() as u64,
                }),
            },
        }
    }
}

/// UFS's side of the shared timeout scan: log, withdraw the command (MCQ
/// cleanup by nexus, UTRLCLR), escalate to the controller-reset hook.
struct UfsTimeouts<'a, B: IoBuf, F> {
    qp: &'a mut UfsQueuePair<B>,
    f: &'a mut F,
}

impl<B: IoBuf, F: FnMut(Completion<B>)> TimeoutActions for UfsTimeouts<'_, B, F> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.timeouts, &mut self.qp.trackers)
    }

    fn report(&mut self, e: &Expired) {
        log::warn!(
            "UFS queue pair (tag base {}): command tag {} has no completion after {} ms",
            self.qp.tag_base,
            e.tag,
            e.age_ms
        );
    }

    fn abort(&mut self, e: &Expired) -> bool {
        self.qp.withdraw(e.slot).unwrap_or(false)
    }

    fn reset(&mut self, e: &Expired) -> bool {
        self.qp.reset_for_timeout(e.slot, self.f)
    }

    fn stop(&self) -> bool {
        self.qp.failed.is_some()
    }
}

#[inline(always)]
/// The result of the command in `slot` that did not complete plainly
/// GOOD (`RspHead::is_good`: GOOD, no transfer flag, residual 0): its OCS,
/// SCSI status and transfer report decoded (`io_result`: a GOOD response
/// that moved less or wanted more than the command's transfer is an
/// error), and an ABORTED one that we asked for because it `timed_out`
/// reported as such. Shared by `poll` (MCQ and legacy) and the recovery
/// after a reset.
#[cold]
fn failed_result(
    ocs: Ocs,
    ucds: &UcdSlice,
    slot: u16,
    task_tag: u8,
    timed_out: bool,
) -> std::result::Result<(), IoError> {
    let expected = ucds.command_len(slot);
    match io_result(ocs, &ucds.response(slot), task_tag, expected) {
        Ok(()) => Ok(()),
        // Given up at our request because it timed out.
        Err(UfsError::Transport(Ocs::ABORTED)) if timed_out => Err(IoError::TimedOut),
        Err(e) => Err(IoError::Ufs(e)),
    }
}

/// If `slot` (its tracker already freed) held an internal HPB command, end
/// it in the HPB state — never as an application completion — and return
/// true. A map load must have moved every byte: a short one would publish
/// whatever the buffer held before; `result` is `Ok` only for a response
/// with no transfer flag and a residual of 0 (`RspHead::is_good`,
/// `failed_result`), the same rule as for the application's reads. An
/// application write or unmap dirties its sub-regions again here, before
/// the application hears of it (`HpbQp::write_ended`).
#[inline(always)]
fn end_internal(
    hpb: &mut HpbQp,
    ucds: &UcdSlice,
    slot: u16,
    result: &std::result::Result<(), IoError>,
) -> bool {
    // One test when HPB is off.
    if !hpb.on() {
        return false;
    }
    if !hpb.is_internal(slot) {
        hpb.write_ended(slot);
        return false;
    }
    // `is_ok` already implies a residual of 0; asked again as a guard.
    let whole = result.is_ok() && ucds.response(slot).residual() == 0;
    hpb.complete(slot, whole);
    true
}

fn health_error(h: u8) -> Error {
    if h == health::GONE {
        Error::DeviceGone
    } else {
        Error::ControllerFatal
    }
}

impl<B: IoBuf> Drop for UfsQueuePair<B> {
    fn drop(&mut self) {
        self.shutdown(&mut |_| {});
        // SAFETY: taken once, here; neither field is used after.
        let (t, u) = unsafe {
            (
                ManuallyDrop::take(&mut self.transport),
                ManuallyDrop::take(&mut self.ucds),
            )
        };
        if self.leak {
            self.hpb.leak_buffers();
        }
        // Counted once, here; `HpbQp`'s drop leaks them.
        self.ctrl.add_leaked(self.hpb.leaking_bytes());
        if self.leak {
            // The controller may still write these: never free or reuse them.
            self.ctrl
                .add_leaked((self.trackers.slots() * SLOT_BYTES) as u64);
            std::mem::forget(u);
            std::mem::forget(t);
        } else if self.failed.is_none() {
            self.ctrl.give_back(t, Some(u));
        } else {
            drop(u.into_region());
        }
    }
}

impl<B: IoBuf> UfsQueuePair<B> {
    /// SYNCHRONIZE CACHE of LU `lun`, and wait. Needs an idle queue pair
    /// ([`Error::QueueBusy`] otherwise).
    pub fn flush_blocking(&mut self, lun: u8) -> Result<()> {
        block::flush_blocking(self, lun)
    }
}

impl UfsQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (whole blocks) from `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn read_blocking(&mut self, lun: u8, lba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, lun, lba, dst)
    }

    /// Write `src` (whole blocks) at `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn write_blocking(&mut self, lun: u8, lba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, lun, lba, src)
    }
}

/// The block operations shared with the NVMe transport: each is the
/// inherent method of the same name (no extra work per I/O). A UFS LUN is
/// the address; deallocate is UNMAP.
impl<B: IoBuf> BlockQueue for UfsQueuePair<B> {
    type Addr = u8;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        UfsQueuePair::read(self, lun, lba, blocks, buf, tag)
    }

    #[inline]
    fn write(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        UfsQueuePair::write(self, lun, lba, blocks, buf, tag)
    }

    fn flush(&mut self, lun: u8, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        UfsQueuePair::flush(self, lun, tag)
    }

    fn deallocate(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        UfsQueuePair::unmap(self, lun, lba, blocks, tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        UfsQueuePair::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, f: F) -> Result<usize> {
        UfsQueuePair::poll(self, max, f)
    }

    #[inline]
    fn depth(&self) -> usize {
        UfsQueuePair::depth(self)
    }

    #[inline]
    fn outstanding(&self) -> usize {
        UfsQueuePair::outstanding(self)
    }

    #[inline]
    fn is_full(&self) -> bool {
        UfsQueuePair::is_full(self)
    }

    fn max_transfer(&self) -> u64 {
        self.max_xfer
    }

    fn block_shift(&self, lun: u8) -> Option<u32> {
        self.lus
            .get(usize::from(lun))
            .copied()
            .flatten()
            .map(|g| g.shift)
    }

    fn close<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        UfsQueuePair::close(self, f)
    }
}

impl<B: IoBuf> Blocking for UfsQueuePair<B> {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn blocking_timeout(&self) -> Duration {
        self.ctrl.options().blocking_timeout
    }

    /// An idle queue pair catches up with a host controller reset before
    /// it queues on a stale hardware queue (a poll of nothing does that).
    fn blocking_sync(&mut self) -> Result<()> {
        self.poll(0, |_| {}).map(|_| ())
    }

    fn unknown(lun: u8) -> SubmitErrorKind {
        // A UFS LUN is the namespace of this engine's vocabulary.
        SubmitErrorKind::UnknownNamespace {
            nsid: u32::from(lun),
        }
    }
}
