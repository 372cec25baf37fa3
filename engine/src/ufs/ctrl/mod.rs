//! [`UfsController`]: bring-up of a UFSHCI 4.0 host controller and its UFS
//! device, then the choice between MCQ and legacy single-doorbell mode.
//!
//! Bring-up, in order (every wait bounded by [`UfsOptions::init_timeout`]):
//!
//! 1. HCE: disable if enabled, clear a MEM_CFG MCQ mode a previous owner
//!    left selected, enable, wait for HCS.UCRDY.
//! 2. DME_LINKSTARTUP through the UIC command registers; the result code
//!    (UCMDARG2 bits 7:0) must be 0 and HCS.DP set; retried a bounded number
//!    of times.
//! 3. A legacy transfer request list (as Linux does) for device management:
//!    NOP OUT / NOP IN, set fDeviceInit and poll it until the device clears
//!    it, read the device, geometry and unit descriptors, REPORT LUNS, then
//!    per LU TEST UNIT READY (clears the power-on UNIT ATTENTION) and READ
//!    CAPACITY(16), cross-checked with the unit descriptor. Each of these
//!    device commands is sent again when it fails transiently — a
//!    transport error (OCS), a malformed response, a request that timed
//!    out and was withdrawn (UTRLCLR confirmed), BUSY, CHECK CONDITION
//!    other than ILLEGAL REQUEST or MEDIUM NOT PRESENT — up to 3 attempts,
//!    plus up to 10 UNIT ATTENTIONs; an answer that stays wrong ends in its
//!    typed error. One rule for every command, in one place (`transient`
//!    in `ctrl/devcmd.rs`); a reset runs the same path.
//! 4. MCQ when CAP.MCQS is set and [`UfsOptions::mcq`] allows it: the number
//!    of queues from MCQCAP.MAXQ (the configuration array it implies must
//!    lie inside the BAR) and [`UfsOptions::queues`]; queues a previous
//!    owner left enabled are disabled first; each queue's rings programmed,
//!    CQ enabled before SQ, the DAO/ISAO offsets **read back** and checked
//!    to lie inside the BAR, 4-byte aligned and clear of the host
//!    registers, the configuration array and every other queue's blocks,
//!    the rings started where the controller's head/tail pointers stand;
//!    MCQ_CFG.MAC; MEM_CFG MCQ mode.
//!
//! If a step fails after the controller was given memory (the legacy list,
//! its command descriptor and data page, MCQ rings), the controller is
//! disabled (HCE = 0, read back, bounded) before that memory is freed; a
//! controller that will not stop keeps it: it is leaked. Dropping the
//! controller does the same with its pooled queue memory. An LU whose
//! capacity in bytes overflows 64 bits is refused; one whose blocks are
//! larger than [`UfsOptions::max_transfer`] is kept with
//! [`LogicalUnit::usable`] = `false`.
//!
//! QEMU's UFS model (10.0) needs several of these: it keeps queues, their
//! pointers and MCQ mode across the HCE reset, has no unit descriptor for
//! an absent LU, and reports "target failure" next to every CHECK
//! CONDITION (see `fixtures/vm/README.md`).
//!    Otherwise the legacy list stays, serving one queue pair.
//!
//! Every value the device reports is checked into a [`UfsCtrlError`].
//!
//! File by file: this one holds the controller itself (options, the state
//! word, the logical units, accessors, the queue pool, leak accounting and
//! [`UfsController::reset`]); `ctrl/bringup.rs` steps 1–3, the MCQ/legacy
//! choice and the way down (disable, abandon, `Drop`); `ctrl/devcmd.rs` the
//! device-command channel (NOP OUT, queries, SCSI commands over slot 0 of
//! the legacy list) and its one retry rule; step 4 is `mcq/config.rs`,
//! next to the rings it programs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mcqio_vfio::{Backend, DmaDir, DmaRegion, DmaSpace, Mmio};

