//! Bring-up, reset and shutdown of an NVMe controller over PCIe: the
//! sequence of [`Controller::new`] (see [`crate::nvme::pcie::controller`]), the disable
//! and re-initialisation of [`Controller::reset`], and the CC.SHN shutdown
//! at drop.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcqio_vfio::{Backend, DmaDir};

use super::{state, Controller, ControllerOptions, PcieLink};
use crate::core::error::{Error, Result};
use crate::core::state::StateWord;
use crate::nvme::host::identify::{check_same, identify, number_of_queues, Identified};
use crate::nvme::host::qids::QidPool;
use crate::nvme::host::regs::{disable, enable, quiesced, shutdown, READY_BEFORE_DISABLE};
use crate::nvme::host::NvmeController;
use crate::nvme::pcie::admin::{AdminQueue, AER_CID_BASE};
use crate::nvme::pcie::bar::{doorbells_fit, Bar, BarPtr};
use crate::nvme::pcie::queue::cq::CompQueue;
use crate::nvme::pcie::queue::doorbell::Doorbell;
use crate::nvme::pcie::queue::sq::SubQueue;
use crate::nvme::pcie::queue::PAGE_SIZE;
use crate::nvme::pcie::shadow::ShadowPages;
use crate::nvme::spec::identify::IDENTIFY_LEN;
use crate::nvme::spec::regs::{self, Aqa, Cap, Version};
use crate::nvme::spec::sqe::{Command, DoorbellBufferConfig};
use crate::nvme::spec::{Cqe, Sqe};

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
        match disable(&mut Bar(regs), ready_timeout) {
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
                let r = disable(&mut Bar(regs), ready_timeout);
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
            found:
                Identified {
                    identify,
                    namespaces,
                    max_transfer,
                    ..
                },
            granted,
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
        let link = PcieLink {
            backend,
            bar,
            admin: ManuallyDrop::new(Mutex::new(admin)),
            shadow,
            ready_timeout,
            shutdown_timeout: opts.shutdown_timeout,
            irqs: Mutex::new(None),
        };
        Ok(Arc::new(NvmeController {
            link,
            opts,
            dma,
            cap,
            version,
            identify,
            namespaces,
            qids: QidPool::new(granted),
            max_transfer,
            state: StateWord::default(),
            resets: AtomicU64::new(0),
            leaked_bytes: AtomicU64::new(0),
        }))
    }

    pub(in crate::nvme) fn reset_locked(&self, a: &mut AdminQueue) -> Result<()> {
        let regs = self.link.backend.regs();
        let name = self.link.backend.name();
        let s = self.state();
        if regs.read64(regs::CAP) == u64::MAX {
            self.fail_locked(state::GONE);
            return Err(Error::DeviceGone);
        }
        log::warn!("{name}: resetting the controller");
        if let Err(e) = disable(&mut Bar(regs), self.link.ready_timeout) {
            match e {
                Error::DeviceGone => self.fail_locked(state::GONE),
                _ => self.state.store(state::kept(s, state::FATAL)),
            }
            return Err(e);
        }
        // Disabled: every queue and command on the device is gone. New
        // epoch; marked failed until bring-up below succeeds.
        self.state.store(state::next(s, state::FATAL));
        match self.reinit_locked(a) {
            Ok(()) => {
                self.state.store(state::next(s, state::OK));
                self.resets.fetch_add(1, Ordering::Relaxed);
                log::warn!("{name}: reset complete");
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::DeviceGone) {
                    self.state.store(state::next(s, state::GONE));
                }
                log::error!("{name}: bring-up after reset failed: {e}");
                Err(e)
            }
        }
    }

    /// Bring-up on the existing admin queue memory, after a disable: the
    /// same controller, namespaces and grant must answer.
    fn reinit_locked(&self, a: &mut AdminQueue) -> Result<()> {
        let regs = self.link.backend.regs();
        let t = self.opts.admin_timeout;
        a.sq.reset();
        a.cq.reset();
        a.next_cid = 0;
        a.aers = 0;
        a.aer_out = [0; 4];
        if let Some(sh) = &self.link.shadow {
            // Only the admin slots: I/O queue slots are zeroed by their
            // owners when they re-create their queues.
            let _ = sh.slots(0, self.cap.dstrd(), true);
        }
        program_admin_queues(regs, a);
        enable(&mut Bar(regs), self.link.ready_timeout)?;
        let mut x = a.exchange_on(regs, t);
        let found = identify(&mut x, self.opts.max_transfer)?;
        let granted = number_of_queues(&mut x, self.opts.io_queues)?;
        check_same(
            (&self.identify, &self.namespaces, self.qids.granted()),
            (&found, granted),
        )?;
        if let Some(sh) = &self.link.shadow {
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
}

/// Point the controller at the admin rings (AQA, ASQ, ACQ), before CC.EN.
fn program_admin_queues(regs: &dyn mcqio_vfio::Mmio, a: &AdminQueue) {
    regs.write32(regs::AQA, Aqa::new(a.entries, a.entries).0);
    regs.write64(regs::ASQ, a.sq.region().iova().raw());
    regs.write64(regs::ACQ, a.cq.region().iova().raw());
}

/// What [`bring_up`] learned.
pub(in crate::nvme) struct BringUp {
    found: Identified,
    granted: u16,
}

/// Steps 2 to 7 of bring-up (see the module docs), on admin queues not yet
/// given to the controller. Shadow doorbell pages handed to the controller
/// are stored in `shadow` before the command that hands them over, so that
/// the caller can leak them if this fails and the controller cannot be
/// disabled.
/// `cap` is the value read (and checked) once at the start: a device that
/// reports another one later is not listened to.
pub(in crate::nvme) fn bring_up(
    backend: &dyn Backend,
    opts: &ControllerOptions,
    cap: Cap,
    ready_timeout: Duration,
    admin: &mut AdminQueue,
    shadow: &mut Option<ShadowPages>,
) -> Result<BringUp> {
    let regs = backend.regs();
    let dstrd = cap.dstrd();
    program_admin_queues(regs, admin);

    // 3. Enable.
    enable(&mut Bar(regs), ready_timeout)?;

    // 4. Identify; 5. Number of queues. The grant is capped to the queues
    // whose doorbells fit in BAR0.
    let t = opts.admin_timeout;
    let mut x = admin.exchange_on(regs, t);
    let found = identify(&mut x, opts.max_transfer)?;
    let mut granted = number_of_queues(&mut x, opts.io_queues)?;
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
    if opts.shadow_doorbells && found.identify.supports_doorbell_buffer() {
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
        .min(found.identify.aerl as u16 + 1)
        .min(admin.entries.saturating_sub(2))
        .min(0xFF);
    admin.aer_target = aers;
    for i in 0..aers {
        admin.post_aer(AER_CID_BASE + i);
    }
    Ok(BringUp { found, granted })
}

impl Drop for PcieLink {
    /// Normal shutdown (CC.SHN, bounded by
    /// [`ControllerOptions::shutdown_timeout`]), then disable (CC.EN = 0,
    /// CSTS.RDY = 0, bounded by CAP.TO): only a disabled controller has
    /// dropped its Asynchronous Event Requests and stopped using the admin
    /// rings and shadow doorbell pages, so only then are they freed. A
    /// controller that cannot be disabled keeps them (leaked).
    fn drop(&mut self) {
        let name = self.backend.name();
        let mut bar = Bar(self.backend.regs());
        match shutdown(&mut bar, self.shutdown_timeout) {
            Ok(true) | Err(Error::DeviceGone) => {}
            Ok(false) => log::debug!("{name}: not enabled and healthy at drop; no shutdown"),
            Err(e) => log::warn!("{name}: shutdown: {e}"),
        }
        let r = disable(&mut bar, self.ready_timeout);
        if quiesced(&r) {
            // SAFETY: `admin` is not used after this point (this is `drop`),
            // and it is dropped exactly once.
            unsafe { ManuallyDrop::drop(&mut self.admin) };
        } else {
            log::error!(
                "{name}: the controller could not be disabled at drop ({}); leaking its admin queue and shadow doorbell memory",
                r.err().map_or_else(String::new, |e| e.to_string())
            );
            std::mem::forget(self.shadow.take());
        }
    }
}
