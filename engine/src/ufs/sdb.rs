//! Legacy single-doorbell mode: one UTP Transfer Request List (UTRL) of up
//! to 32 UTRD slots and the UTRLDBR bitmap.
//!
//! The host writes a slot's UTRD and sets the slot's doorbell bit; the
//! controller executes it, writes the OCS into the slot's UTRD (byte 8),
//! sets the slot's UTRLCNR bit and clears the doorbell bit. A poll reads
//! UTRLDBR once: every bit we set that reads back clear is a completion.
//! UTRLCNR is then cleared (write 1) for those bits in one store.
//!
//! UTRLDBR is write-1-to-set and UTRLCNR write-1-to-clear, so both go
//! through [`mcqio_vfio::Mmio`] (one call per submit batch and per poll
//! with something outstanding, never per command). The list serves one
//! queue pair; the slot of a command is its tracker slot.
//!
//! What a completion proves here: a doorbell bit we set reads clear, and a
//! bit clears once per ring, so there is no stale or duplicate completion
//! on this wire — the command the slot was rung for is the one that ended
//! (UTRLCLR withdrawals are tracked, and a controller reset is told apart
//! by the caller's `live` check). The OCS byte was pre-filled with
//! INVALID_COMMAND_STATUS at the post, so any other value was written
//! since; a slot that clears with the pre-fill still there ends as that
//! transport error. What it cannot prove: that the OCS and RESPONSE bytes
//! are complete when the bit clears, beyond the controller's word (the
//! spec has it write them first), nor anything about a controller that
//! clears bits it did not complete.

use std::ptr::NonNull;
use std::sync::Arc;

use mcqio_vfio::{barrier, Backend, DmaRegion};

use super::spec::regs::{UTRLCLR, UTRLCNR, UTRLDBR};
use super::spec::utrd::{Ocs, Utrd};

/// Counters of the legacy list.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SdbStats {
    /// UTRLDBR stores (one per submit batch).
    pub doorbell_writes: u64,
    /// UTRLDBR reads (one per poll with commands outstanding).
    pub doorbell_reads: u64,
}

/// What a poll found.
pub(crate) enum SdbReaped {
    /// `n` slots completed.
    Entries(usize),
    /// UTRLDBR read all ones: the device is gone.
    AllOnes,
}

pub(crate) struct SdbQueue {
    backend: Arc<dyn Backend>,
    utrl: DmaRegion,
    list: NonNull<Utrd>,
    slots: u32,
    /// Bits set in posts since the last flush.
    pending: u32,
    /// Bits rung and not yet seen complete.
    outstanding: u32,
    /// Bits withdrawn with UTRLCLR: their doorbell bit clears without the
    /// controller writing an OCS.
    withdrawn: u32,
    pub stats: SdbStats,
}

// SAFETY: `list` points into `utrl`, owned by this value; the backend is
// `Send + Sync`. Used through `&mut self` by one thread at a time.
unsafe impl Send for SdbQueue {}

impl SdbQueue {
    /// Take the list `utrl` (programmed in UTRLBA and running) of `slots`
    /// (1..=32) entries.
    pub fn new(backend: Arc<dyn Backend>, utrl: DmaRegion, slots: u32) -> Self {
        debug_assert!((1..=32).contains(&slots) && utrl.len() >= slots as usize * 32);
        SdbQueue {
            list: utrl.as_ptr().cast(),
            backend,
            utrl,
            slots,
            pending: 0,
            outstanding: 0,
            withdrawn: 0,
            stats: SdbStats::default(),
        }
    }

    pub fn into_list(self) -> DmaRegion {
        self.utrl
    }

    /// Write a UTRD, given as its words ([`Utrd::to_le_words`]), into list
    /// slot `slot` (< slots, free): four 64-bit stores.
    #[inline(always)]
    pub fn post_words(&mut self, slot: u16, w: [u64; 4]) {
        debug_assert!(u32::from(slot) < self.slots);
        // SAFETY: `slot < slots` (the tracker's depth is at most `slots`),
        // inside the list this value owns (32-byte UTRDs in a 1 KiB-aligned
        // list, so each u64 is aligned); the slot's doorbell bit is clear
        // (its previous command completed), so the controller does not read
        // it until we ring: volatile stores racing with nothing.
        unsafe {
            let p = self.list.as_ptr().add(usize::from(slot)).cast::<u64>();
            p.write_volatile(w[0].to_le());
            p.add(1).write_volatile(w[1].to_le());
            p.add(2).write_volatile(w[2].to_le());
            p.add(3).write_volatile(w[3].to_le());
        }
        self.pending |= 1 << slot;
    }

