//! What the NVMe and UFS job queues share: one DMA region per job,
//! allocated and mapped once (premapped mode) and cut into one [`SlotBuf`]
//! per slot, and [`BlockJobQueue`], the job queue over any queue pair of
//! the engine ([`BlockQueue`], whatever the wire).
//!
//! The queue pair moves a [`SlotBuf`] (the engine's [`DmaSlice`]: the
//! slice's IOVA and length) instead of a [`DmaBuf`] (which carries an `Arc`
//! of its region), so a submission copies no reference count and the
//! completion hands nothing back that must be stored; nothing is allocated
//! or mapped per I/O.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use mcqio::core::block::BlockQueue;
use mcqio::{Completion, DmaBuf, DmaSlice, IoError, SubmitErrorKind};
use mcqio_vfio::{DmaDir, DmaSpace};

use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::workload::Op;

/// One slot's slice of a job's premapped region, as the queue pair moves
/// it: the engine's [`DmaSlice`].
///
/// Every `SlotBuf` lives in a job queue (in its slot table or inside its
/// queue pair). The queue closes its queue pair before it frees the region
/// the slices point into, and frees it only if every slice came back: a
/// completion without its buffer (a fatal controller that could not be
/// disabled, or a queue whose deletion failed) means the device may still
/// access that slice, and then the region is leaked, never unmapped or
/// reused ([`SlotBuffers::release`]). Such a completion reaches the job as
/// [`IoStatus::Lost`], and the job never uses that slot again.
pub(crate) type SlotBuf = DmaSlice;

/// A job's premapped buffers: `depth` slots of `buf_len` bytes in one
/// region.
pub(crate) struct SlotBuffers {
    pub(crate) bufs: Vec<SlotBuf>,
    pub(crate) ptrs: Vec<NonNull<u8>>,
    pub(crate) buf_len: usize,
    region: ManuallyDrop<DmaBuf>,
}

impl SlotBuffers {
    /// Allocate and map `depth` slots of `buf_len` bytes in `space`.
    pub(crate) fn alloc(
        space: &std::sync::Arc<DmaSpace>,
        depth: usize,
        buf_len: usize,
    ) -> Result<Self, String> {
        let region = DmaBuf::alloc(space, depth * buf_len, DmaDir::Bidirectional).map_err(|e| {
            format!(
                "cannot allocate {} bytes of DMA buffers: {e}",
                depth * buf_len
            )
        })?;
        let bufs = (0..depth)
            // SAFETY: slot i is inside the region, mapped Bidirectional in
            // `space`; the region is freed only when every slice came back
            // (else leaked: `release`), and the job touches a slot's bytes
            // only through raw pointers while it is not in flight.
            .map(|i| unsafe {
                DmaSlice::new(
                    space,
                    region.iova().add((i * buf_len) as u64),
                    buf_len,
                    DmaDir::Bidirectional,
                )
            })
            .collect();
        let ptrs = (0..depth)
            // SAFETY: i * buf_len < depth * buf_len <= the region's length.
            .map(|i| unsafe { region.as_ptr().add(i * buf_len) })
            .collect();
        Ok(SlotBuffers {
            bufs,
            ptrs,
            buf_len,
            region: ManuallyDrop::new(region),
        })
    }

    /// Free the region, or leak it when the device may still access it.
    /// Called once, by the owner's `Drop`.
    pub(crate) fn release(&mut self, lost: bool) {
        if lost {
            eprintln!(
                "mcqio-perf: the device may still access this job's buffers; leaking {} bytes",
                self.region.len()
            );
            return;
        }
        // SAFETY: called once, from the owner's Drop; every SlotBuf came
        // back, so the device accesses none of the region any more.
        unsafe { ManuallyDrop::drop(&mut self.region) };
    }
}

/// The job's view of a completion of one of its reads or writes (every
/// one carries its slot's buffer): [`IoStatus::Lost`] when the buffer did
/// not come back, so the job never uses that slot again.
#[inline]
pub(crate) fn status_of(c: &Completion<SlotBuf>) -> IoStatus {
    let failure = match c.result {
        Ok(()) if c.buf.is_some() => return IoStatus::Ok,
        Err(e) if c.buf.is_some() => return IoStatus::Failed(failure_of(e)),
        Err(e) => failure_of(e),
        // Not a promise the engine makes; treated as the failure it would be.
        Ok(()) => Failure::Host(IoError::ControllerFailed),
    };
    lost(failure)
}

#[inline]
fn failure_of(e: IoError) -> Failure {
    match e {
        IoError::Nvme(s) => Failure::Nvme(s),
        e => Failure::Host(e),
    }
}

