//! Controller bring-up, the admin queue, and shutdown.
//!
//! [`Controller::new`] runs the NVMe initialisation sequence synchronously:
//!
//! 1. read CAP; if CC.EN is set, clear it and wait for CSTS.RDY = 0 (bounded by CAP.TO);
//! 2. allocate the admin queues, program AQA/ASQ/ACQ;
//! 3. enable with CSS = NVM, MPS = 4 KiB, IOSQES = 64 B, IOCQES = 16 B; wait
//!    for CSTS.RDY = 1 (bounded by CAP.TO); CSTS.CFS fails with [`Error::ControllerFatal`];
//! 4. Identify Controller, the active namespace list, Identify each namespace;
//! 5. Set Features (Number of Queues) — the grant bounds [`Controller::create_qpair`];
//! 6. Doorbell Buffer Config (shadow doorbells) when OACS bit 8 is set and
//!    [`ControllerOptions::shadow_doorbells`] allows it.
//!
//! Admin commands are serialised by a mutex: they are rare and never on the
//! I/O path. Dropping the last `Arc<Controller>` (every [`QueuePair`] holds
//! one, so they are gone by then) performs a normal shutdown: CC.SHN =
//! normal, then wait for CSTS.SHST = complete, bounded.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcqio_vfio::{Backend, DmaDir, DmaRegion, DmaSpace, DoorbellHook, Mmio};

use crate::io::IoBuf;
use crate::queue::cq::CompQueue;
use crate::queue::doorbell::{Doorbell, Shadow};
use crate::queue::sq::SubQueue;
use crate::queue::{QpairOptions, QueuePair, PAGE_SIZE};
use crate::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::spec::regs::{self, Aqa, Cap, Cc, Csts, Version};
use crate::spec::sqe::{
    AsyncEventRequest, Command, DeleteIoCq, DeleteIoSq, DoorbellBufferConfig, Identify, SetFeatures,
};
use crate::spec::status::{generic, sct};
use crate::spec::{Cqe, NvmeStatus, Sqe};
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
    /// Bound on the shutdown handshake at drop.
    pub shutdown_timeout: Duration,
    /// Asynchronous Event Requests to keep posted (capped by the
    /// controller's AERL). Events are collected while admin commands run and
    /// by [`Controller::async_events`]. 0 disables them.
    pub async_event_requests: u8,
    /// Cap on bytes per I/O command. The effective limit is the smaller of
    /// this and the controller's MDTS; it sizes the pre-allocated PRP list
    /// pages (one 4 KiB page covers up to 2 MiB).
    pub max_transfer: u64,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: true,
            admin_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(10),
            max_transfer: 2 << 20,
            async_event_requests: 1,
        }
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
}

impl Namespace {
    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nsze << self.lba_shift
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
}