    /// Ring every slot posted since the last flush with one UTRLDBR store.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.pending == 0 {
            return false;
        }
        // Release: UTRDs and command descriptors before the doorbell bits.
        barrier::stores_before_doorbell();
        self.backend.regs().write32(UTRLDBR, self.pending);
        self.outstanding |= self.pending;
        self.pending = 0;
        self.stats.doorbell_writes += 1;
        true
    }

    /// Find completed slots (one UTRLDBR read), up to `max`, calling
    /// `f(slot, ocs)` for each.
    #[inline]
    /// `live()` is asked once, after the UTRLDBR read: false means a
    /// controller reset may have begun before that read (a disable clears
    /// the doorbell bits without completing anything), so nothing is
    /// consumed.
    pub fn reap(
        &mut self,
        max: usize,
        live: impl FnOnce() -> bool,
        mut f: impl FnMut(u16, Ocs),
    ) -> SdbReaped {
        if self.outstanding == 0 {
            return SdbReaped::Entries(0);
        }
        let regs = self.backend.regs();
        let dbr = regs.read32(UTRLDBR);
        self.stats.doorbell_reads += 1;
        if !live() {
            return SdbReaped::Entries(0);
        }
        if dbr == u32::MAX {
            return SdbReaped::AllOnes;
        }
        let mut done = self.outstanding & !dbr;
        if done == 0 {
            return SdbReaped::Entries(0);
        }
        // Acquire: the OCS bytes, response UPIUs and data were written
        // before the controller cleared the doorbell bits we just read.
        barrier::loads_after_phase();
        let mut taken = 0u32;
        let mut n = 0;
        while done != 0 && n < max {
            let slot = done.trailing_zeros() as u16;
            done &= done - 1;
            taken |= 1 << slot;
            // SAFETY: `slot < slots` (a bit we set), inside the list; the
            // controller is done with the slot (its bit cleared). Volatile
            // copy of the UTRD, no reference.
            let utrd = unsafe { self.list.as_ptr().add(usize::from(slot)).read_volatile() };
            n += 1;
            self.outstanding &= !(1 << slot);
            let mut ocs = Ocs(utrd.ocs & 0xF);
            if self.withdrawn & 1 << slot != 0 {
                self.withdrawn &= !(1 << slot);
                // Still the host's pre-fill: withdrawn before it completed.
                if ocs == Ocs::INVALID_COMMAND_STATUS {
                    ocs = Ocs::ABORTED;
                }
            }
            f(slot, ocs);
        }
        regs.write32(UTRLCNR, taken);
        SdbReaped::Entries(n)
    }

    /// Withdraw the outstanding slots of `bits` (UTRLCLR): the next poll
    /// reports each as completed with OCS ABORTED unless it finished first.
    /// Returns whether any of `bits` was outstanding.
    pub fn withdraw(&mut self, bits: u32) -> bool {
        let bits = bits & self.outstanding;
        if bits == 0 {
            return false;
        }
        self.withdrawn |= bits;
        self.backend.regs().write32(UTRLCLR, !bits);
        true
    }

    /// Withdraw every outstanding slot (UTRLCLR: write 0 to a slot's bit)
    /// and return the bits withdrawn. The caller waits for the doorbell bits
    /// to read clear before reusing the memory.
    pub fn clear_outstanding(&mut self) -> u32 {
        let bits = self.outstanding;
        if bits != 0 {
            self.backend.regs().write32(UTRLCLR, !bits);
        }
        bits
    }

    /// The doorbell bits of `bits` that still read set.
    pub fn still_set(&self, bits: u32) -> u32 {
        self.backend.regs().read32(UTRLDBR) & bits
    }

    /// After a controller reset: the OCS the controller wrote into slot
    /// `slot`'s UTRD if it completed the command (rung, and the OCS no
    /// longer the host's pre-fill), `None` otherwise.
    pub fn completed_before_reset(&self, slot: u16) -> Option<Ocs> {
        if u32::from(slot) >= self.slots || self.outstanding & 1 << slot == 0 {
            return None;
        }
        // SAFETY: `slot < slots`, inside the list this value owns; the
        // controller is disabled and writes nothing more. Volatile copy.
        let utrd = unsafe { self.list.as_ptr().add(usize::from(slot)).read_volatile() };
        let ocs = Ocs(utrd.ocs & 0xF);
        (ocs != Ocs::INVALID_COMMAND_STATUS).then_some(ocs)
    }

    /// Forget outstanding bits (after [`Self::clear_outstanding`] and the
    /// wait, or a controller reset).
    pub fn forget_outstanding(&mut self) {
        self.outstanding = 0;
        self.withdrawn = 0;
        self.pending = 0;
    }
}
