//! mcqio-vm-tests: the guest side of `fixtures/vm/run-tests.sh`.
//!
//! Runs inside the throw-away QEMU guest against QEMU's NVMe controller
//! through VFIO and the emulated Intel IOMMU. Each subcommand is one check
//! that `fixtures/vm/guest/vm-tests.sh` calls; each exits non-zero with a
//! message saying what differed when the check fails.
//!
//! `gen-pattern` needs no device: it prints the same deterministic bytes that
//! `write-pattern` writes and `check-pattern` expects, so the guest script can
//! compare what the kernel's nvme driver sees with `cmp`.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The guest test program of the mcqio VM harness.
#[derive(Parser, Debug)]
#[command(name = "mcqio-vm-tests", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the cross-check pattern for a byte range to stdout.
    GenPattern(PatternArgs),
}

/// A pattern region: which seed, where on the namespace, how long.
#[derive(clap::Args, Debug, Clone, Copy)]
struct PatternArgs {
    /// Seed of the pattern (any 64-bit value).
    #[arg(long)]
    seed: u64,
    /// Byte offset on the namespace (a multiple of 8; of the LBA size for I/O).
    #[arg(long)]
    offset: u64,
    /// Length in bytes (a multiple of 8; of the LBA size for I/O).
    #[arg(long)]
    len: u64,
}

/// Deterministic test data shared by the mcqio and the kernel side.
mod pattern {
    /// Bytes per pattern word.
    pub const WORD: u64 = 8;

    /// SplitMix64's finaliser: a bijective 64-bit mixer, so neighbouring words
    /// and neighbouring seeds give unrelated values.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The word stored at absolute byte offset `offset` (a multiple of
    /// [`WORD`]). It depends on the position, so data landing at the wrong
    /// LBA is caught as surely as corrupted data.
    pub fn word(seed: u64, offset: u64) -> u64 {
        mix(mix(seed) ^ (offset / WORD))
    }

    /// Fill `buf` with the pattern of the region starting at byte `offset`.
    pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
        for (i, chunk) in buf.chunks_exact_mut(WORD as usize).enumerate() {
            let w = word(seed, offset + i as u64 * WORD);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
    }

    /// The first word of `buf` that differs from the pattern, as
    /// (byte offset on the namespace, expected, found).
    pub fn first_mismatch(seed: u64, offset: u64, buf: &[u8]) -> Option<(u64, u64, u64)> {
        buf.chunks_exact(WORD as usize)
            .enumerate()
            .find_map(|(i, chunk)| {
                let at = offset + i as u64 * WORD;
                let want = word(seed, at);
                let got = u64::from_le_bytes(chunk.try_into().expect("chunk of WORD bytes"));
                (want != got).then_some((at, want, got))
            })
    }
}

/// Why a check failed; printed as the process's last line.
type Failure = String;

fn check_region(p: &PatternArgs) -> Result<(), Failure> {
    if p.offset % pattern::WORD != 0 || p.len % pattern::WORD != 0 || p.len == 0 {
        return Err(format!(
            "--offset {} and --len {} must be non-zero multiples of {}",
            p.offset,
            p.len,
            pattern::WORD
        ));
    }
    Ok(())
}

fn gen_pattern(p: &PatternArgs) -> Result<(), Failure> {
    check_region(p)?;
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut out = std::io::stdout().lock();
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK) as usize;
        pattern::fill(p.seed, p.offset + done, &mut buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| format!("writing the pattern to stdout: {e}"))?;
        done += n as u64;
    }
    out.flush().map_err(|e| format!("flushing stdout: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::GenPattern(p) => gen_pattern(p),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("mcqio-vm-tests: FAIL: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn pattern_is_positional_and_seeded() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        pattern::fill(7, 8192, &mut a);
        pattern::fill(7, 8192, &mut b);
        assert_eq!(a, b);
        assert_eq!(pattern::first_mismatch(7, 8192, &a), None);
        // Same data checked at another offset or with another seed fails.
        assert_eq!(
            pattern::first_mismatch(7, 8192 + 512, &a).map(|m| m.0),
            Some(8192 + 512)
        );
        assert!(pattern::first_mismatch(8, 8192, &a).is_some());
        // A region is the concatenation of its parts.
        let mut tail = vec![0u8; 2048];
        pattern::fill(7, 8192 + 2048, &mut tail);
        assert_eq!(&a[2048..], &tail[..]);
    }
}
