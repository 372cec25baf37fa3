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
//! namespace whose size overflows 64 bits or more than [`MAX_NAMESPACES`](crate::nvme::MAX_NAMESPACES)
//! active namespaces are [`Error::BadDevice`]; the active namespace list is
//! sorted and deduplicated and may be sparse (any NSID up to FFFFFFFEh);
//! malformed Identify data is [`Error::Identify`]. A namespace whose blocks
//! are larger than one command may move (LBADS above MDTS) is kept with
//! [`Namespace::usable`](crate::nvme::Namespace::usable) = `false` — its reads and writes are refused with
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
//! the reset on their next [`QueuePair::poll`](crate::nvme::QueuePair::poll) (one relaxed load of the
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
//! write into them. Dropping the last `Arc<Controller>` (every [`QueuePair`](crate::nvme::QueuePair) holds
//! one, so they are gone by then) performs a normal shutdown: CC.SHN =
//! normal, then wait for CSTS.SHST = complete, bounded; then it disables
//! the controller (which drops its Asynchronous Event Requests) before the
//! admin queue and shadow doorbell memory is freed, or leaks that memory if
//! the controller cannot be disabled.
//!
//! # Where the code is
//!
//! [`Controller`] is the NVMe layer's [`NvmeController`] over
//! [`PcieLink`]: what every NVMe wire shares (identify, namespaces, the
//! state word, queue ids, the enable/disable/shutdown handshakes) is in
//! [`crate::nvme::host`]; this folder holds what only PCIe has — the BAR,
//! the admin rings (`pcie::admin`: commands, Asynchronous Event Requests,
//! [`Controller::admin_read`]), shadow doorbells, MSI-X vectors, and the
//! failure and reset handling that disabling a controller needs
//! (`bringup`: bring-up, reset, shutdown at drop).

mod admin_read;
mod bringup;

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcqio_vfio::{Backend, DoorbellHook};

use crate::core::error::{Error, Result};
use crate::nvme::host::regs::disable;
use crate::nvme::host::{NvmeController, Sealed};
use crate::nvme::pcie::admin::AdminQueue;
use crate::nvme::pcie::bar::{Bar, BarPtr};
use crate::nvme::pcie::queue::doorbell::Shadow;
use crate::nvme::pcie::shadow::ShadowPages;
use crate::nvme::spec::{Cqe, Sqe};

/// Options for [`Controller::new`].
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (2..=4096).
    pub admin_queue_entries: u16,
    /// I/O queue pairs to ask for in Set Features (Number of Queues). The
    /// controller may grant fewer; [`Controller::granted_io_queues`] says how many.
    pub io_queues: u16,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller
    /// supports them. Only emulated controllers (QEMU, some clouds') do.
    /// Off by default: they save the doorbell stores (MMIO exits) that a
    /// queue pair still makes after batching its doorbells — a few per
    /// hundred I/Os at depth, none at QD1, where an idle controller must
    /// be woken anyway — while the controller then reads a shadow doorbell
    /// and writes an EventIdx for every command it fetches and every
    /// completion it posts. On QEMU's NVMe (TCG, intel-iommu) queue pairs
    /// without them completed more I/Os per second (the README's
    /// side-by-side).
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
            shadow_doorbells: false,
            admin_timeout: Duration::from_secs(10),
            admin_timeout_policy: TimeoutPolicy::Reset,
            shutdown_timeout: Duration::from_secs(10),
            max_transfer: 2 << 20,
            async_event_requests: 1,
        }
    }
}

pub use crate::core::timeout::TimeoutPolicy;

/// The controller state word (one encoding for every wire).
pub(crate) use crate::core::state;

pub(super) fn failure_error(s: u64) -> Option<Error> {
    match state::failure(s) {
        state::OK => None,
        state::GONE => Some(Error::DeviceGone),
        _ => Some(Error::ControllerFatal),
    }
}

/// An initialised NVMe controller over PCIe. Shareable (`Sync`); create
/// one [`QueuePair`](crate::nvme::QueuePair) per thread for I/O.
pub type Controller = NvmeController<PcieLink>;

