//! Submission: request checks, a command's capsule into the send queue
//! (`ring` sends the batch), splits queued all or nothing, Flush and
//! Dataset Management.

use super::data::{capsule_pieces, queue_capsule};
use super::{Cmd, Kind, TcpQueuePair, HEADER_ROOM};
use crate::core::io::Completion;
use crate::core::io::{IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::qpair::Addressed;
use crate::core::qpair::SplitRequest;
use crate::nvme::host::nvm::check_blocks;
use crate::nvme::spec::sqe::Command;
use crate::nvme::spec::sqe::MAX_NLB;
use crate::nvme::spec::sqe::{DatasetManagement, DsmRange, Flush, Read, Write};
use crate::nvme::spec::Sqe;
use crate::nvme::tcp::digest::DataDigest;
use crate::nvme::tcp::fabrics::FabricsSqe;
use crate::nvme::tcp::fabrics::SglDescriptor;
use crate::nvme::tcp::pdu;
use mcqio_vfio::DmaSpace;
use std::sync::Arc;

impl<B: IoBuf> TcpQueuePair<B> {
    /// Queue a command that the engine does not split.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_one(
        &mut self,
        sqe: Sqe,
        kind: Kind,
        len: u32,
        buf: Option<&B>,
        slot: u16,
    ) -> bool {
        let cid = self.eng.trackers.slot(slot).cid();
        let sqe = sqe.with_cid(cid);
        let Self { tx, conn, cmds, .. } = self;
        let cmd = &mut cmds[usize::from(slot)];
        if queue_capsule(tx, conn, cmd, sqe, kind, len, 0, buf) {
            return true;
        }
        // Full: send what is queued, then try once more.
        if tx.flush(&conn.sock).is_err() {
            return false;
        }
        queue_capsule(tx, conn, cmd, sqe, kind, len, 0, buf)
    }

    /// A read or write above the per-command limit, as children: planned
    /// and refused all or nothing by the engine, then queued all or
    /// nothing here. Room for every child's capsule is checked before the
    /// plan (with the rule `queue_capsule` uses, `capsule_pieces`); should
    /// a child still not queue, what the others queued is taken back out
    /// of the send queue (none of it was sent), every slot is freed and
    /// the request is refused with [`SubmitErrorKind::QueueFull`], its
    /// buffer back — never a child left unsent with its parent waiting.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        shift: u32,
        limit: u64,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let per_child = limit >> shift;
        let children = if per_child == 0 {
            0
        } else {
            u64::from(blocks).div_ceil(per_child) as usize
        };
        let in_capsule = self.in_capsule;
        let kind_of = |len: u64| {
            if read {
                Kind::Read
            } else if len as usize <= in_capsule {
                Kind::WriteInCapsule
            } else {
                Kind::WriteR2t
            }
        };
        // Any write child may go in the capsule (the last may be short).
        let widest = if read {
            Kind::Read
        } else {
            Kind::WriteInCapsule
        };
        let pieces = capsule_pieces(widest, buf.segment_count());
        let _ = self.flush_tx();
        if children > 0 && !self.tx.room(children * HEADER_ROOM, children * pieces) {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        let r = SplitRequest {
            lba,
            blocks,
            shift,
            per_child,
            tag,
        };
        let (p, plan) = self.eng.plan_split(r, buf, |_, _| Ok(()))?;
        let mark = self.tx.mark();
        let mut all = true;
        for (c, ()) in &plan {
            #[cfg(test)]
            let refused = self.fail_child == Some(c.lba);
            #[cfg(not(test))]
            let refused = false;
            let len = c.bytes as u32;
            let kind = kind_of(c.bytes);
            let cid = self.eng.trackers.slot(c.slot).cid();
            let sqe = if read {
                Read::new(nsid, c.lba, c.blocks).sqe()
            } else {
                Write::new(nsid, c.lba, c.blocks).sqe()
            }
            .with_cid(cid);
            let Self {
                tx,
                conn,
                cmds,
                eng,
                ..
            } = self;
            let b = eng.splits.buf_of(p);
            let cmd = &mut cmds[usize::from(c.slot)];
            if refused || !queue_capsule(tx, conn, cmd, sqe, kind, len, c.offset, b) {
                all = false;
                break;
            }
        }
        if !all {
            return Err(self.unplan_split(p, plan, mark));
        }
        for (c, ()) in &plan {
            if !read && c.bytes as usize <= self.in_capsule {
                self.stats.in_capsule_writes += 1;
            }
            self.eng.arm_child(c.slot, p, tag);
        }
        self.eng.armed_split(plan);
        Ok(())
    }

    /// Take back a split whose children did not all queue: out of the send
    /// queue, every slot free, the parent ended; the refusal with the
    /// buffer.
    #[cold]
    #[inline(never)]
    pub(super) fn unplan_split(
        &mut self,
        p: u16,
        plan: Vec<(crate::core::qpair::Child, ())>,
        mark: crate::nvme::tcp::conn::TxMark,
    ) -> SubmitError<B> {
        if !self.tx.roll_back(mark) {
            // Sent already (not possible: nothing flushes in between):
            // the bytes are on the wire; the connection cannot go on.
            log::error!(
                "nvme-tcp queue {}: a split's capsules left before all were queued",
                self.qid
            );
            self.conn.close();
        }
        let mut back = None;
        for (c, ()) in &plan {
            self.eng.trackers.unreserve(c.slot);
            if let Some((_, buf, _)) = self.eng.splits.child_done(c.slot, p, Err(IoError::Aborted))
            {
                back = buf;
            }
        }
        self.eng.armed_split(plan);
        log::warn!(
            "nvme-tcp queue {}: a split's children did not all fit the send queue; refused",
            self.qid
        );
        match back {
            Some(buf) => SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            },
            None => unreachable!("the last child of a parent hands its buffer back"),
        }
    }

    /// Queue a command with no data of the caller's (Flush, DSM).
    pub(super) fn queue_internal_data(
        &mut self,
        sqe: Sqe,
        data: Option<&[u8]>,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        let refuse = |kind| Err(SubmitError { kind, buf: () });
        if self.eng.stopped.is_some() {
            return refuse(SubmitErrorKind::ControllerFailed);
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return refuse(SubmitErrorKind::QueueFull);
        };
        let ok = match data {
            None => self.queue_one(sqe, Kind::NoData, 0, None, slot),
            Some(d) => {
                // Data from the arena, in the capsule.
                let cid = self.eng.trackers.slot(slot).cid();
                let sqe = sqe
                    .with_cid(cid)
                    .with_sgl(SglDescriptor::in_capsule(0, d.len() as u32));
                let neg = self.conn.neg;
                let tx = &mut self.tx;
                if !tx.room(HEADER_ROOM + d.len(), 3) {
                    false
                } else {
                    let h = tx.header(|b| {
                        pdu::write_capsule_cmd_header(b, &sqe, d.len(), &neg).map(|l| l.pdo)
                    });
                    let body = tx.header(|b: &mut [u8]| -> std::result::Result<usize, ()> {
                        b[..d.len()].copy_from_slice(d);
                        Ok(d.len())
                    });
                    if neg.digests.data {
                        let mut g = DataDigest::new();
                        g.update(d);
                        tx.digest(&g);
                    }
                    self.cmds[usize::from(slot)] = Cmd {
                        data_done_at: tx.queued,
                        ..Cmd::default()
                    };
                    h.is_ok() && body.is_ok()
                }
            }
        };
        if !ok {
            self.eng.trackers.unreserve(slot);
            return refuse(SubmitErrorKind::QueueFull);
        }
        self.eng.arm(slot, tag, None);
        Ok(())
    }
}

