//! Data verification: every written block carries a tag, reads check it.
//!
//! Each logical block written under `--verify` starts with a 32-byte header of
//! four little-endian u64 words — a magic, the block's LBA, the run's seed and
//! the block's write generation — followed by a payload of u64 words derived
//! from those three numbers and the word index. A read checks the header
//! (wrong LBA = misdirected I/O, wrong generation = lost or stale write,
//! wrong seed = data from another run) and then every payload word (bit rot,
//! torn or corrupted transfers).
//!
//! The job keeps the current generation of every block it owns in a
//! [`VerifyMap`]; a block with an I/O in flight is marked busy so a read never
//! races a write to the same block (its expected contents would be ambiguous).
//!
//! Buffers are device DMA memory: access goes through raw pointers with
//! volatile word accesses, never through references, and only while the slot
//! is not in flight.

use std::fmt;
use std::ptr::NonNull;

/// "MCQIOVFY" as a little-endian word.
pub const TAG_MAGIC: u64 = u64::from_le_bytes(*b"MCQIOVFY");
/// Bytes of header at the start of each block.
pub const TAG_LEN: usize = 32;
const WORD: usize = 8;

/// The header of a tagged block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// [`TAG_MAGIC`] when the block was written by mcqio-perf.
    pub magic: u64,
    /// The block's LBA.
    pub lba: u64,
    /// The run's seed.
    pub seed: u64,
    /// Write generation (1 = the prefill).
    pub generation: u64,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.magic == TAG_MAGIC {
            write!(
                f,
                "{{lba {}, seed {:#x}, gen {}}}",
                self.lba, self.seed, self.generation
            )
        } else {
            write!(
                f,
                "{{no tag: magic {:#018x}, words {:#x} {:#x} {:#x}}}",
                self.magic, self.lba, self.seed, self.generation
            )
        }
    }
}

/// What a failed check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The header is not the expected one.
    Tag {
        /// LBA that was read.
        lba: u64,
        /// What should be there.
        expected: Tag,
        /// What was there.
        found: Tag,
    },
    /// The header matches but a payload word differs.
    Payload {
        /// LBA that was read.
        lba: u64,
        /// Offset in the block of the first byte that differs.
        offset: usize,
        /// Expected 8-byte word containing it.
        expected: u64,
        /// Found word.
        found: u64,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Tag { lba, expected, found } => {
                write!(f, "LBA {lba}: expected tag {expected}, found {found}")
            }
            Mismatch::Payload { lba, offset, expected, found } => write!(
                f,
                "LBA {lba}: tag correct but payload differs at byte {offset}: expected word {expected:#018x}, found {found:#018x}"
            ),
        }
    }
}

