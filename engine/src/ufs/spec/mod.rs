//! UFSHCI 4.0 / UPIU / SCSI wire formats. See the parent module for the map.

pub mod desc;
pub mod regs;
pub mod scsi;
pub mod status;
pub mod upiu;
pub mod utrd;

/// Read a big-endian `u16` at `off` (callers check bounds first).
#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Read a big-endian `u32` at `off` (callers check bounds first).
#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Read a big-endian `u64` at `off` (callers check bounds first).
#[inline]
pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}