/// NVMe/TCP's submission API is the shared block interface: its reads,
/// writes, Flush and Dataset Management are `Addressed`'s (there is no
/// inherent `read`/`write`, unlike the PCIe queue pair).
impl<B: IoBuf> Addressed for TcpQueuePair<B> {
    type Addr = u32;

    fn read_write(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let refuse = |kind, buf| Err(SubmitError { kind, buf });
        if self.eng.stopped.is_some() {
            return refuse(SubmitErrorKind::ControllerFailed, buf);
        }
        let Some(g) = self.geom(nsid) else {
            return refuse(SubmitErrorKind::UnknownNamespace { nsid }, buf);
        };
        if let Err(kind) = check_blocks(lba, blocks, g.nsze) {
            return refuse(kind, buf);
        }
        let bytes = u64::from(blocks) << g.shift;
        if !g.usable {
            return refuse(
                SubmitErrorKind::TransferTooLarge {
                    bytes: 1 << g.shift,
                    max: self.eng.max_xfer,
                },
                buf,
            );
        }
        let available = buf.total_len() as u64;
        if available < bytes {
            return refuse(
                SubmitErrorKind::BufferTooSmall {
                    needed: bytes,
                    available,
                },
                buf,
            );
        }
        if let Err(mapped) = buf.check_dir(read) {
            let needs = if read {
                "write into the buffer"
            } else {
                "read from the buffer"
            };
            return refuse(SubmitErrorKind::WrongDirection { mapped, needs }, buf);
        }
        if (0..buf.segment_count()).any(|i| buf.segment_host(i).is_none()) {
            // A socket copies: a buffer without a host view cannot be moved.
            return refuse(SubmitErrorKind::NotDmaMapped, buf);
        }
        let limit = self.limit_for(g.shift);
        if bytes > limit {
            return self.split(nsid, lba, blocks, g.shift, limit, buf, tag, read);
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return refuse(SubmitErrorKind::QueueFull, buf);
        };
        let (sqe, kind) = if read {
            (Read::new(nsid, lba, blocks).sqe(), Kind::Read)
        } else if bytes as usize <= self.in_capsule {
            (Write::new(nsid, lba, blocks).sqe(), Kind::WriteInCapsule)
        } else {
            (Write::new(nsid, lba, blocks).sqe(), Kind::WriteR2t)
        };
        if !self.queue_one(sqe, kind, bytes as u32, Some(&buf), slot) {
            self.eng.trackers.unreserve(slot);
            return refuse(SubmitErrorKind::QueueFull, buf);
        }
        if kind == Kind::WriteInCapsule {
            self.stats.in_capsule_writes += 1;
        }
        self.eng.stamp_if_idle(0);
        self.eng.arm(slot, tag, Some(buf));
        Ok(())
    }

