//! The block operations the rw phases need, on NVMe and UFS queue pairs alike.

use super::*;

/// The block operations [`phase`] needs, on an NVMe queue pair (namespace
/// 1) or a UFS one (LU 0): the same checks run on both.
pub(crate) trait Blk {
    type B;
    /// Queue a write (`write`) or a read of `blocks` blocks at `lba`.
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: Self::B,
        tag: u64,
    ) -> Result<(), Failure>;
    fn ring(&mut self);
    /// Poll once, appending what completed to `out`.
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<Self::B>>) -> Result<usize, Failure>;
    fn in_flight(&self) -> usize;
    /// The queue pair's id (NVMe qid; UFS hardware queue, 0 in legacy mode).
    fn id(&self) -> u16;
}

/// Where a queue pair's checks send their I/O and which hardware queue it
/// is: with [`BlockQueue`], all [`Blk`] needs.
pub(crate) trait Target: BlockQueue {
    /// The namespace (NVMe) or LU (UFS) every check uses.
    const AT: Self::Addr;
    /// NVMe qid; UFS hardware queue, 0 in legacy mode.
    fn queue_id(&self) -> u16;
}

impl<B: IoBuf> Target for QueuePair<B> {
    const AT: u32 = NSID;
    fn queue_id(&self) -> u16 {
        self.qid()
    }
}

impl<B: IoBuf> Target for mcqio::ufs::UfsQueuePair<B> {
    const AT: u8 = ufs::LUN;
    fn queue_id(&self) -> u16 {
        self.hw_queue().unwrap_or(0)
    }
}

impl<Q: Target> Blk for Q {
    type B = Q::Buf;
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: Q::Buf,
        tag: u64,
    ) -> Result<(), Failure> {
        let r = if write {
            self.write(Q::AT, lba, blocks, buf, tag)
        } else {
            self.read(Q::AT, lba, blocks, buf, tag)
        };
        r.map_err(|e| e.to_string())
    }
    fn ring(&mut self) {
        self.submit();
    }
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<Q::Buf>>) -> Result<usize, Failure> {
        self.poll(usize::MAX, |c| out.push(c))
            .map_err(|e| e.to_string())
    }
    fn in_flight(&self) -> usize {
        self.outstanding()
    }
    fn id(&self) -> u16 {
        self.queue_id()
    }
}

/// The engine's mapping wrapper on UFS: it maps each `AppBuffer` at
/// submission and hands it back only after its unmap (and, lazy, the
/// batch's invalidation) completed.
impl Blk for mcqio::MappedQueuePair<mcqio::ufs::UfsQueuePair<Mapped>> {
    type B = AppBuffer;
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: AppBuffer,
        tag: u64,
    ) -> Result<(), Failure> {
        let r = if write {
            self.write(ufs::LUN, lba, blocks, buf, tag)
        } else {
            self.read(ufs::LUN, lba, blocks, buf, tag)
        };
        r.map_err(|e| e.to_string())
    }
    fn ring(&mut self) {
        self.submit();
    }
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<AppBuffer>>) -> Result<usize, Failure> {
        self.poll(usize::MAX, |c| out.push(c))
            .map_err(|e| e.to_string())
    }
    fn in_flight(&self) -> usize {
        self.outstanding()
    }
    fn id(&self) -> u16 {
        self.queue_pair().and_then(|q| q.hw_queue()).unwrap_or(0)
    }
}
