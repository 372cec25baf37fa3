//! [`BlockQueue`] and the blocking helpers, implemented once for every
//! wire that states its addresses and block commands ([`Addressed`]).

use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::DmaSpace;

use super::{Lifecycle, Wire};
use crate::core::block::{BlockQueue, Blocking};
use crate::core::error::Result;
use crate::core::io::{Completion, DmaBuf, IoBuf, SubmitError, SubmitErrorKind};

/// What a wire's queue pair adds to the lifecycle to be a [`BlockQueue`]
/// (and to run the blocking helpers): its address type and its block
/// commands. The `BlockQueue` and blocking implementations below are
/// written once, for every such wire.
pub(crate) trait Addressed: Wire {
    /// An NVMe namespace id, a UFS LUN.
    type Addr: Copy + Into<u32>;
    /// Queue a read (`read`) or a write of `blocks` blocks at `lba` of `at`.
    fn read_write(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<Self::Buf>>;
    /// Queue a cache flush of `at`.
    fn flush_at(&mut self, at: Self::Addr, tag: u64) -> std::result::Result<(), SubmitError<()>>;
    /// Queue the deallocation of `blocks` blocks at `lba` of `at`.
    fn deallocate_at(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>>;
    /// log2 of the block size of `at`.
    fn shift_of(&self, at: Self::Addr) -> Option<u32>;
    /// The refusal for an address that names nothing, in the wire's words.
    fn unknown_at(at: Self::Addr) -> SubmitErrorKind {
        SubmitErrorKind::UnknownNamespace { nsid: at.into() }
    }
    /// Commands in flight that are the wire's own (not the application's).
    #[inline(always)]
    fn internal(&self) -> usize {
        0
    }
    /// Where the blocking helpers' bounce buffer is allocated.
    fn dma_space(&self) -> &Arc<DmaSpace>;
    /// Most bytes one command may move with blocks of `1 << shift` bytes.
    fn limit_for(&self, shift: u32) -> u64 {
        let _ = shift;
        self.eng_ref().max_xfer
    }
    /// Finish the queue pair: every command ends once through `f`.
    fn finish<F: FnMut(Completion<Self::Buf>)>(self, f: F) -> Result<()>;
}

// Spelled with `A` and `B` bound by the projections so that the public
// trait's associated types name no crate-private trait.
impl<Q, A, B> BlockQueue for Q
where
    Q: Addressed<Addr = A> + Wire<Buf = B>,
    A: Copy + Into<u32>,
    B: IoBuf,
{
    type Addr = A;
    type Buf = B;

    // Always inlined, as the wire's submission is: as a call, the buffer
    // and the result go through memory and the call saves registers
    // (16 of ~150 instructions a read took).
    #[inline(always)]
    fn read(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<Self::Buf>> {
        self.read_write(at, lba, blocks, buf, tag, true)
    }

    #[inline(always)]
    fn write(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<Self::Buf>> {
        self.read_write(at, lba, blocks, buf, tag, false)
    }

    fn flush(&mut self, at: Self::Addr, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        self.flush_at(at, tag)
    }

    fn deallocate(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        self.deallocate_at(at, lba, blocks, tag)
    }

    #[inline]
    fn submit(&mut self) -> bool {
        Lifecycle::submit(self)
    }

    #[inline]
    fn poll<F: FnMut(Completion<Self::Buf>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        Lifecycle::poll(self, max, &mut f)
    }

    fn wait<F: FnMut(Completion<Self::Buf>)>(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        mut f: F,
    ) -> Result<usize> {
        Lifecycle::wait(self, max, timeout, &mut f)
    }

    fn interrupt(&self) -> Option<super::Interrupt> {
        self.eng_ref().wait.irq.clone()
    }

    fn arm_sleep(&mut self) -> Option<super::SleepOn> {
        Lifecycle::arm_sleep(self)
    }

    fn slept(&mut self, woken: bool) {
        Lifecycle::slept(self, woken)
    }

    #[inline]
    fn depth(&self) -> usize {
        self.eng_ref().depth()
    }

    #[inline]
    fn outstanding(&self) -> usize {
        self.eng_ref().outstanding(self.internal())
    }

    #[inline]
    fn is_full(&self) -> bool {
        self.eng_ref().trackers.is_full()
    }

    fn max_transfer(&self) -> u64 {
        self.eng_ref().max_xfer
    }

    fn counters(&self) -> super::QueueCounters {
        self.all_counters()
    }

    fn block_shift(&self, at: Self::Addr) -> Option<u32> {
        self.shift_of(at)
    }

    fn unknown(at: Self::Addr) -> SubmitErrorKind {
        Q::unknown_at(at)
    }

    fn close<F: FnMut(Completion<Self::Buf>)>(self, f: F) -> Result<()> {
        self.finish(f)
    }
}

impl<Q: Addressed> Blocking for Q {
    fn bounce(&mut self) -> &mut Option<DmaBuf> {
        &mut self.eng().bounce
    }

    fn space(&self) -> &Arc<DmaSpace> {
        self.dma_space()
    }

    fn blocking_timeout(&self) -> Duration {
        self.eng_ref().blocking_timeout
    }

    fn command_limit(&self, shift: u32) -> u64 {
        self.limit_for(shift)
    }

    /// Blocking calls first catch up with a reset or failure (nothing is
    /// outstanding, so nothing is lost) so they never submit into a queue
    /// the controller already dropped.
    fn blocking_sync(&mut self) -> Result<()> {
        if self.state() != self.eng_ref().seen_state {
            self.recover(true, &mut drop)?;
        }
        match self.eng_ref().stopped {
            Some(s) => Err(self.stopped_error(s)),
            None => Ok(()),
        }
    }
}
