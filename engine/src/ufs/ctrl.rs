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
//!    in this module); a reset runs the same path.
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

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mcqio_vfio::{barrier, Backend, DmaDir, DmaRegion, DmaSpace, Mmio};

use super::error::{UfsCtrlError, UfsResult};
use super::mcq::{McqRegs, McqRings, OpReg};
use super::spec::desc::{self, DeviceDesc, GeometryDesc, UnitDesc, MAX_DESC_LEN};
use super::spec::regs::{
    self, cq_op, is, qcfg, sq_op, uic, Cap, Hcs, McqCap, QueueAttr, QueueConfig,
};
use super::spec::scsi::{self, Capacity};
use super::spec::status::{command_result, UfsError};
use super::spec::upiu::{self, flag_idn, trans, CommandUpiu, QueryUpiu, ResponseUpiu};
use super::spec::utrd::{DataDir, Ocs, PrdtEntry, Ucd, Utrd};

/// Query response code "invalid index" (a descriptor index that does not
/// exist).
const QUERY_INVALID_INDEX: u8 = 0xFC;

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

/// What differs between the logical units found at bring-up (`was`) and
/// after a reset (`now`), for [`UfsCtrlError::DeviceChanged`].
fn lus_changed(was: &[LogicalUnit], now: &[LogicalUnit]) -> String {
    for w in was {
        match now.iter().find(|n| n.lun == w.lun) {
            None => return format!("LU {} is gone", w.lun),
            Some(n) if n != w => {
                return format!(
                    "LU {} has {} blocks of {} B, {} of {} B at bring-up",
                    w.lun, n.blocks, n.block_len, w.blocks, w.block_len
                )
            }
            Some(_) => {}
        }
    }
    match now.iter().find(|n| !was.iter().any(|w| w.lun == n.lun)) {
        Some(n) => format!("LU {} is new", n.lun),
        None => "the logical units differ".into(),
    }
}

/// Controller health, shared by every queue pair.
pub(crate) mod health {
    pub const OK: u8 = 0;
    /// IS reported a fatal error; the controller was disabled (HCE = 0).
    pub const FATAL: u8 = 1;
    /// Registers read all ones.
    pub const GONE: u8 = 2;
}

/// The controller's state word, read by every poll with one relaxed load:
/// the failure ([`health`]) in bits 1:0, a reset in progress in bit 2, and
/// the epoch above. A new epoch means the controller was disabled
/// (HCE = 0 confirmed) or is gone since: it dropped every queue and command
/// and accesses none of their memory any more.
pub(crate) mod state {
    /// Failure bits ([`super::health`]).
    pub const FAILURE: u64 = 3;
    /// A reset is running: ring no doorbell.
    pub const RESETTING: u64 = 4;
    /// One epoch step.
    pub const EPOCH: u64 = 8;

    /// The failure ([`super::health`]) of `s`.
    pub const fn failure(s: u64) -> u8 {
        (s & FAILURE) as u8
    }

    /// The epoch bits of `s`.
    pub const fn epoch(s: u64) -> u64 {
        s & !(EPOCH - 1)
    }

    /// The next epoch after `s` (the controller was disabled or is gone),
    /// with `failure`.
    pub const fn next(s: u64, failure: u8) -> u64 {
        (epoch(s) + EPOCH) | failure as u64
    }
}

/// Queue memory waiting for a queue pair.
pub(crate) enum Pool {
    Mcq(Vec<Option<McqRings>>),
    Legacy(Option<DmaRegion>),
}

/// A UFS host controller, brought up and ready for queue pairs.
pub struct UfsController {
    backend: Arc<dyn Backend>,
    mode: UfsMode,
    depth: u16,
    lus: Vec<LogicalUnit>,
    device: DeviceDesc,
    geometry: GeometryDesc,
    opts: UfsOptions,
    pub(crate) pool: Mutex<Pool>,
    /// See [`state`].
    state: AtomicU64,
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
}

