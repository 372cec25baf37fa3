//! # The NVMe layer shared by every NVMe wire
//!
//! What an NVMe controller is whatever reaches it — PCIe's BAR and rings
//! or a fabric's connections — written once, as SPDK's `nvme_ctrlr.c` and
//! `nvme_ns_cmd.c` sit over `nvme_transport.c` and Linux's
//! `nvme/host/core.c` over `nvme_ctrl_ops`:
//!
//! - [`NvmeController`]: what bring-up learnt (CAP, VS, Identify, the
//!   namespaces, the grant, the transfer limit), the queue-id pool, the
//!   state word every queue pair polls, the reset and leak counters, the
//!   buffers' DMA space — over a [`Link`], the wire's part (its admin
//!   queue, how it resets, fails and shuts down, its queue pairs).
//!   [`crate::nvme::Controller`] is `NvmeController<PcieLink>`,
//!   [`crate::nvme::tcp::TcpController`] `NvmeController<TcpLink>`.
//! - `regs`: the registers every wire has (CAP, VS, CC, CSTS) behind
//!   `Registers` — MMIO or Property Get/Set — and the
//!   enable, disable and shutdown handshakes on them.
//! - `identify`: bring-up's questions behind the admin
//!   `Exchange` — Identify Controller, the
//!   namespace walk, Number of Queues — and the same-device check after a
//!   reset.
//! - `namespace`: [`Namespace`] and the active namespace list.
//! - `qids`: the pool of granted I/O queue ids.
//! - `options`: [`QpairOptions`], one for every NVMe queue pair.
//! - `nvm`: the NVM command set's semantics every queue pair shares: the
//!   namespace geometry and range checks of a request, a completion's
//!   status as an [`IoError`](crate::IoError).
//! - `timeouts`: a timed-out command is aborted through the admin queue
//!   (Abort), and what that does not settle resets the controller.
//!
//! Nothing here names a wire: `pcie/` and `tcp/` implement [`Link`] and
//! their queue mechanics, and never call each other.

pub(in crate::nvme) mod identify;
pub(in crate::nvme) mod namespace;
pub(in crate::nvme) mod nvm;
mod options;
pub(in crate::nvme) mod qids;
pub(in crate::nvme) mod regs;
pub(in crate::nvme) mod timeouts;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mcqio_vfio::{DmaDir, DmaSpace};

use crate::core::block::{BlockDevice, BlockUnit};
use crate::core::error::Result;
use crate::core::io::DmaBuf;
use crate::core::per_core::PerCore;
use crate::core::state::{Controlled, StateWord};
use crate::nvme::spec::identify::IdentifyController;
use crate::nvme::spec::regs::{Cap, Version};
use crate::nvme::spec::{Cqe, Sqe};

pub use self::namespace::{Namespace, MAX_NAMESPACES};
pub use self::options::QpairOptions;
use self::qids::QidPool;

mod sealed {
    /// Only this crate's wires are links.
    pub trait Sealed {}
}
pub(in crate::nvme) use sealed::Sealed;

/// The wire under an [`NvmeController`]: what differs between NVMe over
/// PCIe and NVMe over a fabric. Implemented by
/// [`PcieLink`](crate::nvme::PcieLink) and
/// [`TcpLink`](crate::nvme::TcpLink) only.
pub trait Link: Sealed + Sized + Send + Sync + 'static {
    /// How the controller was asked to come up.
    type Options: Clone + std::fmt::Debug + Send + Sync;
    /// The queue pair (of [`DmaBuf`]s) the wire creates.
    type Qpair: Send;
    /// The controller's name in `Debug` output.
    const NAME: &'static str;

    /// `Err` if the controller is known to have failed, or is found so now.
    fn health(c: &NvmeController<Self>) -> Result<()>;
    /// One admin command that names no host memory (Abort, Set Features
    /// without data, Keep Alive), waited for, with the wire's handling of
    /// a failed exchange.
    fn admin_cmd(c: &NvmeController<Self>, sqe: Sqe, what: &'static str) -> Result<Cqe>;
    /// Reset the controller and bring it up again: every command
    /// outstanding on a queue pair ends, at that queue pair's next poll,
    /// with [`crate::IoError::AbortedByReset`] (or normally, if it
    /// completed before), and the queue pairs re-create their queues.
    fn reset(c: &NvmeController<Self>) -> Result<()>;
    /// Reset unless the state word moved on from `seen`: several queue
    /// pairs timing out together cause one reset.
    fn reset_if(c: &NvmeController<Self>, seen: u64) -> Result<()>;
    /// The state word once no reset is running.
    fn settled_state(c: &NvmeController<Self>) -> u64;
    /// A queue pair with `opts`.
    fn create_qpair(c: &Arc<NvmeController<Self>>, opts: &QpairOptions) -> Result<Self::Qpair>;
    /// What `Debug` shows of the wire.
    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>);
}

