//! The submission ring.

use crate::core::ring;
use std::ptr::NonNull;

use mcqio_vfio::{barrier, DmaRegion};

use super::doorbell::Doorbell;
use crate::nvme::spec::Sqe;

/// A submission queue: ring memory, local tail, and the tail doorbell.
pub(crate) struct SubQueue {
    ring: NonNull<Sqe>,
    entries: u16,
    tail: u16,
    rung_tail: u16,
    /// Last SQ head the controller reported in a CQE.
    pub head: u16,
    /// Some SQE since the last doorbell was written with streaming stores
    /// (x86_64 only: the other architectures have no streaming path).
    #[cfg(target_arch = "x86_64")]
    streamed: bool,
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
            #[cfg(target_arch = "x86_64")]
            streamed: false,
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

    /// Write `sqe` at the tail with ordinary stores and advance it (see
    /// [`SubQueue::push_with`]).
    #[inline(always)]
    pub fn push(&mut self, sqe: Sqe) {
        self.push_with(sqe, false);
    }

    /// Write `sqe` at the tail and advance it. The caller guarantees a free
    /// slot (trackers bound outstanding commands to `entries - 1`).
    ///
    /// With `stream` (x86_64), the entry is written with non-temporal
    /// stores: the slot's cache line was last read by the device, one lap
    /// ago, so an ordinary store must first win the line back from the
    /// device's cache (a read-for-ownership, a cross-core round trip of
    /// hundreds of ns on some machines), and stores retire in order, so a
    /// burst of SQEs stalled the submitting core on those round trips. Four
    /// 16-byte streaming stores fill one write-combining buffer and go out as
    /// one full-line write with no read; `flush` orders them before the
    /// doorbell with an SFENCE. A lone command is better off with an
    /// ordinary store (the device then reads it from a cache, not DRAM, and
    /// no SFENCE waits for the write-back), so callers stream only when the
    /// queue is busy.
    #[inline(always)]
    pub fn push_with(&mut self, sqe: Sqe, stream: bool) {
        // The tail and ring size are loaded before the entry's stores: the
        // streaming stores are an `asm!` block, which may write any memory
        // as far as the compiler knows, so they were loaded again after it.
        let (tail, entries) = (self.tail, self.entries);
        // SAFETY: `tail < entries` and the ring holds `entries` SQEs in live
        // DMA memory owned by `self`. The device does not read this slot
        // until the doorbell publishes it (after the fences in `flush`), so
        // for now the slot is ours alone: writing it through the raw pointer
        // is race-free and forms no reference.
        let slot = unsafe { self.ring.as_ptr().add(tail as usize) };
        #[cfg(target_arch = "x86_64")]
        if stream {
            use std::arch::x86_64::{__m128i, _mm_set_epi64x};
            // The four 16-byte lanes from the entry's fields, in registers:
            // loading them from the entry kept it in memory, built there
            // first.
            let w = |lo: u32, hi: u32| (u64::from(hi) << 32 | u64::from(lo)) as i64;
            // SAFETY: SSE2 is part of the x86_64 baseline; no memory access.
            let lanes: [__m128i; 4] = unsafe {
                [
                    _mm_set_epi64x(w(sqe.cdw2, sqe.cdw3), w(sqe.cdw0, sqe.nsid)),
                    _mm_set_epi64x(sqe.prp1 as i64, sqe.mptr as i64),
                    _mm_set_epi64x(w(sqe.cdw10, sqe.cdw11), sqe.prp2 as i64),
                    _mm_set_epi64x(w(sqe.cdw14, sqe.cdw15), w(sqe.cdw12, sqe.cdw13)),
                ]
            };
            // One block of four MOVNTDQ at constant offsets from the slot:
            // `_mm_stream_si128` is an `asm!` block of its own, so each of
            // its addresses was computed into a register first (three more
            // instructions per entry).
            // SAFETY: the slot is 64 bytes, 16-byte aligned (ring base page
            // aligned, 64-byte entries) and ours until the doorbell (see
            // above), so the four 16-byte stores at offsets 0, 16, 32 and 48
            // stay inside it; little-endian fields, as the device reads
            // them. SSE2 is baseline. The block touches no stack and leaves
            // the flags alone; its ordering against the doorbell is
            // `flush`'s SFENCE.
            unsafe {
                std::arch::asm!(
                    "movntdq xmmword ptr [{p}], {a}",
                    "movntdq xmmword ptr [{p} + 16], {b}",
                    "movntdq xmmword ptr [{p} + 32], {c}",
                    "movntdq xmmword ptr [{p} + 48], {d}",
                    p = in(reg) slot,
                    a = in(xmm_reg) lanes[0],
                    b = in(xmm_reg) lanes[1],
                    c = in(xmm_reg) lanes[2],
                    d = in(xmm_reg) lanes[3],
                    options(nostack, preserves_flags),
                )
            };
            self.streamed = true;
        } else {
            // SAFETY: see above.
            unsafe { slot.write(sqe) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = stream;
            // SAFETY: see above.
            unsafe { slot.write(sqe) };
        }
        self.tail = ring::next(tail, entries);
    }

    /// Ring the tail doorbell once for everything pushed since the last ring.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.tail == self.rung_tail {
            return false;
        }
        // SFENCE: SQEs written with non-temporal stores (`push`) are not
        // ordered with later stores on x86; this drains them to memory
        // before the doorbell store below can be seen.
        #[cfg(target_arch = "x86_64")]
        if self.streamed {
            self.streamed = false;
            barrier::drain_streaming_stores();
        }
        // Every SQE (and PRP list / DSM range) store above must be visible
        // to the device before it can observe the new tail through the
        // doorbell (MMIO or shadow) store below (aarch64: `dmb oshst`).
        barrier::stores_before_doorbell();
        self.db.ring(self.rung_tail, self.tail);
        self.rung_tail = self.tail;
        true
    }
}
