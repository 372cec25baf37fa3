//! One MCQ queue pair (UFSHCI 4.0 multi-circular queue): an SQ ring of
//! UTRDs and a CQ ring of completion entries, with their operational
//! registers found through the DAO offsets the controller reported.
//!
//! - Heads and tails are **byte offsets** into the ring (slot × 32).
//! - The CQ has **no phase bit**: a poll reads CQTP (one MMIO read) to
//!   learn how far the controller has written, and skips that read when
//!   nothing is outstanding.
//! - A CQE names its command by the UCD address; [`McqQueue::reap`] hands
//!   that address to the caller, which owns the slice of command
//!   descriptors and checks that it is the command now in flight in its
//!   slot (`UcdSlice::command_of`).
//! - Every consumed entry's address word is cleared before CQHP releases
//!   it (as Linux does), so the ring past what the controller wrote holds
//!   no address of ours: after a reset, when CQTP cannot be trusted,
//!   [`McqQueue::drain_posted`] stops at the first cleared entry instead
//!   of reading entries of the ring's previous lap as new ones.
//! - SQTP is written once per submit batch ([`McqQueue::flush`]), CQHP once
//!   32 consumed entries have piled up (fewer on a queue too deep for that
//!   much room, see [`McqQueue::new`]): a head that lags is flow control
//!   only, and the ring has room for it.
//!
//! The rings hold `entries` slots and at most `entries - 1` commands are
//! ever outstanding (the caller's trackers bound it), so neither ring can
//! overflow.

pub(super) mod config;

use crate::core::ring;
use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{barrier, DmaRegion, DoorbellHook};

use super::spec::regs::ENTRY_SIZE;
use super::spec::utrd::{McqCqe, Ocs, Utrd};
use super::ucd::UcdSlice;

/// Consumed CQ entries a queue leaves unreleased before it stores CQHP
/// (as NVMe's queue pairs do): one store per poll was one per I/O at QD1.
const CQ_HEAD_BATCH: u32 = 32;

/// A 32-bit operational register in the BAR, addressed once at setup.
pub(crate) struct OpReg {
    ptr: NonNull<u32>,
    offset: usize,
}

impl OpReg {
    /// # Safety
    ///
    /// `offset` must be 4-byte aligned with `offset + 4` inside the BAR
    /// mapped at `base`, and that mapping must outlive this value.
    pub(crate) unsafe fn new(base: NonNull<u8>, offset: usize) -> Self {
        OpReg {
            // SAFETY: in bounds per this function's contract.
            ptr: unsafe { base.add(offset) }.cast(),
            offset,
        }
    }

    #[inline(always)]
    pub(crate) fn read(&self) -> u32 {
        // SAFETY: an aligned register inside the live BAR mapping
        // (constructor contract); one 32-bit load, no reference. `readl`
        // ordering: later loads (CQEs, responses, data) stay after it.
        unsafe { barrier::mmio_read32(self.ptr.as_ptr()) }
    }

    #[inline(always)]
    pub(crate) fn write(&self, v: u32) {
        // SAFETY: as in `read`; one 32-bit store. Relaxed: each caller
        // issues the barrier its doorbell needs first.
        unsafe { barrier::mmio_write32_relaxed(self.ptr.as_ptr(), v) }
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }
}

/// The operational registers of one queue (BAR offsets already checked
/// against the BAR length by the controller).
pub(crate) struct McqRegs {
    /// SQ tail (doorbell).
    pub sqtp: OpReg,
    /// SQ run-time control.
    pub sqrtc: OpReg,
    /// SQ cleanup target.
    pub sqcti: OpReg,
    /// SQ run-time status.
    pub sqrts: OpReg,
    /// CQ head (the host writes it).
    pub cqhp: OpReg,
    /// CQ tail (the controller writes it).
    pub cqtp: OpReg,
    /// CQ interrupt status (write 1 to clear); touched only by a wait.
    pub cqis: OpReg,
    /// CQ interrupt enable; touched only by a wait.
    pub cqie: OpReg,
}