use super::error::{UfsCtrlError, UfsResult};
use super::mcq::McqRings;
use super::spec::desc::{DeviceDesc, GeometryDesc};
use super::spec::regs::{self, is, Cap};

/// Options for [`UfsController::new`].
#[derive(Clone, Debug)]
pub struct UfsOptions {
    /// Use MCQ when the controller supports it (false: legacy single doorbell).
    pub mcq: bool,
    /// MCQ hardware queues to set up (bounded by MCQCAP.MAXQ and 32): one
    /// per queue pair, so one per thread.
    pub queues: u16,
    /// Commands outstanding per queue pair, bounded by MCQ MAC (or the 32
    /// legacy slots), the device's bQueueDepth, 256, and in MCQ mode by 256
    /// divided by the number of queues set up: a task tag is 8 bits and
    /// must be unique among the commands outstanding at the device, so
    /// every queue pair has its own `depth` tags (the controller's
    /// [`depth`](UfsController::depth) says what was granted).
    pub depth: u16,
    /// Largest read or write per command, in bytes. Bigger ones are split
    /// into child commands that complete once; `TransferTooLarge` only when
    /// that needs more children than the queue depth.
    pub max_transfer: u32,
    /// Bound of every wait during bring-up and device management.
    pub init_timeout: Duration,
    /// How long blocking calls wait for their completion.
    pub blocking_timeout: Duration,
    /// How long `close` polls for commands still in flight before
    /// withdrawing them.
    pub close_timeout: Duration,
    /// Host Performance Booster on the device's HPB LUs (`None`: off). See
    /// [`super::hpb`].
    pub hpb: Option<super::hpb::HpbConfig>,
}

impl Default for UfsOptions {
    fn default() -> Self {
        UfsOptions {
            mcq: true,
            queues: std::thread::available_parallelism().map_or(1, |n| n.get().min(32) as u16),
            depth: 32,
            max_transfer: 1 << 20,
            init_timeout: Duration::from_secs(2),
            blocking_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(1),
            hpb: None,
        }
    }
}

/// How the transfer requests travel.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum UfsMode {
    /// Multi-circular queues: one SQ/CQ pair per queue pair.
    Mcq {
        /// Hardware queues set up.
        queues: u16,
    },
    /// The legacy list with its 32-bit doorbell, one queue pair.
    Legacy,
}

/// A logical unit the engine can address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LogicalUnit {
    /// LUN.
    pub lun: u8,
    /// Logical blocks.
    pub blocks: u64,
    /// Logical block length in bytes (a power of two, ≥ 512).
    pub block_len: u32,
    /// Whether reads and writes can reach it: `false` when one block is
    /// larger than [`UfsOptions::max_transfer`] lets one command move. The
    /// controller and its other LUs stay usable; every read or write to
    /// this one is refused before submission with
    /// [`crate::SubmitErrorKind::TransferTooLarge`].
    pub usable: bool,
}

impl LogicalUnit {
    /// log2 of the block length.
    pub fn block_shift(&self) -> u32 {
        self.block_len.trailing_zeros()
    }
}

/// The controller state word (one encoding for every wire).
pub(crate) use crate::core::state;

/// Queue memory waiting for a queue pair.
pub(crate) enum Pool {
    Mcq(Vec<Option<McqRings>>),
    Legacy(Option<DmaRegion>),
}

/// A UFS host controller, brought up and ready for queue pairs.
pub struct UfsController {
    pub(super) backend: Arc<dyn Backend>,
    mode: UfsMode,
    depth: u16,
    lus: Vec<LogicalUnit>,
    device: DeviceDesc,
    geometry: GeometryDesc,
    opts: UfsOptions,
    pub(crate) pool: Mutex<Pool>,
    /// See [`state`].
    pub(super) state: crate::core::state::StateWord,
    /// Held for the whole of a reset, and by queue pairs re-creating their
    /// queue: a pair that saw the state change waits here for the settled
    /// state.
    reset_lock: Mutex<()>,
    resets: AtomicU64,
    /// What a reset needs to set the queues up again.
    layout: QueueLayout,
    leaked: AtomicU64,
    /// HPB maps by LUN (empty without HPB).
    hpb: Vec<Option<Arc<super::hpb::LuMap>>>,
    /// The notifier of the controller's interrupt line, routed when the
    /// first queue pair that waits on it is created (`irq.rs`).
    irq: Mutex<Option<Arc<mcqio_vfio::Notifier>>>,
}

