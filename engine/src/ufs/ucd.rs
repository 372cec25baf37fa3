//! A queue pair's own slice of UTP command descriptors (UCDs). A command's
//! UCD holds its COMMAND UPIU, the RESPONSE UPIU the device writes, and its
//! PRDT built from the buffer's segments. The CQE of an MCQ command names
//! its command by the UCD address only (the entry has no tag), so the
//! address must also say *which* use of a slot an entry is for:
//!
//! - each tracker slot owns [`SLOT_BYTES`] of the slice, and a command in
//!   it places its UCD at one of [`GENERATIONS`] bases 128 bytes apart in
//!   that region (the UTRD's UCD base address only needs 128-byte
//!   alignment; the response and PRDT offsets are relative to it, so a
//!   UCD may start anywhere), the next one each time the slot is reused —
//!   the UFS form of NVMe's CID generations (`core/tracker.rs`);
//! - a completion entry proves its command when its address is exactly the
//!   UCD of the command now in flight in that slot
//!   ([`UcdSlice::command_of`]): a stale or duplicate entry of an earlier
//!   command in the slot names an earlier base, whatever its OCS, unless
//!   the slot was reused a multiple of [`GENERATIONS`] times since — as
//!   strong as NVMe's CIDs at their deepest queue (4 generation bits).
//!
//! Only one command at a time uses a slot's region, so the UCDs of its
//! generations may overlap. Queues share no descriptor and need no shared
//! tag space.

use std::ptr::NonNull;

use mcqio_vfio::DmaRegion;

use super::spec::scsi::Cdb;
use super::spec::upiu::{flags, trans, CommandUpiu, ResponseUpiu};
use super::spec::utrd::{PrdtEntry, Ucd};
use crate::core::io::{IoBuf, SubmitErrorKind};

/// Most PRDT entries per command (each up to 256 KiB).
pub const MAX_PRDT_ENTRIES: usize = Ucd::MAX_PRDT_ENTRIES;
/// Bytes per command descriptor.
pub(crate) const UCD_SIZE: usize = Ucd::size(MAX_PRDT_ENTRIES);
/// UCD bases per slot, used in rotation (see the module docs).
pub(crate) const GENERATIONS: u8 = 16;
/// Bytes of the slice per tracker slot: room for the UCD at its last base.
/// A power of two, so an address's slot is a shift.
pub(crate) const SLOT_BYTES: usize = 8192;
const SLOT_SHIFT: u32 = SLOT_BYTES.trailing_zeros();
/// The bit a generation offset carries into past the last generation.
const GEN_CARRY: u32 = GENERATIONS as u32 * Ucd::ALIGN as u32;

const _: () = assert!(GENERATIONS.is_power_of_two() && (GEN_CARRY as usize) < SLOT_BYTES);
const _: () = assert!(
    256 * SLOT_BYTES <= u32::MAX as usize,
    "a slice of the deepest queue's slots has u32 offsets"
);

const _: () = assert!(SLOT_BYTES.is_power_of_two());
const _: () = assert!(
    (GENERATIONS as usize - 1) * Ucd::ALIGN as usize + UCD_SIZE <= SLOT_BYTES,
    "the UCD at a slot's last base fits its region"
);
/// Where an UNMAP parameter list goes: in the PRDT area past the one entry
/// that names it (dword aligned, so a PRDT entry can name it; see [`Ucd`]).
pub(crate) const PARAM_OFFSET: usize = 64;

const _: () = assert!(UCD_SIZE % Ucd::ALIGN as usize == 0);
const _: () = assert!(
    Ucd::RESPONSE_OFFSET % 8 == 0,
    "the response header is read as aligned words"
);
const _: () = assert!(PARAM_OFFSET >= Ucd::PRDT_OFFSET + 16);
const _: () = assert!(PARAM_OFFSET + 64 <= Ucd::PRDT_OFFSET + MAX_PRDT_ENTRIES * 16);

/// The fast-path view of a RESPONSE UPIU's first 16 bytes.
#[derive(Copy, Clone, Debug)]
pub(crate) struct RspHead {
    /// Bytes 0..8 as a little-endian word: transaction code (byte 0),
    /// flags (1: OVERFLOW, UNDERFLOW), task tag (3), response (6), SCSI
    /// status (7).
    pub w0: u64,
    /// Device information (bit 1: HPB update alert).
    pub dev_info: u8,
    /// The residual transfer count (bytes 12..16) as stored; only whether
    /// it is zero is asked here (the slow path decodes it).
    pub residual_raw: u32,
}

