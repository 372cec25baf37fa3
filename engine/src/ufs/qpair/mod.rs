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
//!
//! File by file: this one holds the options, statistics, the queue pair
//! itself, its creation and accessors; `submit.rs`, `reap.rs` (the poll),
//! `recover.rs` (timeouts and withdrawal), `reset.rs` (after a controller
//! reset or failure), `teardown.rs` (close, drop, leaks) and `blocking.rs`
//! (blocking helpers, [`BlockQueue`](crate::core::block::BlockQueue)).

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio_vfio::{DmaDir, DmaSpace, Mapped};

use super::ctrl::{state, Pool, UfsController, UfsMode, TASK_TAGS};
use super::hpb::qp::{HpbQp, Overdue, DEV_INFO_HPB};
use super::mcq::{McqQueue, Reaped};
use super::sdb::{SdbQueue, SdbReaped};
use super::spec::regs::sq_op;
use super::spec::scsi;
use super::spec::status::{io_result, UfsError};
use super::spec::utrd::{DataDir, Ocs, PrdtEntry, Ucd, Utrd};
use super::ucd::{UcdSlice, MAX_PRDT_ENTRIES, SLOT_BYTES};
use crate::core::block;
use crate::core::deliver;
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::mapped::{MappedQueuePair, MappingMode};
use crate::core::qpair::Reaped as CoreReaped;
use crate::core::qpair::{Closing, Engine, Recreated, SplitRequest, WaitPolicy, Wire};
use crate::core::split::Routed;
use crate::core::state::Stopped;
use crate::core::timeout::{self, Expired, Outstanding, TimeoutActions, TimeoutPolicy, Timeouts};
use crate::core::tracker::Trackers;
use crate::{Error, Result};