/// How the queues were set up at bring-up (a reset restores exactly this).
#[derive(Copy, Clone, Debug)]
pub(super) struct QueueLayout {
    cap: Cap,
    /// IOVA of the legacy list (legacy mode).
    legacy_list: u64,
}

impl std::fmt::Debug for UfsController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UfsController")
            .field("backend", &self.backend.name())
            .field("mode", &self.mode)
            .field("depth", &self.depth)
            .field("lus", &self.lus)
            .finish_non_exhaustive()
    }
}
mod bringup;
mod devcmd;
mod irq;
pub(crate) use irq::completion_cause;

use bringup::start_list;

/// Task tags per queue pair are unique device-wide up to this many commands.
pub(super) const MAX_DEPTH: u16 = 256;
/// Task tags (8 bits), shared by every queue's commands.
pub(crate) const TASK_TAGS: u16 = 256;

pub(super) fn wait_until(
    timeout: Duration,
    what: &'static str,
    mut f: impl FnMut() -> UfsResult<bool>,
) -> UfsResult<()> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(UfsCtrlError::Timeout {
                what,
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        std::thread::yield_now();
    }
}

/// Check that `[offset, offset + size)` is an aligned register block inside the BAR.
pub(super) fn in_bar(
    what: &'static str,
    offset: u64,
    size: usize,
    bar_len: usize,
) -> UfsResult<usize> {
    match offset.checked_add(size as u64) {
        Some(end) if end <= bar_len as u64 && offset % 4 == 0 => Ok(offset as usize),
        _ => Err(UfsCtrlError::OutsideBar {
            what,
            offset,
            size,
            bar_len,
        }),
    }
}

pub(super) struct Regs<'a>(pub(super) &'a dyn Mmio);

impl Regs<'_> {
    /// Read, refusing all ones (the device is gone).
    pub(super) fn read(&self, off: usize) -> UfsResult<u32> {
        match self.0.read32(off) {
            u32::MAX => Err(UfsCtrlError::DeviceGone),
            v => Ok(v),
        }
    }
    pub(super) fn write(&self, off: usize, v: u32) {
        self.0.write32(off, v)
    }
    /// Fail if IS holds a fatal bit.
    pub(super) fn check_fatal(&self) -> UfsResult<()> {
        let s = self.read(regs::IS)?;
        if s & is::FATAL & !is::UE != 0 {
            return Err(UfsCtrlError::ControllerFatal { is: s });
        }
        Ok(())
    }
}

impl UfsController {
    /// HPB counters of LU `lun` (`None` when HPB is off on it).
    pub fn hpb_stats(&self, lun: u8) -> Option<super::hpb::HpbStats> {
        self.hpb.get(usize::from(lun))?.as_ref().map(|m| m.stats())
    }

    /// HPB counters of every LU with HPB on.
    pub fn hpb_stats_all(&self) -> Vec<super::hpb::HpbStats> {
        self.hpb.iter().flatten().map(|m| m.stats()).collect()
    }

    pub(crate) fn hpb_maps(&self) -> &[Option<Arc<super::hpb::LuMap>>] {
        &self.hpb
    }

    /// MCQ (with the number of queues) or legacy.
    pub fn mode(&self) -> UfsMode {
        self.mode
    }

    /// Commands outstanding per queue pair.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// The logical units found.
    pub fn logical_units(&self) -> &[LogicalUnit] {
        &self.lus
    }

