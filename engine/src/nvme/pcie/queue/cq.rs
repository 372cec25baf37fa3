//! The completion ring: phase-bit polling.

use std::ptr::NonNull;

use mcqio_vfio::{barrier, DmaRegion};

use super::doorbell::Doorbell;
use crate::nvme::spec::cqe::STATUS_OFFSET;
use crate::nvme::spec::Cqe;

/// Completion entries per 64-byte cache line.
#[cfg(target_arch = "x86_64")]
const CQES_PER_LINE: usize = 64 / std::mem::size_of::<Cqe>();

/// A completion queue: ring memory, local head and phase, head doorbell.
pub(crate) struct CompQueue {
    ring: NonNull<Cqe>,
    entries: u16,
    head: u16,
    phase: u16,
    rung_head: u16,
    pub db: Doorbell,
    mem: DmaRegion,
}

// SAFETY: `ring` points into `mem`, owned by this value; used only through
// `&mut self` by the owning thread.
unsafe impl Send for CompQueue {}

impl CompQueue {
    /// Take ownership of `mem` (at least `entries * 16` bytes). The ring is
    /// zeroed here so every entry starts with phase 0; the first pass of the
    /// controller writes phase 1.
    pub fn new(mut mem: DmaRegion, entries: u16, db: Doorbell) -> Self {
        assert!(mem.len() >= entries as usize * std::mem::size_of::<Cqe>());
        mem.fill(0);
        CompQueue {
            ring: mem.as_ptr().cast(),
            entries,
            head: 0,
            phase: 1,
            rung_head: 0,
            db,
            mem,
        }
    }

    pub fn region(&self) -> &DmaRegion {
        &self.mem
    }

    /// Start over as a new queue: ring zeroed (phase 0 everywhere), head 0,
    /// expected phase 1. Only call while the controller cannot post into
    /// the ring (queue deleted, controller disabled).
    pub fn reset(&mut self) {
        self.mem.fill(0);
        self.head = 0;
        self.phase = 1;
        self.rung_head = 0;
    }

    /// The entry at the head if the controller has posted it.
    #[inline]
    pub fn peek(&self) -> Option<Cqe> {
        // SAFETY: `head < entries`; the ring is live DMA memory owned by self.
        let slot = unsafe { self.ring.as_ptr().add(self.head as usize) };
        // SAFETY: in bounds (above); the status halfword is 2-byte aligned;
        // volatile because the controller writes it concurrently.
        let status = unsafe {
            slot.cast::<u8>()
                .add(STATUS_OFFSET)
                .cast::<u16>()
                .read_volatile()
        };
        if status & 1 != self.phase {
            return None;
        }
        // The phase-bit load above must happen before the loads of the rest
        // of this CQE and, later, of the data the device wrote into the
        // command's buffer. (The device writes data, then the CQE with the
        // phase bit last.) aarch64: `dmb oshld`.
        barrier::loads_after_phase();
        // Two 8-byte loads, the fields cut out in registers: a volatile
        // read of the struct loads each field apart and goes through the
        // stack.
        let words = slot.cast::<u64>();
        // SAFETY: in bounds; the entry is 16 bytes at a 16-byte aligned
        // slot (page-aligned ring), so both 8-byte loads are aligned and
        // inside it; the controller finished writing it (phase matched);
        // volatile, no reference.
        let (lo, hi) = unsafe {
            (
                u64::from_le(words.read_volatile()),
                u64::from_le(words.add(1).read_volatile()),
            )
        };
        Some(Cqe {
            dw0: lo as u32,
            dw1: (lo >> 32) as u32,
            sq_head: hi as u16,
            sq_id: (hi >> 16) as u16,
            cid: (hi >> 32) as u16,
            status: (hi >> 48) as u16,
        })
    }

    /// Call `f` with the command identifier of every entry the controller
    /// has posted and the host has not consumed yet, from the head on,
    /// without consuming any (for the timeout scan, a cold path).
    ///
    /// No fence is needed: the CID and the phase bit share dword 3 of the
    /// entry, which is read with one aligned 32-bit volatile load, so the
    /// CID seen always belongs to the phase seen.
    pub fn posted_cids(&self, mut f: impl FnMut(u16)) {
        let (mut idx, mut phase) = (self.head, self.phase);
        // At most `entries - 1` entries can be posted and unconsumed.
        for _ in 1..self.entries {
            // SAFETY: `idx < entries`: inside the ring (live DMA memory
            // owned by self); dword 3 (offset 12) of a 16-byte entry is
            // 4-byte aligned; volatile because the controller writes it
            // concurrently. No reference is formed.
            let dw3 = unsafe {
                self.ring
                    .as_ptr()
                    .add(idx as usize)
                    .cast::<u8>()
                    .add(STATUS_OFFSET - 2)
                    .cast::<u32>()
                    .read_volatile()
            };
            if (dw3 >> 16) as u16 & 1 != phase {
                return;
            }
            f(dw3 as u16);
            idx += 1;
            if idx == self.entries {
                idx = 0;
                phase ^= 1;
            }
        }
    }

    /// Consume the head entry.
    #[inline]
    pub fn advance(&mut self) {
        self.head += 1;
        if self.head == self.entries {
            self.head = 0;
            self.phase ^= 1;
        }
    }

    /// Hint the CPU to fetch the next cache line of entries, once per line:
    /// when the head (just advanced) enters a new 64-byte line, the line
    /// after it. The ring is page aligned and an entry is 16 bytes, so a
    /// line starts at every fourth entry. One test per entry instead of a
    /// wrapped index and a prefetch per entry, for the same lines (issue
    /// 28).
    #[inline(always)]
    pub fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        if self.head as usize % CQES_PER_LINE == 0 {
            let mut next = self.head as usize + CQES_PER_LINE;
            if next >= self.entries as usize {
                next = 0;
            }
            // SAFETY: `next < entries`, inside the ring; prefetch has no
            // architectural effect and forms no reference.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.ring.as_ptr().add(next).cast(),
                )
            };
        }
    }

    /// Tell the controller how far we consumed, but only once at least
    /// `threshold` entries were consumed since the last head doorbell.
    ///
    /// The head only tells the controller which slots are free again. A
    /// queue never has more than `entries - 1` commands outstanding, so the
    /// controller can only find the CQ full when consumed-but-unreported plus
    /// posted-but-unconsumed entries reach `entries - 1`; the next poll
    /// consumes the latter, the count then reaches the threshold (which must
    /// be at most `entries - 1`), and the doorbell is written. So delaying
    /// the head never stalls the controller, and it saves a doorbell store
    /// (an MMIO write, or a cache line the device polls) on most polls.
    #[inline]
    pub fn flush_lazy(&mut self, threshold: u16) {
        let consumed = if self.head >= self.rung_head {
            self.head - self.rung_head
        } else {
            self.head + self.entries - self.rung_head
        };
        if consumed >= threshold {
            self.flush();
        }
    }

    /// Tell the controller how far we consumed.
    #[inline]
    pub fn flush(&mut self) {
        if self.head == self.rung_head {
            return;
        }
        // Our reads of the consumed CQEs must complete before the controller
        // may reuse their slots, which the head store permits (aarch64:
        // `dmb oshld`, which orders loads before later stores).
        barrier::loads_before_doorbell();
        self.db.ring(self.rung_head, self.head);
        self.rung_head = self.head;
    }
}