/// CIDs from here up belong to Asynchronous Event Requests (one per
/// outstanding AER), so their completions — which arrive at any time — are
/// never mistaken for the command being waited on.
const AER_CID_BASE: u16 = 0xFF00;

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
    /// too small for that queue. `zero` resets the shadow values (a new
    /// queue starts at 0; the admin queue keeps what the controller copied in).
    fn slots(&self, qid: u16, dstrd: u8, zero: bool) -> (Option<Shadow>, Option<Shadow>) {
        let stride = regs::doorbell_stride(dstrd);
        let sq_off = 2 * qid as usize * stride;
        let cq_off = (2 * qid as usize + 1) * stride;
        if cq_off + 4 > self.shadow.len() || cq_off + 4 > self.event_idx.len() {
            return (None, None);
        }
        if zero {
            let _ = self.shadow.write_obj::<u32>(sq_off, 0);
            let _ = self.shadow.write_obj::<u32>(cq_off, 0);
        }
        // SAFETY: offsets checked against both pages' lengths above; the
        // pages live as long as the controller, which every queue (and the
        // admin queue, which the controller owns) keeps alive.
        let at = |r: &DmaRegion, off: usize| unsafe { r.as_ptr().add(off).cast::<u32>() };
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
    admin: Mutex<AdminQueue>,
    shadow: Option<ShadowPages>,
    max_transfer: u64,
    opts: ControllerOptions,
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
        let mut spins = 0u32;
        loop {
            if let Some(cqe) = self.cq.peek() {
                self.cq.advance();
                self.cq.flush();
                if cqe.cid >= AER_CID_BASE {
                    self.on_aer(cqe);
                    continue;
                }
                if cqe.cid != cid {
                    log::warn!("admin queue: dropped stale completion cid {:#06x} (waiting for {cid:#06x})", cqe.cid);
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
                    return Err(Error::Timeout {
                        what,
                        timeout_ms: timeout.as_millis() as u64,
                    });
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
        self.aers += 1;
        self.sq.push(AsyncEventRequest.sqe().with_cid(cid));
        self.sq.flush();
    }

    /// An AER completed: keep the event and re-arm, or (error status, e.g.
    /// aborted at shutdown) let it go.
    fn on_aer(&mut self, cqe: Cqe) {
        self.aers = self.aers.saturating_sub(1);
        let st = cqe.nvme_status();
        if st.is_success() {
            let ev = AsyncEvent::from_dw0(cqe.dw0);
            log::info!("asynchronous event: {ev:?}");
            self.events.push_back(ev);
            self.post_aer(cqe.cid);
        } else {
            log::warn!("Asynchronous Event Request ended with {st}; not re-posted");
        }
    }

    /// Consume whatever the admin CQ holds (AER completions; anything else
    /// is stale here since no command is being waited on).
    fn drain(&mut self) {
        while let Some(cqe) = self.cq.peek() {
            self.cq.advance();
            if cqe.cid >= AER_CID_BASE {
                self.on_aer(cqe);
            } else {
                log::warn!("admin queue: dropped stale completion cid {:#06x}", cqe.cid);
            }
        }
        self.cq.flush();
    }
}

impl Controller {
    /// Bring up the controller behind `backend` (see the module docs for
    /// the sequence).
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

        // 1. Disable.
        let cc = Cc(regs.read32(regs::CC));
        if cc.enabled() {
            regs.write32(regs::CC, cc.disable().0);
        }
        wait_csts(
            regs,
            ready_timeout,
            "become disabled (CSTS.RDY=0)",
            false,
            |c| !c.rdy(),
        )?;

        // 2. Admin queues.
        let dma = Arc::clone(backend.dma());
        let entries = opts
            .admin_queue_entries
            .min(cap.max_queue_entries().min(4096) as u16);
        let asq = dma.alloc(entries as usize * size_of::<Sqe>(), DmaDir::ToDevice)?;
        let acq = dma.alloc(entries as usize * size_of::<Cqe>(), DmaDir::Bidirectional)?;
        let data = dma.alloc(IDENTIFY_LEN, DmaDir::Bidirectional)?;
        let bar = BarPtr(regs.base());
        let dstrd = cap.dstrd();
        let hook = backend.doorbell_hook();
        regs.write32(regs::AQA, Aqa::new(entries, entries).0);
        regs.write64(regs::ASQ, asq.iova().raw());
        regs.write64(regs::ACQ, acq.iova().raw());
        // SAFETY: admin doorbells (qid 0) are inside BAR0, which the backend
        // maps for as long as the controller (which owns the queues) lives.
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
        };

        // 3. Enable.
        let cc = Cc::new()
            .css(Cc::CSS_NVM)
            .mps(0)
            .ams(Cc::AMS_ROUND_ROBIN)
            .iosqes(6)
            .iocqes(4);
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
            &mut admin,
            regs,
            Identify::controller(),
            "Identify Controller",
            t,
        )?;
        let identify = IdentifyController::parse(&page)?;
        let nsids = active_namespaces(&mut admin, regs, &identify, t)?;
        let mut namespaces = Vec::with_capacity(nsids.len());
        for id in nsids {
            let page = identify_page(
                &mut admin,
                regs,
                Identify::namespace(id),
                "Identify Namespace",
                t,
            )?;
            let ns = IdentifyNamespace::parse(&page)?;
            if ns.nsze == 0 {
                continue;
            }
            namespaces.push(Namespace {
                id,
                nsze: ns.nsze,
                lba_size: ns.lba_size(),
                lba_shift: ns.lba_shift(),
                identify: ns,
            });
        }

        // 5. Number of queues.
        let cqe = admin.exec(
            regs,
            SetFeatures::number_of_queues(opts.io_queues, opts.io_queues).sqe(),
            "Set Features (Number of Queues)",
            t,
        )?;
        let nsqa = (cqe.dw0 & 0xFFFF) as u32 + 1;
        let ncqa = (cqe.dw0 >> 16) as u32 + 1;
        let granted = nsqa.min(ncqa).min(opts.io_queues as u32).min(65534) as u16;

        // 6. Shadow doorbells.
        let mut shadow = None;
        if opts.shadow_doorbells && identify.supports_doorbell_buffer() {
            let s = dma.alloc(PAGE_SIZE as usize, DmaDir::Bidirectional)?;
            let e = dma.alloc(PAGE_SIZE as usize, DmaDir::Bidirectional)?;
            s.fill(0);
            e.fill(0);
            let sqe = DoorbellBufferConfig
                .sqe()
                .with_prp(s.iova().raw(), e.iova().raw());
            match admin.exec(regs, sqe, "Doorbell Buffer Config", t) {
                Ok(_) => {
                    let pages = ShadowPages {
                        shadow: s,
                        event_idx: e,
                    };
                    // Newer QEMU applies the shadow doorbells to the admin
                    // queue too (and reads the shadow tail instead of the MMIO
                    // value), so the admin doorbells update their slots as
                    // well; they still always write MMIO (`always_mmio`), so a
                    // controller that ignores the admin slots works too.
                    let (sq, cq) = pages.slots(0, dstrd, false);
                    admin.sq.db.set_shadow(sq);
                    admin.cq.db.set_shadow(cq);
                    shadow = Some(pages);
                }
                Err(Error::Command { status, .. }) => {
                    log::warn!(
                        "Doorbell Buffer Config failed ({status}); using MMIO doorbells only"
                    )
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
        for i in 0..aers {
            admin.post_aer(AER_CID_BASE + i);
        }

        let mdts = identify.max_transfer_bytes(12).unwrap_or(u64::MAX);
        let max_transfer = mdts.min(opts.max_transfer).max(PAGE_SIZE);
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
            admin: Mutex::new(admin),
            shadow,
            max_transfer,
            opts,
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

    /// Namespace `id`, if active.
    pub fn namespace(&self, id: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.id == id)
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

    /// Read CSTS: `Err` if the controller is fatal or gone.
    pub fn health(&self) -> Result<()> {
        let c = read_csts(self.backend.regs())?;
        if c.cfs() {
            return Err(Error::ControllerFatal);
        }
        Ok(())
    }

    /// Execute one admin command (no data, or data pointers already set)
    /// and wait for it. `what` names it in errors.
    pub fn admin(&self, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        let mut a = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        a.exec(self.backend.regs(), sqe, what, self.opts.admin_timeout)
    }

    /// Execute an admin command that returns up to 4 KiB of data (Identify,
    /// Get Log Page): PRP1 is set to an internal page, the data is copied out.
    pub fn admin_read(&self, sqe: Sqe, what: &'static str) -> Result<(Cqe, Vec<u8>)> {
        let mut a = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let prp = a.data.iova().raw();
        let cqe = a.exec(
            self.backend.regs(),
            sqe.with_prp(prp, 0),
            what,
            self.opts.admin_timeout,
        )?;
        let mut v = vec![0; IDENTIFY_LEN];
        a.data.read_bytes(0, &mut v)?;
        Ok((cqe, v))
    }

    /// Asynchronous events received so far (collected while admin commands
    /// run, and by checking the admin completion queue now). Each event is
    /// returned once. Read the event's log page to unmask its type.
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        let mut a = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        a.drain();
        a.events.drain(..).collect()
    }

    /// Asynchronous Event Requests currently posted to the controller.
    pub fn async_event_requests_posted(&self) -> usize {
        self.admin.lock().unwrap_or_else(|p| p.into_inner()).aers as usize
    }

    /// Create an I/O queue pair for [`DmaBuf`] buffers.
    pub fn create_qpair(self: &Arc<Self>, opts: QpairOptions) -> Result<QueuePair<DmaBuf>> {
        QueuePair::create(self, &opts)
    }

    /// Create an I/O queue pair moving buffers of type `B` (e.g.
    /// `Vec<DmaBuf>` for vectored I/O, or a mapping layer's buffer type).
    pub fn create_qpair_for<B: IoBuf>(
        self: &Arc<Self>,
        opts: QpairOptions,
    ) -> Result<QueuePair<B>> {
        QueuePair::create(self, &opts)
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

    pub(crate) fn delete_sq(&self, qid: u16) -> Result<()> {
        self.admin(DeleteIoSq(qid).sqe(), "Delete I/O Submission Queue")
            .map(drop)
    }

    pub(crate) fn delete_cq(&self, qid: u16) -> Result<()> {
        self.admin(DeleteIoCq(qid).sqe(), "Delete I/O Completion Queue")
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

/// Active NSIDs via CNS 02h (paged by 1024), falling back to 1..=NN for
/// controllers older than NVMe 1.1 that reject that CNS.
fn active_namespaces(
    admin: &mut AdminQueue,
    regs: &dyn Mmio,
    id: &IdentifyController,
    t: Duration,
) -> Result<Vec<u32>> {
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
                return Ok((1..=id.nn.min(1024)).collect());
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
        // Guard against a controller returning non-increasing lists.
        out.extend(ids.into_iter().filter(|&n| n > after && n != 0xFFFF_FFFF));
        match last {
            Some(l) if full && l > after && l < 0xFFFF_FFFE => after = l,
            _ => break,
        }
    }
    Ok(out)
}

impl Drop for Controller {
    fn drop(&mut self) {
        let regs = self.backend.regs();
        let cc = Cc(regs.read32(regs::CC));
        let csts = Csts(regs.read32(regs::CSTS));
        if cc.0 == u32::MAX || csts.is_all_ones() || !cc.enabled() {
            return;
        }
        if csts.cfs() {
            // A fatal controller does not process shutdown; don't wait for it.
            log::warn!(
                "{}: controller fatal at drop; skipping shutdown",
                self.backend.name()
            );
            return;
        }
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
    }
}
