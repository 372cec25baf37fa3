//! Controller bring-up, the admin queue, and shutdown.
//!
//! [`Controller::new`] runs the NVMe initialisation sequence synchronously:
//!
//! 1. read CAP; check that the admin doorbells (at the CAP.DSTRD stride)
//!    lie inside BAR0; disable the controller (see below);
//! 2. allocate the admin queues, program AQA/ASQ/ACQ;
//! 3. enable with CSS = NVM, MPS = 4 KiB, IOSQES = 64 B, IOCQES = 16 B; wait
//!    for CSTS.RDY = 1 (bounded by CAP.TO); CSTS.CFS fails with [`Error::ControllerFatal`];
//! 4. Identify Controller, the active namespace list, Identify each namespace;
//! 5. Set Features (Number of Queues) — the grant, capped to the request
//!    and to the queues whose doorbells lie inside BAR0, bounds
//!    [`Controller::create_qpair`];
//! 6. Doorbell Buffer Config (shadow doorbells) when OACS bit 8 is set and
//!    [`ControllerOptions::shadow_doorbells`] allows it;
//! 7. Asynchronous Event Requests posted.
//!
//! If any step after 2 fails, the controller is disabled before the admin
//! and shadow doorbell memory is freed; if it cannot be disabled, that
//! memory is leaked (the device might still write it).
//!
//! **Disabling** clears CC.EN and waits for CSTS.RDY = 0, bounded by CAP.TO.
//! Clearing EN while EN = 1 and RDY = 0 (an enable in progress) is undefined
//! in the spec, so that state first waits for RDY = 1, bounded by CAP.TO, as
//! SPDK does; a controller that never gets there counts as not disabled.
//!
//! # Values from the device
//!
//! Nothing the controller reports is trusted: a doorbell outside BAR0, a
//! namespace whose size overflows 64 bits or more than [`MAX_NAMESPACES`]
//! active namespaces are [`Error::BadDevice`]; the active namespace list is
//! sorted and deduplicated and may be sparse (any NSID up to FFFFFFFEh);
//! malformed Identify data is [`Error::Identify`]. A namespace whose blocks
//! are larger than one command may move (LBADS above MDTS) is kept with
//! [`Namespace::usable`] = `false` — its reads and writes are refused with
//! [`crate::SubmitErrorKind::TransferTooLarge`] — rather than failing the
//! bring-up of the controller and its other namespaces. An admin command waits
//! at most [`ControllerOptions::admin_timeout`] however many completions
//! that are not its own (stale CIDs, completions in the AER range that no
//! outstanding Asynchronous Event Request owns) the device posts meanwhile;
//! those are dropped and never re-post an AER.
//!
//! Admin commands are serialised by a mutex: they are rare and never on the
//! I/O path. [`Controller::admin`] passes a command through as given and is
//! `unsafe` (its data pointers are the caller's promise);
//! [`Controller::admin_read`] builds the data pointers itself and is safe.
//!
//! # Reset and failure
//!
//! [`Controller::reset`] (also run by the timeout policies) disables the
//! controller (CC.EN = 0, wait for CSTS.RDY = 0, bounded by CAP.TO), which
//! ends every command and every I/O queue on the device: from then on it
//! does not touch host memory. It then re-runs bring-up on the same admin
//! queue memory (enable, Identify — the controller and its namespaces must
//! be the same device —, Set Features Number of Queues, Doorbell Buffer
//! Config, Asynchronous Event Requests re-posted). Queue pairs learn about
//! the reset on their next [`QueuePair::poll`] (one relaxed load of the
//! controller's state word per poll): they deliver the completions the
//! controller posted before the reset, complete everything else with
//! [`crate::IoError::AbortedByReset`] (buffers handed back: the device is
//! provably done with them), and re-create their queues on the controller
//! with the same queue id and ring memory. The application only resubmits.
//!
//! Controller fatal status (CSTS.CFS) and surprise removal (registers read
//! all ones) are seen by whichever poll or admin command notices first. A
//! fatal controller is disabled at once (bounded by CAP.TO) so that no DMA
//! can still be in flight; then every queue pair completes its commands with
//! [`crate::IoError::ControllerFailed`] and every later call (submit, poll,
//! admin, close) fails fast with [`Error::ControllerFatal`] or
//! [`Error::DeviceGone`] until a successful [`Controller::reset`]. If a fatal
//! controller cannot even be disabled, buffers of its outstanding commands
//! are leaked (their completions carry no buffer): the device might still
//! write into them. Dropping the last `Arc<Controller>` (every [`QueuePair`] holds
//! one, so they are gone by then) performs a normal shutdown: CC.SHN =
//! normal, then wait for CSTS.SHST = complete, bounded; then it disables
//! the controller (which drops its Asynchronous Event Requests) before the
//! admin queue and shadow doorbell memory is freed, or leaks that memory if
//! the controller cannot be disabled.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcqio_vfio::{Backend, DmaDir, DmaRegion, DmaSpace, DoorbellHook, Mmio};

use crate::core::io::IoBuf;
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::doorbell::{Doorbell, Shadow};
use crate::nvme::pcie::queue::sq::SubQueue;
use crate::nvme::pcie::queue::{QpairOptions, QueuePair, PAGE_SIZE};
use crate::nvme::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::nvme::spec::opcodes::admin as admin_op;
use crate::nvme::spec::regs::{self, Aqa, Cap, Cc, Csts, Version};
use crate::nvme::spec::sqe::{
    AsyncEventRequest, Command, CreateIoCq, CreateIoSq, DeleteIoCq, DeleteIoSq,
    DoorbellBufferConfig, Identify, SetFeatures,
};
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::{Cqe, NvmeStatus, Sqe};
use crate::{DmaBuf, Error, Result};

/// Options for [`Controller::new`].
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (2..=4096).
    pub admin_queue_entries: u16,
    /// I/O queue pairs to ask for in Set Features (Number of Queues). The
    /// controller may grant fewer; [`Controller::granted_io_queues`] says how many.
    pub io_queues: u16,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller
    /// supports them. Only emulated controllers (QEMU) do; it saves MMIO exits.
    pub shadow_doorbells: bool,
    /// Bound on each admin command.
    pub admin_timeout: Duration,
    /// What to do when an admin command times out: [`TimeoutPolicy::ReportOnly`]
    /// returns [`Error::Timeout`]; [`TimeoutPolicy::Abort`] and
    /// [`TimeoutPolicy::Reset`] both reset the controller (aborting an admin
    /// command would itself need the stuck admin queue) and then return
    /// [`Error::Timeout`].
    pub admin_timeout_policy: TimeoutPolicy,
    /// Bound on the shutdown handshake at drop.
    pub shutdown_timeout: Duration,
    /// Asynchronous Event Requests to keep posted (capped by the
    /// controller's AERL). Events are collected while admin commands run and
    /// by [`Controller::async_events`]. 0 disables them.
    pub async_event_requests: u8,
    /// Cap on bytes per I/O command. The effective limit is the smaller of
    /// this and the controller's MDTS; it sizes the pre-allocated PRP list
    /// pages (one 4 KiB page covers up to 2 MiB). Creating a queue pair
    /// fails with [`Error::InvalidOption`] if one command could need more
    /// than 64 list pages (about 127 MiB): lower this on a controller
    /// without an MDTS.
    pub max_transfer: u64,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: true,
            admin_timeout: Duration::from_secs(10),
            admin_timeout_policy: TimeoutPolicy::Reset,
            shutdown_timeout: Duration::from_secs(10),
            max_transfer: 2 << 20,
            async_event_requests: 1,
        }
    }
}

pub use crate::core::timeout::TimeoutPolicy;

/// Controller state word: reset epoch in the high bits, failure in the low
/// two. A new epoch means the controller was disabled since: it dropped
/// every I/O queue and no longer accesses the memory of their commands.
pub(crate) mod state {
    /// No failure.
    pub const OK: u64 = 0;
    /// CSTS.CFS was seen (or a reset failed).
    pub const FATAL: u64 = 1;
    /// Registers read all ones.
    pub const GONE: u64 = 2;
    /// Failure bits.
    pub const MASK: u64 = 3;
    /// One epoch step.
    pub const EPOCH: u64 = 4;

