//! The blocking helpers and UFS's block commands for the shared
//! [`BlockQueue`](crate::core::block::BlockQueue) implementation.

use super::UfsQueuePair;
use crate::core::block;
use crate::core::error::Result;
use crate::core::io::{Completion, DmaBuf, IoBuf, SubmitError, SubmitErrorKind};
use crate::core::qpair::Addressed;
use mcqio_vfio::DmaSpace;
use std::sync::Arc;

impl<B: IoBuf> UfsQueuePair<B> {
    /// SYNCHRONIZE CACHE of LU `lun`, and wait. Needs an idle queue pair
    /// ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
    pub fn flush_blocking(&mut self, lun: u8) -> Result<()> {
        block::flush_blocking(self, lun)
    }
}

impl UfsQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (whole blocks) from `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
    pub fn read_blocking(&mut self, lun: u8, lba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, lun, lba, dst)
    }

    /// Write `src` (whole blocks) at `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`](crate::core::error::Error::QueueBusy) otherwise).
    pub fn write_blocking(&mut self, lun: u8, lba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, lun, lba, src)
    }
}

/// UFS's block commands for the shared `BlockQueue` and blocking
/// implementations (`core::qpair::Addressed`): a LUN is the address,
/// deallocate is UNMAP; HPB's own commands are not the application's.
impl<B: IoBuf> Addressed for UfsQueuePair<B> {
    type Addr = u8;

    #[inline(always)]
    fn read_write(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_data(lun, lba, blocks, buf, tag, read)
    }

    fn flush_at(&mut self, lun: u8, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        self.flush(lun, tag)
    }

    fn deallocate_at(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        self.unmap(lun, lba, blocks, tag)
    }

    fn shift_of(&self, lun: u8) -> Option<u32> {
        self.lus
            .get(usize::from(lun))
            .copied()
            .flatten()
            .map(|g| g.shift)
    }

    fn unknown_at(lun: u8) -> SubmitErrorKind {
        SubmitErrorKind::UnknownLun { lun }
    }

    #[inline(always)]
    fn internal(&self) -> usize {
        self.hpb.inflight()
    }

    fn dma_space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn finish<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        self.close(f)
    }
}