/// How the queues were set up at bring-up (a reset restores exactly this).
#[derive(Copy, Clone, Debug)]
struct QueueLayout {
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

/// Request/response area of device management during bring-up: a UCD, a
/// 4 KiB data page, and the legacy list (slot 0).
struct DevCmd {
    utrl: DmaRegion,
    ucd: DmaRegion,
    data: DmaRegion,
    next_tag: u8,
}

/// Slots of the legacy list.
const UTRL_SLOTS: u32 = 32;
/// DME_LINKSTARTUP attempts.
const LINK_ATTEMPTS: u32 = 3;
/// Attempts of one device command of the bring-up (NOP OUT, a query, a
/// SCSI command) that keeps failing transiently (see [`transient`]).
/// Linux sends a query 3 times (ufshcd, QUERY_REQ_RETRIES) and READ
/// CAPACITY 3 times (sd).
const DEV_CMD_ATTEMPTS: u32 = 3;
/// UNIT ATTENTIONs one device command may meet on top of those: each
/// reports an event (power on, a reset) and that the command did not run,
/// not a failure. Linux's sd allows READ CAPACITY 10 of the power-on/reset
/// kind outside its 3 attempts.
const DEV_CMD_UNIT_ATTENTIONS: u32 = 10;
/// The `what` of a device-management request that did not complete in time
/// and was withdrawn (UTRLCLR, its doorbell bit read 0 again): the
/// controller dropped it, so the slot and its descriptor may be reused.
const DEV_CMD_WITHDRAWN: &str = "complete a device-management request (withdrawn)";
/// The same, but the doorbell bit did not clear after UTRLCLR: the
/// controller may still hold the request and its memory. Never retried.
const DEV_CMD_STUCK: &str =
    "complete a device-management request (nor clear it from the list with UTRLCLR)";
/// Query response code "general failure".
const QUERY_GENERAL_FAILURE: u8 = 0xFF;
/// Bytes of the device-management data page.
const DEV_DATA: usize = 4096;
/// Task tags per queue pair are unique device-wide up to this many commands.
const MAX_DEPTH: u16 = 256;
/// Task tags (8 bits), shared by every queue's commands.
pub(crate) const TASK_TAGS: u16 = 256;

fn wait_until(
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
fn in_bar(what: &'static str, offset: u64, size: usize, bar_len: usize) -> UfsResult<usize> {
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

struct Regs<'a>(&'a dyn Mmio);

impl Regs<'_> {
    /// Read, refusing all ones (the device is gone).
    fn read(&self, off: usize) -> UfsResult<u32> {
        match self.0.read32(off) {
            u32::MAX => Err(UfsCtrlError::DeviceGone),
            v => Ok(v),
        }
    }
    fn write(&self, off: usize, v: u32) {
        self.0.write32(off, v)
    }
    /// Fail if IS holds a fatal bit.
    fn check_fatal(&self) -> UfsResult<()> {
        let s = self.read(regs::IS)?;
        if s & is::FATAL & !is::UE != 0 {
            return Err(UfsCtrlError::ControllerFatal { is: s });
        }
        Ok(())
    }
}

impl UfsController {
    /// Bring up the controller behind `backend` and its device (see the
    /// module docs).
    pub fn new(backend: Arc<dyn Backend>, opts: UfsOptions) -> UfsResult<Arc<Self>> {
        if opts.depth == 0 || opts.queues == 0 {
            return Err(UfsCtrlError::InvalidOption(
                "depth and queues must be at least 1".into(),
            ));
        }
        if opts.max_transfer == 0 || opts.max_transfer % 4 != 0 {
            return Err(UfsCtrlError::InvalidOption(
                "max_transfer must be a non-zero multiple of 4".into(),
            ));
        }
        let mmio = backend.regs();
        let bar_len = mmio.len();
        in_bar("host controller registers", 0, regs::UCMDARG3 + 4, bar_len)?;
        let r = Regs(mmio);
        let cap = Cap(r.read(regs::CAP)?);
        let t = opts.init_timeout;

        let init = init_device(&r, backend.dma(), cap, bar_len, opts.max_transfer, t)?;
        let (device, geometry, lus) = (init.device, init.geometry, init.lus);
        let space = backend.dma();
        let mut dc = init.dc;
        let legacy_list = dc.utrl.iova().raw();
        // Memory the controller was given by a step that failed: freed only
        // once the controller is disabled.
        let mut given = Vec::new();
        let mut rings = Vec::new();
        let mut depth = opts.depth.min(MAX_DEPTH);
        let up = (|| {
            let hpb = match &opts.hpb {
                Some(h) => super::hpb::enable(
                    h,
                    &init.dev_raw,
                    &init.geo_raw,
                    &init.unit_raw,
                    &lus,
                    &mut |q| dc.hpb_query(&r, t, q),
                )?,
                None => Vec::new(),
            };

            // 4. MCQ or legacy.
            if device.queue_depth != 0 {
                depth = depth.min(u16::from(device.queue_depth));
            }
            let bar = mmio.base();
            let mcq = if cap.mcq() && opts.mcq {
                in_bar(
                    "MEM_CFG / MCQ_CFG",
                    regs::MEM_CFG as u64,
                    regs::MCQ_CFG + 4 - regs::MEM_CFG,
                    bar_len,
                )?;
                depth = depth.min(cap.mcq_mac() as u16);
                let n = setup_mcq(
                    &r,
                    space,
                    (bar, bar_len),
                    depth,
                    opts.queues,
                    (&mut rings, &mut given),
                )?;
                // Task tags: queue `i` uses `i * depth ..` (see `create_qpair`);
                // `n * depth` of them must fit the 8-bit tag.
                depth = depth.min(TASK_TAGS / n.max(1));
                select_mcq(&r, cap)?;
                Some(n)
            } else {
                depth = depth.min(cap.sdb_slots() as u16);
                None
            };
            r.check_fatal()?;
            Ok((hpb, mcq))
        })();
        let (hpb, mcq) = match up {
            Ok(x) => x,
            Err(e) => {
                abandon(&r, t, (dc, given, rings));
                return Err(e);
            }
        };
        let (mode, pool) = match mcq {
            Some(n) => (
                UfsMode::Mcq { queues: n },
                Pool::Mcq(rings.into_iter().map(Some).collect()),
            ),
            // The list (idle: every request above completed) goes to the
            // one queue pair legacy mode has.
            None => (UfsMode::Legacy, Pool::Legacy(Some(dc.utrl))),
        };
        Ok(Arc::new(UfsController {
            mode,
            depth,
            lus,
            device,
            geometry,
            opts,
            pool: Mutex::new(pool),
            state: AtomicU64::new(u64::from(health::OK)),
            reset_lock: Mutex::new(()),
            resets: AtomicU64::new(0),
            layout: QueueLayout { cap, legacy_list },
            leaked: AtomicU64::new(0),
            hpb,
            backend,
        }))
    }

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
    pub fn alloc_buf(&self, len: usize, dir: DmaDir) -> crate::Result<crate::DmaBuf> {
        Ok(crate::DmaBuf::alloc(self.dma(), len, dir)?)
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

    /// Current health ([`health`]): the failure bits of the state word.
    #[inline]
    pub(crate) fn health(&self) -> u8 {
        state::failure(self.state())
    }

    /// The state word ([`state`]); one relaxed load, read by every poll.
    #[inline(always)]
    pub(crate) fn state(&self) -> u64 {
        self.state.load(Ordering::Relaxed)
    }

    /// The state word once no reset is running.
    pub(crate) fn settled_state(&self) -> u64 {
        let _g = self.lock_reset();
        self.state.load(Ordering::Acquire)
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
        if state::failure(s) != health::OK {
            return s;
        }
        let regs = self.backend.regs();
        let v = regs.read32(regs::IS);
        let gone = v == u32::MAX;
        if !gone && v & is::FATAL & !is::UE == 0 {
            return s;
        }
        let _g = self.lock_reset();
        let now = self.state.load(Ordering::Acquire);
        if now != s {
            return now; // a reset or another queue pair acted first
        }
        let next = if gone {
            log::warn!("UFS host controller gone (registers read all ones)");
            state::next(s, health::GONE)
        } else {
            log::warn!("UFS host controller fatal (IS = {v:#010x}); disabling it");
            match self.disable() {
                Ok(()) => state::next(s, health::FATAL),
                Err(UfsCtrlError::DeviceGone) => state::next(s, health::GONE),
                Err(e) => {
                    log::error!("UFS host controller could not be disabled ({e}); buffers of outstanding commands are leaked");
                    state::epoch(s) | u64::from(health::FATAL)
                }
            }
        };
        self.state.store(next, Ordering::Release);
        next
    }

    /// HCE = 0 and wait (bounded) until it reads 0: from then on the
    /// controller has dropped every queue and command and no longer
    /// accesses their memory.
    fn disable(&self) -> UfsResult<()> {
        let r = Regs(self.backend.regs());
        r.write(regs::HCE, 0);
        wait_until(
            self.opts.init_timeout,
            "clear HCE (disable the host controller)",
            || Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0),
        )
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
        let s = self.state.load(Ordering::Acquire);
        let regs = self.backend.regs();
        if regs.read32(regs::CAP) == u32::MAX {
            self.state
                .store(state::next(s, health::GONE), Ordering::Release);
            return Err(UfsCtrlError::DeviceGone);
        }
        log::warn!("{}: resetting the UFS host controller", self.backend.name());
        // From here on queue pairs ring no doorbell.
        self.state.store(s | state::RESETTING, Ordering::Release);
        if let Err(e) = self.disable() {
            let next = match e {
                UfsCtrlError::DeviceGone => state::next(s, health::GONE),
                // Not disabled: the device may still DMA; same epoch.
                _ => state::epoch(s) | u64::from(health::FATAL),
            };
            log::error!("{}: UFS reset failed: {e}", self.backend.name());
            self.state.store(next, Ordering::Release);
            return Err(e);
        }
        // Disabled: a new epoch. Failed until the bring-up below succeeds.
        let epoch = state::epoch(s) + state::EPOCH;
        self.state.store(
            epoch | state::RESETTING | u64::from(health::FATAL),
            Ordering::Release,
        );
        match self.reinit() {
            Ok(()) => {
                self.state
                    .store(epoch | u64::from(health::OK), Ordering::Release);
                self.resets.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: UFS reset complete", self.backend.name());
                Ok(())
            }
            Err(e) => {
                let f = if matches!(e, UfsCtrlError::DeviceGone) {
                    health::GONE
                } else {
                    // Leave it disabled: nothing of ours is on it.
                    let _ = self.disable();
                    health::FATAL
                };
                self.state.store(epoch | u64::from(f), Ordering::Release);
                log::error!(
                    "{}: bring-up after the reset failed: {e}",
                    self.backend.name()
                );
                Err(e)
            }
        }
    }

