//! Submission: request checks (LU, range, transfer limit), slot allocation,
//! UTRD and command descriptor (UCD) building, splitting above the
//! per-command limit, and the one doorbell per batch.

use super::{submit_err, LuGeom, UfsQueuePair};
use crate::core::io::{IoBuf, SubmitError, SubmitErrorKind};
use crate::core::qpair::Lifecycle;
use crate::core::qpair::SplitRequest;
use crate::ufs::spec::scsi;
use crate::ufs::spec::utrd::{DataDir, Utrd};
use mcqio_vfio::DmaDir;

impl<B: IoBuf> UfsQueuePair<B> {
    /// Reserve a free slot for a new command and move its command
    /// descriptor to the slot's next base, so that no completion entry of
    /// an earlier command in the slot names this one (`UcdSlice::begin`).
    /// Every command takes its slot here.
    #[inline(always)]
    pub(super) fn alloc_slot(&mut self) -> Option<u16> {
        let slot = self.eng.trackers.alloc()?;
        self.ucds.begin(slot);
        Some(slot)
    }

    /// Every command passes here first, so this is also where an idle
    /// queue reads the clock (`Timeouts::stamp_if_idle`).
    #[inline]
    fn check_range(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
    ) -> std::result::Result<LuGeom, SubmitErrorKind> {
        // Only this pair's own flag (no load through the controller per
        // I/O): a failure another pair found is picked up by the next poll,
        // which then ends whatever was submitted meanwhile.
        // Idle for the application even with map loads in flight.
        self.eng.stamp_if_idle(self.hpb.inflight());
        if self.eng.stopped.is_some() {
            return Err(SubmitErrorKind::ControllerFailed);
        }
        let Some(Some(g)) = self.lus.get(usize::from(lun)).copied() else {
            return Err(SubmitErrorKind::UnknownLun { lun });
        };
        if blocks == 0 {
            return Err(SubmitErrorKind::ZeroLength);
        }
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= g.blocks => Ok(g),
            _ => Err(SubmitErrorKind::LbaOutOfRange {
                slba: lba,
                nlb: u64::from(blocks),
                nsze: g.blocks,
            }),
        }
    }

    /// Read `blocks` logical blocks from `lba` of LU `lun` into `buf`. The
    /// request goes into the ring; [`submit`](Self::submit) or the next
    /// [`poll`](Self::poll) rings the doorbell.
    #[inline]
    pub fn read(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_data(lun, lba, blocks, buf, tag, true)
    }

    /// Write `blocks` logical blocks at `lba` of LU `lun` from `buf`.
    #[inline]
    pub fn write(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<B>> {
        self.submit_data(lun, lba, blocks, buf, tag, false)
    }

    /// The hot path's check of a read or write: LU, a count of 1 to
    /// `unsplit` blocks (no split) and the LBA range, after the idle
    /// clock stamp and the stopped flag. `None` sends the command to the
    /// cold path (`submit_data_cold`), which makes every check in turn and
    /// gives the refusal its reason (as NVMe's `check_unsplit`).
    #[inline(always)]
    fn check_unsplit(&mut self, lun: u8, lba: u64, blocks: u32) -> Option<LuGeom> {
        self.eng.stamp_if_idle(self.hpb.inflight());
        if self.eng.stopped.is_some() {
            return None;
        }
        let Some(Some(g)) = self.lus.get(usize::from(lun)).copied() else {
            return None;
        };
        if blocks.wrapping_sub(1) >= g.unsplit {
            return None;
        }
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= g.blocks => Some(g),
            _ => None,
        }
    }

    /// What is wrong with `buf` for a data command (`read`: the device
    /// writes it): its direction, then whether it is mapped in this
    /// queue's space. The cold paths ask in that order.
    #[inline(always)]
    fn buf_fault(&self, buf: &B, read: bool) -> Option<SubmitErrorKind> {
        if let Err(mapped) = buf.check_dir(read) {
            return Some(wrong_direction(mapped, read));
        }
        if !buf.is_mapped_in(&self.space) {
            return Some(SubmitErrorKind::NotDmaMapped);
        }
        None
    }

    #[inline(always)]
    pub(super) fn submit_data(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let Some(g) = self.check_unsplit(lun, lba, blocks) else {
            return self.submit_data_cold(lun, lba, blocks, buf, tag, read);
        };
        // Direction and space in one compare; the reason on the cold path.
        if !buf.usable_in(&self.space, self.space_key, read) {
            return Err(self.unusable(buf, read));
        }
        self.submit_one(lun, lba, blocks, g, buf, tag, read)
    }

    /// Why `buf` is refused for a data command (`read`: the device writes
    /// it), `buf_fault`'s answer.
    #[cold]
    #[inline(never)]
    fn unusable(&self, buf: B, read: bool) -> SubmitError<B> {
        // `usable_in` is false only when a check fails (`IoBuf`'s
        // contract).
        let k = self
            .buf_fault(&buf, read)
            .unwrap_or(SubmitErrorKind::NotDmaMapped);
        submit_err(k, buf)
    }

    /// `submit_data` for a command its one compare did not pass: every
    /// check in turn (stopped, LU, count, range, direction, mapping), then
    /// a split or a single command.
    #[cold]
    #[inline(never)]
    fn submit_data_cold(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let g = match self.check_range(lun, lba, blocks) {
            Ok(g) => g,
            Err(k) => return Err(submit_err(k, buf)),
        };
        if let Some(k) = self.buf_fault(&buf, read) {
            return Err(submit_err(k, buf));
        }
        let bytes = u64::from(blocks) << g.shift;
        if bytes > self.eng.max_xfer {
            return self.submit_split(lun, lba, blocks, g.shift, buf, tag, read);
        }
        self.submit_one(lun, lba, blocks, g, buf, tag, read)
    }

    /// Post one checked command (at most `max_xfer` bytes): a slot, its
    /// PRDT, its command descriptor, its UTRD, its tracker.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn submit_one(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        g: LuGeom,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let bytes = u64::from(blocks) << g.shift;
        let Some(slot) = self.alloc_slot() else {
            return Err(submit_err(SubmitErrorKind::QueueFull, buf));
        };
        let prdt = match self.ucds.build_prdt(slot, &buf, 0, bytes) {
            Ok(n) => n,
            Err(k) => {
                self.eng.trackers.unreserve(slot);
                return Err(submit_err(k, buf));
            }
        };
        let task_tag = self.tag_base.wrapping_add(slot as u8);
        // `bytes <= max_xfer <= 16 MiB`: fits the 32-bit length field.
        // An HPB READ when the host map holds this block's entry; else the
        // plain READ/WRITE, built straight into the descriptor.
        match (read && g.hpb)
            .then(|| self.hpb.read_cdb(slot, lun, lba, blocks))
            .flatten()
        {
            Some(cdb) => self
                .ucds
                .write_command(slot, lun, task_tag, cdb, bytes as u32, true),
            None => self
                .ucds
                .write_rw(slot, lun, task_tag, lba, blocks, bytes as u32, read),
        }
        let dir = if read {
            DataDir::FromDevice
        } else {
            // HPB: dirtied before the doorbell, and again when it ends.
            self.hpb.dirty_write(slot, lun, lba, blocks);
            DataDir::ToDevice
        };
        self.hwq
            .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
        self.eng.arm(slot, tag, Some(buf));
        Ok(())
    }

    /// A read or write above `max_xfer`: children of at most `max_xfer`
    /// bytes (whole blocks), all or nothing (the core plans them:
    /// `Engine::plan_split`).
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn submit_split(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        shift: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let req = SplitRequest {
            lba,
            blocks,
            shift,
            per_child: (self.eng.max_xfer >> shift).min(u64::from(u32::MAX)),
            tag,
        };
        // Reserve every child's slot (its command descriptor moved to the
        // next base, as `alloc_slot` does) and build its PRDT before
        // anything is posted, so a rejection leaves nothing behind.
        let ucds = &mut *self.ucds;
        let (parent, children) = self.eng.plan_split(req, buf, |c, buf| {
            ucds.begin(c.slot);
            ucds.build_prdt(c.slot, buf, c.offset, c.bytes)
        })?;
        let dir = if read {
            DataDir::FromDevice
        } else {
            self.hpb.dirty(lun, lba, blocks);
            DataDir::ToDevice
        };
        for &(c, prdt) in &children {
            let cdb = if read {
                scsi::read(c.lba, c.blocks, false)
            } else {
                scsi::write(c.lba, c.blocks, false)
            };
            let task_tag = self.tag_base.wrapping_add(c.slot as u8);
            self.ucds
                .write_command(c.slot, lun, task_tag, cdb, c.bytes as u32, read);
            self.hwq
                .post(c.slot, Utrd::new(self.ucds.iova(c.slot), dir, prdt));
            if !read {
                self.hpb.note_write(c.slot, lun, c.lba, c.blocks);
            }
            self.eng.arm_child(c.slot, parent, tag);
        }
        self.eng.armed_split(children);
        Ok(())
    }

    /// A command without a data buffer (or with a parameter list carried in
    /// its own command descriptor).
    /// Returns the slot it went into.
    fn submit_nodata(
        &mut self,
        lun: u8,
        cdb: scsi::Cdb,
        param: Option<&[u8]>,
        tag: u64,
    ) -> std::result::Result<u16, SubmitError<()>> {
        let Some(slot) = self.alloc_slot() else {
            return Err(submit_err(SubmitErrorKind::QueueFull, ()));
        };
        let task_tag = self.tag_base.wrapping_add(slot as u8);
        let (dir, prdt, bytes) = match param {
            Some(p) => {
                let iova = self.ucds.write_param(slot, p);
                let n = self.ucds.param_prdt(slot, iova, p.len() as u32);
                (DataDir::ToDevice, n, p.len() as u32)
            }
            None => (DataDir::None, 0, 0),
        };
        self.ucds
            .write_command(slot, lun, task_tag, cdb, bytes, false);
        self.hwq
            .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
        self.eng.arm(slot, tag, None);
        Ok(slot)
    }

    /// SYNCHRONIZE CACHE(10) of LU `lun`.
    pub fn flush(&mut self, lun: u8, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        if let Err(k) = self.check_range(lun, 0, 1) {
            return Err(submit_err(k, ()));
        }
        self.submit_nodata(lun, scsi::synchronize_cache(), None, tag)
            .map(|_| ())
    }

    /// UNMAP `blocks` blocks from `lba` of LU `lun` (the UFS form of
    /// NVMe's deallocate). The parameter list travels in the command's own
    /// descriptor: no buffer.
    pub fn unmap(
        &mut self,
        lun: u8,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        if let Err(k) = self.check_range(lun, lba, blocks) {
            return Err(submit_err(k, ()));
        }
        self.hpb.dirty(lun, lba, blocks);
        let list = scsi::unmap_list(lba, blocks);
        let slot = self.submit_nodata(lun, scsi::unmap(list.len() as u16), Some(&list), tag)?;
        self.hpb.note_write(slot, lun, lba, blocks);
        Ok(())
    }

    /// Ring the doorbell once for everything queued since the last ring.
    /// Returns whether a doorbell was written.
    #[inline]
    pub fn submit(&mut self) -> bool {
        // One relaxed load per batch: no doorbell once a reset began, until
        // the next poll re-created the queue.
        Lifecycle::submit(self)
    }
}

/// The refusal of a buffer mapped `mapped` for a command that needs the
/// device to write into it (`read`) or read from it.
#[cold]
fn wrong_direction(mapped: DmaDir, read: bool) -> SubmitErrorKind {
    let needs = if read {
        "write into it (read command)"
    } else {
        "read from it (write command)"
    };
    SubmitErrorKind::WrongDirection { mapped, needs }
}