/// A completion whose buffer did not come back: the queue's memory may
/// still be accessed by the device (`device_may_access`), and the job
/// retires the slot.
#[cold]
#[inline(never)]
fn deliver_lost<F: FnMut(usize, IoStatus)>(lost: &mut bool, done: &mut F, tag: u64, why: Failure) {
    *lost = true;
    done(tag as usize, IoStatus::Lost(why));
}

#[cold]
fn lost(f: Failure) -> IoStatus {
    IoStatus::Lost(f)
}

/// The job's view of a refused submission.
#[inline]
pub(crate) fn push_err(k: SubmitErrorKind) -> PushError {
    match k {
        SubmitErrorKind::QueueFull => PushError::Full,
        k => PushError::Rejected(k.to_string()),
    }
}

/// One job's own queue pair (NVMe or UFS, resolved at compile time) and
/// its premapped buffers.
pub struct BlockJobQueue<Q: BlockQueue<Buf = SlotBuf>> {
    // Dropped by hand: the queue pair (holding in-flight SlotBufs) closes
    // first, then the region is freed or leaked.
    pub(crate) qp: ManuallyDrop<Q>,
    pub(crate) at: Q::Addr,
    /// A completion came without its buffer: the device may still access
    /// that slot, so the region must never be freed.
    device_may_access: bool,
    pub(crate) mem: SlotBuffers,
}

impl<Q: BlockQueue<Buf = SlotBuf>> BlockJobQueue<Q> {
    /// The job queue of `qp`, its commands addressed to `at`.
    pub(crate) fn new(qp: Q, at: Q::Addr, mem: SlotBuffers) -> Self {
        BlockJobQueue {
            qp: ManuallyDrop::new(qp),
            at,
            device_may_access: false,
            mem,
        }
    }
}

impl<Q: BlockQueue<Buf = SlotBuf>> Drop for BlockJobQueue<Q> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here, and never used again.
        let qp = unsafe { ManuallyDrop::take(&mut self.qp) };
        let mut lost = self.device_may_access;
        // Every outstanding command ends exactly once in `close`; one
        // without its buffer is still the device's.
        let _ = qp.close(|c| lost |= c.buf.is_none());
        self.mem.release(lost);
    }
}

impl<Q: BlockQueue<Buf = SlotBuf>> JobQueue for BlockJobQueue<Q> {
    fn depth(&self) -> usize {
        self.mem.bufs.len().min(self.qp.depth())
    }

    fn buffer_len(&self) -> usize {
        self.mem.buf_len
    }

    #[inline]
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        self.mem.ptrs[slot]
    }

    // Always inlined into the job loop: as a call, its
    // prologue, epilogue and the result returned through memory cost 20 of
    // the ~170 instructions a push took.
    #[inline(always)]
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        let buf = self.mem.bufs[slot];
        let r = match req.op {
            Op::Read => self.qp.read(self.at, req.slba, req.nlb, buf, slot as u64),
            Op::Write => self.qp.write(self.at, req.slba, req.nlb, buf, slot as u64),
        };
        r.map_err(|e| push_err(e.kind))
    }

    #[inline]
    fn submit(&mut self, _inflight: usize) -> Result<(), QueueError> {
        self.qp.submit();
        Ok(())
    }

    #[inline(always)]
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        let lost = &mut self.device_may_access;
        // The callback inlined into the engine's reaping loop: as a call it
        // takes each completion through memory. `move`: it holds
        // `done` itself, not its address. A buffer that did not come back
        // is rare: a branch, not a flag or-ed in at every completion.
        self.qp
            .poll(
                usize::MAX,
                #[inline(always)]
                move |c| {
                    // A lost buffer (`IoStatus::Lost`) is delivered by a
                    // cold call of its own, so the inlined `done` below
                    // knows the status is not `Lost`: with one `done` for
                    // both, the buffer was tested twice per completion,
                    // once for the flag and once in the job.
                    match status_of(&c) {
                        IoStatus::Lost(why) => deliver_lost(lost, &mut done, c.tag, why),
                        status => done(c.tag as usize, status),
                    }
                },
            )
            .map_err(|e| QueueError(e.to_string()))
    }

    fn wait<F: FnMut(usize, IoStatus)>(
        &mut self,
        timeout: std::time::Duration,
        mut done: F,
    ) -> Result<usize, QueueError> {
        let lost = &mut self.device_may_access;
        self.qp
            .wait(usize::MAX, Some(timeout), |c| {
                *lost |= c.buf.is_none();
                done(c.tag as usize, status_of(&c));
            })
            .map_err(|e| QueueError(e.to_string()))
    }

    fn counters(&self) -> Option<mcqio::QueueCounters> {
        Some(self.qp.counters())
    }
}