    /// Bring-up after a disable (reset lock held): the same steps as
    /// [`UfsController::new`], the same device, the same queue layout.
    /// Pooled queues are set up here; queues held by queue pairs are
    /// re-created by their pair ([`Self::recreate_mcq_queue`],
    /// [`Self::restart_legacy_list`]).
    fn reinit(&self) -> UfsResult<()> {
        let mmio = self.backend.regs();
        let (bar, bar_len) = (mmio.base(), mmio.len());
        let r = Regs(mmio);
        let cap = self.layout.cap;
        let now = r.read(regs::CAP)?;
        if Cap(now) != cap {
            return Err(UfsCtrlError::DeviceChanged(format!(
                "CAP reads {now:#010x}, {:#010x} at bring-up",
                cap.0
            )));
        }
        let init = init_device(
            &r,
            self.dma(),
            cap,
            bar_len,
            self.opts.max_transfer,
            self.opts.init_timeout,
        )?;
        if init.lus != self.lus {
            return Err(UfsCtrlError::DeviceChanged(lus_changed(
                &self.lus, &init.lus,
            )));
        }
        let mut dc = init.dc;
        if self.hpb.iter().any(Option::is_some) {
            // The reset cleared the device's HPB state: enable it again (on
            // the management list, before the queues take the controller)
            // and reload what the host had active.
            let t = self.opts.init_timeout;
            super::hpb::after_reset(&self.hpb, &mut |q| dc.hpb_query(&r, t, q))?;
        }
        let mut pool = self.lock_pool();
        match &mut *pool {
            Pool::Mcq(rings) => {
                let mcap = McqCap(r.read(regs::MCQCAP)?);
                disable_queues(&r, mcap)?;
                for ring in rings.iter_mut().flatten() {
                    nullify_ring(&mut ring.sq, ring.entries)?;
                    let (regs, sq_tail, cq_head) = enable_queue(
                        &r,
                        mcap,
                        u32::from(ring.index),
                        &ring.sq,
                        &ring.cq,
                        ring.entries,
                        (bar, bar_len),
                        true,
                    )?;
                    ring.regs = regs;
                    ring.sq_tail = sq_tail;
                    ring.cq_head = cq_head;
                }
                select_mcq(&r, cap)?;
            }
            Pool::Legacy(list) => {
                // Device management ran on its own list; the queue pair's
                // list goes back in (now if pooled, else by the pair).
                r.write(regs::UTRLRSR, 0);
                if list.is_some() {
                    start_list(&r, self.layout.legacy_list);
                }
            }
        }
        drop(pool);
        r.check_fatal()?;
        drop(dc);
        Ok(())
    }

    /// Re-create MCQ queue `rings.index` on its rings after a reset, if
    /// the state is still `seen` (`Ok(None)`: it moved on, look again).
    /// The SQ ring is nullified first, so entries left from before the
    /// reset are never executed. Returns the queue's registers and where
    /// the host's SQ tail and CQ head start.
    pub(crate) fn recreate_mcq_queue(
        &self,
        seen: u64,
        rings: &McqRings,
    ) -> UfsResult<Option<(McqRegs, u32, u32)>> {
        let _g = self.lock_reset();
        if self.state.load(Ordering::Acquire) != seen {
            return Ok(None);
        }
        let mmio = self.backend.regs();
        let r = Regs(mmio);
        let mcap = McqCap(r.read(regs::MCQCAP)?);
        enable_queue(
            &r,
            mcap,
            u32::from(rings.index),
            &rings.sq,
            &rings.cq,
            rings.entries,
            (mmio.base(), mmio.len()),
            true,
        )
        .map(Some)
    }

    /// Put the legacy list back after a reset (UTRLBA, UTRLRSR), if the
    /// state is still `seen` (`Ok(false)`: it moved on, look again).
    pub(crate) fn restart_legacy_list(&self, seen: u64) -> UfsResult<bool> {
        let _g = self.lock_reset();
        if self.state.load(Ordering::Acquire) != seen {
            return Ok(false);
        }
        let r = Regs(self.backend.regs());
        start_list(&r, self.layout.legacy_list);
        r.check_fatal()?;
        Ok(true)
    }
}

/// Overwrite every SQ slot with a nullified UTRD: whatever the controller
/// still finds between its head and tail is consumed without execution.
fn nullify_ring(sq: &mut DmaRegion, entries: u16) -> UfsResult<()> {
    let n = Utrd::new(0, DataDir::None, 0).nullified();
    for i in 0..usize::from(entries) {
        sq.write_obj(i * 32, n)?;
    }
    Ok(())
}

/// Program and run the legacy list at `iova` (the list is idle).
fn start_list(r: &Regs<'_>, iova: u64) {
    r.write(regs::UTRLRSR, 0);
    r.write(regs::UTRLBA, iova as u32);
    r.write(regs::UTRLBAU, (iova >> 32) as u32);
    r.write(regs::UTRLRSR, 1);
}

/// Leave the legacy list and select MCQ mode (after the queues are set up).
fn select_mcq(r: &Regs<'_>, cap: Cap) -> UfsResult<()> {
    // The legacy list is no longer used.
    r.write(regs::UTRLRSR, 0);
    r.write(regs::MCQ_CFG, regs::mcq_cfg_mac(cap.mcq_mac()));
    r.write(regs::MEM_CFG, regs::MEM_CFG_MCQ_MODE);
    if r.read(regs::MEM_CFG)? & regs::MEM_CFG_MCQ_MODE == 0 {
        return Err(UfsCtrlError::QueueRefused {
            queue: 0,
            what: "MCQ mode",
        });
    }
    Ok(())
}

impl Drop for UfsController {
    /// Every queue pair is gone (each holds the controller): disable the
    /// controller before the pooled queue memory is freed, so nothing the
    /// controller might still fetch is unmapped under it.
    /// A controller that does not read disabled within
    /// [`UfsOptions::init_timeout`] might still write that memory: it is
    /// leaked instead.
    fn drop(&mut self) {
        if self.health() == health::GONE {
            return;
        }
        let r = Regs(self.backend.regs());
        if !disable(&r, self.opts.init_timeout) {
            log::error!("UFS host controller cannot be disabled: leaking its queue memory");
            let pool = std::mem::replace(
                self.pool.get_mut().unwrap_or_else(|p| p.into_inner()),
                Pool::Legacy(None),
            );
            std::mem::forget(pool);
        }
    }
}

/// What steps 1–3 of bring-up found.
struct Init {
    dc: DevCmd,
    device: DeviceDesc,
    geometry: GeometryDesc,
    lus: Vec<LogicalUnit>,
    /// The raw device, geometry and unit descriptors (HPB reads fields of
    /// its own from them).
    dev_raw: Vec<u8>,
    geo_raw: Vec<u8>,
    unit_raw: Vec<(u8, Vec<u8>)>,
}

/// Bring-up steps 1–3 (see the module docs): HCE, link start-up, device
/// management on a fresh legacy list. Used by [`UfsController::new`] and
/// again by [`UfsController::reset`].
fn init_device(
    r: &Regs<'_>,
    space: &Arc<DmaSpace>,
    cap: Cap,
    bar_len: usize,
    max_transfer: u32,
    t: Duration,
) -> UfsResult<Init> {
    // 1. Host controller enable.
    if r.read(regs::HCE)? & regs::HCE_ENABLE != 0 {
        r.write(regs::HCE, 0);
        wait_until(t, "clear HCE", || {
            Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0)
        })?;
    }
    // A previous owner may have left MCQ mode selected; QEMU (10.0)
    // keeps it across the HCE reset, and device management below
    // travels on the legacy list.
    if cap.mcq()
        && bar_len >= regs::MEM_CFG + 4
        && r.read(regs::MEM_CFG)? & regs::MEM_CFG_MCQ_MODE != 0
    {
        r.write(regs::MEM_CFG, 0);
    }
    r.write(regs::HCE, regs::HCE_ENABLE);
    wait_until(t, "set HCE and HCS.UCRDY", || {
        Ok(r.read(regs::HCE)? & regs::HCE_ENABLE != 0 && Hcs(r.read(regs::HCS)?).uic_ready())
    })?;