/// The payload word `i` of a block (splitmix64 of the identity).
#[inline]
fn payload_word(lba: u64, seed: u64, generation: u64, i: u64) -> u64 {
    let mut z = lba.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ seed.rotate_left(17)
        ^ generation.wrapping_mul(0xD6E8_FEB8_6659_FD93)
        ^ i.wrapping_mul(0xA076_1D64_78BD_642F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill one block at `block` (`block_len` bytes) with its tag and payload.
///
/// # Safety
///
/// `block..block+block_len` must be writable memory that no I/O is using and
/// `block` must be 8-byte aligned; `block_len` is a multiple of 8 and at
/// least [`TAG_LEN`].
pub unsafe fn write_block(
    block: NonNull<u8>,
    block_len: usize,
    lba: u64,
    seed: u64,
    generation: u64,
) {
    let w = block.as_ptr().cast::<u64>();
    let header = [TAG_MAGIC, lba, seed, generation];
    for (i, v) in header.iter().enumerate() {
        // SAFETY: i < 4 words = TAG_LEN <= block_len (caller contract).
        unsafe { w.add(i).write_volatile(v.to_le()) };
    }
    for i in TAG_LEN / WORD..block_len / WORD {
        let v = payload_word(lba, seed, generation, i as u64);
        // SAFETY: i < block_len / 8, inside the caller's block.
        unsafe { w.add(i).write_volatile(v.to_le()) };
    }
}

/// Read the tag at the start of a block.
///
/// # Safety
///
/// As [`write_block`], readable instead of writable.
pub unsafe fn read_tag(block: NonNull<u8>) -> Tag {
    let w = block.as_ptr().cast::<u64>();
    // SAFETY: the first four words are inside the block (caller contract).
    let r = |i| u64::from_le(unsafe { w.add(i).read_volatile() });
    Tag {
        magic: r(0),
        lba: r(1),
        seed: r(2),
        generation: r(3),
    }
}

/// Check one block against the expected LBA, seed and generation.
///
/// # Safety
///
/// As [`write_block`], readable instead of writable.
pub unsafe fn check_block(
    block: NonNull<u8>,
    block_len: usize,
    lba: u64,
    seed: u64,
    generation: u64,
) -> Result<(), Mismatch> {
    // SAFETY: forwarded caller contract.
    let found = unsafe { read_tag(block) };
    let expected = Tag {
        magic: TAG_MAGIC,
        lba,
        seed,
        generation,
    };
    if found != expected {
        return Err(Mismatch::Tag {
            lba,
            expected,
            found,
        });
    }
    let w = block.as_ptr().cast::<u64>();
    for i in TAG_LEN / WORD..block_len / WORD {
        let want = payload_word(lba, seed, generation, i as u64);
        // SAFETY: i < block_len / 8, inside the caller's block.
        let got = u64::from_le(unsafe { w.add(i).read_volatile() });
        if got != want {
            return Err(Mismatch::Payload {
                lba,
                // Words are little-endian: the lowest differing bit is in the
                // first differing byte.
                offset: i * WORD + (want ^ got).trailing_zeros() as usize / 8,
                expected: want,
                found: got,
            });
        }
    }
    Ok(())
}

/// Generation state of the blocks one job owns.
#[derive(Debug)]
pub struct VerifyMap {
    base: u64,
    state: Vec<u32>,
}

/// Bit set while an I/O covering the block is in flight.
const BUSY: u32 = 1 << 31;
/// Generation value meaning "contents unknown" (a failed write).
pub const UNKNOWN: u32 = BUSY - 1;

impl VerifyMap {
    /// A map for `blocks` blocks starting at `base`, all at generation `generation`.
    pub fn new(base: u64, blocks: u64, generation: u32) -> Self {
        VerifyMap {
            base,
            state: vec![generation; blocks as usize],
        }
    }

    fn range(&self, lba: u64, nlb: u32) -> std::ops::Range<usize> {
        let s = (lba - self.base) as usize;
        s..s + nlb as usize
    }

    /// Mark `nlb` blocks from `lba` busy, unless one already is.
    pub fn try_claim(&mut self, lba: u64, nlb: u32) -> bool {
        let r = self.range(lba, nlb);
        if self.state[r.clone()].iter().any(|g| g & BUSY != 0) {
            return false;
        }
        self.state[r].iter_mut().for_each(|g| *g |= BUSY);
        true
    }

    /// The generation of a block (without the busy bit).
    pub fn generation(&self, lba: u64) -> u32 {
        self.state[(lba - self.base) as usize] & !BUSY
    }

    /// The generation the next write of a block gets.
    pub fn next_generation(&self, lba: u64) -> u32 {
        match self.generation(lba) {
            UNKNOWN => 1,
            g if g + 1 >= UNKNOWN => 1,
            g => g + 1,
        }
    }

    /// Release blocks after a read.
    pub fn release(&mut self, lba: u64, nlb: u32) {
        let r = self.range(lba, nlb);
        self.state[r].iter_mut().for_each(|g| *g &= !BUSY);
    }

    /// Release blocks after a write, recording its outcome.
    pub fn release_written(&mut self, lba: u64, nlb: u32, generation: Option<u32>) {
        let r = self.range(lba, nlb);
        let g = generation.unwrap_or(UNKNOWN);
        self.state[r].iter_mut().for_each(|s| *s = g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Buf(Vec<u64>);
    impl Buf {
        fn new(bytes: usize) -> Self {
            Buf(vec![0; bytes / 8])
        }
        fn ptr(&mut self) -> NonNull<u8> {
            NonNull::new(self.0.as_mut_ptr().cast()).unwrap()
        }
    }

    #[test]
    fn roundtrip_and_detection() {
        let mut b = Buf::new(4096);
        let p = b.ptr();
        // SAFETY: p is a 4096-byte, 8-aligned owned buffer.
        unsafe {
            write_block(p, 4096, 77, 0xabc, 3);
            assert_eq!(check_block(p, 4096, 77, 0xabc, 3), Ok(()));
            let t = read_tag(p);
            assert_eq!(
                t,
                Tag {
                    magic: TAG_MAGIC,
                    lba: 77,
                    seed: 0xabc,
                    generation: 3
                }
            );
            // Wrong LBA, seed, generation are all reported as tag mismatches.
            assert!(matches!(
                check_block(p, 4096, 78, 0xabc, 3),
                Err(Mismatch::Tag { lba: 78, .. })
            ));
            assert!(matches!(
                check_block(p, 4096, 77, 0xabd, 3),
                Err(Mismatch::Tag { .. })
            ));
            assert!(matches!(
                check_block(p, 4096, 77, 0xabc, 4),
                Err(Mismatch::Tag { .. })
            ));
        }
        // Flip one payload bit (byte 2400 + 2).
        b.0[300] ^= 1 << 17;
        // SAFETY: as above.
        let e = unsafe { check_block(b.ptr(), 4096, 77, 0xabc, 3) }.unwrap_err();
        match &e {
            Mismatch::Payload {
                lba,
                offset,
                expected,
                found,
            } => {
                assert_eq!((*lba, *offset), (77, 2402));
                assert_eq!(expected ^ found, 1 << 17);
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("LBA 77"));
        assert!(e.to_string().contains("byte 2402"));
    }

    #[test]
    fn zeroed_block_has_no_tag() {
        let mut b = Buf::new(512);
        // SAFETY: owned 512-byte buffer.
        let e = unsafe { check_block(b.ptr(), 512, 5, 1, 1) }.unwrap_err();
        let s = e.to_string();
        assert!(s.contains("expected tag {lba 5, seed 0x1, gen 1}"), "{s}");
        assert!(s.contains("no tag"), "{s}");
    }

    #[test]
    fn payload_differs_per_identity() {
        let a = payload_word(1, 2, 3, 4);
        assert_ne!(a, payload_word(2, 2, 3, 4));
        assert_ne!(a, payload_word(1, 3, 3, 4));
        assert_ne!(a, payload_word(1, 2, 4, 4));
        assert_ne!(a, payload_word(1, 2, 3, 5));
    }

    #[test]
    fn map_claims_and_generations() {
        let mut m = VerifyMap::new(100, 16, 1);
        assert!(m.try_claim(100, 4));
        assert!(
            !m.try_claim(103, 2),
            "overlap with an in-flight I/O must be refused"
        );
        assert!(m.try_claim(104, 4));
        assert_eq!(m.generation(101), 1);
        assert_eq!(m.next_generation(101), 2);
        m.release_written(100, 4, Some(2));
        assert_eq!(m.generation(103), 2);
        assert!(m.try_claim(100, 4));
        m.release_written(100, 4, None);
        assert_eq!(m.generation(100), UNKNOWN);
        assert_eq!(m.next_generation(100), 1);
        m.release(104, 4);
        assert!(m.try_claim(104, 4));
    }
}
