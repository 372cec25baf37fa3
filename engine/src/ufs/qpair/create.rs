//! Creation: a [`UfsQueuePair`] takes one of the hardware queues set up
//! at bring-up (MCQ) or the legacy list, with its command descriptors and
//! interrupt line; and gives them back when it is dropped.

use super::{HwQueue, LuGeom, UfsQpairOptions, UfsQueuePair};
use crate::core::error::{Error, Result};
use crate::core::io::{DmaBuf, IoBuf};
use crate::core::mapped::{MappedQueuePair, MappingMode};
use crate::core::qpair::Engine;
use crate::ufs::ctrl::{Pool, UfsController, UfsMode, TASK_TAGS};
use crate::ufs::hpb::qp::HpbQp;
use crate::ufs::mcq::McqQueue;
use crate::ufs::sdb::SdbQueue;
use crate::ufs::spec::utrd::{PrdtEntry, Ucd};
use crate::ufs::ucd::{UcdSlice, MAX_PRDT_ENTRIES, SLOT_BYTES};
use mcqio_vfio::{DmaDir, Mapped};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

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
        let (hwq, tag_base, pooled) = match (&mut *pool, self.mode()) {
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
                (HwQueue::Mcq(McqQueue::new(r, hook, depth)), base, pooled)
            }
            (Pool::Legacy(list), _) => {
                let Some(l) = list.take() else {
                    return Err(Error::NoFreeQueue { granted: 1 });
                };
                (
                    HwQueue::Legacy(SdbQueue::new(
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
                        self.give_back(hwq, None);
                        return Err(e.into());
                    }
                };
                if ucd_mem.iova().raw() % Ucd::ALIGN != 0 || ucd_mem.iova().raw() == 0 {
                    self.give_back(hwq, None);
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
                self.give_back(hwq, Some(ucds));
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
            hwq: ManuallyDrop::new(hwq),
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

    /// Return a queue's memory to the pool (nothing outstanding on it),
    /// with the command descriptors used on it (MCQ: they stay with the
    /// queue; legacy: freed).
    pub(super) fn give_back(&self, t: HwQueue, ucds: Option<UcdSlice>) {
        let mut pool = self.lock_pool();
        match (&mut *pool, t) {
            (Pool::Mcq(rings), HwQueue::Mcq(q)) => {
                let mut r = q.into_rings();
                r.ucds = ucds;
                let i = usize::from(r.index);
                rings[i] = Some(r);
            }
            (Pool::Legacy(list), HwQueue::Legacy(q)) => *list = Some(q.into_list()),
            _ => {}
        }
    }
}