    // 2. Link start-up.
    link_startup(r, t)?;
    if !Hcs(r.read(regs::HCS)?).device_present() {
        return Err(UfsCtrlError::NoDevice);
    }

    // 3. Legacy list for device management.
    let mut dc = DevCmd {
        utrl: space.alloc(UTRL_SLOTS as usize * 32, DmaDir::Bidirectional)?,
        ucd: space.alloc(Ucd::size(1), DmaDir::Bidirectional)?,
        data: space.alloc(DEV_DATA, DmaDir::Bidirectional)?,
        next_tag: 0,
    };
    // From here on the controller may hold the list and what it points at.
    let found = (|| {
        wait_until(t, "set HCS.UTRLRDY", || {
            Ok(Hcs(r.read(regs::HCS)?).utrl_ready())
        })?;
        let utrl = dc.utrl.iova().raw();
        if utrl % 1024 != 0 || (!cap.addr64() && utrl >> 32 != 0) {
            return Err(UfsCtrlError::BadValue {
                what: "UTRL address",
                value: utrl,
                why: "the list must be 1 KiB aligned and reachable by the controller",
            });
        }
        r.write(regs::UTRLBA, utrl as u32);
        r.write(regs::UTRLBAU, (utrl >> 32) as u32);
        r.write(regs::UTRLRSR, 1);

        dc.nop(r, t)?;
        dc.device_init(r, t)?;
        let dev_raw = dc.read_desc(r, t, desc::idn::DEVICE, 0)?;
        let geo_raw = dc.read_desc(r, t, desc::idn::GEOMETRY, 0)?;
        let device = DeviceDesc::parse(&dev_raw)?;
        let geometry = GeometryDesc::parse(&geo_raw)?;
        let mut unit_raw = Vec::new();
        let mut units = Vec::new();
        for i in 0..geometry.max_lus {
            // bNumberLU counts the enabled LUs: past the last one there is
            // nothing to find (and QEMU has no descriptor to read).
            if units.len() >= usize::from(device.lus) {
                break;
            }
            let d = match dc.read_desc(r, t, desc::idn::UNIT, i) {
                Ok(d) => d,
                // No unit descriptor at this index. UFS 4.0 devices return
                // one with bLUEnable = 0 for an absent LU; QEMU (10.0)
                // answers INVALID_INDEX instead and also fails the request
                // with OCS INVALID_CMD_TABLE_ATTR. Either way: no LU here.
                Err(UfsCtrlError::Query { code, .. }) if code == QUERY_INVALID_INDEX => continue,
                Err(UfsCtrlError::DevCmd {
                    err: UfsError::Transport(ocs),
                    ..
                }) if ocs == Ocs::INVALID_CMD_TABLE_ATTR => continue,
                Err(e) => return Err(e),
            };
            // A disabled LU's descriptor holds no usable geometry: look at
            // bLUEnable (byte 3) before asking the rest to make sense
            // (1 = enabled, 2 = enabled HPB LU).
            if !matches!(d.get(3), Some(&1) | Some(&2)) {
                continue;
            }
            let u = UnitDesc::parse(&d)?;
            if u.enabled {
                if u.lun != i {
                    return Err(UfsCtrlError::BadValue {
                        what: "unit descriptor bUnitIndex",
                        value: u64::from(u.lun),
                        why: "differs from the index asked for",
                    });
                }
                units.push(u);
                unit_raw.push((i, d));
            }
        }
        if units.is_empty() {
            return Err(UfsCtrlError::NoLogicalUnits);
        }
        let reported = dc.report_luns(r, t, units[0].lun)?;
        let mut lus = Vec::new();
        for u in units.iter().filter(|u| reported.contains(&u.lun)) {
            dc.clear_unit_attention(r, t, u.lun)?;
            let c = dc.read_capacity(r, t, u.lun)?;
            if !c.block_len.is_power_of_two() || c.block_len < 512 || c.block_len > 1 << 20 {
                return Err(UfsCtrlError::BadValue {
                    what: "READ CAPACITY(16) block length",
                    value: u64::from(c.block_len),
                    why: "not a power of two between 512 B and 1 MiB",
                });
            }
            if c.block_len != 1 << u.block_shift {
                return Err(UfsCtrlError::BadValue {
                    what: "unit descriptor bLogicalBlockSize",
                    value: u64::from(u.block_shift),
                    why: "disagrees with the block length READ CAPACITY(16) reports",
                });
            }
            // The smaller of the two counts: never address past either.
            let blocks = if u.blocks == 0 {
                c.blocks
            } else {
                c.blocks.min(u.blocks)
            };
            if blocks.checked_mul(u64::from(c.block_len)).is_none() {
                return Err(UfsCtrlError::BadValue {
                    what: "LU capacity (READ CAPACITY(16), qLogicalBlockCount)",
                    value: blocks,
                    why: "blocks of this length overflow 64 bits of bytes",
                });
            }
            lus.push(LogicalUnit {
                lun: u.lun,
                blocks,
                block_len: c.block_len,
                // One block must fit in one command (the PRDT limit, 64 MiB,
                // is above any block length accepted here): else this LU alone
                // is unusable, not the controller.
                usable: c.block_len <= max_transfer,
            });
            if c.block_len > max_transfer {
                log::warn!(
                    "LU {}: {} B blocks but one command moves at most {max_transfer} B: reads and writes to it are refused",
                    u.lun,
                    c.block_len
                );
            }
        }
        if lus.is_empty() {
            return Err(UfsCtrlError::NoLogicalUnits);
        }
        Ok((device, geometry, lus, dev_raw, geo_raw, unit_raw))
    })();
    let (device, geometry, lus, dev_raw, geo_raw, unit_raw) = match found {
        Ok(x) => x,
        Err(e) => {
            abandon(r, t, dc);
            return Err(e);
        }
    };
    Ok(Init {
        dc,
        device,
        geometry,
        lus,
        dev_raw,
        geo_raw,
        unit_raw,
    })
}

