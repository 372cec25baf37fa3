//! The blocking convenience API and the shared [`BlockQueue`](crate::core::block::BlockQueue) view.

use super::QueuePair;
use crate::core::block;
use crate::core::error::Result;
use crate::core::io::{Completion, DmaBuf, IoBuf, SubmitError};
use crate::core::qpair::Addressed;
use crate::nvme::spec::sqe::MAX_NLB;
use mcqio_vfio::DmaSpace;
use std::sync::Arc;

/// The blocking convenience API, on the default buffer type. It bounces
/// through one DMA buffer the queue pair keeps (allocated on first use) and
/// splits requests larger than the per-command limit.
impl QueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        block::flush_blocking(self, nsid)
    }
}

/// NVMe's block commands for the shared `BlockQueue` and blocking
/// implementations (`core::qpair::Addressed`): each is the inherent method
/// of the same name (no extra work per I/O).
impl<B: IoBuf> Addressed for QueuePair<B> {
    type Addr = u32;

    #[inline(always)]
    fn read_write(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> Result<(), SubmitError<B>> {
        if read {
            self.read(nsid, lba, blocks, buf, tag)
        } else {
            self.write(nsid, lba, blocks, buf, tag)
        }
    }

    fn flush_at(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError<()>> {
        self.flush(nsid, tag)
    }

    fn deallocate_at(
        &mut self,
        nsid: u32,
        lba: u64,
        n: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        self.deallocate(nsid, &[(lba, n)], tag)
    }

    fn shift_of(&self, nsid: u32) -> Option<u32> {
        self.geom(nsid).map(|g| g.lba_shift)
    }

    fn dma_space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn limit_for(&self, shift: u32) -> u64 {
        self.eng.max_xfer.min(u64::from(MAX_NLB) << shift)
    }

    fn finish<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        self.close(f)
    }
}
