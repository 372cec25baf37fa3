//! Shadow doorbells (Doorbell Buffer Config): the shadow and EventIdx
//! pages and each queue's slots in them.

use mcqio_vfio::DmaRegion;

use crate::nvme::pcie::queue::doorbell::Shadow;
use crate::nvme::spec::regs;

/// Shadow doorbell and EventIdx pages.
pub(in crate::nvme) struct ShadowPages {
    pub(in crate::nvme) shadow: DmaRegion,
    pub(in crate::nvme) event_idx: DmaRegion,
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
    pub(in crate::nvme) fn slots(
        &self,
        qid: u16,
        dstrd: u8,
        zero: bool,
    ) -> (Option<Shadow>, Option<Shadow>) {
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