    fn flush_at(&mut self, nsid: u32, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        if self.geom(nsid).is_none() {
            return Err(SubmitError {
                kind: SubmitErrorKind::UnknownNamespace { nsid },
                buf: (),
            });
        }
        self.eng.stamp_if_idle(0);
        self.queue_internal_data(Flush::new(nsid).sqe(), None, tag)
    }

    fn deallocate_at(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        let refuse = |kind| Err(SubmitError { kind, buf: () });
        let Some(g) = self.geom(nsid) else {
            return refuse(SubmitErrorKind::UnknownNamespace { nsid });
        };
        if let Err(kind) = check_blocks(lba, blocks, g.nsze) {
            return refuse(kind);
        }
        let range = DsmRange {
            cattr: 0,
            nlb: blocks,
            slba: lba,
        };
        let mut bytes = [0u8; 16];
        bytes[4..8].copy_from_slice(&range.nlb.to_le_bytes());
        bytes[8..16].copy_from_slice(&range.slba.to_le_bytes());
        self.eng.stamp_if_idle(0);
        self.queue_internal_data(
            DatasetManagement::new(nsid, 1).deallocate().sqe(),
            Some(&bytes),
            tag,
        )
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

    fn finish<F: FnMut(Completion<B>)>(self, f: F) -> crate::core::error::Result<()> {
        self.close(f)
    }
}
