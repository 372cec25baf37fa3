//! The blocking convenience API and the shared
//! [`BlockQueue`](crate::core::block::BlockQueue) view (`core::qpair::Addressed`).

use super::TcpQueuePair;
use crate::core::error::Result;
use crate::core::io::{Completion, DmaBuf, IoBuf, SubmitError};
use crate::core::qpair::Addressed;
use crate::nvme::spec::sqe::MAX_NLB;
use mcqio_vfio::DmaSpace;
use std::sync::Arc;

impl<B: IoBuf> Addressed for TcpQueuePair<B> {
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
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_rw(nsid, lba, blocks, buf, tag, read)
    }

    fn flush_at(&mut self, nsid: u32, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        self.submit_flush(nsid, tag)
    }

    fn deallocate_at(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        self.submit_deallocate(nsid, lba, blocks, tag)
    }

    fn shift_of(&self, nsid: u32) -> Option<u32> {
        self.geom(nsid).map(|g| g.shift)
    }

    fn dma_space(&self) -> &Arc<DmaSpace> {
        self.ctrl.dma()
    }

    fn limit_for(&self, shift: u32) -> u64 {
        self.eng.max_xfer.min(u64::from(MAX_NLB) << shift)
    }

    fn finish<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        self.close(f)
    }
}

/// The blocking convenience API (as on the PCIe queue pair): one bounce
/// buffer kept by the queue pair, requests above the per-command limit
/// split. Each needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
impl TcpQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        crate::core::block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        crate::core::block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        crate::core::block::flush_blocking(self, nsid)
    }
}