pub(crate) struct UcdSlice {
    mem: DmaRegion,
    ptr: NonNull<u8>,
    base: u64,
    slots: usize,
    /// Per slot: the byte offset in the slice of the UCD of the command
    /// being built or in flight, `slot * SLOT_BYTES + generation * 128`.
    ucd_off: Box<[u32]>,
}

// SAFETY: `ptr` points into `mem`, which this value owns; accessed through
// `&mut self`/`&self` of the one queue pair that owns it.
unsafe impl Send for UcdSlice {}

impl UcdSlice {
    /// Take `mem` (at least `slots * SLOT_BYTES` bytes, 128-byte aligned,
    /// non-zero IOVA: a zero address is what a consumed completion entry is
    /// cleared to).
    pub fn new(mem: DmaRegion, slots: usize) -> Self {
        debug_assert!(mem.len() >= slots * SLOT_BYTES);
        debug_assert!(mem.iova().raw() % Ucd::ALIGN == 0 && mem.iova().raw() != 0);
        UcdSlice {
            ptr: mem.as_ptr(),
            base: mem.iova().raw(),
            mem,
            slots,
            ucd_off: (0..slots).map(|s| (s * SLOT_BYTES) as u32).collect(),
        }
    }

    /// Start a new command in free `slot`: its UCD moves to the slot's next
    /// base, so no completion entry of an earlier command in the slot names
    /// it. Every command built in a slot starts here.
    #[inline(always)]
    pub fn begin(&mut self, slot: u16) {
        debug_assert!(usize::from(slot) < self.slots);
        // SAFETY: as in `ucd_off`: a tracker slot of this queue pair, so
        // `< slots == ucd_off.len()`.
        let o = unsafe { self.ucd_off.get_unchecked_mut(usize::from(slot)) };
        // The generation is bits 7..11 of the offset: adding 128 to the
        // last one carries into bit 11, which the mask clears (back to the
        // slot's first base); the slot's bits above are untouched.
        *o = (*o + Ucd::ALIGN as u32) & !GEN_CARRY;
    }

    /// The slot whose command now built or in flight has its UCD at `ucd`
    /// — the proof a completion entry gives of its command — or `u16::MAX`
    /// (past any depth: stale). Whether that slot is busy is the caller's
    /// check.
    #[inline(always)]
    pub fn command_of(&self, ucd: u64) -> u16 {
        let off = ucd.wrapping_sub(self.base);
        let slot = off >> SLOT_SHIFT;
        match self.ucd_off.get(slot as usize) {
            Some(&o) if u64::from(o) == off => slot as u16,
            _ => u16::MAX,
        }
    }

    /// Slots this slice has room for.
    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn into_region(self) -> DmaRegion {
        self.mem
    }

    /// Byte offset in the slice of `slot`'s current UCD.
    #[inline(always)]
    fn ucd_off(&self, slot: u16) -> usize {
        debug_assert!(usize::from(slot) < self.slots);
        // SAFETY: every caller passes a tracker slot of this queue pair,
        // `< slots == ucd_off.len()` (the same contract `at` relies on);
        // a device-reported address goes through `command_of`, which checks.
        (unsafe { *self.ucd_off.get_unchecked(usize::from(slot)) }) as usize
    }

    /// Device address of `slot`'s current UCD (the one [`Self::begin`]
    /// chose).
    #[inline(always)]
    pub fn iova(&self, slot: u16) -> u64 {
        self.base + self.ucd_off(slot) as u64
    }

    #[inline(always)]
    fn at(&self, slot: u16, off: usize) -> *mut u8 {
        debug_assert!(usize::from(slot) < self.slots && off < UCD_SIZE);
        // SAFETY: `slot < slots` (tracker slots; `gen_off` indexing checks
        // it too), the slot's UCD offset is at most `(GENERATIONS - 1) *
        // 128` and `off < UCD_SIZE`, so the address is inside the slot's
        // `SLOT_BYTES` (asserted at compile time), inside `mem`.
        unsafe { self.ptr.as_ptr().add(self.ucd_off(slot) + off) }
    }