    /// The failure bits of `s`.
    pub const fn failure(s: u64) -> u64 {
        s & MASK
    }

    /// The epoch bits of `s`.
    pub const fn epoch(s: u64) -> u64 {
        s & !MASK
    }
}

fn failure_error(s: u64) -> Option<Error> {
    match state::failure(s) {
        state::OK => None,
        state::GONE => Some(Error::DeviceGone),
        _ => Some(Error::ControllerFatal),
    }
}

/// An active namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace id.
    pub id: u32,
    /// Size in blocks.
    pub nsze: u64,
    /// Block size in bytes.
    pub lba_size: u64,
    /// log2 of the block size.
    pub lba_shift: u32,
    /// The full identify data.
    pub identify: IdentifyNamespace,
    /// Whether reads and writes can reach it. `false` when one block is
    /// larger than the controller lets one command move (LBADS above
    /// MDTS): bring-up keeps the controller and its other namespaces, and
    /// every read or write to this one is refused before submission with
    /// [`crate::SubmitErrorKind::TransferTooLarge`] (commands that move no
    /// data — Flush, Write Zeroes, Dataset Management — still go through).
    pub usable: bool,
}

impl Namespace {
    /// Check what the controller reported for namespace `id`: its capacity
    /// in bytes must fit in a `u64`. Usable if one block fits in
    /// `max_transfer` bytes.
    fn new(id: u32, identify: IdentifyNamespace, max_transfer: u64) -> Result<Self> {
        let ns = Namespace {
            id,
            nsze: identify.nsze,
            lba_size: identify.lba_size(),
            lba_shift: identify.lba_shift(),
            usable: identify.lba_size() <= max_transfer,
            identify,
        };
        if ns.checked_size_bytes().is_none() {
            return Err(Error::BadDevice {
                what: "namespace size (NSZE)",
                detail: format!(
                    "namespace {id}: {} blocks of {} B overflow 64 bits",
                    ns.nsze, ns.lba_size
                ),
            });
        }
        Ok(ns)
    }

    /// Capacity in bytes, `None` if it does not fit in a `u64` (never for a
    /// namespace from [`Controller::namespaces`]: bring-up rejects those).
    pub fn checked_size_bytes(&self) -> Option<u64> {
        self.nsze.checked_mul(1u64.checked_shl(self.lba_shift)?)
    }

    /// Capacity in bytes, saturating at `u64::MAX` (see
    /// [`Self::checked_size_bytes`]).
    pub fn size_bytes(&self) -> u64 {
        self.checked_size_bytes().unwrap_or(u64::MAX)
    }
}

/// The admin queue pair plus a 4 KiB data page for identify and logs.
struct AdminQueue {
    sq: SubQueue,
    cq: CompQueue,
    next_cid: u16,
    data: DmaRegion,
    /// Asynchronous Event Requests the controller holds.
    aers: u16,
    /// Events received and not yet handed out.
    events: VecDeque<AsyncEvent>,
    /// Asynchronous Event Requests to keep posted (re-posted after a reset).
    aer_target: u16,
    /// Which AER CIDs (`AER_CID_BASE + bit`) the controller holds.
    aer_out: [u64; 4],
    /// Ring entries (both queues).
    entries: u16,
}

/// CIDs from here up belong to Asynchronous Event Requests (one per
/// outstanding AER), so their completions — which arrive at any time — are
/// never mistaken for the command being waited on.
const AER_CID_BASE: u16 = 0xFF00;

/// Asynchronous events kept until [`Controller::async_events`] takes them;
/// beyond this the oldest are dropped.
const MAX_EVENTS: usize = 256;

/// Event types of an asynchronous event (completion dword 0, bits 2:0).
pub mod event_type {
    /// Error status.
    pub const ERROR: u8 = 0;
    /// SMART / health status.
    pub const SMART_HEALTH: u8 = 1;
    /// Notice (namespace attribute changed, firmware activation, ...).
    pub const NOTICE: u8 = 2;
    /// I/O command set specific.
    pub const IO_COMMAND_SET: u8 = 6;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// An asynchronous event the controller reported.
///
/// The controller masks further events of the same type until the host
/// reads `log_page` (Get Log Page without Retain Asynchronous Event).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Event type ([`event_type`]).
    pub event_type: u8,
    /// Event information (meaning depends on the type).
    pub info: u8,
    /// Log page that holds the details.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Decode completion dword 0 of an Asynchronous Event Request.
    pub const fn from_dw0(dw0: u32) -> Self {
        AsyncEvent {
            event_type: (dw0 & 0b111) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }
}

/// Shadow doorbell and EventIdx pages.
struct ShadowPages {
    shadow: DmaRegion,
    event_idx: DmaRegion,
}

impl ShadowPages {
    /// The (SQ tail, CQ head) slots of queue `qid`; `None` if the page is
    /// too small for that queue. `zero` resets the shadow values and the
    /// EventIdx entries (a new queue starts at 0; the admin queue keeps
    /// what the controller copied in). EventIdx must be reset too: the
    /// doorbell skips the MMIO write unless the new tail passes EventIdx,
    /// and one left behind by an earlier queue with this id (before a reset,
    /// or a queue pair since dropped) would make a queue starting over at 0
    /// skip its first doorbells — a hang on controllers that only look at a
    /// queue when its MMIO doorbell is written (QEMU).
    fn slots(&self, qid: u16, dstrd: u8, zero: bool) -> (Option<Shadow>, Option<Shadow>) {
        let stride = regs::doorbell_stride(dstrd);
        let sq_off = 2 * qid as usize * stride;
        let cq_off = (2 * qid as usize + 1) * stride;
        if cq_off + 4 > self.shadow.len() || cq_off + 4 > self.event_idx.len() {
            return (None, None);
        }
        // SAFETY: offsets checked against both pages' lengths above; the
        // pages live as long as the controller, which every queue (and the
        // admin queue, which the controller owns) keeps alive.
        let at = |r: &DmaRegion, off: usize| unsafe { r.as_ptr().add(off).cast::<u32>() };
        if zero {
            for p in [
                at(&self.shadow, sq_off),
                at(&self.shadow, cq_off),
                at(&self.event_idx, sq_off),
                at(&self.event_idx, cq_off),
            ] {
                // SAFETY: in bounds (checked above), 4-byte aligned (offsets
                // are multiples of the doorbell stride in page-aligned pages).
                // These are queue `qid`'s slots and the caller is setting that
                // queue up (a fresh qid, or the admin queue under its lock), so
                // no queue stores to them now; other queues' slots are at other
                // offsets. The volatile store forms no reference.
                unsafe { p.write_volatile(0) };
            }
        }
        (
            Some(Shadow {
                value: at(&self.shadow, sq_off),
                event_idx: at(&self.event_idx, sq_off),
            }),
            Some(Shadow {
                value: at(&self.shadow, cq_off),
                event_idx: at(&self.event_idx, cq_off),
            }),
        )
    }
}

/// BAR base pointer. `Send + Sync`: it is only used to compute doorbell
/// addresses; stores through it are volatile and made by queue owners.
#[derive(Copy, Clone)]
struct BarPtr(NonNull<u8>);
// SAFETY: the pointer is an address into the BAR mapping owned by the
// backend (kept alive by the controller); sharing the address is harmless,
// and every access through it is a volatile MMIO access.
unsafe impl Send for BarPtr {}
// SAFETY: see Send.
unsafe impl Sync for BarPtr {}

/// An initialised NVMe controller. Shareable (`Sync`); create one
/// [`QueuePair`] per thread for I/O.
pub struct Controller {
    backend: Arc<dyn Backend>,
    dma: Arc<DmaSpace>,
    cap: Cap,
    version: Version,
    bar: BarPtr,
    identify: IdentifyController,
    namespaces: Vec<Namespace>,
    granted: u16,
    free_qids: Mutex<Vec<u16>>,
    /// Dropped in `Drop for Controller` only once the controller is
    /// disabled; leaked otherwise (the device may still write its rings).
    admin: ManuallyDrop<Mutex<AdminQueue>>,
    shadow: Option<ShadowPages>,
    max_transfer: u64,
    opts: ControllerOptions,
    /// See [`state`]. Written only with the admin lock held.
    state: AtomicU64,
    /// Successful resets.
    resets: AtomicU64,
    /// Bound on CSTS.RDY transitions (CAP.TO, at least 500 ms).
    ready_timeout: Duration,
    /// Bytes of queue memory (rings, PRP pages, in-flight buffers) leaked
    /// because the device might still access them.
    leaked_queue_bytes: AtomicU64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("backend", &self.backend.name())
            .field("version", &self.version)
            .field("model", &self.identify.model)
            .field("serial", &self.identify.serial)
            .field("namespaces", &self.namespaces.len())
            .field("granted_io_queues", &self.granted)
            .finish_non_exhaustive()
    }
}

