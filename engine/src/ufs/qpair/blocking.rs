//! The blocking helpers and the shared [`BlockQueue`] / [`Blocking`] traits.

use super::*;

impl<B: IoBuf> UfsQueuePair<B> {
    /// SYNCHRONIZE CACHE of LU `lun`, and wait. Needs an idle queue pair
    /// ([`Error::QueueBusy`] otherwise).
    pub fn flush_blocking(&mut self, lun: u8) -> Result<()> {
        block::flush_blocking(self, lun)
    }
}

impl UfsQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (whole blocks) from `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn read_blocking(&mut self, lun: u8, lba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, lun, lba, dst)
    }

    /// Write `src` (whole blocks) at `lba` of LU `lun` and wait.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn write_blocking(&mut self, lun: u8, lba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, lun, lba, src)
    }
}

/// The block operations shared with the NVMe transport: each is the
/// inherent method of the same name (no extra work per I/O). A UFS LUN is
/// the address; deallocate is UNMAP.
impl<B: IoBuf> BlockQueue for UfsQueuePair<B> {
    type Addr = u8;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        UfsQueuePair::read(self, lun, lba, blocks, buf, tag)
    }

    #[inline]
    fn write(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        UfsQueuePair::write(self, lun, lba, blocks, buf, tag)
    }

    fn flush(&mut self, lun: u8, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        UfsQueuePair::flush(self, lun, tag)
    }

    fn deallocate(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        UfsQueuePair::unmap(self, lun, lba, blocks, tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        UfsQueuePair::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, f: F) -> Result<usize> {
        UfsQueuePair::poll(self, max, f)
    }

    #[inline]
    fn depth(&self) -> usize {
        UfsQueuePair::depth(self)
    }

    #[inline]
    fn outstanding(&self) -> usize {
        UfsQueuePair::outstanding(self)
    }

    #[inline]
    fn is_full(&self) -> bool {
        UfsQueuePair::is_full(self)
    }

    fn max_transfer(&self) -> u64 {
        self.eng.max_xfer
    }

    fn block_shift(&self, lun: u8) -> Option<u32> {
        self.lus
            .get(usize::from(lun))
            .copied()
            .flatten()
            .map(|g| g.shift)
    }

    fn unknown(lun: u8) -> SubmitErrorKind {
        SubmitErrorKind::UnknownLun { lun }
    }

    fn close<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        UfsQueuePair::close(self, f)
    }
}

impl<B: IoBuf> Blocking for UfsQueuePair<B> {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.eng.bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn blocking_timeout(&self) -> Duration {
        self.eng.blocking_timeout
    }

    /// An idle queue pair catches up with a host controller reset before
    /// it queues on a stale hardware queue (a poll of nothing does that).
    fn blocking_sync(&mut self) -> Result<()> {
        self.poll(0, |_| {}).map(|_| ())
    }
}
