//! The submission ring.

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use mcqio_vfio::DmaRegion;

use super::doorbell::Doorbell;
use crate::spec::Sqe;

/// A submission queue: ring memory, local tail, and the tail doorbell.
pub(crate) struct SubQueue {
    ring: NonNull<Sqe>,
    entries: u16,
    tail: u16,
    rung_tail: u16,
    /// Last SQ head the controller reported in a CQE.
    pub head: u16,
    pub db: Doorbell,
    mem: DmaRegion,
}

// SAFETY: `ring` points into `mem`, which this value owns; access happens only
// through `&mut self` on the owning thread.
unsafe impl Send for SubQueue {}

impl SubQueue {
    /// Take ownership of `mem` (at least `entries * 64` bytes, zeroed).
    pub fn new(mem: DmaRegion, entries: u16, db: Doorbell) -> Self {
        assert!(mem.len() >= entries as usize * std::mem::size_of::<Sqe>());
        SubQueue {
            ring: mem.as_ptr().cast(),
            entries,
            tail: 0,
            rung_tail: 0,
            head: 0,
            db,
            mem,
        }
    }

    pub fn region(&self) -> &DmaRegion {
        &self.mem
    }

    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// Start over at index 0, as a newly created queue does (after a
    /// controller reset deleted it). Nothing is rung.
    pub fn reset(&mut self) {
        self.tail = 0;
        self.rung_tail = 0;
        self.head = 0;
    }

    /// Write `sqe` at the tail and advance it. The caller guarantees a free
    /// slot (trackers bound outstanding commands to `entries - 1`).
    #[inline]
    pub fn push(&mut self, sqe: Sqe) {
        // SAFETY: `tail < entries` and the ring holds `entries` SQEs in live
        // DMA memory owned by `self`. The device does not read this slot
        // until the doorbell publishes it (after the Release fence in
        // `flush`), so for now the slot is ours alone: a plain (non-volatile)
        // write through the raw pointer is race-free, forms no reference, and
        // lets the compiler use wide stores.
        unsafe { self.ring.as_ptr().add(self.tail as usize).write(sqe) };
        self.tail += 1;
        if self.tail == self.entries {
            self.tail = 0;
        }
    }

    /// Ring the tail doorbell once for everything pushed since the last ring.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.tail == self.rung_tail {
            return false;
        }
        // Release: every SQE (and PRP list / DSM range) store above must be
        // visible to the device before it can observe the new tail through
        // the doorbell (MMIO or shadow) store below.
        fence(Ordering::Release);
        self.db.ring(self.rung_tail, self.tail);
        self.rung_tail = self.tail;
        true
    }
}