/// DME_LINKSTARTUP, retried a bounded number of times on a non-zero result.
fn link_startup(r: &Regs<'_>, t: Duration) -> UfsResult<()> {
    let mut result = 0;
    for _ in 0..LINK_ATTEMPTS {
        wait_until(t, "set HCS.UCRDY", || {
            Ok(Hcs(r.read(regs::HCS)?).uic_ready())
        })?;
        r.write(regs::IS, is::UCCS);
        r.write(regs::UCMDARG1, 0);
        r.write(regs::UCMDARG2, 0);
        r.write(regs::UCMDARG3, 0);
        r.write(regs::UICCMD, uic::DME_LINKSTARTUP);
        wait_until(t, "complete DME_LINKSTARTUP (IS.UCCS)", || {
            Ok(r.read(regs::IS)? & is::UCCS != 0)
        })?;
        r.write(regs::IS, is::UCCS);
        result = uic::result(r.read(regs::UCMDARG2)?);
        if result == 0 {
            return Ok(());
        }
    }
    Err(UfsCtrlError::Uic {
        cmd: uic::DME_LINKSTARTUP,
        result,
        attempts: LINK_ATTEMPTS,
    })
}

/// Program `min(requested, MAXQ, 32)` queues; each ring gets `MAX_DEPTH + 1`
/// slots (at most `depth` commands are ever outstanding on it). The rings
/// go to `rings` as they are enabled; those of a queue whose enable failed
/// half-way go to `given`: the controller may hold either, so the caller
/// frees them only once the controller is disabled.
fn setup_mcq(
    r: &Regs<'_>,
    space: &Arc<DmaSpace>,
    (bar, bar_len): (NonNull<u8>, usize),
    depth: u16,
    requested: u16,
    (rings, given): (&mut Vec<McqRings>, &mut Vec<DmaRegion>),
) -> UfsResult<u16> {
    let mcap = McqCap(r.read(regs::MCQCAP)?);
    let maxq = mcap.max_queues();
    let cfg = mcap.config_offset();
    if cfg < regs::MCQ_CFG + 4 {
        return Err(UfsCtrlError::BadValue {
            what: "MCQCAP.QCFGPTR",
            value: cfg as u64,
            why: "the queue configuration array would overlap the host registers",
        });
    }
    // The whole array MAXQ implies must be inside the BAR.
    in_bar(
        "MCQ queue configuration array (MCQCAP.MAXQ)",
        cfg as u64,
        regs::QCFG_SIZE * maxq as usize,
        bar_len,
    )?;
    let n = u32::from(requested).min(maxq).min(32);
    // Every ring gets the slots of the deepest queue this engine makes,
    // whatever `depth` is (the trackers bound what is outstanding): QEMU
    // (10.0) keeps each queue's head and tail across the HCE reset and the
    // re-enable, even past the end of a smaller new ring, so a ring only as
    // large as `depth + 1` could not follow an earlier, deeper owner (QD 1
    // after QD 32: "SQHP after enable: 0xa0"). 2 × 257 × 32 B per queue.
    let entries = (depth + 1).max(MAX_DEPTH + 1);
    // Every queue's register blocks, clear of each other's, before any
    // queue is enabled.
    let mut taken = Vec::with_capacity(4 * n as usize);
    for i in 0..n {
        let b = queue_blocks(r, mcap, i, bar_len, &taken)?;
        taken.extend(b);
    }
    disable_queues(r, mcap)?;
    rings.reserve(n as usize);
    for i in 0..n {
        let sq = space.alloc(usize::from(entries) * 32, DmaDir::Bidirectional)?;
        let cq = space.alloc(usize::from(entries) * 32, DmaDir::Bidirectional)?;
        let (regs, sq_tail, cq_head) =
            match enable_queue(r, mcap, i, &sq, &cq, entries, (bar, bar_len), false) {
                Ok(x) => x,
                Err(e) => {
                    given.push(sq);
                    given.push(cq);
                    return Err(e);
                }
            };
        rings.push(McqRings {
            index: i as u16,
            entries,
            sq,
            cq,
            regs,
            sq_tail,
            cq_head,
            ucds: None,
        });
    }
    Ok(n as u16)
}

/// Disable the controller (HCE = 0) and wait, bounded by `t`, until it
/// reads disabled. Whether it did: only then has it stopped touching host
/// memory.
fn disable(r: &Regs<'_>, t: Duration) -> bool {
    r.write(regs::HCE, 0);
    wait_until(t, "clear HCE", || {
        Ok(r.read(regs::HCE)? & regs::HCE_ENABLE == 0)
    })
    .is_ok()
}

/// A bring-up step failed after the controller was given `memory`
/// (queues, the legacy list, command descriptors, data pages): disable the
/// controller before that memory is freed; one that cannot be disabled
/// (or is gone) might still write it, so it is leaked.
fn abandon<T>(r: &Regs<'_>, t: Duration, memory: T) {
    if !disable(r, t) {
        log::error!(
            "UFS bring-up failed and the controller cannot be disabled: leaking its memory"
        );
        std::mem::forget(memory);
    }
}

/// Disable every queue still enabled (each SQ before its CQ). QEMU (10.0)
/// keeps queues enabled, on the previous owner's rings, across the HCE
/// reset, and programming an enabled queue does not move it.
fn disable_queues(r: &Regs<'_>, mcap: McqCap) -> UfsResult<()> {
    let maxq = mcap.max_queues();
    for i in 0..maxq.min(32) {
        let q = QueueConfig::new(mcap, i);
        if QueueAttr(r.read(q.reg(qcfg::SQATTR))?).is_enabled() {
            r.write(q.reg(qcfg::SQATTR), 0);
        }
    }
    for i in 0..maxq.min(32) {
        let q = QueueConfig::new(mcap, i);
        if QueueAttr(r.read(q.reg(qcfg::CQATTR))?).is_enabled() {
            r.write(q.reg(qcfg::CQATTR), 0);
        }
    }
    Ok(())
}