/// NVMe over PCIe under the NVMe layer: the BAR and its admin rings.
pub struct PcieLink {
    pub(in crate::nvme) backend: Arc<dyn Backend>,
    pub(in crate::nvme) bar: BarPtr,
    /// Dropped in `Drop for PcieLink` only once the controller is
    /// disabled; leaked otherwise (the device may still write its rings).
    pub(in crate::nvme) admin: ManuallyDrop<Mutex<AdminQueue>>,
    pub(in crate::nvme) shadow: Option<ShadowPages>,
    /// Bound on CSTS.RDY transitions (CAP.TO, at least 500 ms).
    pub(in crate::nvme) ready_timeout: Duration,
    /// Bound on the shutdown handshake at drop.
    pub(in crate::nvme) shutdown_timeout: Duration,
    /// The notifiers of the MSI-X vectors, routed when the first queue
    /// pair that waits on an interrupt is created (`pcie::irq`).
    pub(in crate::nvme) irqs: Mutex<Option<Arc<[Arc<mcqio_vfio::Notifier>]>>>,
}

impl Sealed for PcieLink {}

impl PcieLink {
    /// BAR0's registers.
    pub(in crate::nvme) fn regs(&self) -> Bar<'_> {
        Bar(self.backend.regs())
    }
}

impl Controller {
    /// The backend (cold path only).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.link.backend
    }

    /// Whether shadow doorbells are in use.
    pub fn shadow_doorbells(&self) -> bool {
        self.link.shadow.is_some()
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
    /// [`DmaBuf`](crate::DmaBuf) owned by the application or in flight on a queue pair,
    /// not memory of this controller — large enough for the transfer the
    /// command describes, and that stays mapped and unused for as long as
    /// the device may access it: until this call returns `Ok` or
    /// [`Error::Command`], and, after any other error (a timeout under
    /// [`TimeoutPolicy::ReportOnly`], a controller that could not be
    /// disabled), for as long as the controller lives. Queue-creating and
    /// queue-deleting commands must not name queues owned by a
    /// [`QueuePair`](crate::nvme::QueuePair). (Validation cannot replace this contract: which
    /// fields hold host addresses depends on the opcode and, for
    /// vendor-specific commands, on nothing the host can know.)
    pub unsafe fn admin(&self, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        let mut a = self.lock_admin();
        self.admin_locked(&mut a, sqe, what)
    }

    pub(super) fn lock_admin(&self) -> std::sync::MutexGuard<'_, AdminQueue> {
        self.link.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn admin_locked(
        &self,
        a: &mut AdminQueue,
        sqe: Sqe,
        what: &'static str,
    ) -> Result<Cqe> {
        if let Some(e) = failure_error(self.state()) {
            return Err(e);
        }
        match a.exec(self.link.backend.regs(), sqe, what, self.opts.admin_timeout) {
            Err(e @ Error::Timeout { .. }) => {
                if self.opts.admin_timeout_policy != TimeoutPolicy::ReportOnly {
                    log::warn!(
                        "{}: {e}; resetting the controller",
                        self.link.backend.name()
                    );
                    if let Err(r) = self.reset_locked(a) {
                        log::error!(
                            "{}: reset after an admin timeout failed: {r}",
                            self.link.backend.name()
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
    pub(super) fn fail_locked(&self, failure: u64) {
        let s = self.state();
        if state::failure(s) == state::GONE {
            return;
        }
        let mut quiesced = failure == state::GONE;
        if !quiesced {
            match disable(&mut self.link.regs(), self.link.ready_timeout) {
                Ok(()) => quiesced = true,
                Err(Error::DeviceGone) => {
                    return self.fail_locked(state::GONE);
                }
                Err(e) => log::error!(
                    "{}: a failed controller could not be disabled ({e}); buffers of outstanding commands will be leaked",
                    self.link.backend.name()
                ),
            }
        }
        let next = if quiesced {
            state::next(s, failure)
        } else {
            state::kept(s, failure)
        };
        log::error!(
            "{}: controller {}; outstanding commands fail",
            self.link.backend.name(),
            if failure == state::GONE {
                "removed (registers read all ones)"
            } else {
                "fatal (CSTS.CFS)"
            }
        );
        self.state.store(next);
        self.wake_waiters();
    }

    /// The doorbell hook of the backend, if any.
    pub fn doorbell_hook(&self) -> Option<Arc<dyn DoorbellHook>> {
        self.link.backend.doorbell_hook()
    }
}

impl Controller {
    /// Shadow doorbell slots for queue `qid` (SQ tail, CQ head), zeroed.
    pub(crate) fn shadow_slots(&self, qid: u16) -> (Option<Shadow>, Option<Shadow>) {
        match &self.link.shadow {
            Some(s) => s.slots(qid, self.cap.dstrd(), true),
            None => (None, None),
        }
    }
}
