//! What a job does: the access pattern, the read/write mix, and a per-job
//! generator of (operation, LBA) pairs.

use serde::{Deserialize, Serialize};

/// Access pattern (fio names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential mixed reads and writes (`-M` sets the read share).
    Rw,
    /// Random mixed reads and writes (`-M` sets the read share).
    Randrw,
}

impl Pattern {
    /// Whether LBAs are random.
    pub fn random(self) -> bool {
        matches!(
            self,
            Pattern::Randread | Pattern::Randwrite | Pattern::Randrw
        )
    }

    /// Percentage of reads, given the `-M` value for mixed patterns.
    pub fn read_pct(self, mix: u8) -> u8 {
        match self {
            Pattern::Read | Pattern::Randread => 100,
            Pattern::Write | Pattern::Randwrite => 0,
            Pattern::Rw | Pattern::Randrw => mix.min(100),
        }
    }

    /// The fio name.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::Randread => "randread",
            Pattern::Randwrite => "randwrite",
            Pattern::Rw => "rw",
            Pattern::Randrw => "randrw",
        }
    }
}

/// Direction of one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Device to host.
    Read,
    /// Host to device.
    Write,
}

/// A fast, seedable PRNG (wyrand): one multiply per number.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x2545_F491_4F6C_DD1D)
    }

    /// The next 64 random bits.
    #[inline(always)]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xA076_1D64_78BD_642F);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xE703_7ED1_A0B4_28DB) as u128);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A number in `0..n` (multiply-high reduction; bias below 2^-64 * n).
    #[inline(always)]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Produces the (op, LBA) stream of one job over its LBA range.
#[derive(Debug, Clone)]
pub struct IoGen {
    rng: Rng,
    random: bool,
    read_pct: u8,
    /// First LBA of the range.
    first: u64,
    /// Number of I/O-sized positions in the range.
    positions: u64,
    /// Blocks per I/O.
    nlb: u32,
    /// Next sequential position.
    next: u64,
}

impl IoGen {
    /// A generator over `[first, first + blocks)` for I/Os of `nlb` blocks,
    /// starting sequential streams at position `start`. `blocks >= nlb`.
    pub fn new(
        pattern: Pattern,
        read_pct: u8,
        first: u64,
        blocks: u64,
        nlb: u32,
        start: u64,
        seed: u64,
    ) -> Self {
        let positions = (blocks / nlb as u64).max(1);
        IoGen {
            rng: Rng::new(seed),
            random: pattern.random(),
            read_pct,
            first,
            positions,
            nlb,
            next: start % positions,
        }
    }

    /// The next operation.
    #[inline(always)]
    pub fn op(&mut self) -> Op {
        match self.read_pct {
            100 => Op::Read,
            0 => Op::Write,
            p => {
                if self.rng.below(100) < p as u64 {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }

    /// The next starting LBA (aligned to the I/O size within the range).
    #[inline(always)]
    pub fn lba(&mut self) -> u64 {
        let pos = if self.random {
            self.rng.below(self.positions)
        } else {
            let p = self.next;
            self.next += 1;
            if self.next == self.positions {
                self.next = 0;
            }
            p
        };
        self.first + pos * self.nlb as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_wraps_inside_range() {
        let mut g = IoGen::new(Pattern::Read, 100, 1000, 10, 4, 1, 7);
        // 10 blocks / 4 per I/O = 2 positions: 1004, 1000, 1004, ...
        let v: Vec<u64> = (0..4).map(|_| g.lba()).collect();
        assert_eq!(v, vec![1004, 1000, 1004, 1000]);
        assert_eq!(g.op(), Op::Read);
    }

    #[test]
    fn random_stays_in_range_and_aligned() {
        let mut g = IoGen::new(Pattern::Randrw, 70, 64, 1024, 8, 0, 42);
        let mut reads = 0;
        for _ in 0..10_000 {
            let l = g.lba();
            assert!((64..64 + 1024).contains(&l) && l + 8 <= 64 + 1024);
            assert_eq!((l - 64) % 8, 0);
            if g.op() == Op::Read {
                reads += 1;
            }
        }
        // 70% reads: a deterministic seed, so an exact-ish band is safe.
        assert!((6500..7500).contains(&reads), "{reads}");
    }

    #[test]
    fn read_pct_by_pattern() {
        assert_eq!(Pattern::Randread.read_pct(10), 100);
        assert_eq!(Pattern::Write.read_pct(90), 0);
        assert_eq!(Pattern::Randrw.read_pct(30), 30);
        assert_eq!(Pattern::Rw.read_pct(200), 100);
        let mut g = IoGen::new(Pattern::Randwrite, 0, 0, 100, 1, 0, 1);
        assert!((0..100).all(|_| g.op() == Op::Write));
    }

    #[test]
    fn rng_is_seeded() {
        let a: Vec<u64> = {
            let mut r = Rng::new(5);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(5);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(6);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