/// A register block the controller placed: what it is, its offset, its
/// length in bytes.
type Block = (&'static str, usize, usize);

/// Read queue `i`'s SQ doorbell, SQ interrupt, CQ doorbell and CQ
/// interrupt blocks (DAO/ISAO) and check them: inside the BAR, 4-byte
/// aligned, clear of the host registers, of the queue configuration array,
/// of each other and of `others` (blocks already accepted). A doorbell
/// store into an overlapping block would land in another register.
fn queue_blocks(
    r: &Regs<'_>,
    mcap: McqCap,
    i: u32,
    bar_len: usize,
    others: &[Block],
) -> UfsResult<[Block; 4]> {
    let q = QueueConfig::new(mcap, i);
    let mut blocks = [
        ("SQ doorbell block (SQDAO)", qcfg::SQDAO, 0x14),
        ("SQ interrupt block (SQISAO)", qcfg::SQISAO, 8),
        ("CQ doorbell block (CQDAO)", qcfg::CQDAO, 8),
        ("CQ interrupt block (CQISAO)", qcfg::CQISAO, 8),
    ];
    let host = ("the host controller registers", 0, regs::MCQ_CFG + 4);
    let array = (
        "the queue configuration array",
        mcap.config_offset(),
        regs::QCFG_SIZE * mcap.max_queues() as usize,
    );
    let overlap = |a: &Block, b: &Block| a.1 < b.1.saturating_add(b.2) && b.1 < a.1 + a.2;
    for k in 0..blocks.len() {
        let (what, reg, len) = blocks[k];
        let at = in_bar(what, u64::from(r.read(q.reg(reg))?), len, bar_len)?;
        blocks[k] = (what, at, len);
        let b = blocks[k];
        let clash = [host, array]
            .iter()
            .chain(&blocks[..k])
            .chain(others)
            .any(|o| overlap(&b, o));
        if clash {
            return Err(UfsCtrlError::BadValue {
                what,
                value: at as u64,
                why: "overlaps the host registers, the configuration array or another queue register block",
            });
        }
    }
    Ok(blocks)
}

/// Program queue `i` (disabled) on rings `sq`/`cq` of `entries` slots and
/// enable it, CQ before SQ; read the DAO/ISAO offsets back and check them
/// against the BAR. `resync` (after a reset, on a nullified SQ ring): an
/// SQ tail ahead of the head is set back to it. Returns its operational registers and where the
/// host's SQ tail and CQ head start.
#[allow(clippy::too_many_arguments)]
fn enable_queue(
    r: &Regs<'_>,
    mcap: McqCap,
    i: u32,
    sq: &DmaRegion,
    cq: &DmaRegion,
    entries: u16,
    (bar, bar_len): (NonNull<u8>, usize),
    resync: bool,
) -> UfsResult<(McqRegs, u32, u32)> {
    let q = QueueConfig::new(mcap, i);
    let (s, c) = (sq.iova().raw(), cq.iova().raw());
    r.write(q.reg(qcfg::SQLBA), s as u32);
    r.write(q.reg(qcfg::SQUBA), (s >> 32) as u32);
    r.write(q.reg(qcfg::CQLBA), c as u32);
    r.write(q.reg(qcfg::CQUBA), (c >> 32) as u32);
    // The offsets are the controller's: read them back and use them.
    let blocks = queue_blocks(r, mcap, i, bar_len, &[])?;
    let (sqdao, cqdao) = (blocks[0].1, blocks[2].1);
    r.write(q.reg(qcfg::CQATTR), QueueAttr::enabled(entries, 0).0);
    if !QueueAttr(r.read(q.reg(qcfg::CQATTR))?).is_enabled() {
        return Err(UfsCtrlError::QueueRefused {
            queue: i,
            what: "CQ",
        });
    }
    r.write(q.reg(qcfg::SQATTR), QueueAttr::enabled(entries, i as u8).0);
    if !QueueAttr(r.read(q.reg(qcfg::SQATTR))?).is_enabled() {
        return Err(UfsCtrlError::QueueRefused {
            queue: i,
            what: "SQ",
        });
    }
    // Where the controller's pointers stand. UFSHCI starts an enabled
    // queue at 0, but QEMU (10.0) keeps SQHP/SQTP/CQHP/CQTP across a
    // host controller reset and a re-enable: a ring that started at 0
    // there makes it fetch slots nobody wrote. Start where it stands
    // (nothing may be pending in the SQ); drop leftover CQ entries.
    let slot = |what: &'static str, v: u32| -> UfsResult<u32> {
        if v % 32 != 0 || v / 32 >= u32::from(entries) {
            return Err(UfsCtrlError::BadValue {
                what,
                value: u64::from(v),
                why: "not a slot of the ring just enabled",
            });
        }
        Ok(v / 32)
    };
    let sq_head = slot("SQHP after enable", r.read(sqdao + sq_op::SQHP)?)?;
    let mut sq_tail = slot("SQTP after enable", r.read(sqdao + sq_op::SQTP)?)?;
    let cq_tail = slot("CQTP after enable", r.read(cqdao + cq_op::CQTP)?)?;
    if sq_head != sq_tail && resync {
        // After a reset, on a nullified ring: a tail a doorbell store left
        // (one that raced the reset) is taken back to the head.
        r.write(sqdao + sq_op::SQTP, sq_head * 32);
        sq_tail = slot("SQTP after resync", r.read(sqdao + sq_op::SQTP)?)?;
    }
    if sq_head != sq_tail {
        return Err(UfsCtrlError::BadValue {
            what: "SQHP after enable",
            value: u64::from(sq_head) * 32,
            why: "differs from SQTP: the new SQ would start with entries pending",
        });
    }
    if slot("CQHP after enable", r.read(cqdao + cq_op::CQHP)?)? != cq_tail {
        r.write(cqdao + cq_op::CQHP, cq_tail * 32);
    }
    let op = |o: usize| {
        // SAFETY: every offset was checked above to be 4-byte aligned
        // with the whole block inside the BAR mapped at `bar`, which the
        // backend keeps alive as long as the controller (and every queue
        // pair holds the controller).
        unsafe { OpReg::new(bar, o) }
    };
    let regs = McqRegs {
        sqtp: op(sqdao + sq_op::SQTP),
        sqrtc: op(sqdao + sq_op::SQRTC),
        sqcti: op(sqdao + sq_op::SQCTI),
        sqrts: op(sqdao + sq_op::SQRTS),
        cqhp: op(cqdao + cq_op::CQHP),
        cqtp: op(cqdao + cq_op::CQTP),
    };
    Ok((regs, sq_tail, cq_tail))
}

impl DevCmd {
    fn tag(&mut self) -> u8 {
        self.next_tag = self.next_tag.wrapping_add(1);
        self.next_tag
    }

    /// Run one request in legacy slot 0 and wait for it. `upiu` is the
    /// request UPIU; `data_len` bytes of the data page take part in the
    /// transfer in direction `dir`. Returns the OCS and the response area.
    fn exec(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        upiu: &[u8],
        dir: DataDir,
        data_len: usize,
    ) -> UfsResult<(Ocs, [u8; Ucd::RESPONSE_LEN])> {
        debug_assert!(upiu.len() <= 64 && data_len <= DEV_DATA && data_len % 4 == 0);
        let zero = [0u8; Ucd::RESPONSE_LEN];
        self.ucd.write_bytes(Ucd::COMMAND_OFFSET, &zero[..64])?;
        self.ucd.write_bytes(Ucd::COMMAND_OFFSET, upiu)?;
        self.ucd.write_bytes(Ucd::RESPONSE_OFFSET, &zero)?;
        let mut prdt = 0;
        if data_len > 0 {
            let e = PrdtEntry::new(self.data.iova().raw(), data_len as u32).ok_or(
                UfsCtrlError::BadValue {
                    what: "device-management data page",
                    value: self.data.iova().raw(),
                    why: "not dword aligned",
                },
            )?;
            self.ucd.write_obj(Ucd::PRDT_OFFSET, e)?;
            prdt = 1;
        }
        let d = Utrd::new(self.ucd.iova().raw(), dir, prdt);
        self.utrl.write_obj(0, d)?;
        // Release: UCD and UTRD stores before the doorbell.
        barrier::stores_before_doorbell();
        r.write(regs::UTRLDBR, 1);
        let waited = wait_until(t, DEV_CMD_WITHDRAWN, || {
            r.check_fatal()?;
            Ok(r.read(regs::UTRLDBR)? & 1 == 0)
        });
        if let Err(e) = waited {
            if !matches!(e, UfsCtrlError::Timeout { .. }) {
                return Err(e);
            }
            // Withdraw it (write 0 to clear) and wait until the controller
            // confirms: only then is the slot free and the descriptor ours.
            r.write(regs::UTRLCLR, !1);
            let cleared = wait_until(t, DEV_CMD_STUCK, || Ok(r.read(regs::UTRLDBR)? & 1 == 0));
            return Err(cleared.err().unwrap_or(e));
        }
        r.write(regs::UTRLCNR, 1);
        // Acquire: the OCS and response were written before the bit cleared.
        barrier::loads_after_phase();
        let d: Utrd = self.utrl.read_obj(0)?;
        let mut rsp = [0u8; Ucd::RESPONSE_LEN];
        self.ucd.read_bytes(Ucd::RESPONSE_OFFSET, &mut rsp)?;
        Ok((Ocs(d.ocs & 0xF), rsp))
    }

