//! Submission: request checks, SQEs into the ring, the SQ tail doorbell
//! (one per batch); NVMe-only commands (Flush, Write Zeroes, Dataset
//! Management).

use super::{QueuePair, STREAM_MIN_OUTSTANDING};
use crate::core::error::Result;
use crate::core::io::{IoBuf, SubmitError, SubmitErrorKind};
use crate::core::qpair::Lifecycle;
use crate::nvme::spec::sqe::{
    Command, DatasetManagement, DsmRange, Flush, Read, Write, WriteZeroes, DSM_MAX_RANGES, MAX_NLB,
};
use crate::nvme::spec::Sqe;
use mcqio_vfio::DmaDir;

impl<B: IoBuf> QueuePair<B> {
    /// Read `nlb` blocks from `slba` of namespace `nsid` into `buf`.
    ///
    /// The SQE is written to the ring; the doorbell is rung by
    /// [`submit`](Self::submit) or the next [`poll`](Self::poll).
    #[inline]
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        self.submit_read(Read::new(nsid, slba, nlb), buf, tag)
    }

    /// Write `nlb` blocks at `slba` of namespace `nsid` from `buf`.
    #[inline]
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        self.submit_write(Write::new(nsid, slba, nlb), buf, tag)
    }

    /// Submit a [`Read`] built with options (FUA, limited retry).
    #[inline]
    pub fn submit_read(&mut self, cmd: Read, buf: B, tag: u64) -> Result<(), SubmitError<B>> {
        self.submit_data(cmd, cmd.nsid(), cmd.slba(), cmd.nlb(), buf, tag, true)
    }

    /// Submit a [`Write`] built with options (FUA, limited retry).
    #[inline]
    pub fn submit_write(&mut self, cmd: Write, buf: B, tag: u64) -> Result<(), SubmitError<B>> {
        self.submit_data(cmd, cmd.nsid(), cmd.slba(), cmd.nlb(), buf, tag, false)
    }

    // Always inlined into `read`/`write`: the call's register saves are
    // stores, and on a busy queue the submitting core waits on its store
    // buffer (SQE and doorbell lines shared with the device). The command
    // is encoded only where its SQE is written: an `Sqe` argument was
    // built in memory before the checks, for the cold path's sake, and
    // then written again from registers.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn submit_data<C: Command>(
        &mut self,
        cmd: C,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
        device_writes: bool,
    ) -> Result<(), SubmitError<B>> {
        let Some(bytes) = self.check_unsplit(nsid, slba, nlb) else {
            return self.submit_data_cold(cmd, nsid, slba, nlb, buf, tag, device_writes);
        };
        // Direction and space in one compare; the reason on the cold path.
        if !buf.usable_in(&self.space, self.space_key, device_writes) {
            return Err(self.unusable(buf, device_writes));
        }
        self.submit_one(cmd, bytes, buf, tag)
    }

    /// Why `buf` is refused for a data command (`device_writes`: a
    /// read): its direction, then its space, the order the cold path
    /// checks them in.
    #[cold]
    #[inline(never)]
    fn unusable(&self, buf: B, device_writes: bool) -> SubmitError<B> {
        if let Err(mapped) = buf.check_dir(device_writes) {
            return wrong_direction(mapped, device_writes, buf);
        }
        // `usable_in` is false only when a check fails (`IoBuf`'s
        // contract): this one.
        SubmitError {
            kind: SubmitErrorKind::NotDmaMapped,
            buf,
        }
    }

    /// `submit_data` for a command its one compare did not pass: every
    /// check in turn (stopped, namespace, count, range, metadata,
    /// direction, mapping), then a split or a single command.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn submit_data_cold<C: Command>(
        &mut self,
        cmd: C,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
        device_writes: bool,
    ) -> Result<(), SubmitError<B>> {
        let g = match self.check_range(nsid, slba, nlb) {
            Ok(g) => g,
            Err(kind) => return Err(SubmitError { kind, buf }),
        };
        if g.metadata {
            return Err(SubmitError {
                kind: SubmitErrorKind::Unsupported(
                    "data transfers on a namespace formatted with metadata",
                ),
                buf,
            });
        }
        if let Err(mapped) = buf.check_dir(device_writes) {
            return Err(wrong_direction(mapped, device_writes, buf));
        }
        if !buf.is_mapped_in(&self.space) {
            return Err(SubmitError {
                kind: SubmitErrorKind::NotDmaMapped,
                buf,
            });
        }
        let bytes = (nlb as u64) << g.lba_shift;
        if nlb > MAX_NLB || bytes > self.eng.max_xfer {
            return self.submit_split(cmd.sqe(), g.lba_shift, slba, nlb, buf, tag);
        }
        self.submit_one(cmd, bytes, buf, tag)
    }

    /// Post one checked command of `bytes` bytes: a slot, its PRPs, its
    /// tracker, its SQE.
    #[inline(always)]
    fn submit_one<C: Command>(
        &mut self,
        cmd: C,
        bytes: u64,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        // Where an idle queue reads the clock (`Engine::reserve`).
        let Some(slot) = self.eng.reserve() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        };
        let (prp1, prp2) = match self.prp.build(&buf, 0, bytes, slot) {
            Ok(p) => p,
            Err(kind) => {
                self.eng.trackers.unreserve(slot);
                return Err(SubmitError { kind, buf });
            }
        };
        // Armed first (the device sees nothing before the doorbell): the
        // slot is looked up once for its CID and its state.
        let cid = self.eng.arm(slot, tag, Some(buf));
        let stream = self.eng.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
        self.sq
            .push_with(cmd.sqe().with_cid(cid).with_prp(prp1, prp2), stream);
        Ok(())
    }

    #[inline]
    pub(super) fn submit_no_data(&mut self, sqe: Sqe, tag: u64) -> Result<(), SubmitError<()>> {
        self.stamp_if_idle();
        let Some(slot) = self.eng.trackers.alloc() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf: (),
            });
        };
        let cid = self.eng.trackers.slot(slot).cid();
        let stream = self.eng.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
        self.sq.push_with(sqe.with_cid(cid), stream);
        self.eng.arm(slot, tag, None);
        Ok(())
    }

    /// Flush the volatile write cache of namespace `nsid`.
    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        if self.eng.stopped.is_some() {
            return err(SubmitErrorKind::ControllerFailed);
        }
        if self.geom(nsid).is_none() {
            return err(SubmitErrorKind::UnknownNamespace { nsid });
        }
        self.submit_no_data(Flush::new(nsid).sqe(), tag)
    }

    /// Write zeroes to `nlb` blocks from `slba` (no data buffer).
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        if let Err(k) = self.check_range(nsid, slba, nlb) {
            return err(k);
        }
        if nlb > MAX_NLB {
            return err(SubmitErrorKind::TransferTooLarge {
                bytes: nlb as u64,
                max: MAX_NLB as u64,
            });
        }
        if self.oncs & crate::nvme::spec::identify::oncs::WRITE_ZEROES == 0 {
            return err(SubmitErrorKind::Unsupported("Write Zeroes (ONCS bit 3)"));
        }
        self.submit_no_data(WriteZeroes::new(nsid, slba, nlb).sqe(), tag)
    }

    /// Deallocate (TRIM) the `(slba, nlb)` ranges with one Dataset
    /// Management command. The range list goes into the command's
    /// pre-allocated page: no buffer needed.
    pub fn deallocate(
        &mut self,
        nsid: u32,
        ranges: &[(u64, u32)],
        tag: u64,
    ) -> Result<(), SubmitError<()>> {
        let err = |kind| Err(SubmitError { kind, buf: () });
        self.stamp_if_idle();
        if self.eng.stopped.is_some() {
            return err(SubmitErrorKind::ControllerFailed);
        }
        if self.geom(nsid).is_none() {
            return err(SubmitErrorKind::UnknownNamespace { nsid });
        }
        if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
            return err(SubmitErrorKind::BadRangeCount {
                count: ranges.len(),
            });
        }
        for &(slba, nlb) in ranges {
            if let Err(k) = self.check_range(nsid, slba, nlb) {
                return err(k);
            }
        }
        if self.oncs & crate::nvme::spec::identify::oncs::DATASET_MANAGEMENT == 0 {
            return err(SubmitErrorKind::Unsupported(
                "Dataset Management (ONCS bit 2)",
            ));
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return err(SubmitErrorKind::QueueFull);
        };
        let w = self.prp.writer(slot);
        let list = w.list.cast::<DsmRange>();
        for (i, &(slba, nlb)) in ranges.iter().enumerate() {
            // SAFETY: at most 256 ranges of 16 bytes: inside the slot's first
            // 4 KiB list page (live DMA memory owned by the queue, not read
            // by the device before the doorbell).
            unsafe {
                list.add(i).write_volatile(DsmRange {
                    cattr: 0,
                    nlb,
                    slba,
                })
            };
        }
        let cid = self.eng.trackers.slot(slot).cid();
        let sqe = DatasetManagement::new(nsid, ranges.len() as u16)
            .deallocate()
            .sqe()
            .with_cid(cid)
            .with_prp(w.list_iova, 0);
        self.sq.push(sqe);
        self.eng.arm(slot, tag, None);
        Ok(())
    }

    /// Ring the SQ tail doorbell once for every command queued since the
    /// last ring. Returns whether the doorbell was rung: `false` when there
    /// was nothing to ring, when the queue failed, and also when the
    /// controller was reset or failed since this queue last looked — the
    /// reset deleted the queue, so its doorbell must not be written; the
    /// next [`poll`](Self::poll) completes the queued commands (with [`IoError::AbortedByReset`](crate::core::io::IoError::AbortedByReset) or
    /// [`IoError::ControllerFailed`](crate::core::io::IoError::ControllerFailed)) and re-creates the queue. One relaxed
    /// load per batch. A reset that starts between that load and the
    /// doorbell store is not caught: the store then reaches a controller
    /// that has no such queue (it ignores the store or reports an invalid
    /// doorbell write as an asynchronous event); no command is lost.
    #[inline]
    pub fn submit(&mut self) -> bool {
        Lifecycle::submit(self)
    }
}

/// The refusal of a buffer mapped `mapped` for a command that needs the
/// device to write into it (`device_writes`, a read) or read from it.
#[cold]
fn wrong_direction<B>(mapped: DmaDir, device_writes: bool, buf: B) -> SubmitError<B> {
    let needs = if device_writes {
        "write into it (read command)"
    } else {
        "read from it (write command)"
    };
    SubmitError {
        kind: SubmitErrorKind::WrongDirection { mapped, needs },
        buf,
    }
}