    /// Write the COMMAND UPIU of `slot`. The response area is not cleared:
    /// a completion entry proves its command by the UCD address
    /// ([`Self::command_of`]), and one that proves it with OCS SUCCESS says
    /// the controller wrote this command's RESPONSE before the entry.
    #[inline(always)]
    pub fn write_command(
        &mut self,
        slot: u16,
        lun: u8,
        task_tag: u8,
        cdb: Cdb,
        bytes: u32,
        read: bool,
    ) {
        let w = CommandUpiu::new(lun, task_tag, cdb, bytes, read).to_words();
        let p = self.at(slot, Ucd::COMMAND_OFFSET).cast::<u64>();
        // SAFETY: inside `mem` (see `at`), 32 bytes at a 128-byte aligned
        // slot base (so each u64 is aligned); the slot is free (not in
        // flight), so the device does not read or write this UCD now.
        // Volatile stores, no reference; four words, not one store per
        // field.
        unsafe {
            p.write_volatile(w[0]);
            p.add(1).write_volatile(w[1]);
            p.add(2).write_volatile(w[2]);
            p.add(3).write_volatile(w[3]);
        }
    }

    /// [`UcdSlice::write_command`] for a READ or WRITE of `blocks` blocks
    /// at `lba` moving `bytes` (the I/O path): the UPIU is computed as words
    /// in registers ([`CommandUpiu::rw_le_words`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn write_rw(
        &mut self,
        slot: u16,
        lun: u8,
        task_tag: u8,
        lba: u64,
        blocks: u32,
        bytes: u32,
        read: bool,
    ) {
        let w = CommandUpiu::rw_le_words(lun, task_tag, lba, blocks, bytes, read);
        let p = self.at(slot, Ucd::COMMAND_OFFSET).cast::<u64>();
        // SAFETY: as in `write_command`: 32 bytes at the 128-byte aligned
        // base of a slot that is not in flight, inside `mem`; volatile
        // stores, no reference.
        unsafe {
            p.write_volatile(w[0].to_le());
            p.add(1).write_volatile(w[1].to_le());
            p.add(2).write_volatile(w[2].to_le());
            p.add(3).write_volatile(w[3].to_le());
        }
    }

    /// The expected data transfer length written into `slot`'s COMMAND
    /// UPIU (bytes 12..16, big-endian): what the command asked to move.
    pub fn command_len(&self, slot: u16) -> u32 {
        // SAFETY: 4 bytes inside `mem` (see `at`); the host wrote them at
        // submission. Volatile copy, no reference. (The device could
        // overwrite them; the value only names the transfer in an error,
        // see `status::io_result`.)
        let b: [u8; 4] = unsafe {
            self.at(slot, Ucd::COMMAND_OFFSET + 12)
                .cast::<[u8; 4]>()
                .read_volatile()
        };
        u32::from_be_bytes(b)
    }

    /// The LUN written into `slot`'s COMMAND UPIU (header byte 2).
    pub fn command_lun(&self, slot: u16) -> u8 {
        // SAFETY: inside `mem` (see `at`); the host wrote this byte at
        // submission and the device only reads it. Volatile load.
        unsafe { self.at(slot, Ucd::COMMAND_OFFSET + 2).read_volatile() }
    }

    /// Copy `bytes` (≤ 64) into `slot`'s parameter area; returns its IOVA.
    /// The command's PRDT must be the one entry [`UcdSlice::param_prdt`]
    /// writes (the area is the PRDT's unused tail).
    pub fn write_param(&mut self, slot: u16, bytes: &[u8]) -> u64 {
        debug_assert!(bytes.len() <= 64);
        // SAFETY: `PARAM_OFFSET + 64` is inside the PRDT area, so inside
        // `mem` (asserted at compile time); the slot is not in flight.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at(slot, PARAM_OFFSET), bytes.len())
        };
        self.iova(slot) + PARAM_OFFSET as u64
    }

    /// Write one PRDT entry.
    #[inline(always)]
    fn put_prd(&mut self, slot: u16, i: usize, e: PrdtEntry) {
        debug_assert!(i < MAX_PRDT_ENTRIES);
        let w = e.to_le_words();
        let p = self.at(slot, Ucd::PRDT_OFFSET + i * 16).cast::<u64>();
        // SAFETY: `i < MAX_PRDT_ENTRIES`, so the entry lies inside the UCD
        // (its size has room for that many), 16-byte aligned (the PRDT
        // offset is); the slot is not in flight. Two word stores.
        unsafe {
            p.write_volatile(w[0].to_le());
            p.add(1).write_volatile(w[1].to_le());
        }
    }

    /// A PRDT of one entry for the parameter list at `iova`, `len` bytes.
    pub fn param_prdt(&mut self, slot: u16, iova: u64, len: u32) -> u16 {
        match PrdtEntry::new(iova, len) {
            Some(e) => {
                self.put_prd(slot, 0, e);
                1
            }
            None => 0,
        }
    }

    /// Build `slot`'s PRDT for `bytes` bytes of `buf` starting at byte
    /// `offset`: segments in order, empty ones skipped, each cut into
    /// entries of at most 256 KiB. Every entry must start on a dword and
    /// cover whole dwords. Returns the entry count.
    #[inline]
    pub fn build_prdt<B: IoBuf>(
        &mut self,
        slot: u16,
        buf: &B,
        offset: u64,
        bytes: u64,
    ) -> Result<u16, SubmitErrorKind> {
        // The common I/O: the whole transfer in the start of one segment,
        // one entry. The general walk below set up its loops for it too;
        // whatever this test does not take (offsets, several
        // segments or entries, a misaligned or empty transfer) goes there
        // and ends as before.
        if offset == 0 && buf.segment_count() == 1 && bytes <= u64::from(PrdtEntry::MAX_BYTES) {
            let seg = buf.segment(0);
            if bytes <= seg.len as u64 {
                if let Some(e) = PrdtEntry::new(seg.iova.raw(), bytes as u32) {
                    self.put_prd(slot, 0, e);
                    return Ok(1);
                }
            }
        }
        let mut left = bytes;
        let mut skip = offset;
        let mut n = 0usize;
        let segs = buf.segment_count();
        let mut i = 0;
        while left > 0 && i < segs {
            let seg = buf.segment(i);
            if skip >= seg.len as u64 {
                skip -= seg.len as u64;
                i += 1;
                continue;
            }
            let mut addr = seg.iova.raw() + skip;
            let mut len = (seg.len as u64 - skip).min(left);
            skip = 0;
            while len > 0 {
                let chunk = len.min(u64::from(PrdtEntry::MAX_BYTES));
                let Some(e) = PrdtEntry::new(addr, chunk as u32) else {
                    return Err(SubmitErrorKind::Misaligned {
                        segment: i,
                        iova: seg.iova,
                    });
                };
                if n == MAX_PRDT_ENTRIES {
                    return Err(SubmitErrorKind::Unsupported(
                        "a buffer needing more than 256 PRDT entries (256 KiB each) in one command",
                    ));
                }
                self.put_prd(slot, n, e);
                n += 1;
                addr += chunk;
                len -= chunk;
                left -= chunk;
            }
            i += 1;
        }
        if left > 0 {
            return Err(SubmitErrorKind::BufferTooSmall {
                needed: bytes,
                available: bytes - left,
            });
        }
        Ok(n as u16)
    }

    /// The response header of `slot` (after the completion's Acquire fence).
    #[inline(always)]
    pub fn response_head(&self, slot: u16) -> RspHead {
        // SAFETY: 16 bytes inside the UCD's response area, 8-byte aligned
        // (the UCD is 128-byte aligned, the response offset a multiple of
        // 8); the device wrote them before completing the command (ordered
        // by the queue's Acquire fence) and no longer touches them. Two
        // volatile word loads, no reference.
        let (w0, w1) = unsafe {
            let p = self.at(slot, Ucd::RESPONSE_OFFSET).cast::<u64>();
            (p.read_volatile(), p.add(1).read_volatile())
        };
        let (w0, w1) = (u64::from_le(w0), u64::from_le(w1));
        RspHead {
            w0,
            dev_info: (w1 >> 8) as u8,
            residual_raw: (w1 >> 32) as u32,
        }
    }

    /// The whole RESPONSE UPIU of `slot` (the slow path: errors).
    pub fn response(&self, slot: u16) -> ResponseUpiu {
        // SAFETY: as in `response_head`; `ResponseUpiu` is 52 bytes of plain
        // data (u8 arrays, alignment 1), inside the 512-byte response area.
        unsafe {
            self.at(slot, Ucd::RESPONSE_OFFSET)
                .cast::<ResponseUpiu>()
                .read_volatile()
        }
    }
}