/// An initialised NVMe controller on link `L`. Shareable (`Sync`); create
/// one queue pair per thread for I/O.
pub struct NvmeController<L: Link> {
    /// The wire's part.
    pub(in crate::nvme) link: L,
    pub(in crate::nvme) opts: L::Options,
    pub(in crate::nvme) dma: Arc<DmaSpace>,
    pub(in crate::nvme) cap: Cap,
    pub(in crate::nvme) version: Version,
    pub(in crate::nvme) identify: IdentifyController,
    pub(in crate::nvme) namespaces: Vec<Namespace>,
    pub(in crate::nvme) qids: QidPool,
    pub(in crate::nvme) max_transfer: u64,
    /// See [`crate::core::state`]. Written only by the wire with its
    /// admin lock held.
    pub(in crate::nvme) state: StateWord,
    /// Successful resets.
    pub(in crate::nvme) resets: AtomicU64,
    /// Bytes of queue memory (rings, PRP pages, in-flight buffers) leaked
    /// because the device might still access them.
    pub(in crate::nvme) leaked_bytes: AtomicU64,
}

impl<L: Link> std::fmt::Debug for NvmeController<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(L::NAME);
        self.link.describe(&mut d);
        d.field("model", &self.identify.model)
            .field("serial", &self.identify.serial)
            .field("namespaces", &self.namespaces.len())
            .field("granted_io_queues", &self.qids.granted())
            .finish_non_exhaustive()
    }
}

impl<L: Link> NvmeController<L> {
    /// The DMA space buffers must come from (over a fabric, host memory
    /// no device maps).
    pub fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }

    /// Allocate a buffer of `len` bytes usable with this controller.
    pub fn alloc_buf(&self, len: usize, dir: DmaDir) -> Result<DmaBuf> {
        Ok(DmaBuf::alloc(&self.dma, len, dir)?)
    }

    /// CAP (a register over PCIe, a property over a fabric).
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
        usize::from(self.qids.granted())
    }

    /// I/O queue pairs not currently in use.
    pub fn free_io_queues(&self) -> usize {
        self.qids.free()
    }

    /// Largest transfer per I/O command in bytes (MDTS and options).
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// The options the controller was brought up with.
    pub fn options(&self) -> &L::Options {
        &self.opts
    }

    /// `Err` if the controller failed (fatal, gone, a lost association)
    /// and has not been reset since.
    pub fn health(&self) -> Result<()> {
        L::health(self)
    }

    /// Successful controller resets so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Bytes of DMA memory (queue rings, PRP list pages, buffers of commands
    /// in flight) that queue pairs leaked instead of freeing, because the
    /// controller might still access it: deleting the queues failed, or a
    /// fatal controller could not be disabled. Never unmapped, so the device
    /// cannot write into memory reused for something else. Normally 0 (and
    /// always over a fabric: a socket reaches no memory).
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn note_leak(&self, bytes: u64) {
        self.leaked_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The state word (see [`crate::core::state`]); one relaxed load, read
    /// by every poll.
    #[inline(always)]
    pub(crate) fn state(&self) -> u64 {
        self.state.load()
    }

    /// Run an admin command that names no host memory (Abort, Set
    /// Features without data, Keep Alive; its data and metadata pointers
    /// are the wire's to clear) and wait for it: its completion, or
    /// [`crate::Error::Command`] with its status.
    pub fn admin_cmd(&self, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        L::admin_cmd(self, sqe, what)
    }

    /// Reset the controller and bring it up again (see [`Link::reset`]
    /// and the wire's module docs). Also clears a failure.
    pub fn reset(&self) -> Result<()> {
        L::reset(self)
    }

    /// Reset unless the state moved on from `seen` (see [`Link::reset_if`]).
    pub(crate) fn reset_if(&self, seen: u64) -> Result<()> {
        L::reset_if(self, seen)
    }

    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        self.qids.alloc()
    }

    pub(crate) fn release_qid(&self, qid: u16) {
        self.qids.release(qid)
    }
}

impl<L: Link> Controlled for NvmeController<L> {
    #[inline(always)]
    fn state_word(&self) -> &StateWord {
        &self.state
    }

    fn settled_state(&self) -> u64 {
        L::settled_state(self)
    }
}

/// Its active namespaces.
impl<L: Link> BlockDevice for NvmeController<L> {
    fn units(&self) -> Vec<BlockUnit> {
        self.namespaces.iter().map(Into::into).collect()
    }
}

/// One queue pair per thread ([`crate::core::per_core`]), at most as many
/// as Set Features (Number of Queues) granted.
impl<L: Link> PerCore for Arc<NvmeController<L>> {
    type Qpair = L::Qpair;
    type Options = QpairOptions;

    fn granted_queues(&self) -> usize {
        self.granted_io_queues()
    }

    fn create_for_core(&self, opts: &QpairOptions) -> Result<L::Qpair> {
        L::create_qpair(self, opts)
    }
}
