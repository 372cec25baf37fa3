//! The 16-byte completion queue entry.

use super::status::NvmeStatus;
use mcqio_vfio::PlainData;

/// A completion queue entry, 16 bytes.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific dword 0 (e.g. Set Features result).
    pub dw0: u32,
    /// Command specific dword 1.
    pub dw1: u32,
    /// Submission queue head pointer at the time of completion.
    pub sq_head: u16,
    /// Submission queue the command came from.
    pub sq_id: u16,
    /// Command identifier of the completed command.
    pub cid: u16,
    /// Phase tag (bit 0) and status field (bits 15:1).
    pub status: u16,
}

const _: () = assert!(std::mem::size_of::<Cqe>() == 16);
const _: () = assert!(std::mem::offset_of!(Cqe, status) == STATUS_OFFSET);

/// Byte offset of the status/phase halfword inside a CQE: the poll loop
/// reads only this halfword until the phase flips.
pub const STATUS_OFFSET: usize = 14;

// SAFETY: `Cqe` is `#[repr(C)]`, integers only, 16 bytes without padding
// (asserted above): every bit pattern is valid.
unsafe impl PlainData for Cqe {}

impl Cqe {
    /// The phase tag.
    #[inline]
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }
    /// The decoded status (phase bit stripped).
    #[inline]
    pub const fn nvme_status(&self) -> NvmeStatus {
        NvmeStatus::from_cqe_status(self.status)
    }
}