    /// The logical unit `lun`, if it exists.
    pub fn logical_unit(&self, lun: u8) -> Option<LogicalUnit> {
        self.lus.iter().copied().find(|l| l.lun == lun)
    }

    /// The device descriptor fields read at bring-up.
    pub fn device_descriptor(&self) -> DeviceDesc {
        self.device
    }

    /// The geometry descriptor fields read at bring-up.
    pub fn geometry(&self) -> GeometryDesc {
        self.geometry
    }

    /// The options the controller was brought up with.
    pub fn options(&self) -> &UfsOptions {
        &self.opts
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The DMA space buffers must come from.
    pub fn dma(&self) -> &Arc<DmaSpace> {
        self.backend.dma()
    }

    /// Allocate an I/O buffer in the controller's DMA space.
    pub fn alloc_buf(
        &self,
        len: usize,
        dir: DmaDir,
    ) -> crate::core::error::Result<crate::core::io::DmaBuf> {
        Ok(crate::core::io::DmaBuf::alloc(self.dma(), len, dir)?)
    }

    /// Bytes of queue memory and buffers leaked because the device might
    /// still access them (a command that never completed and could not be
    /// withdrawn).
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked.load(Ordering::Relaxed)
    }

    pub(crate) fn add_leaked(&self, n: u64) {
        self.leaked.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current health ([`state::OK`], [`state::FATAL`], [`state::GONE`]): the failure bits of the state word.
    #[inline]
    pub(crate) fn health(&self) -> u64 {
        state::failure(self.state())
    }

    /// The state word ([`state`]); one relaxed load, read by every poll.
    #[inline(always)]
    pub(crate) fn state(&self) -> u64 {
        self.state.load()
    }

    pub(crate) fn lock_reset(&self) -> MutexGuard<'_, ()> {
        self.reset_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Successful host controller resets so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Look at IS (and all ones) after a poll found something wrong or
    /// nothing for a long time. A fatal controller is disabled (HCE = 0,
    /// waited for) so no DMA stays in flight: only then does the epoch
    /// advance and outstanding buffers come back; one that cannot be
    /// disabled keeps its epoch (its queue pairs leak their buffers).
    /// Returns the new state word.
    pub(crate) fn check_health(&self) -> u64 {
        let s = self.state();
        if state::failure(s) != state::OK {
            return s;
        }
        let regs = self.backend.regs();
        let v = regs.read32(regs::IS);
        let gone = v == u32::MAX;
        if !gone && v & is::FATAL & !is::UE == 0 {
            return s;
        }
        let _g = self.lock_reset();
        let now = self.state.load_acquire();
        if now != s {
            return now; // a reset or another queue pair acted first
        }
        let next = if gone {
            log::warn!("UFS host controller gone (registers read all ones)");
            state::next(s, state::GONE)
        } else {
            log::warn!("UFS host controller fatal (IS = {v:#010x}); disabling it");
            match self.disable() {
                Ok(()) => state::next(s, state::FATAL),
                Err(UfsCtrlError::DeviceGone) => state::next(s, state::GONE),
                Err(e) => {
                    log::error!("UFS host controller could not be disabled ({e}); buffers of outstanding commands are leaked");
                    state::kept(s, state::FATAL)
                }
            }
        };
        self.state.store(next);
        next
    }

    /// Host controller reset, the last resort of recovery: disable the
    /// controller (HCE = 0, waited for), then bring it up again — link
    /// start-up, NOP, fDeviceInit, the same logical units, MCQ
    /// configuration or the legacy list — as [`UfsController::new`] did.
    ///
    /// Every queue pair notices at its next poll (one relaxed load of the
    /// controller's state word per poll): it delivers what the controller
    /// completed before the reset, completes every other command in flight
    /// exactly once with [`crate::IoError::AbortedByReset`] and its buffer,
    /// and re-creates its hardware queue (same rings) before ringing
    /// anything again; [`UfsQueuePair::submit`](super::UfsQueuePair::submit)
    /// rings no doorbell from the start of the reset until then.
    ///
    /// The device commands of the bring-up are retried as in
    /// [`UfsController::new`] (see the module docs): one transient failure
    /// of, say, TEST UNIT READY does not fail the reset.
    ///
    /// Also brings back a controller that went fatal. Errors:
    /// [`UfsCtrlError::DeviceGone`] for a removed device;
    /// [`UfsCtrlError::Timeout`] when HCE does not read 0 — the controller
    /// may still access the buffers of commands in flight, so the queue
    /// pairs end those with [`crate::IoError::ControllerFailed`] and
    /// **without** their buffers (leaked, counted in
    /// [`leaked_bytes`](Self::leaked_bytes)); any bring-up error, after
    /// which the controller stays failed (outstanding commands end with
    /// `ControllerFailed` and their buffers) until a reset succeeds.
    pub fn reset(&self) -> UfsResult<()> {
        let _g = self.lock_reset();
        let s = self.state.load_acquire();
        let regs = self.backend.regs();
        if regs.read32(regs::CAP) == u32::MAX {
            self.state.store(state::next(s, state::GONE));
            return Err(UfsCtrlError::DeviceGone);
        }
        log::warn!("{}: resetting the UFS host controller", self.backend.name());
        // From here on queue pairs ring no doorbell.
        self.state.begin_reset(s);
        if let Err(e) = self.disable() {
            let next = match e {
                UfsCtrlError::DeviceGone => state::next(s, state::GONE),
                // Not disabled: the device may still DMA; same epoch.
                _ => state::kept(s, state::FATAL),
            };
            log::error!("{}: UFS reset failed: {e}", self.backend.name());
            self.state.store(next);
            return Err(e);
        }
        // Disabled: a new epoch. Failed until the bring-up below succeeds.
        self.state
            .store(state::next(s, state::FATAL) | state::RESETTING);
        match self.reinit() {
            Ok(()) => {
                self.state.store(state::next(s, state::OK));
                self.resets.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: UFS reset complete", self.backend.name());
                Ok(())
            }
            Err(e) => {
                let f = if matches!(e, UfsCtrlError::DeviceGone) {
                    state::GONE
                } else {
                    // Leave it disabled: nothing of ours is on it.
                    let _ = self.disable();
                    state::FATAL
                };
                self.state.store(state::next(s, f));
                log::error!(
                    "{}: bring-up after the reset failed: {e}",
                    self.backend.name()
                );
                Err(e)
            }
        }
    }

    /// Put the legacy list back after a reset (UTRLBA, UTRLRSR), if the
    /// state is still `seen` (`Ok(false)`: it moved on, look again).
    pub(crate) fn restart_legacy_list(&self, seen: u64) -> UfsResult<bool> {
        let _g = self.lock_reset();
        if self.state.load_acquire() != seen {
            return Ok(false);
        }
        let r = Regs(self.backend.regs());
        start_list(&r, self.layout.legacy_list);
        r.check_fatal()?;
        Ok(true)
    }
}

impl state::Controlled for UfsController {
    #[inline(always)]
    fn state_word(&self) -> &state::StateWord {
        &self.state
    }

    /// Taken under the reset lock, which a reset holds throughout.
    fn settled_state(&self) -> u64 {
        let _g = self.lock_reset();
        self.state.load_acquire()
    }
}

impl From<LogicalUnit> for crate::core::block::BlockUnit {
    fn from(l: LogicalUnit) -> Self {
        crate::core::block::BlockUnit {
            id: u32::from(l.lun),
            blocks: l.blocks,
            block_size: l.block_len,
            usable: l.usable,
        }
    }
}

/// Its logical units (by LUN).
impl crate::core::block::BlockDevice for UfsController {
    fn units(&self) -> Vec<crate::core::block::BlockUnit> {
        self.logical_units()
            .iter()
            .copied()
            .map(Into::into)
            .collect()
    }
}