/// Ring memory and registers of one hardware queue, owned by the controller
/// while no queue pair uses it.
pub(crate) struct McqRings {
    /// Hardware queue index (SQ id = CQ id).
    pub index: u16,
    /// Slots per ring.
    pub entries: u16,
    pub sq: DmaRegion,
    pub cq: DmaRegion,
    pub regs: McqRegs,
    /// Where the host's SQ tail and CQ head stand (slots). The controller
    /// keeps its own SQHP/CQTP across queue pairs, so a queue pair taking
    /// these rings continues from here, not from 0.
    pub sq_tail: u32,
    pub cq_head: u32,
    /// The command descriptors of the queue pairs on this queue, kept with
    /// it across owners: their generations go on, so an entry naming an
    /// earlier owner's command never proves a later owner's (`None` until
    /// the first queue pair).
    pub ucds: Option<UcdSlice>,
}

// SAFETY: the register pointers address the controller's BAR, kept alive by
// the controller (an `Arc` every holder of the rings also holds); the rings
// are owned DMA regions. One owner at a time, so moving it across threads
// creates no shared mutable access.
unsafe impl Send for McqRings {}

/// Counters of one MCQ queue.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct McqStats {
    /// SQTP stores (one per submit batch).
    pub sq_doorbell_writes: u64,
    /// CQHP stores (one per 32 consumed entries, see [`McqQueue::new`]).
    pub cq_doorbell_writes: u64,
    /// CQTP reads (one per poll with commands outstanding).
    pub cqtp_reads: u64,
    /// Polls that skipped the CQTP read because nothing was outstanding.
    pub cqtp_reads_skipped: u64,
    /// CQTP values that were not a slot boundary inside the ring.
    pub bad_tails: u64,
}

/// The queue pair's rings with local head/tail copies.
pub(crate) struct McqQueue {
    rings: McqRings,
    sq_ring: NonNull<Utrd>,
    cq_ring: NonNull<McqCqe>,
    entries: u32,
    /// Next SQ slot to fill.
    sq_tail: u32,
    /// SQ slot the controller was last told about.
    sq_rung: u32,
    /// Next CQ slot to consume.
    cq_head: u32,
    /// Entries consumed since the last CQHP store.
    cq_unreleased: u32,
    /// Consumed entries that make a poll store CQHP.
    cq_batch: u32,
    hook: Option<Arc<dyn DoorbellHook>>,
    pub stats: McqStats,
}

// SAFETY: `sq_ring`/`cq_ring` point into `rings`, which this value owns; the
// register pointers are valid as long as the controller lives (the queue
// pair holding this value holds the controller). Used through `&mut self`
// by one thread at a time.
unsafe impl Send for McqQueue {}

/// What a poll found.
pub(crate) enum Reaped {
    /// `n` entries consumed.
    Entries(usize),
    /// CQTP read all ones (device gone) or outside the ring: nothing consumed.
    BadTail,
}

impl McqQueue {
    /// Before a wait sleeps (UFSHCI 4.0 MCQ): enable the CQ's tail entry
    /// push interrupt (CQIE.TEPS; a host controller reset clears it) and
    /// acknowledge the status it left (CQIS.TEPS, write 1 to clear). An
    /// entry pushed after this sets CQIS.TEPS, and IS.CQES, again.
    #[cold]
    pub(crate) fn arm_interrupt(&self) {
        use super::spec::regs::cq_int::TEPS;
        self.rings.regs.cqie.write(TEPS);
        self.rings.regs.cqis.write(TEPS);
    }