    /// One device command, attempted again while it fails transiently:
    /// the one retry rule of the bring-up and of a reset ([`transient`]).
    /// `f` sends it once (with a new task tag each time). At most
    /// [`DEV_CMD_ATTEMPTS`] transient failures and
    /// [`DEV_CMD_UNIT_ATTENTIONS`] UNIT ATTENTIONs; the last error is
    /// returned as it came.
    fn retried<T>(&mut self, mut f: impl FnMut(&mut Self) -> UfsResult<T>) -> UfsResult<T> {
        let (mut failures, mut attentions) = (0, 0);
        loop {
            let e = match f(self) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let again = match transient(&e) {
                Transient::No => false,
                Transient::UnitAttention => {
                    attentions += 1;
                    attentions <= DEV_CMD_UNIT_ATTENTIONS
                }
                Transient::Yes => {
                    failures += 1;
                    failures < DEV_CMD_ATTEMPTS
                }
            };
            if !again {
                return Err(e);
            }
            log::debug!("device command failed ({e}); sending it again");
        }
    }

    fn nop(&mut self, r: &Regs<'_>, t: Duration) -> UfsResult<()> {
        self.retried(|s| {
            let tag = s.tag();
            let (ocs, rsp) = s.exec(r, t, &upiu::nop_out(tag), DataDir::None, 0)?;
            let err = if ocs != Ocs::SUCCESS {
                UfsError::Transport(ocs)
            } else if rsp[0] != trans::NOP_IN || rsp[3] != tag {
                UfsError::BadResponse {
                    trans_type: rsp[0],
                    task_tag: rsp[3],
                }
            } else {
                return Ok(());
            };
            Err(UfsCtrlError::DevCmd {
                what: "NOP OUT",
                err,
            })
        })
    }

    /// A QUERY REQUEST built by `q` from a task tag, retried
    /// ([`Self::retried`]); returns the QUERY RESPONSE header and its data
    /// segment.
    fn query(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        what: &'static str,
        q: impl Fn(u8) -> QueryUpiu,
        data_len: usize,
    ) -> UfsResult<(QueryUpiu, Vec<u8>)> {
        self.retried(|s| {
            let tag = s.tag();
            s.query_once(r, t, what, q(tag), data_len)
        })
    }

