//! Doorbells: a plain BAR address computed once per queue, plus the
//! optional shadow doorbell (Doorbell Buffer Config) and device hook.

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{barrier, DoorbellHook};

/// Shadow doorbell slot and its EventIdx, both in host DMA memory.
#[derive(Copy, Clone)]
pub(crate) struct Shadow {
    pub value: NonNull<u32>,
    pub event_idx: NonNull<u32>,
}

/// One doorbell register of one queue.
pub(crate) struct Doorbell {
    mmio: NonNull<u32>,
    offset: usize,
    shadow: Option<Shadow>,
    /// Admin doorbells always write MMIO even with shadows configured
    /// (controllers differ on whether the admin queue uses the shadow).
    always_mmio: bool,
    hook: Option<Arc<dyn DoorbellHook>>,
    /// MMIO doorbell stores made.
    pub mmio_writes: u64,
    /// Shadow updates that made the MMIO store unnecessary.
    pub mmio_skipped: u64,
}

// SAFETY: the pointers address the controller's BAR and the controller's
// shadow-doorbell pages, which the owning queue keeps alive through its
// `Arc<Controller>`; a Doorbell is owned by exactly one queue, so moving it
// to another thread creates no shared mutable access.
unsafe impl Send for Doorbell {}

/// The virtio/NVMe "need event" test: the controller asked to be notified
/// (EventIdx) at a value between the old and the new doorbell value.
#[inline]
pub(crate) fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Doorbell {
    /// # Safety
    ///
    /// `bar + offset` must be a 4-byte aligned doorbell inside a BAR mapping
    /// that outlives this value; `shadow` pointers likewise valid DMA memory.
    pub unsafe fn new(
        bar: NonNull<u8>,
        offset: usize,
        shadow: Option<Shadow>,
        always_mmio: bool,
        hook: Option<Arc<dyn DoorbellHook>>,
    ) -> Self {
        Doorbell {
            // SAFETY: in bounds of the BAR per this function's contract.
            mmio: unsafe { bar.add(offset) }.cast(),
            offset,
            shadow,
            always_mmio,
            hook,
            mmio_writes: 0,
            mmio_skipped: 0,
        }
    }

    /// Start (or stop) updating a shadow slot on every ring.
    pub fn set_shadow(&mut self, shadow: Option<Shadow>) {
        self.shadow = shadow;
    }

    /// Publish `new` (the doorbell previously held `old`). The caller has
    /// already issued the barrier that orders its ring accesses first
    /// ([`barrier::stores_before_doorbell`] for a tail,
    /// [`barrier::loads_before_doorbell`] for a head).
    #[inline]
    pub fn ring(&mut self, old: u16, new: u16) {
        if let Some(s) = self.shadow {
            // SAFETY: the shadow slot is live DMA memory (constructor contract);
            // volatile store, no reference formed.
            unsafe { s.value.as_ptr().write_volatile(new as u32) };
            if !self.always_mmio {
                // Full barrier: the shadow store must be visible to the
                // controller before we read EventIdx (store→load ordering,
                // which Release/Acquire do not give). Otherwise the
                // controller could miss the new value while we skip the MMIO
                // write. x86: MFENCE; aarch64: `dmb osh`.
                barrier::store_then_load();
                // SAFETY: as above; the controller writes EventIdx concurrently,
                // so this is a volatile read.
                let ei = unsafe { s.event_idx.as_ptr().read_volatile() } as u16;
                if !need_event(ei, new, old) {
                    self.mmio_skipped += 1;
                    return;
                }
            }
        }
        // SAFETY: `mmio` is an aligned doorbell register in the live BAR
        // mapping (constructor contract); one 32-bit store as NVMe requires.
        // Relaxed: the ordering barrier was issued by the caller (above).
        unsafe { barrier::mmio_write32_relaxed(self.mmio.as_ptr(), new as u32) };
        self.mmio_writes += 1;
        if let Some(h) = &self.hook {
            h.rung(self.offset, new as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn event_idx_rule() {
        // Controller wants to hear about index 5; we move 3 -> 6: crossed it.
        assert!(need_event(5, 6, 3));
        // Moving 3 -> 5 has not passed event index 5 (need new > ei).
        assert!(!need_event(5, 5, 3));
        // Already notified past it.
        assert!(!need_event(2, 6, 4));
        // Wrap-around.
        assert!(need_event(0xFFFF, 2, 0xFFFE));
    }
}