    /// The queue on `rings` for a queue pair of at most `depth` commands
    /// outstanding (`depth < rings.entries`).
    ///
    /// CQHP is stored once [`CQ_HEAD_BATCH`] consumed entries have piled
    /// up, or `entries - depth` if that is smaller. The controller finds
    /// the CQ full at `entries - 1` posted and unreleased entries; after a
    /// poll fewer than the batch are unreleased and at most `depth`
    /// commands are outstanding, so that never happens.
    pub fn new(rings: McqRings, hook: Option<Arc<dyn DoorbellHook>>, depth: u16) -> Self {
        let entries = u32::from(rings.entries);
        debug_assert!(u32::from(depth) < entries);
        debug_assert!(rings.sq.len() >= entries as usize * ENTRY_SIZE as usize);
        debug_assert!(rings.cq.len() >= entries as usize * ENTRY_SIZE as usize);
        let mut q = McqQueue {
            sq_ring: rings.sq.as_ptr().cast(),
            cq_ring: rings.cq.as_ptr().cast(),
            sq_tail: rings.sq_tail,
            sq_rung: rings.sq_tail,
            cq_head: rings.cq_head,
            cq_unreleased: 0,
            cq_batch: CQ_HEAD_BATCH
                .min(entries.saturating_sub(u32::from(depth)))
                .max(1),
            rings,
            entries,
            hook,
            stats: McqStats::default(),
        };
        q.discard_leftovers();
        q
    }

    /// A new owner of pooled rings: entries the controller posted after the
    /// previous owner's last poll (nothing was outstanding then, so each is
    /// a stale or duplicate one) are cleared and released unread. Their
    /// addresses name the previous owner's command descriptors, which the
    /// new owner's may reuse. CQHP is stored even when there are none: the
    /// previous owner may have left consumed entries unreleased (its
    /// batch), which this owner's count would not include.
    fn discard_leftovers(&mut self) {
        let tail = self.rings.regs.cqtp.read();
        if tail % ENTRY_SIZE != 0 || tail / ENTRY_SIZE >= self.entries {
            return;
        }
        let tail = tail / ENTRY_SIZE;
        let mut n = 0u32;
        while self.cq_head != tail {
            // SAFETY: `cq_head < entries`, inside the CQ ring this value
            // owns; the entry was posted (before CQTP, read above) and is
            // not touched by the controller until CQHP releases it.
            unsafe { clear_entry(self.cq_ring.as_ptr().add(self.cq_head as usize)) };
            self.cq_head = (self.cq_head + 1) % self.entries;
            n += 1;
        }
        // The clears are visible before the store that frees the slots.
        barrier::stores_before_doorbell();
        let v = self.cq_head * ENTRY_SIZE;
        self.rings.regs.cqhp.write(v);
        if let Some(h) = &self.hook {
            h.rung(self.rings.regs.cqhp.offset(), v);
        }
        if n > 0 {
            log::debug!(
                "UFS queue {}: {n} completion entries left by the previous owner discarded",
                self.rings.index
            );
        }
    }

    /// Hardware queue index (the SQ id in CQEs).
    pub fn index(&self) -> u16 {
        self.rings.index
    }

    pub fn regs(&self) -> &McqRegs {
        &self.rings.regs
    }

    /// Give the rings back (the controller no longer processes this queue's
    /// commands: nothing outstanding).
    pub fn into_rings(mut self) -> McqRings {
        self.rings.sq_tail = self.sq_rung;
        self.rings.cq_head = self.cq_head;
        self.rings
    }

    /// The rings (a controller reset re-creates the queue on them).
    pub fn rings(&self) -> &McqRings {
        &self.rings
    }

    /// After a controller reset: continue on the re-created queue's
    /// registers from `sq_tail` / `cq_head`. The controller's head may skip
    /// entries we never consumed (they were drained or ended with the
    /// reset): the whole CQ ring is cleared, so none of them is read as a
    /// new entry by a later reset's drain.
    pub fn restart(&mut self, regs: McqRegs, sq_tail: u32, cq_head: u32) {
        for i in 0..self.entries as usize {
            // SAFETY: `i < entries`, inside the CQ ring this value owns. The
            // re-created queue has no command (its SQ was nullified before
            // it was enabled and nothing was rung since), so the controller
            // writes no entry now: volatile stores racing with nothing.
            unsafe { clear_entry(self.cq_ring.as_ptr().add(i)) };
        }
        self.rings.regs = regs;
        self.sq_tail = sq_tail;
        self.sq_rung = sq_tail;
        self.cq_head = cq_head;
        // The re-created queue's CQHP is `cq_head`: nothing unreleased.
        self.cq_unreleased = 0;
    }

