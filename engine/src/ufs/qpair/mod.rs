//! [`UfsQueuePair`]: the application's per-thread UFS I/O object, with the
//! same block operations and semantics as NVMe's [`crate::QueuePair`]:
//! buffers move in at submission and come back in exactly one
//! [`Completion`](crate::core::io::Completion) (or in the [`SubmitError`] of a refused submission),
//! [`submit`](UfsQueuePair::submit) rings one doorbell per batch,
//! [`poll`](UfsQueuePair::poll) reaps.
//!
//! A read or write above the per-command limit is split into child commands
//! (the shared `core/split_table.rs` and `core/qpair/split_plan.rs`) and still completes once, with its buffer after every child
//! finished.
//!
//! The hardware queue (`HwQueue`: an MCQ queue pair or the legacy list) is an enum resolved
//! once per queue pair; nothing is dispatched dynamically per I/O.
//!
//! What is UFS-specific here: the command descriptors (`ucd.rs`), the
//! UTRD, the SCSI CDBs and the decoding of OCS and SCSI status. The
//! tracking of tags (slot + generation, `crate::core::tracker`) and the
//! completion delivery rules are the engine's, shared with NVMe.
//!
//! File by file, the same roles as every wire's queue pair: this one holds
//! the options, statistics, the queue pair itself and its accessors;
//! `create.rs` (taking a hardware queue at creation, giving it back),
//! `submit.rs`, `reap.rs` (the poll), `wire.rs` (the core's `Wire` hooks,
//! and recovery after a controller reset or failure), `timeouts.rs`
//! (timeouts and withdrawal), `teardown.rs` (close, drop, leaks),
//! `wait.rs` (the interrupt) and `blocking.rs` (blocking helpers,
//! [`BlockQueue`](crate::core::block::BlockQueue)).

use crate::core::qpair::Lifecycle;
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::DmaSpace;

use super::ctrl::UfsController;
use super::hpb::qp::HpbQp;
use super::mcq::McqQueue;
use super::sdb::SdbQueue;
use super::spec::status::{io_result, UfsError};
use super::spec::utrd::{Ocs, Utrd};
use super::ucd::UcdSlice;
use crate::core::error::Error;
use crate::core::io::{DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::mapped::MappingMode;
use crate::core::qpair::{Engine, WaitPolicy};
use crate::core::state::Stopped;
use crate::core::timeout::TimeoutPolicy;

mod blocking;
mod create;
mod reap;
mod submit;
mod teardown;
mod timeouts;
mod wait;
mod wire;

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
    /// for the zero-count and split checks.
    unsplit: u32,
}

/// The kind of hardware queue a queue pair runs on, with that queue: one
/// of the MCQ queue pairs, or the legacy single-doorbell list (SDB);
/// chosen once at creation.
// One per queue pair, built once and never moved on the I/O path: boxing the
// larger variant would only add a pointer chase to every submit and poll.
#[allow(clippy::large_enum_variant)]
enum HwQueue {
    Mcq(McqQueue),
    Legacy(SdbQueue),
}

impl HwQueue {
    // The descriptor is turned into its four words before the match: built
    // as a struct across it, it went through the stack one field at a time.
    #[inline(always)]
    fn post(&mut self, slot: u16, utrd: Utrd) {
        let w = utrd.to_le_words();
        match self {
            HwQueue::Mcq(q) => q.post_words(w),
            HwQueue::Legacy(q) => q.post_words(slot, w),
        }
    }

    #[inline]
    fn flush(&mut self) -> bool {
        match self {
            HwQueue::Mcq(q) => q.flush(),
            HwQueue::Legacy(q) => q.flush(),
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
/// through one hook, `UfsController::reset_for_timeout` (in `timeouts.rs`),
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
    hwq: ManuallyDrop<HwQueue>,
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
        match &*self.hwq {
            HwQueue::Mcq(q) => Some(q.index()),
            HwQueue::Legacy(_) => None,
        }
    }

    /// The counters every wire keeps, in the type shared with NVMe
    /// ([`crate::QueueCounters`]).
    pub fn counters(&self) -> crate::core::qpair::QueueCounters {
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
        match &*self.hwq {
            HwQueue::Mcq(q) => {
                s.doorbell_writes = q.stats.sq_doorbell_writes;
                s.cq_head_writes = q.stats.cq_doorbell_writes;
                s.completion_reads = q.stats.cqtp_reads;
                s.completion_reads_skipped = q.stats.cqtp_reads_skipped;
                s.bad_tails = q.stats.bad_tails;
            }
            HwQueue::Legacy(q) => {
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
