//! Deterministic test data shared by the mcqio and the kernel side.

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