    /// Overwrite every SQ slot with `nullified` (before the queue is
    /// re-created: nothing left from before a reset is ever executed).
    pub fn nullify(&mut self, nullified: Utrd) {
        for i in 0..self.entries as usize {
            // SAFETY: `i < entries`, inside the SQ ring this value owns;
            // the queue is disabled (controller reset), so the controller
            // reads none of it: volatile stores racing with nothing.
            unsafe { self.sq_ring.as_ptr().add(i).write_volatile(nullified) };
        }
    }

    /// After a controller reset (the controller disabled, CQTP not to be
    /// trusted): consume the entries the controller wrote from the host's
    /// CQ head on, without any register access, up to the first cleared
    /// one (see the module docs) and at most a ring's worth, calling
    /// `f(ucd, ocs)` for each; the caller proves each one as `reap`'s
    /// does. Returns how many were consumed.
    pub fn drain_posted(&mut self, mut f: impl FnMut(u64, Ocs)) -> usize {
        let mut n = 0;
        while n + 1 < self.entries as usize {
            // `cq_head < entries`: inside the CQ ring this value owns.
            let p = self.cq_ring.as_ptr().wrapping_add(self.cq_head as usize);
            // SAFETY: in the ring (above); the controller is disabled and
            // writes no more entries. Volatile copy, no reference.
            let cqe = unsafe { p.read_volatile() };
            if cqe.ucd() == 0 {
                break;
            }
            // SAFETY: as above; the controller is disabled.
            unsafe { clear_entry(p) };
            self.cq_head = ring::next(self.cq_head, self.entries);
            n += 1;
            f(cqe.ucd(), cqe.ocs());
        }
        n
    }

    /// Write a UTRD, given as its words ([`Utrd::to_le_words`]), into the
    /// next SQ slot. The caller guarantees a free slot.
    #[inline(always)]
    pub fn post_words(&mut self, w: [u64; 4]) {
        let p = self
            .sq_ring
            .as_ptr()
            .wrapping_add(self.sq_tail as usize)
            .cast::<u64>();
        // SAFETY: `sq_tail < entries` and the ring holds `entries` UTRDs in
        // DMA memory `self` owns (32-byte aligned, so each u64 is); the
        // controller does not read this slot until SQTP publishes it (after
        // the barrier in `flush`), so the volatile stores race with nothing
        // and form no reference. Four words, not one store per field.
        unsafe {
            p.write_volatile(w[0].to_le());
            p.add(1).write_volatile(w[1].to_le());
            p.add(2).write_volatile(w[2].to_le());
            p.add(3).write_volatile(w[3].to_le());
        }
        self.sq_tail = ring::next(self.sq_tail, self.entries);
    }