mod blocking;
mod reap;
mod recover;
// Recovery after a host controller reset (`UfsController::reset`).
mod reset;
mod submit;
mod teardown;
mod wait;

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
    /// The most blocks one command carries without a split (`max_xfer >>
    /// shift`): the hot path's one compare `blocks - 1 < unsplit` stands
    /// for the zero-count and split checks (issue 28).
    unsplit: u32,
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
    // The descriptor is turned into its four words before the match: built
    // as a struct across it, it went through the stack one field at a time
    // (issue 28).
    #[inline(always)]
    fn post(&mut self, slot: u16, utrd: Utrd) {
        let w = utrd.to_le_words();
        match self {
            Transport::Mcq(q) => q.post_words(w),
            Transport::Sdb(q) => q.post_words(slot, w),
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
/// ([`UfsController::create_qpair_for`]).
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
    /// How buffers get their device addresses, as NVMe's
    /// [`crate::QpairOptions::mapping`]: premapped [`DmaBuf`]s
    /// ([`UfsController::create_qpair`], the default) or application
    /// buffers mapped per I/O in strict or lazy mode
    /// ([`UfsController::create_mapped_qpair`]).
    pub mapping: MappingMode,
    /// How [`UfsQueuePair::wait`] waits, as NVMe's
    /// [`crate::QpairOptions::wait`]: spinning ([`WaitPolicy::Poll`], the
    /// default), or sleeping on the host controller's interrupt
    /// (`Interrupt`, `Hybrid`; QEMU's UFS has an INTx line, shared by
    /// every waiting queue pair of the controller). MCQ only: in legacy
    /// single-doorbell mode a wait polls whatever the policy.
    pub wait: WaitPolicy,
}

impl Default for UfsQpairOptions {
    /// The NVMe defaults: 30 s, [`TimeoutPolicy::Abort`], premapped.
    fn default() -> Self {
        UfsQpairOptions {
            io_timeout: Some(Duration::from_secs(30)),
            timeout_policy: TimeoutPolicy::Abort,
            mapping: MappingMode::Premapped,
            wait: WaitPolicy::Poll,
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
    /// CQHP stores (MCQ), one per 32 consumed entries (fewer on a queue
    /// too deep for that much room in its ring).
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
    /// The state and lifecycle every wire shares (`core::qpair`); a split
    /// child being built keeps its PRDT entry count.
    eng: Engine<B, u16>,
    /// Task tag of slot 0: tags are `tag_base + slot`, hardware queue `i`
    /// has `i * depth ..`, unique device-wide because the controller bounds
    /// queues × depth to the 256 task tags (`UfsOptions::depth`).
    tag_base: u8,
    lus: Vec<Option<LuGeom>>,
    space: Arc<DmaSpace>,
    /// `B::space_key(&space)`, for the hot path's buffer check
    /// (`IoBuf::usable_in`).
    space_key: u64,
    /// HPB: the read/write hooks and internal map loads (`super::hpb`).
    hpb: HpbQp,
    _not_sync: PhantomData<Cell<()>>,
}

impl UfsController {
    /// Create a queue pair for [`DmaBuf`] buffers, as
    /// [`Controller::create_qpair`](crate::Controller::create_qpair) does on
    /// NVMe: in MCQ mode one of the hardware queues set up at bring-up, in
    /// legacy mode the one list. [`Error::NoFreeQueue`] when every queue is
    /// taken by a live queue pair. `opts.mapping` must be
    /// [`MappingMode::Premapped`]: strict and lazy modes take application
    /// buffers, through [`UfsController::create_mapped_qpair`].
    pub fn create_qpair(self: &Arc<Self>, opts: UfsQpairOptions) -> Result<UfsQueuePair<DmaBuf>> {
        self.create_qpair_for(opts)
    }

    /// Create a queue pair for application buffers mapped per I/O in the
    /// strict or lazy mode `opts.mapping` names: the same
    /// [`MappedQueuePair`] as NVMe's, over a UFS queue pair (see
    /// [`crate::core::mapped`]).
    pub fn create_mapped_qpair(
        self: &Arc<Self>,
        opts: UfsQpairOptions,
    ) -> Result<MappedQueuePair<UfsQueuePair<Mapped>>> {
        let mapping = opts.mapping.clone();
        MappedQueuePair::<UfsQueuePair<Mapped>>::check_mode(&mapping)?;
        let qp = self.new_qpair::<Mapped>(&opts)?;
        let max = qp.max_transfer();
        MappedQueuePair::new(qp, self.dma(), max, &mapping)
    }

    /// Create a queue pair moving buffers of type `B` (e.g. `Vec<DmaBuf>`
    /// for vectored I/O), as
    /// [`Controller::create_qpair_for`](crate::Controller::create_qpair_for)
    /// on NVMe. `opts.mapping` must be premapped, as for
    /// [`create_qpair`](Self::create_qpair).
    pub fn create_qpair_for<B: IoBuf>(
        self: &Arc<Self>,
        opts: UfsQpairOptions,
    ) -> Result<UfsQueuePair<B>> {
        match opts.mapping {
            MappingMode::Premapped => self.new_qpair(&opts),
            ref m => Err(Error::InvalidOption(format!(
                "mapping {m:?} maps application buffers per I/O: create the queue pair with UfsController::create_mapped_qpair"
            ))),
        }
    }

    fn new_qpair<B: IoBuf>(self: &Arc<Self>, opts: &UfsQpairOptions) -> Result<UfsQueuePair<B>> {
        // The legacy list's UTRDs do not ask for IS.UTRCS (their
        // Interrupt bit is clear): a legacy queue pair waits by polling.
        let mcq = matches!(self.mode(), UfsMode::Mcq { .. });
        let irq = match opts.wait.wants_interrupt() && mcq {
            true => Some(self.interrupt_line()?),
            false => None,
        };
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
                (Transport::Mcq(McqQueue::new(r, hook, depth)), base, pooled)
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
        let max_xfer = u64::from(self.options().max_transfer)
            .min(MAX_PRDT_ENTRIES as u64 * u64::from(PrdtEntry::MAX_BYTES));
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
                unsplit: (max_xfer >> l.block_shift()).min(u64::from(u32::MAX)) as u32,
            });
        }
        let hpb = match HpbQp::new(self.hpb_maps(), self.dma(), usize::from(depth)) {
            Ok(h) => h,
            Err(e) => {
                self.give_back(transport, Some(ucds));
                return Err(e);
            }
        };
        let mut eng = Engine::new(
            depth,
            0,
            max_xfer,
            opts.io_timeout,
            opts.timeout_policy,
            self.options().blocking_timeout,
            seen_state,
        );
        // Every waiting queue pair shares the controller's one line.
        eng.wait = crate::core::qpair::wait::Waiter::new(
            opts.wait,
            irq.map(crate::core::qpair::Interrupt::Notifier),
            true,
        );
        Ok(UfsQueuePair {
            ctrl: Arc::clone(self),
            transport: ManuallyDrop::new(transport),
            ucds: ManuallyDrop::new(ucds),
            eng,
            tag_base,
            lus,
            space_key: B::space_key(self.dma()),
            space: Arc::clone(self.dma()),
            hpb,
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
        self.eng.depth()
    }

    /// Commands submitted and not yet completed (the application's; HPB
    /// map loads in flight are not counted).
    pub fn outstanding(&self) -> usize {
        // Internal commands are in the trackers' count and in `inflight`
        // until the same moment.
        self.eng.outstanding(self.hpb.inflight())
    }

    /// Whether a submission now would fail with `QueueFull`.
    pub fn is_full(&self) -> bool {
        self.eng.trackers.is_full()
    }

    /// Largest transfer per command, in bytes.
    pub fn max_transfer(&self) -> u64 {
        self.eng.max_xfer
    }

    /// The MCQ hardware queue this pair uses (`None` in legacy mode).
    pub fn hw_queue(&self) -> Option<u16> {
        match &*self.transport {
            Transport::Mcq(q) => Some(q.index()),
            Transport::Sdb(_) => None,
        }
    }

    /// The counters every wire keeps, in the type shared with NVMe
    /// ([`crate::QueueCounters`]).
    pub fn counters(&self) -> crate::QueueCounters {
        self.all_counters()
    }

    /// Counters.
    pub fn stats(&self) -> UfsQpairStats {
        let mut s = UfsQpairStats {
            submitted: self.eng.submitted,
            completed: self.eng.completed,
            stale_completions: self.eng.trackers.stale,
            timeouts: self.eng.timeouts.stats.timeouts,
            aborts_sent: self.eng.timeouts.stats.aborts_sent,
            timed_out: self.eng.timeouts.stats.timed_out,
            resets_requested: self.eng.timeouts.stats.resets_requested,
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

/// The error of a stopped queue pair, in UFS's words.
fn stopped_error(s: Stopped, qid: u16) -> Error {
    match s {
        Stopped::Gone => Error::DeviceGone,
        Stopped::Fatal => Error::ControllerFatal,
        Stopped::Lost => Error::QueueLost { qid },
    }
}
