//! The blocking convenience API and the shared [`BlockQueue`] view.

use super::*;

/// The blocking convenience API, on the default buffer type. It bounces
/// through one DMA buffer the queue pair keeps (allocated on first use) and
/// splits requests larger than the per-command limit.
impl QueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    /// Needs an idle queue pair ([`Error::QueueBusy`] otherwise).
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        block::flush_blocking(self, nsid)
    }
}

/// The block operations shared with the UFS transport: each is the
/// inherent method of the same name (no extra work per I/O).
impl<B: IoBuf> BlockQueue for QueuePair<B> {
    type Addr = u32;
    type Buf = B;

    #[inline]
    fn read(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        QueuePair::read(self, nsid, lba, blocks, buf, tag)
    }

    #[inline]
    fn write(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        QueuePair::write(self, nsid, lba, blocks, buf, tag)
    }

    fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError<()>> {
        QueuePair::flush(self, nsid, tag)
    }

    fn deallocate(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        QueuePair::deallocate(self, nsid, &[(lba, blocks)], tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        QueuePair::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, f: F) -> Result<usize> {
        QueuePair::poll(self, max, f)
    }

    #[inline]
    fn depth(&self) -> usize {
        QueuePair::depth(self)
    }

    #[inline]
    fn outstanding(&self) -> usize {
        QueuePair::outstanding(self)
    }

    #[inline]
    fn is_full(&self) -> bool {
        QueuePair::is_full(self)
    }

    fn max_transfer(&self) -> u64 {
        QueuePair::max_transfer(self)
    }

    fn block_shift(&self, nsid: u32) -> Option<u32> {
        self.geom(nsid).map(|g| g.lba_shift)
    }

    fn close<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        QueuePair::close(self, f)
    }
}

impl<B: IoBuf> Blocking for QueuePair<B> {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.eng.bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn blocking_timeout(&self) -> Duration {
        self.eng.blocking_timeout
    }

    fn command_limit(&self, shift: u32) -> u64 {
        self.eng.max_xfer.min(u64::from(MAX_NLB) << shift)
    }

    /// Blocking calls first catch up with a reset or failure (nothing is
    /// outstanding, so nothing is lost) so they never submit into a queue
    /// the controller already dropped.
    fn blocking_sync(&mut self) -> Result<()> {
        if self.ctrl.state() != self.eng.seen_state {
            self.recover(true, &mut |c: Completion<B>| drop(c))?;
        }
        match self.eng.stopped {
            Some(e) => Err(super::recover::stopped_error(e, self.qid)),
            None => Ok(()),
        }
    }
}
