//! The job's buffers: the one DMA region fio's `xfer_buf`s point into, the
//! view a command carries (the IOVA and the host address of its bytes),
//! and the count of buffers the device may still access.

use std::sync::Arc;

use mcqio::{DmaSlice, IoBuf, IoSeg};
use mcqio_vfio::{DmaDir, DmaRegion, DmaSpace, Iova};

#[cfg(doc)]
use super::Job;
#[cfg(doc)]
use crate::device::Device;

/// A view into the job's DMA region: fio's `xfer_buf` for one command,
/// as the engine's [`DmaSlice`] (its IOVA and length) and the host address
/// of the same bytes. The PCIe and UFS wires hand the IOVA to the device;
/// NVMe/TCP copies from (writes) and into (reads) the host address, since
/// a socket reaches no memory by IOVA ([`IoBuf::segment_host`]). Built per
/// I/O on the stack; nothing is allocated.
///
/// Only created by [`Job::queue`], from a range checked to lie inside the
/// job's region; the only place it lives after that is the job's queue
/// pair, which is closed before the region is freed ([`Job::free_buffers`],
/// also run by `Job`'s `Drop`). A read or write that ends without its
/// buffer (the device may still access it: a failed controller that could
/// not be disabled, a withdrawal the controller did not confirm) poisons
/// the region: it is then leaked, never unmapped or reused (the
/// [`DmaSlice::new`] contract), and counted ([`Device::leaked_bytes`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct FioBuf {
    pub(super) slice: DmaSlice,
    /// Host address of the slice's first byte (an integer, so the buffer
    /// stays `Send` as the slice is).
    pub(super) host: usize,
}

// SAFETY: the IOVA side is the slice's, under the `DmaSlice::new` contract
// `Job::queue` upholds (mapped in the controller's space, allocated while
// the queue pair may touch it, no Rust reference meanwhile). `host` is the
// job region's host address plus the same offset the slice's IOVA has
// from the region's IOVA (`Job::queue` builds both from one `start`), so it
// addresses the same `len` bytes, inside the region, for as long as the
// slice's memory stays allocated. All answers come from fields that never
// change.
unsafe impl IoBuf for FioBuf {
    #[inline]
    fn segment_count(&self) -> usize {
        1
    }
    #[inline]
    fn segment(&self, i: usize) -> IoSeg {
        self.slice.segment(i)
    }
    #[inline]
    fn dir(&self) -> DmaDir {
        self.slice.dir()
    }
    #[inline]
    fn segment_host(&self, _i: usize) -> Option<std::ptr::NonNull<u8>> {
        std::ptr::NonNull::new(self.host as *mut u8)
    }
    #[inline]
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        self.slice.is_mapped_in(space)
    }
    #[inline]
    fn total_len(&self) -> usize {
        self.slice.len()
    }
}

/// fio's buffers: one region, and where it starts in the host and device
/// address spaces.
pub(super) struct Buffers {
    pub(super) region: DmaRegion,
    pub(super) base: usize,
    pub(super) len: usize,
    pub(super) iova: Iova,
    pub(super) space: Arc<DmaSpace>,
}

/// Which of the job's buffers the device may still access.
///
/// A completion names no command kind, and a trim or flush comes back
/// without a buffer as a leaked read or write does; so the job counts the
/// reads and writes whose buffer has not come back. More of them than
/// commands outstanding means one ended without its buffer (seen at the
/// latest when the queue is idle or closed): the region is poisoned.
#[derive(Debug, Default)]
pub(super) struct BufsOut {
    /// Reads and writes submitted whose buffer has not come back.
    pub(super) out: usize,
    /// One of them ended without it: the device may still access the
    /// region, which must never be freed or handed to the device again.
    pub(super) poisoned: bool,
}

impl BufsOut {
    #[inline]
    pub(super) fn submitted(&mut self) {
        self.out += 1;
    }

    /// A completion; `buf` says whether it brought a buffer back.
    #[inline]
    pub(super) fn returned(&mut self, buf: bool) {
        if buf {
            // Every buffer handed back was counted when it was submitted.
            self.out = self.out.saturating_sub(1);
        }
    }

    /// Compare with the commands still outstanding.
    #[inline]
    pub(super) fn check(&mut self, outstanding: usize) {
        if self.out > outstanding {
            self.poisoned = true;
        }
    }
}