fn read_csts(regs: &dyn Mmio) -> Result<Csts> {
    let c = Csts(regs.read32(regs::CSTS));
    if c.is_all_ones() {
        return Err(Error::DeviceGone);
    }
    Ok(c)
}

/// Spin (then yield) until `done(csts)` or `timeout`.
fn wait_csts(
    regs: &dyn Mmio,
    timeout: Duration,
    what: &'static str,
    check_cfs: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let c = read_csts(regs)?;
        if done(c) {
            return Ok(());
        }
        if check_cfs && c.cfs() {
            return Err(Error::ControllerFatal);
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what,
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// What [`disable`] reports when an enable in progress never completed
/// (returned only once the controller did read RDY = 0 afterwards).
const READY_BEFORE_DISABLE: &str = "become ready before being disabled (CSTS.RDY=1)";

/// Disable the controller: clear CC.EN and wait for CSTS.RDY = 0, bounded
/// by `timeout` (CAP.TO). `Ok` means the controller reached the disabled
/// state, so it no longer accesses host memory; `Err(Error::DeviceGone)`
/// means the registers read all ones (a removed device cannot DMA either).
/// Any other `Err` means the device might still access memory it was
/// given: the caller must leak that memory rather than free it.
///
/// Clearing EN while EN = 1 and RDY = 0 (an enable still in progress) is
/// undefined in the spec, so that state first waits for RDY = 1 (or CFS),
/// bounded by the same timeout, as SPDK does. If RDY never comes, EN is
/// cleared anyway (nothing better is left to try), but the result is an
/// error: whether the controller really stopped cannot be known.
fn disable(regs: &dyn Mmio, timeout: Duration) -> Result<()> {
    let cc = Cc(regs.read32(regs::CC));
    if cc.0 == u32::MAX {
        return Err(Error::DeviceGone);
    }
    let mut settled = Ok(());
    if cc.enabled() {
        let c = read_csts(regs)?;
        if !c.rdy() && !c.cfs() {
            settled = wait_csts(regs, timeout, READY_BEFORE_DISABLE, false, |c| {
                c.rdy() || c.cfs()
            });
            if let Err(Error::DeviceGone) = settled {
                return settled;
            }
        }
        regs.write32(regs::CC, cc.disable().0);
    }
    wait_csts(regs, timeout, "become disabled (CSTS.RDY=0)", false, |c| {
        !c.rdy()
    })?;
    settled
}

/// Whether the outcome of [`disable`] lets memory the controller was given
/// be freed.
fn quiesced(r: &Result<()>) -> bool {
    matches!(r, Ok(()) | Err(Error::DeviceGone))
}

impl AdminQueue {
    fn exec(
        &mut self,
        regs: &dyn Mmio,
        sqe: Sqe,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Cqe> {
        let cid = self.next_cid;
        self.next_cid = if cid + 1 >= AER_CID_BASE { 0 } else { cid + 1 };
        self.sq.push(sqe.with_cid(cid));
        self.sq.flush();
        let start = Instant::now();
        let timed_out = || Error::Timeout {
            what,
            timeout_ms: timeout.as_millis() as u64,
        };
        let mut spins = 0u32;
        loop {
            if let Some(cqe) = self.cq.peek() {
                self.cq.advance();
                self.cq.flush();
                if cqe.cid != cid {
                    if !self.on_aer(cqe) {
                        log::warn!("admin queue: dropped stale completion cid {:#06x} (waiting for {cid:#06x})", cqe.cid);
                    }
                    // A device can post completions that are not ours
                    // without end: the deadline holds regardless.
                    if start.elapsed() >= timeout {
                        return Err(timed_out());
                    }
                    continue;
                }
                let st = cqe.nvme_status();
                if !st.is_success() {
                    return Err(Error::Command {
                        command: what,
                        status: st,
                    });
                }
                return Ok(cqe);
            }
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                let c = read_csts(regs)?;
                if c.cfs() {
                    return Err(Error::ControllerFatal);
                }
                if start.elapsed() >= timeout {
                    return Err(timed_out());
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl AdminQueue {
    /// Post one Asynchronous Event Request with `cid` (>= AER_CID_BASE).
    /// A completed AER is re-posted with its own CID, so outstanding AERs
    /// never share one.
    fn post_aer(&mut self, cid: u16) {
        let i = cid.wrapping_sub(AER_CID_BASE);
        self.aer_out[i as usize / 64] |= 1 << (i % 64);
        self.aers += 1;
        self.sq.push(AsyncEventRequest.sqe().with_cid(cid));
        self.sq.flush();
    }

    /// A completion arrived that is not the command being waited on. If it
    /// ends an outstanding Asynchronous Event Request: keep the event and
    /// re-arm, or (error status, e.g. aborted at shutdown) let it go, and
    /// return true. Anything else (a CID in the AER range that is not
    /// outstanding included) is stale: false. So a device cannot make the
    /// host post more AERs than it has outstanding, nor grow the event
    /// queue without bound.
    fn on_aer(&mut self, cqe: Cqe) -> bool {
        let Some(i) = cqe.cid.checked_sub(AER_CID_BASE) else {
            return false;
        };
        let (w, bit) = (i as usize / 64, 1u64 << (i % 64));
        if self.aer_out[w] & bit == 0 {
            return false;
        }
        self.aer_out[w] &= !bit;
        self.aers = self.aers.saturating_sub(1);
        let st = cqe.nvme_status();
        if st.is_success() {
            let ev = AsyncEvent::from_dw0(cqe.dw0);
            log::info!("asynchronous event: {ev:?}");
            if self.events.len() >= MAX_EVENTS {
                log::warn!("asynchronous events: queue full; dropping the oldest");
                self.events.pop_front();
            }
            self.events.push_back(ev);
            self.post_aer(cqe.cid);
        } else {
            log::warn!("Asynchronous Event Request ended with {st}; not re-posted");
        }
        true
    }

    /// Consume whatever the admin CQ holds (AER completions; anything else
    /// is stale here since no command is being waited on). Bounded by one
    /// lap of the ring, so a device that keeps posting cannot hold it.
    fn drain(&mut self) {
        for _ in 0..self.entries {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            if !self.on_aer(cqe) {
                log::warn!("admin queue: dropped stale completion cid {:#06x}", cqe.cid);
            }
        }
        self.cq.flush();
    }
}

impl Controller {
    /// Bring up the controller behind `backend` (see the module docs for
    /// the sequence).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mcqio::{Controller, ControllerOptions, vfio::Backend};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A real controller: Arc::new(mcqio::vfio::VfioBackend::open("0000:03:00.0")?).
    /// let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
    /// let ctrl = Controller::new(backend, ControllerOptions::default())?;
    /// for ns in ctrl.namespaces() {
    ///     println!("namespace {}: {} blocks of {} B", ns.id, ns.nsze, ns.lba_size);
    /// }
    /// assert_eq!(ctrl.namespace(1).map(|ns| ns.lba_size), Some(512));
    /// assert!(ctrl.granted_io_queues() >= 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(backend: Arc<dyn Backend>, opts: ControllerOptions) -> Result<Arc<Controller>> {
        if !(2..=4096).contains(&opts.admin_queue_entries) {
            return Err(Error::InvalidOption(format!(
                "admin_queue_entries {} is outside 2..=4096",
                opts.admin_queue_entries
            )));
        }
        if opts.io_queues == 0 || opts.io_queues == u16::MAX {
            return Err(Error::InvalidOption("io_queues must be 1..=65534".into()));
        }
        let regs = backend.regs();
        let cap_raw = regs.read64(regs::CAP);
        if cap_raw == u64::MAX {
            return Err(Error::DeviceGone);
        }
        let cap = Cap(cap_raw);
        let version = Version(regs.read32(regs::VS));
        if cap.css() & 1 == 0 {
            return Err(Error::InvalidOption(
                "the controller does not support the NVM command set (CAP.CSS bit 0)".into(),
            ));
        }
        if cap.mps_min_shift() > 12 {
            return Err(Error::InvalidOption(format!(
                "the controller's minimum page size is {} bytes; mcqio uses 4096",
                1u64 << cap.mps_min_shift()
            )));
        }
        // CAP.TO of 0 would make every wait fail at once; use 500 ms minimum.
        let ready_timeout = Duration::from_millis(cap.timeout_ms().max(500));

        // Every doorbell the engine will store to must lie inside BAR0: a
        // large CAP.DSTRD would otherwise put even the admin doorbells past
        // the mapping. The I/O queues' doorbells are checked against the
        // grant below.
        let dstrd = cap.dstrd();
        let bar_len = regs.len();
        if !doorbells_fit(0, dstrd, bar_len) {
            return Err(Error::BadDevice {
                what: "doorbell stride (CAP.DSTRD)",
                detail: format!(
                    "DSTRD {dstrd} puts the admin doorbells at {:#x}, outside the {bar_len:#x}-byte BAR0",
                    regs::cq_head_doorbell(0, dstrd)
                ),
            });
        }

        if cap.max_queue_entries() < 2 {
            return Err(Error::BadDevice {
                what: "maximum queue entries (CAP.MQES)",
                detail: "MQES 0 (one entry); a queue needs at least two".into(),
            });
        }

        // 1. Disable. No memory of ours is at stake yet: a controller left
        // enabling by someone else that never became ready but is disabled
        // now is usable.
        match disable(regs, ready_timeout) {
            Err(Error::Timeout { what, .. }) if what == READY_BEFORE_DISABLE => {
                log::warn!(
                    "{}: the controller was enabling and never became ready; disabled it anyway",
                    backend.name()
                );
            }
            r => r?,
        }

        // 2. Admin queues.
        let dma = Arc::clone(backend.dma());
        let entries = opts
            .admin_queue_entries
            .min(cap.max_queue_entries().min(4096) as u16);
        let asq = dma.alloc(entries as usize * size_of::<Sqe>(), DmaDir::ToDevice)?;
        let acq = dma.alloc(entries as usize * size_of::<Cqe>(), DmaDir::Bidirectional)?;
        let data = dma.alloc(IDENTIFY_LEN, DmaDir::Bidirectional)?;
        let bar = BarPtr(regs.base());
        let hook = backend.doorbell_hook();
        // SAFETY: the admin doorbells (qid 0) were checked above to lie
        // inside BAR0, which the backend maps for as long as the controller
        // (which owns the queues) lives.
        let (sq_db, cq_db) = unsafe {
            (
                Doorbell::new(
                    bar.0,
                    regs::sq_tail_doorbell(0, dstrd),
                    None,
                    true,
                    hook.clone(),
                ),
                Doorbell::new(
                    bar.0,
                    regs::cq_head_doorbell(0, dstrd),
                    None,
                    true,
                    hook.clone(),
                ),
            )
        };
        let mut admin = AdminQueue {
            sq: SubQueue::new(asq, entries, sq_db),
            cq: CompQueue::new(acq, entries, cq_db),
            next_cid: 0,
            data,
            aers: 0,
            events: VecDeque::new(),
            aer_target: 0,
            aer_out: [0; 4],
            entries,
        };
        let mut shadow = None;
        let up = bring_up(
            &*backend,
            &opts,
            cap,
            ready_timeout,
            &mut admin,
            &mut shadow,
        );
        let up = match up {
            Ok(up) => up,
            Err(e) => {
                // The controller may be enabled, holding Asynchronous Event
                // Requests and the admin and shadow doorbell pages: stop it
                // before those pages go back to the allocator, or leak them.
                let r = disable(regs, ready_timeout);
                if !quiesced(&r) {
                    log::error!(
                        "{}: bring-up failed ({e}) and the controller could not be disabled ({}); leaking its admin queue memory",
                        backend.name(),
                        r.err().map_or_else(String::new, |e| e.to_string())
                    );
                    std::mem::forget(admin);
                    std::mem::forget(shadow);
                }
                return Err(e);
            }
        };
        let BringUp {
            identify,
            namespaces,
            granted,
            max_transfer,
        } = up;
        log::info!(
            "{}: {} {} fw {} NVMe {version}, {} namespaces, {granted} I/O queues, max transfer {max_transfer} B, shadow doorbells {}",
            backend.name(),
            identify.model,
            identify.serial,
            identify.firmware,
            namespaces.len(),
            shadow.is_some()
        );
        Ok(Arc::new(Controller {
            backend,
            dma,
            cap,
            version,
            bar,
            identify,
            namespaces,
            granted,
            free_qids: Mutex::new((1..=granted).rev().collect()),
            admin: ManuallyDrop::new(Mutex::new(admin)),
            shadow,
            max_transfer,
            opts,
            state: AtomicU64::new(state::OK),
            resets: AtomicU64::new(0),
            ready_timeout,
            leaked_queue_bytes: AtomicU64::new(0),
        }))
    }

    /// The backend (cold path only).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The DMA space buffers must come from.
    pub fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }

    /// Allocate a DMA buffer of `len` bytes usable with this controller.
    pub fn alloc_buf(&self, len: usize, dir: DmaDir) -> Result<DmaBuf> {
        Ok(DmaBuf::alloc(&self.dma, len, dir)?)
    }

    /// CAP.
    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// VS.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Identify Controller data.
    pub fn identify(&self) -> &IdentifyController {
        &self.identify
    }

    /// Active namespaces, by ascending id.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }

    /// Namespace `id`, if active (a binary search: NSIDs may be sparse).
    pub fn namespace(&self, id: u32) -> Option<&Namespace> {
        self.namespaces
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .map(|i| &self.namespaces[i])
    }

    /// I/O queue pairs the controller granted.
    pub fn granted_io_queues(&self) -> usize {
        self.granted as usize
    }

    /// I/O queue pairs not currently in use.
    pub fn free_io_queues(&self) -> usize {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Largest transfer per I/O command in bytes (MDTS and options).
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// Whether shadow doorbells are in use.
    pub fn shadow_doorbells(&self) -> bool {
        self.shadow.is_some()
    }

    /// The options the controller was created with.
    pub fn options(&self) -> &ControllerOptions {
        &self.opts
    }

    pub(crate) fn bar(&self) -> NonNull<u8> {
        self.bar.0
    }

    /// Read CSTS: `Err` if the controller is fatal or gone (or was found
    /// so earlier and has not been reset since).
    pub fn health(&self) -> Result<()> {
        if let Some(e) = failure_error(self.state()) {
            return Err(e);
        }
        let c = read_csts(self.backend.regs())?;
        if c.cfs() {
            return Err(Error::ControllerFatal);
        }
        Ok(())
    }

    /// Execute one admin command exactly as given (data pointers included)
    /// and wait for it. `what` names it in errors. For Identify and Get Log
    /// Page, the safe [`Controller::admin_read`] builds the data pointers
    /// itself.
    ///
    /// Fails fast with [`Error::ControllerFatal`] / [`Error::DeviceGone`]
    /// once the controller is known to have failed. A timeout is handled per
    /// [`ControllerOptions::admin_timeout_policy`].
    ///
    /// # Safety
    ///
    /// The device will read or write every host address the command names
    /// — PRP1/PRP2 (and the PRP lists they point to), the metadata pointer,
    /// SGL descriptors, and addresses carried in command dwords (Create I/O
    /// queue bases, Doorbell Buffer Config, the Host Memory Buffer
    /// descriptor list of Set Features, vendor-specific commands). The
    /// caller must guarantee that every such address is an IOVA of memory
    /// mapped in [`Controller::dma`] that nothing else uses — not a
    /// [`DmaBuf`] owned by the application or in flight on a queue pair,
    /// not memory of this controller — large enough for the transfer the
    /// command describes, and that stays mapped and unused for as long as
    /// the device may access it: until this call returns `Ok` or
    /// [`Error::Command`], and, after any other error (a timeout under
    /// [`TimeoutPolicy::ReportOnly`], a controller that could not be
    /// disabled), for as long as the controller lives. Queue-creating and
    /// queue-deleting commands must not name queues owned by a
    /// [`QueuePair`]. (Validation cannot replace this contract: which
    /// fields hold host addresses depends on the opcode and, for
    /// vendor-specific commands, on nothing the host can know.)
    pub unsafe fn admin(&self, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        let mut a = self.lock_admin();
        self.admin_locked(&mut a, sqe, what)
    }

    /// An admin command that names no host memory (Abort, Delete I/O
    /// SQ/CQ, Set Features without data): its data and metadata pointers
    /// are cleared.
    pub(crate) fn admin_cmd(&self, mut sqe: Sqe, what: &'static str) -> Result<Cqe> {
        sqe.mptr = 0;
        let mut a = self.lock_admin();
        self.admin_locked(&mut a, sqe.with_prp(0, 0), what)
    }

    fn lock_admin(&self) -> std::sync::MutexGuard<'_, AdminQueue> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admin_locked(&self, a: &mut AdminQueue, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        if let Some(e) = failure_error(self.state()) {
            return Err(e);
        }
        match a.exec(self.backend.regs(), sqe, what, self.opts.admin_timeout) {
            Err(e @ Error::Timeout { .. }) => {
                if self.opts.admin_timeout_policy != TimeoutPolicy::ReportOnly {
                    log::warn!("{}: {e}; resetting the controller", self.backend.name());
                    if let Err(r) = self.reset_locked(a) {
                        log::error!(
                            "{}: reset after an admin timeout failed: {r}",
                            self.backend.name()
                        );
                    }
                }
                Err(e)
            }
            Err(Error::ControllerFatal) => {
                self.fail_locked(state::FATAL);
                Err(Error::ControllerFatal)
            }
            Err(Error::DeviceGone) => {
                self.fail_locked(state::GONE);
                Err(Error::DeviceGone)
            }
            r => r,
        }
    }

    /// The state word (see [`state`]); one relaxed load, read by every poll.
    #[inline]
    pub(crate) fn state(&self) -> u64 {
        self.state.load(Ordering::Relaxed)
    }

    /// The state word once no reset is running (taken under the admin lock).
    pub(crate) fn settled_state(&self) -> u64 {
        let _a = self.lock_admin();
        self.state()
    }

    /// Successful controller resets so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// A queue pair saw CSTS.CFS or all-ones registers: record it for
    /// everyone (once) and, for a fatal controller, disable it so no DMA is
    /// left in flight.
    pub(crate) fn note_failure(&self, seen_state: u64, e: &Error) {
        let _a = self.lock_admin();
        if self.state() != seen_state {
            return; // someone else already acted (or reset it)
        }
        match e {
            Error::DeviceGone => self.fail_locked(state::GONE),
            _ => self.fail_locked(state::FATAL),
        }
    }

    /// Record a failure (admin lock held). A gone device cannot DMA, and a
    /// fatal one is disabled here: in both cases the epoch advances (the
    /// queues are dead and their memory is free). A fatal controller that
    /// does not become disabled keeps the epoch: its queues' buffers must
    /// be leaked.
    fn fail_locked(&self, failure: u64) {
        let s = self.state();
        if state::failure(s) == state::GONE {
            return;
        }
        let mut quiesced = failure == state::GONE;
        if !quiesced {
            match disable(self.backend.regs(), self.ready_timeout) {
                Ok(()) => quiesced = true,
                Err(Error::DeviceGone) => {
                    return self.fail_locked(state::GONE);
                }
                Err(e) => log::error!(
                    "{}: a failed controller could not be disabled ({e}); buffers of outstanding commands will be leaked",
                    self.backend.name()
                ),
            }
        }
        let epoch = state::epoch(s) + if quiesced { state::EPOCH } else { 0 };
        log::error!(
            "{}: controller {}; outstanding commands fail",
            self.backend.name(),
            if failure == state::GONE {
                "removed (registers read all ones)"
            } else {
                "fatal (CSTS.CFS)"
            }
        );
        self.state.store(epoch | failure, Ordering::Release);
    }

    /// Reset the controller and bring it up again (see the module docs).
    ///
    /// Every command outstanding on any queue pair completes — at that queue
    /// pair's next poll — with [`crate::IoError::AbortedByReset`] (or
    /// normally, if the controller completed it before the reset), and the
    /// queue pairs re-create their queues; Asynchronous Event Requests are
    /// re-posted. Also clears a fatal state. Fails with
    /// [`Error::DeviceGone`] for a removed device, [`Error::Timeout`] if the
    /// controller does not become disabled or ready within CAP.TO, and
    /// [`Error::DeviceChanged`] if a different device answers.
    pub fn reset(&self) -> Result<()> {
        let mut a = self.lock_admin();
        self.reset_locked(&mut a)
    }

    /// Reset unless the state moved on from `seen` (another thread already
    /// reset the controller, or it failed): used by timeout policies so
    /// several queues timing out together cause one reset.
    pub(crate) fn reset_if(&self, seen: u64) -> Result<()> {
        let mut a = self.lock_admin();
        if self.state() != seen {
            return Ok(());
        }
        self.reset_locked(&mut a)
    }

    fn reset_locked(&self, a: &mut AdminQueue) -> Result<()> {
        let regs = self.backend.regs();
        let s = self.state();
        if regs.read64(regs::CAP) == u64::MAX {
            self.fail_locked(state::GONE);
            return Err(Error::DeviceGone);
        }
        log::warn!("{}: resetting the controller", self.backend.name());
        if let Err(e) = disable(regs, self.ready_timeout) {
            match e {
                Error::DeviceGone => self.fail_locked(state::GONE),
                _ => self
                    .state
                    .store(state::epoch(s) | state::FATAL, Ordering::Release),
            }
            return Err(e);
        }
        // Disabled: every queue and command on the device is gone. New
        // epoch; marked failed until bring-up below succeeds.
        let epoch = state::epoch(s) + state::EPOCH;
        self.state.store(epoch | state::FATAL, Ordering::Release);
        match self.reinit_locked(a) {
            Ok(()) => {
                self.state.store(epoch | state::OK, Ordering::Release);
                self.resets.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: reset complete", self.backend.name());
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::DeviceGone) {
                    self.state.store(epoch | state::GONE, Ordering::Release);
                }
                log::error!("{}: bring-up after reset failed: {e}", self.backend.name());
                Err(e)
            }
        }
    }

    /// Bring-up on the existing admin queue memory, after a disable.
    fn reinit_locked(&self, a: &mut AdminQueue) -> Result<()> {
        let regs = self.backend.regs();
        let t = self.opts.admin_timeout;
        a.sq.reset();
        a.cq.reset();
        a.next_cid = 0;
        a.aers = 0;
        a.aer_out = [0; 4];
        if let Some(sh) = &self.shadow {
            // Only the admin slots: I/O queue slots are zeroed by their
            // owners when they re-create their queues.
            let _ = sh.slots(0, self.cap.dstrd(), true);
        }
        regs.write32(regs::AQA, Aqa::new(a.entries, a.entries).0);
        regs.write64(regs::ASQ, a.sq.region().iova().raw());
        regs.write64(regs::ACQ, a.cq.region().iova().raw());
        let cc = io_config();
        regs.write32(regs::CC, cc.0);
        regs.write32(regs::CC, cc.enable().0);
        wait_csts(
            regs,
            self.ready_timeout,
            "become ready (CSTS.RDY=1)",
            true,
            |c| c.rdy(),
        )?;

        let page = identify_page(a, regs, Identify::controller(), "Identify Controller", t)?;
        let id = IdentifyController::parse(&page)?;
        if id.serial != self.identify.serial || id.model != self.identify.model {
            return Err(Error::DeviceChanged(format!(
                "controller {} {} answered instead of {} {}",
                id.model, id.serial, self.identify.model, self.identify.serial
            )));
        }
        for ns in &self.namespaces {
            let page = identify_page(a, regs, Identify::namespace(ns.id), "Identify Namespace", t)?;
            let n = IdentifyNamespace::parse(&page)?;
            if n.nsze != ns.nsze || n.lba_shift() != ns.lba_shift {
                return Err(Error::DeviceChanged(format!(
                    "namespace {} changed from {} blocks of {} B to {} blocks of {} B",
                    ns.id,
                    ns.nsze,
                    ns.lba_size,
                    n.nsze,
                    n.lba_size()
                )));
            }
        }
        let cqe = a.exec(
            regs,
            SetFeatures::number_of_queues(self.opts.io_queues, self.opts.io_queues).sqe(),
            "Set Features (Number of Queues)",
            t,
        )?;
        let granted = ((cqe.dw0 & 0xFFFF) + 1).min((cqe.dw0 >> 16) + 1);
        if granted < self.granted as u32 {
            return Err(Error::DeviceChanged(format!(
                "the controller now grants {granted} I/O queues instead of {}",
                self.granted
            )));
        }
        if let Some(sh) = &self.shadow {
            let sqe = DoorbellBufferConfig
                .sqe()
                .with_prp(sh.shadow.iova().raw(), sh.event_idx.iova().raw());
            a.exec(regs, sqe, "Doorbell Buffer Config", t)?;
        }
        for i in 0..a.aer_target {
            a.post_aer(AER_CID_BASE + i);
        }
        Ok(())
    }

    /// Create I/O CQ then SQ `qid` on rings at the given IOVAs; returns the
    /// state word they belong to (the queues die with its epoch).
    ///
    /// On failure, also says whether a queue may have been left on the
    /// controller (a Create that timed out without a reset may have taken
    /// effect; a Delete I/O CQ after a failed Create SQ may fail): then the
    /// rings must not be freed and the queue id not reused.
    pub(crate) fn create_io_queues(
        &self,
        qid: u16,
        entries: u16,
        cq_iova: u64,
        sq_iova: u64,
    ) -> std::result::Result<u64, (Error, bool)> {
        let mut a = self.lock_admin();
        let s = self.state();
        if let Some(e) = failure_error(s) {
            return Err((e, false));
        }
        // Nothing of this epoch's queues survives a disable (new epoch).
        let left_behind = |e: &Error| {
            state::epoch(self.state()) == state::epoch(s) && !matches!(e, Error::Command { .. })
        };
        // A (re-)created queue starts at index 0 in the shadow slots too.
        let _ = self.shadow_slots(qid);
        if let Err(e) = self.admin_locked(
            &mut a,
            CreateIoCq::new(qid, entries).sqe().with_prp(cq_iova, 0),
            "Create I/O Completion Queue",
        ) {
            let left = left_behind(&e);
            return Err((e, left));
        }
        if let Err(e) = self.admin_locked(
            &mut a,
            CreateIoSq::new(qid, entries, qid)
                .sqe()
                .with_prp(sq_iova, 0),
            "Create I/O Submission Queue",
        ) {
            if left_behind(&e) {
                // The SQ may exist (and then the CQ cannot be deleted).
                return Err((e, true));
            }
            let mut left = false;
            if self.state() == s {
                if let Err(d) =
                    self.admin_locked(&mut a, DeleteIoCq(qid).sqe(), "Delete I/O Completion Queue")
                {
                    left = state::epoch(self.state()) == state::epoch(s);
                    log::error!(
                        "queue {qid}: deleting the CQ after a failed Create I/O SQ failed: {d}"
                    );
                }
            }
            return Err((e, left));
        }
        Ok(s)
    }

    /// Execute an admin command that returns data to the host — Identify
    /// (4 KiB) or Get Log Page (NUMD dwords, up to [`MAX_ADMIN_READ`]
    /// bytes) — into memory of its own, and return the completion and the
    /// data. The data pointers (PRP1, PRP2 or a PRP list) are built here
    /// for exactly the length the command describes; the caller's data and
    /// metadata pointers, and its PSDT and fused bits, are ignored. Other
    /// opcodes fail with [`Error::AdminRead`] (their transfer length is not
    /// known here): use the `unsafe` [`Controller::admin`].
    pub fn admin_read(&self, sqe: Sqe, what: &'static str) -> Result<(Cqe, Vec<u8>)> {
        let opcode = sqe.opcode();
        let len: u64 = match opcode {
            admin_op::IDENTIFY => IDENTIFY_LEN as u64,
            admin_op::GET_LOG_PAGE => {
                let numd = u64::from(sqe.cdw11 & 0xFFFF) << 16 | u64::from(sqe.cdw10 >> 16);
                (numd + 1) * 4
            }
            _ => {
                return Err(Error::AdminRead {
                    opcode,
                    reason: "only Identify and Get Log Page are supported".into(),
                })
            }
        };
        if len > MAX_ADMIN_READ {
            return Err(Error::AdminRead {
                opcode,
                reason: format!(
                    "{len} bytes is more than the {MAX_ADMIN_READ} one PRP list describes"
                ),
            });
        }
        // Opcode only: no fused operation, PSDT = PRPs; the CID is set by
        // the queue.
        let mut sqe = sqe;
        sqe.cdw0 &= 0xFF;
        sqe.mptr = 0;
        let mut a = self.lock_admin();
        if len as usize <= IDENTIFY_LEN {
            let prp = a.data.iova().raw();
            a.data.fill(0);
            let cqe = self.admin_locked(&mut a, sqe.with_prp(prp, 0), what)?;
            let mut v = vec![0; len as usize];
            a.data.read_bytes(0, &mut v)?;
            return Ok((cqe, v));
        }
        // More than one page: a buffer of its own, described by PRP2 (two
        // pages) or a PRP list (up to 512 more pages).
        let page = PAGE_SIZE as usize;
        let mut buf = self.dma.alloc(len as usize, DmaDir::Bidirectional)?;
        buf.fill(0);
        let base = buf.iova().raw();
        let pages = (len as usize).div_ceil(page);
        let list = if pages > 2 {
            let mut l = self.dma.alloc(page, DmaDir::ToDevice)?;
            for i in 1..pages {
                l.write_obj::<u64>((i - 1) * 8, base + (i * page) as u64)?;
            }
            Some(l)
        } else {
            None
        };
        let prp2 = match &list {
            Some(l) => l.iova().raw(),
            None => base + page as u64,
        };
        match self.admin_locked(&mut a, sqe.with_prp(base, prp2), what) {
            Ok(cqe) => {
                let mut v = vec![0; len as usize];
                buf.read_bytes(0, &mut v)?;
                Ok((cqe, v))
            }
            // Completed with an error status: the device is done with both.
            Err(e @ Error::Command { .. }) => Err(e),
            Err(e) => {
                // Timed out or failed: the device may still write the
                // buffer (and read the list). Never hand them back.
                std::mem::forget(buf);
                std::mem::forget(list);
                Err(e)
            }
        }
    }

    /// Asynchronous events received so far (collected while admin commands
    /// run, and by checking the admin completion queue now). Each event is
    /// returned once. Read the event's log page to unmask its type.
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        let mut a = self.lock_admin();
        if failure_error(self.state()).is_none() {
            a.drain();
        }
        a.events.drain(..).collect()
    }

    /// Asynchronous Event Requests currently posted to the controller.
    pub fn async_event_requests_posted(&self) -> usize {
        self.admin.lock().unwrap_or_else(|p| p.into_inner()).aers as usize
    }

    /// Create an I/O queue pair for [`DmaBuf`] buffers. `opts.mapping`
    /// must be [`MappingMode::Premapped`](crate::MappingMode::Premapped):
    /// strict and lazy modes take application buffers, through
    /// [`Controller::create_mapped_qpair`].
    pub fn create_qpair(self: &Arc<Self>, opts: QpairOptions) -> Result<QueuePair<DmaBuf>> {
        Self::premapped_only(&opts)?;
        QueuePair::create(self, &opts)
    }

    /// Create an I/O queue pair moving buffers of type `B` (e.g.
    /// `Vec<DmaBuf>` for vectored I/O, or a mapping layer's buffer type).
    /// `opts.mapping` must be premapped, as for [`Controller::create_qpair`].
    pub fn create_qpair_for<B: IoBuf>(
        self: &Arc<Self>,
        opts: QpairOptions,
    ) -> Result<QueuePair<B>> {
        Self::premapped_only(&opts)?;
        QueuePair::create(self, &opts)
    }

    /// Create a queue pair for application buffers
    /// ([`AppBuffer`](mcqio_vfio::AppBuffer)) mapped per I/O in the strict
    /// or lazy mode `opts.mapping` names; see [`crate::core::mapped`].
    pub fn create_mapped_qpair(
        self: &Arc<Self>,
        opts: QpairOptions,
    ) -> Result<crate::MappedQueuePair> {
        crate::MappedQueuePair::create(self, &opts)
    }

    fn premapped_only(opts: &QpairOptions) -> Result<()> {
        match opts.mapping {
            crate::MappingMode::Premapped => Ok(()),
            ref m => Err(Error::InvalidOption(format!(
                "mapping {m:?} maps application buffers per I/O: create the queue pair with Controller::create_mapped_qpair"
            ))),
        }
    }

    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or(Error::NoFreeQueue {
                granted: self.granted as usize,
            })
    }

    pub(crate) fn release_qid(&self, qid: u16) {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qid);
    }

    /// Bytes of DMA memory (queue rings, PRP list pages, buffers of commands
    /// in flight) that queue pairs leaked instead of freeing, because the
    /// controller might still access it: deleting the queues failed, or a
    /// fatal controller could not be disabled. Never unmapped, so the device
    /// cannot write into memory reused for something else. Normally 0.
    pub fn leaked_queue_bytes(&self) -> u64 {
        self.leaked_queue_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn note_leak(&self, bytes: u64) {
        self.leaked_queue_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn delete_sq(&self, qid: u16) -> Result<()> {
        self.admin_cmd(DeleteIoSq(qid).sqe(), "Delete I/O Submission Queue")
            .map(drop)
    }

    pub(crate) fn delete_cq(&self, qid: u16) -> Result<()> {
        self.admin_cmd(DeleteIoCq(qid).sqe(), "Delete I/O Completion Queue")
            .map(drop)
    }

    /// Shadow doorbell slots for queue `qid` (SQ tail, CQ head), zeroed.
    pub(crate) fn shadow_slots(&self, qid: u16) -> (Option<Shadow>, Option<Shadow>) {
        match &self.shadow {
            Some(s) => s.slots(qid, self.cap.dstrd(), true),
            None => (None, None),
        }
    }

    /// The doorbell hook of the backend, if any.
    pub fn doorbell_hook(&self) -> Option<Arc<dyn DoorbellHook>> {
        self.backend.doorbell_hook()
    }
}

/// Whether both doorbells of queue `qid` lie inside a BAR of `bar_len` bytes.
fn doorbells_fit(qid: u16, dstrd: u8, bar_len: usize) -> bool {
    regs::cq_head_doorbell(qid, dstrd)
        .checked_add(4)
        .is_some_and(|end| end <= bar_len)
}

/// What [`bring_up`] learned.
struct BringUp {
    identify: IdentifyController,
    namespaces: Vec<Namespace>,
    granted: u16,
    max_transfer: u64,
}

/// Steps 3 to 7 of bring-up (see the module docs), on admin queues whose
/// registers are programmed. Shadow doorbell pages handed to the controller
/// are stored in `shadow` before the command that hands them over, so that
/// the caller can leak them if this fails and the controller cannot be
/// disabled.
/// `cap` is the value read (and checked) once at the start: a device that
/// reports another one later is not listened to.
fn bring_up(
    backend: &dyn Backend,
    opts: &ControllerOptions,
    cap: Cap,
    ready_timeout: Duration,
    admin: &mut AdminQueue,
    shadow: &mut Option<ShadowPages>,
) -> Result<BringUp> {
    let regs = backend.regs();
    let dstrd = cap.dstrd();
    let entries = admin.entries;
    regs.write32(regs::AQA, Aqa::new(entries, entries).0);
    regs.write64(regs::ASQ, admin.sq.region().iova().raw());
    regs.write64(regs::ACQ, admin.cq.region().iova().raw());

    // 3. Enable.
    let cc = io_config();
    regs.write32(regs::CC, cc.0);
    regs.write32(regs::CC, cc.enable().0);
    wait_csts(
        regs,
        ready_timeout,
        "become ready (CSTS.RDY=1)",
        true,
        |c| c.rdy(),
    )?;

    let t = opts.admin_timeout;
    // 4. Identify.
    let page = identify_page(
        admin,
        regs,
        Identify::controller(),
        "Identify Controller",
        t,
    )?;
    let identify = IdentifyController::parse(&page)?;
    let mdts = identify.max_transfer_bytes(12).unwrap_or(u64::MAX);
    let max_transfer = mdts.min(opts.max_transfer).max(PAGE_SIZE);
    let nsids = active_namespaces(admin, regs, &identify, t)?;
    let mut namespaces = Vec::with_capacity(nsids.len());
    for id in nsids {
        let page = identify_page(
            admin,
            regs,
            Identify::namespace(id),
            "Identify Namespace",
            t,
        )?;
        let ns = IdentifyNamespace::parse(&page)?;
        if ns.nsze == 0 {
            continue;
        }
        let ns = Namespace::new(id, ns, max_transfer)?;
        // A block must fit in one command, or no I/O to it can be built.
        // Below the caller's own cap that is the caller's mistake; above
        // what the controller allows (MDTS) it is this namespace's alone:
        // the controller and its other namespaces stay usable.
        if !ns.usable {
            let detail = format!(
                "namespace {id} has {} B blocks but one command moves at most {max_transfer} B",
                ns.lba_size
            );
            if ns.lba_size <= mdts {
                return Err(Error::InvalidOption(format!("max_transfer: {detail}")));
            }
            log::warn!("{detail} (LBADS above MDTS): reads and writes to it are refused");
        }
        namespaces.push(ns);
    }

    // 5. Number of queues. A grant above the request is capped to it, and
    // the grant to the queues whose doorbells fit in BAR0.
    let cqe = admin.exec(
        regs,
        SetFeatures::number_of_queues(opts.io_queues, opts.io_queues).sqe(),
        "Set Features (Number of Queues)",
        t,
    )?;
    let nsqa = (cqe.dw0 & 0xFFFF) + 1;
    let ncqa = (cqe.dw0 >> 16) + 1;
    let mut granted = nsqa.min(ncqa).min(opts.io_queues as u32).min(65534) as u16;
    let bar_len = regs.len();
    if !doorbells_fit(granted, dstrd, bar_len) {
        let fit = (1..granted)
            .rev()
            .find(|&q| doorbells_fit(q, dstrd, bar_len))
            .unwrap_or(0);
        if fit == 0 {
            return Err(Error::BadDevice {
                what: "doorbell stride (CAP.DSTRD)",
                detail: format!(
                    "with DSTRD {dstrd} not even I/O queue 1's doorbells fit in the {bar_len:#x}-byte BAR0"
                ),
            });
        }
        log::warn!(
            "{}: only {fit} of the {granted} granted I/O queues have doorbells inside BAR0; using {fit}",
            backend.name()
        );
        granted = fit;
    }

    // 6. Shadow doorbells.
    if opts.shadow_doorbells && identify.supports_doorbell_buffer() {
        let dma = backend.dma();
        let mut s = dma.alloc(PAGE_SIZE as usize, DmaDir::Bidirectional)?;
        let mut e = dma.alloc(PAGE_SIZE as usize, DmaDir::Bidirectional)?;
        s.fill(0);
        e.fill(0);
        let sqe = DoorbellBufferConfig
            .sqe()
            .with_prp(s.iova().raw(), e.iova().raw());
        let pages = shadow.insert(ShadowPages {
            shadow: s,
            event_idx: e,
        });
        match admin.exec(regs, sqe, "Doorbell Buffer Config", t) {
            Ok(_) => {
                // Newer QEMU applies the shadow doorbells to the admin
                // queue too (and reads the shadow tail instead of the MMIO
                // value), so the admin doorbells update their slots as
                // well; they still always write MMIO (`always_mmio`), so a
                // controller that ignores the admin slots works too.
                let (sq, cq) = pages.slots(0, dstrd, false);
                admin.sq.db.set_shadow(sq);
                admin.cq.db.set_shadow(cq);
            }
            Err(Error::Command { status, .. }) => {
                // Refused: the controller does not use the pages.
                *shadow = None;
                log::warn!("Doorbell Buffer Config failed ({status}); using MMIO doorbells only")
            }
            Err(e) => return Err(e),
        }
    }

    // 7. Asynchronous events: keep a few requests posted (never more
    // than AERL + 1, and leave admin SQ room for the command being run).
    let aers = (opts.async_event_requests as u16)
        .min(identify.aerl as u16 + 1)
        .min(entries.saturating_sub(2))
        .min(0xFF);
    admin.aer_target = aers;
    for i in 0..aers {
        admin.post_aer(AER_CID_BASE + i);
    }
    Ok(BringUp {
        identify,
        namespaces,
        granted,
        max_transfer,
    })
}

fn identify_page(
    admin: &mut AdminQueue,
    regs: &dyn Mmio,
    cmd: Identify,
    what: &'static str,
    t: Duration,
) -> Result<Vec<u8>> {
    admin.data.fill(0);
    let prp = admin.data.iova().raw();
    admin.exec(regs, cmd.sqe().with_prp(prp, 0), what, t)?;
    let mut v = vec![0; IDENTIFY_LEN];
    admin.data.read_bytes(0, &mut v)?;
    Ok(v)
}

/// Most active namespaces mcqio takes from one controller. Each costs an
/// Identify at bring-up (and after every reset), so a device that reports
/// an endless list is refused instead of keeping bring-up busy.
pub const MAX_NAMESPACES: usize = 1 << 14;

/// Most bytes [`Controller::admin_read`] transfers: PRP1's page plus one
/// PRP list page of 512 entries.
pub const MAX_ADMIN_READ: u64 = PAGE_SIZE * 513;

/// Active NSIDs via CNS 02h (paged by 1024), falling back to 1..=NN for
/// controllers older than NVMe 1.1 that reject that CNS. The result is
/// strictly increasing (sorted, no duplicates, no 0, no broadcast id), at
/// most [`MAX_NAMESPACES`] long, and may be sparse (any id up to
/// 0xFFFF_FFFE).
fn active_namespaces(
    admin: &mut AdminQueue,
    regs: &dyn Mmio,
    id: &IdentifyController,
    t: Duration,
) -> Result<Vec<u32>> {
    let too_many = || Error::BadDevice {
        what: "active namespace list",
        detail: format!("more than {MAX_NAMESPACES} active namespaces"),
    };
    let mut out = Vec::new();
    let mut after = 0u32;
    loop {
        let page = match identify_page(
            admin,
            regs,
            Identify::active_namespaces(after),
            "Identify Active Namespace List",
            t,
        ) {
            Ok(p) => p,
            Err(Error::Command { status, .. })
                if status == NvmeStatus::new(sct::GENERIC, generic::INVALID_FIELD)
                    && out.is_empty() =>
            {
                if id.nn as usize > MAX_NAMESPACES {
                    return Err(too_many());
                }
                return Ok((1..=id.nn).collect());
            }
            Err(e) => return Err(e),
        };
        let ids: Vec<u32> = page
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|&n| n != 0)
            .collect();
        let full = ids.len() == IDENTIFY_LEN / 4;
        let last = ids.last().copied();
        // The list must be increasing and above `after`; whatever a device
        // returns beyond that is dropped here and sorted out below.
        out.extend(ids.into_iter().filter(|&n| n > after && n < 0xFFFF_FFFF));
        if out.len() > MAX_NAMESPACES {
            return Err(too_many());
        }
        match last {
            Some(l) if full && l > after && l < 0xFFFF_FFFE => after = l,
            _ => break,
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Drop for Controller {
    /// Normal shutdown (CC.SHN, bounded by
    /// [`ControllerOptions::shutdown_timeout`]), then disable (CC.EN = 0,
    /// CSTS.RDY = 0, bounded by CAP.TO): only a disabled controller has
    /// dropped its Asynchronous Event Requests and stopped using the admin
    /// rings and shadow doorbell pages, so only then are they freed. A
    /// controller that cannot be disabled keeps them (leaked).
    fn drop(&mut self) {
        let regs = self.backend.regs();
        let cc = Cc(regs.read32(regs::CC));
        let csts = Csts(regs.read32(regs::CSTS));
        let gone = cc.0 == u32::MAX || csts.is_all_ones();
        if !gone && cc.enabled() && csts.rdy() && !csts.cfs() {
            regs.write32(regs::CC, cc.shn(Cc::SHN_NORMAL).0);
            let r = wait_csts(
                regs,
                self.opts.shutdown_timeout,
                "complete shutdown (CSTS.SHST)",
                false,
                |c| c.shst() == Csts::SHST_COMPLETE,
            );
            if let Err(e) = r {
                log::warn!("{}: shutdown: {e}", self.backend.name());
            }
        } else if csts.cfs() && !gone {
            // A fatal controller does not process shutdown; don't wait for it.
            log::warn!(
                "{}: controller fatal at drop; skipping shutdown",
                self.backend.name()
            );
        }
        let r = if gone {
            Err(Error::DeviceGone)
        } else {
            disable(regs, self.ready_timeout)
        };
        if quiesced(&r) {
            // SAFETY: `admin` is not used after this point (this is `drop`),
            // and it is dropped exactly once.
            unsafe { ManuallyDrop::drop(&mut self.admin) };
        } else {
            log::error!(
                "{}: the controller could not be disabled at drop ({}); leaking its admin queue and shadow doorbell memory",
                self.backend.name(),
                r.err().map_or_else(String::new, |e| e.to_string())
            );
            std::mem::forget(self.shadow.take());
        }
    }
}

/// The controller configuration written before CC.EN, at bring-up and after
/// every reset alike: NVM command set, 4 KiB pages (MPS 0), round-robin
/// arbitration, 64-byte SQEs and 16-byte CQEs.
fn io_config() -> Cc {
    Cc::new()
        .css(Cc::CSS_NVM)
        .mps(0)
        .ams(Cc::AMS_ROUND_ROBIN)
        .iosqes(6)
        .iocqes(4)
}