    /// Publish everything posted since the last flush with one SQTP store.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.sq_tail == self.sq_rung {
            return false;
        }
        // Release: the UTRD and command-descriptor stores above must be
        // visible to the controller before it sees the new SQTP.
        barrier::stores_before_doorbell();
        let v = self.sq_tail * ENTRY_SIZE;
        self.rings.regs.sqtp.write(v);
        if let Some(h) = &self.hook {
            h.rung(self.rings.regs.sqtp.offset(), v);
        }
        self.sq_rung = self.sq_tail;
        self.stats.sq_doorbell_writes += 1;
        true
    }

    /// Consume up to `max` completion entries, calling `f(ucd, ocs)` for
    /// each; one CQTP read, and one CQHP store once the batch of consumed
    /// entries (see [`McqQueue::new`]) has piled up.
    /// `outstanding == 0` skips the register read (nothing can arrive that
    /// the caller would accept; a stray entry waits for the next busy poll).
    #[inline]
    ///
    /// `live()` is asked once, after the CQTP read: false means a controller
    /// reset may have begun before that read (CQTP may already be reset),
    /// so nothing is consumed.
    pub fn reap(
        &mut self,
        max: usize,
        outstanding: usize,
        live: impl FnOnce() -> bool,
        mut f: impl FnMut(u64, Ocs),
    ) -> Reaped {
        if outstanding == 0 {
            self.stats.cqtp_reads_skipped += 1;
            return Reaped::Entries(0);
        }
        let tail = self.rings.regs.cqtp.read();
        self.stats.cqtp_reads += 1;
        if !live() {
            return Reaped::Entries(0);
        }
        if tail % ENTRY_SIZE != 0 || tail / ENTRY_SIZE >= self.entries {
            self.stats.bad_tails += 1;
            return Reaped::BadTail;
        }
        let tail = tail / ENTRY_SIZE;
        if tail == self.cq_head {
            return Reaped::Entries(0);
        }
        // Acquire: the CQEs (and the response UPIUs and data they stand
        // for) were written before the controller advanced CQTP; read them
        // only after the CQTP load (`OpReg::read` is `readl`: its
        // `dmb oshld` on aarch64 gives exactly that order).
        let mut n = 0;
        while self.cq_head != tail && n < max {
            // `cq_head < entries`: inside the CQ ring this value owns.
            let p = self.cq_ring.as_ptr().wrapping_add(self.cq_head as usize);
            // SAFETY: in the ring (above); the controller finished writing
            // this entry before moving CQTP past it (ordered by the CQTP
            // read above) and does not touch it again until CQHP releases
            // it. Two volatile loads of aligned fields inside it (the ring
            // is 32-byte aligned), no reference.
            let cqe = unsafe { read_entry(p) };
            // SAFETY: the same entry, ours until CQHP releases it (below,
            // after the barriers): one volatile store, no reference.
            unsafe { clear_entry(p) };
            self.cq_head = ring::next(self.cq_head, self.entries);
            n += 1;
            f(cqe.ucd(), cqe.ocs());
        }
        if n == 0 {
            return Reaped::Entries(0);
        }
        self.cq_unreleased += n as u32;
        if self.cq_unreleased < self.cq_batch {
            return Reaped::Entries(n);
        }
        self.cq_unreleased = 0;
        // Our reads of the consumed entries, and the stores that cleared
        // their addresses, are done before the controller may reuse them:
        // the CQHP store comes after them in program order, the loads are
        // complete (`dmb oshld` on aarch64) and the clearing stores visible
        // to the device (`dmb oshst`) before the store that frees the slots
        // — or a clear could land on the controller's next entry.
        barrier::loads_before_doorbell();
        barrier::stores_before_doorbell();
        let v = self.cq_head * ENTRY_SIZE;
        self.rings.regs.cqhp.write(v);
        if let Some(h) = &self.hook {
            h.rung(self.rings.regs.cqhp.offset(), v);
        }
        self.stats.cq_doorbell_writes += 1;
        Reaped::Entries(n)
    }
}

/// The two words of the completion entry at `p` the host uses (the UCD
/// address with the SQ id, and the status); the other fields read as
/// zero. A volatile copy of the whole entry loaded each of its eight
/// fields.
///
/// # Safety
///
/// `p` points to an entry of a live CQ ring (32-byte aligned entries)
/// that the controller finished writing and does not write until CQHP
/// releases it.
#[inline(always)]
unsafe fn read_entry(p: *const McqCqe) -> McqCqe {
    // SAFETY: per the contract: both fields are inside the entry and
    // naturally aligned; volatile loads, no reference.
    let (ucd_sqid, status) = unsafe {
        (
            std::ptr::addr_of!((*p).ucd_sqid).read_volatile(),
            std::ptr::addr_of!((*p).status).read_volatile(),
        )
    };
    McqCqe {
        ucd_sqid,
        status,
        ..McqCqe::default()
    }
}

/// Clear the address word of the completion entry at `p` (a consumed entry
/// names no command: its UCD address reads 0, never one of ours).
///
/// # Safety
///
/// `p` must be a CQ entry inside a ring the caller owns, not being written
/// by the controller (consumed and not yet released by CQHP, or the
/// controller disabled).
#[inline(always)]
unsafe fn clear_entry(p: *mut McqCqe) {
    // SAFETY: per the contract; `ucd_sqid` is the entry's first, 8-byte
    // aligned word (the ring is 32-byte aligned): one volatile store.
    unsafe { std::ptr::addr_of_mut!((*p).ucd_sqid).write_volatile(0) }
}