    fn query_once(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        what: &'static str,
        q: QueryUpiu,
        data_len: usize,
    ) -> UfsResult<(QueryUpiu, Vec<u8>)> {
        let tag = q.header.task_tag;
        // SAFETY: `QueryUpiu` is PlainData (repr(C), 32 bytes of u8 fields):
        // viewing it as bytes is sound while `q` is borrowed.
        let bytes =
            unsafe { std::slice::from_raw_parts((&q as *const QueryUpiu).cast::<u8>(), 32) };
        let (ocs, rsp) = self.exec(r, t, bytes, DataDir::None, 0)?;
        if ocs != Ocs::SUCCESS {
            return Err(UfsCtrlError::DevCmd {
                what,
                err: UfsError::Transport(ocs),
            });
        }
        if rsp[0] != trans::QUERY_RSP || rsp[3] != tag {
            return Err(UfsCtrlError::DevCmd {
                what,
                err: UfsError::BadResponse {
                    trans_type: rsp[0],
                    task_tag: rsp[3],
                },
            });
        }
        if rsp[6] != 0 {
            return Err(UfsCtrlError::Query { what, code: rsp[6] });
        }
        let mut head = QueryUpiu::default();
        // SAFETY: as above, for writing 32 bytes into a PlainData value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rsp.as_ptr(),
                (&mut head as *mut QueryUpiu).cast::<u8>(),
                32,
            )
        };
        if data_len == 0 {
            return Ok((head, Vec::new()));
        }
        // The data segment length bounds the data; it must agree with the
        // descriptor length the response reports (QEMU 10 writes some
        // segment lengths byte-swapped: accept that form too).
        let dsl = head.header.data_segment_len();
        let len = head.desc_len();
        if !(dsl == len || dsl.swap_bytes() == len) {
            return Err(UfsCtrlError::BadValue {
                what: "QUERY RESPONSE descriptor length",
                value: u64::from(len),
                why: "disagrees with the data segment length",
            });
        }
        let n = usize::from(len).min(data_len).min(Ucd::RESPONSE_LEN - 32);
        Ok((head, rsp[32..32 + n].to_vec()))
    }

    fn read_desc(&mut self, r: &Regs<'_>, t: Duration, idn: u8, index: u8) -> UfsResult<Vec<u8>> {
        let q = |tag| QueryUpiu::read_descriptor(tag, idn, index, MAX_DESC_LEN);
        Ok(self
            .query(r, t, "read descriptor", q, usize::from(MAX_DESC_LEN))?
            .1)
    }

    /// Set fDeviceInit and poll it until the device clears it.
    fn device_init(&mut self, r: &Regs<'_>, t: Duration) -> UfsResult<()> {
        self.query(
            r,
            t,
            "set fDeviceInit",
            |tag| QueryUpiu::set_flag(tag, flag_idn::DEVICE_INIT),
            0,
        )?;
        let start = Instant::now();
        loop {
            let (h, _) = self.query(
                r,
                t,
                "read fDeviceInit",
                |tag| QueryUpiu::read_flag(tag, flag_idn::DEVICE_INIT),
                0,
            )?;
            if !h.flag_value() {
                return Ok(());
            }
            if start.elapsed() > t {
                return Err(UfsCtrlError::Timeout {
                    what: "clear fDeviceInit",
                    timeout_ms: t.as_millis() as u64,
                });
            }
            std::thread::yield_now();
        }
    }

    /// A device-management query of the HPB bring-up: an attribute's value,
    /// or a flag's (0/1) after reading or setting it.
    fn hpb_query(&mut self, r: &Regs<'_>, t: Duration, q: super::hpb::Query) -> UfsResult<u32> {
        use super::hpb::Query;
        let what = match q {
            Query::ReadAttr(_) => "read HPB attribute",
            Query::SetFlag(_) => "set HPB flag",
            Query::ReadFlag(_) => "read HPB flag",
        };
        let req = |tag| match q {
            Query::ReadAttr(idn) => QueryUpiu::read_attribute(tag, idn, 0),
            Query::SetFlag(idn) => QueryUpiu::set_flag(tag, idn),
            Query::ReadFlag(idn) => QueryUpiu::read_flag(tag, idn),
        };
        let (h, _) = self.query(r, t, what, req, 0)?;
        Ok(match q {
            Query::ReadAttr(_) => h.attr_value(),
            _ => u32::from(h.flag_value()),
        })
    }

    /// SCSI command `what` on LU `lun`, reading up to `alloc` bytes into the
    /// data page, retried ([`Self::retried`]).
    fn scsi(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        (what, lun): (&'static str, u8),
        cdb: scsi::Cdb,
        alloc: usize,
    ) -> UfsResult<Vec<u8>> {
        self.retried(|s| {
            s.scsi_once(r, t, lun, cdb, alloc)?
                .map_err(|err| UfsCtrlError::Scsi { what, lun, err })
        })
    }

    /// One SCSI command reading up to `alloc` bytes into the data page.
    fn scsi_once(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        lun: u8,
        cdb: scsi::Cdb,
        alloc: usize,
    ) -> UfsResult<Result<Vec<u8>, UfsError>> {
        let tag = self.tag();
        let cmd = CommandUpiu::new(lun, tag, cdb, alloc as u32, true);
        // SAFETY: `CommandUpiu` is PlainData (32 bytes of u8 fields).
        let bytes =
            unsafe { std::slice::from_raw_parts((&cmd as *const CommandUpiu).cast::<u8>(), 32) };
        let dir = if alloc == 0 {
            DataDir::None
        } else {
            DataDir::FromDevice
        };
        let (ocs, rsp) = self.exec(r, t, bytes, dir, alloc)?;
        let mut resp = ResponseUpiu::default();
        // SAFETY: `ResponseUpiu` is PlainData (52 bytes of u8 fields); the
        // source has 512 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rsp.as_ptr(),
                (&mut resp as *mut ResponseUpiu).cast::<u8>(),
                std::mem::size_of::<ResponseUpiu>(),
            )
        };
        if let Err(e) = command_result(ocs, &resp, tag) {
            return Ok(Err(e));
        }
        // The residual counts what was not moved, except on OVERFLOW: then
        // it counts what the device had beyond `alloc`, and all of `alloc`
        // arrived.
        let got = if resp.header.flags & upiu::flags::OVERFLOW != 0 {
            alloc
        } else {
            alloc.saturating_sub(resp.residual() as usize)
        };
        let mut v = vec![0u8; got];
        self.data.read_bytes(0, &mut v)?;
        Ok(Ok(v))
    }

    fn report_luns(&mut self, r: &Regs<'_>, t: Duration, lun: u8) -> UfsResult<Vec<u8>> {
        let alloc = 8 + 8 * 32;
        let cdb = scsi::report_luns(alloc as u32);
        let d = self.scsi(r, t, ("REPORT LUNS", lun), cdb, alloc)?;
        Ok(scsi::parse_report_luns(&d))
    }

    /// TEST UNIT READY (clears the power-on UNIT ATTENTION: retried).
    fn clear_unit_attention(&mut self, r: &Regs<'_>, t: Duration, lun: u8) -> UfsResult<()> {
        let cdb = scsi::test_unit_ready();
        self.scsi(r, t, ("TEST UNIT READY", lun), cdb, 0)
            .map(|_| ())
    }

    fn read_capacity(&mut self, r: &Regs<'_>, t: Duration, lun: u8) -> UfsResult<Capacity> {
        let (cdb, len) = (scsi::read_capacity16(), scsi::READ_CAPACITY_16_LEN);
        let d = self.scsi(r, t, ("READ CAPACITY(16)", lun), cdb, len)?;
        Capacity::parse(&d).ok_or(UfsCtrlError::BadValue {
            what: "READ CAPACITY(16) data",
            value: d.len() as u64,
            why: "too short, zero block length or a block count that overflows",
        })
    }
}

/// Whether a device command of the bring-up that failed with `e` is sent
/// again ([`DevCmd::retried`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Transient {
    /// No: the answer is final (or the controller is unusable).
    No,
    /// Yes, counted against [`DEV_CMD_ATTEMPTS`].
    Yes,
    /// Yes, a UNIT ATTENTION: counted against [`DEV_CMD_UNIT_ATTENTIONS`].
    UnitAttention,
}

/// The retry rule of the bring-up's device commands (and a reset's, the
/// same path). Transient:
/// - a transport error (any OCS): the host controller's failure to carry
///   the request, not the device's answer (Linux fails such a SCSI command
///   with DID_ERROR / DID_REQUEUE, which its midlayer retries, and retries
///   a NOP OUT or query that ended so);
/// - a malformed or mismatched response UPIU, "target failure" alone;
/// - a device-management request that timed out **and** was withdrawn
///   (UTRLCLR confirmed; Linux: -EAGAIN, retried);
/// - the query response code GENERAL FAILURE;
/// - SCSI status BUSY, TASK SET FULL, TASK ABORTED, CHECK CONDITION
///   without usable sense, or with any sense key but those below
///   (NOT READY "becoming ready", a MEDIUM or HARDWARE ERROR on a command
///   that reads no medium, ABORTED COMMAND, …), as Linux's sd retries READ
///   CAPACITY on any failure but these;
/// - UNIT ATTENTION, on its own allowance.
///
/// Final: ILLEGAL REQUEST (the device rejects the command itself: asking
/// again gets the same answer), NOT READY / MEDIUM NOT PRESENT,
/// RESERVATION CONFLICT, every other query response code (invalid index,
/// IDN, opcode, …: an answer), a request the controller would not give
/// back, a fatal or absent controller, DMA errors and values that do not
/// parse.
fn transient(e: &UfsCtrlError) -> Transient {
    use super::spec::scsi::{sense_key, ScsiStatus};
    match e {
        UfsCtrlError::Timeout { what, .. } if *what == DEV_CMD_WITHDRAWN => Transient::Yes,
        UfsCtrlError::Query { code, .. } if *code == QUERY_GENERAL_FAILURE => Transient::Yes,
        UfsCtrlError::DevCmd { err, .. } | UfsCtrlError::Scsi { err, .. } => match err {
            UfsError::Transport(_) | UfsError::BadResponse { .. } | UfsError::TargetFailure(_) => {
                Transient::Yes
            }
            UfsError::Scsi { sense: Some(s), .. } if s.is_unit_attention() => {
                Transient::UnitAttention
            }
            UfsError::Scsi { sense: Some(s), .. }
                if s.key == sense_key::ILLEGAL_REQUEST
                    || (s.key == sense_key::NOT_READY && s.asc == 0x3A) =>
            {
                Transient::No
            }
            UfsError::Scsi { status, .. } if *status == ScsiStatus::RESERVATION_CONFLICT => {
                Transient::No
            }
            UfsError::Scsi { .. } => Transient::Yes,
            // A transfer that was not whole: the device's own account of
            // this command, asked again it gives the same.
            UfsError::Underflow { .. }
            | UfsError::Overflow { .. }
            | UfsError::BadResidual { .. } => Transient::No,
        },
        _ => Transient::No,
    }
}