impl RspHead {
    /// Whether this is a GOOD response to `task_tag` that moved exactly
    /// the expected transfer: transaction code RESPONSE, neither OVERFLOW
    /// nor UNDERFLOW, the task tag, response 0 (target success), status
    /// GOOD — one masked compare — and a residual of 0. Anything else
    /// takes the slow path, which names what is wrong
    /// ([`super::spec::status::io_result`]).
    #[inline(always)]
    pub fn is_good(&self, task_tag: u8) -> bool {
        const XFER: u64 = (flags::OVERFLOW | flags::UNDERFLOW) as u64;
        const MASK: u64 = 0xFF | XFER << 8 | 0xFF << 24 | 0xFF << 48 | 0xFF << 56;
        let want = u64::from(trans::RESPONSE) | u64::from(task_tag) << 24;
        ((self.w0 & MASK) ^ want) | u64::from(self.residual_raw) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcqio_vfio::{Backend, DmaDir};

    /// Each use of a slot places its UCD at its own address inside the
    /// slot's region; only the current use's address proves the slot, and
    /// every other address (earlier uses, other slots' earlier uses,
    /// garbage) proves nothing.
    #[test]
    fn only_the_current_use_of_a_slot_proves_it() {
        let fake = mcqio_fixtures::ufs::FakeUfs::new(mcqio_fixtures::ufs::UfsConfig {
            exec: mcqio_fixtures::ExecMode::Sync,
            ..Default::default()
        })
        .expect("fake");
        let slots = 4usize;
        let mem = fake
            .dma()
            .alloc(slots * SLOT_BYTES, DmaDir::Bidirectional)
            .unwrap();
        let mut u = UcdSlice::new(mem, slots);
        let base = u.iova(0);
        let mut seen: Vec<Vec<u64>> = vec![Vec::new(); slots];
        for round in 0..3 * usize::from(GENERATIONS) {
            for s in 0..slots as u16 {
                u.begin(s);
                let a = u.iova(s);
                let off = a - base;
                assert_eq!(a % Ucd::ALIGN, 0);
                assert_eq!(off / SLOT_BYTES as u64, u64::from(s), "inside its slot");
                assert!(off % SLOT_BYTES as u64 + UCD_SIZE as u64 <= SLOT_BYTES as u64);
                assert_eq!(u.command_of(a), s);
                let past = &seen[usize::from(s)];
                // The last GENERATIONS - 1 uses of the slot had other addresses.
                for &p in past.iter().rev().take(usize::from(GENERATIONS) - 1) {
                    assert_ne!(p, a, "round {round}: an earlier use's address repeats");
                    assert_eq!(u.command_of(p), u16::MAX);
                }
                seen[usize::from(s)].push(a);
            }
        }
        for bad in [
            0,
            base - 128,
            base + 1,
            base + 64,
            base + (slots * SLOT_BYTES) as u64,
            !0x7F,
        ] {
            assert_eq!(u.command_of(bad), u16::MAX, "{bad:#x}");
        }
        drop(u.into_region());
    }

    fn head(bytes: [u8; 16]) -> RspHead {
        let w0 = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let w1 = u64::from_le_bytes(bytes[8..].try_into().unwrap());
        RspHead {
            w0,
            dev_info: (w1 >> 8) as u8,
            residual_raw: (w1 >> 32) as u32,
        }
    }

    /// The fast path takes only a GOOD response to the task tag with no
    /// transfer flag and a residual of 0; one byte off anywhere it looks
    /// sends the completion to the slow path, the rest is not looked at.
    #[test]
    fn only_a_whole_good_response_is_good() {
        let mut good = [0u8; 16];
        good[0] = trans::RESPONSE;
        good[3] = 9;
        assert!(head(good).is_good(9));
        assert!(!head(good).is_good(8));
        for (at, v, is_good) in [
            (1, flags::UNDERFLOW, false),
            (1, flags::OVERFLOW, false),
            (1, 0x9F, true),
            (2, 0xFF, true),
            (4, 0xFF, true),
            (5, 0xFF, true),
            (6, 1, false),
            (7, 2, false),
            (8, 0xFF, true),
            (9, 0xFF, true),
            (10, 0xFF, true),
            (11, 0xFF, true),
            (12, 1, false),
            (13, 1, false),
            (14, 0x10, false),
            (15, 1, false),
        ] {
            let mut b = good;
            b[at] = v;
            assert_eq!(head(b).is_good(9), is_good, "byte {at} = {v:#x}");
        }
    }
}
