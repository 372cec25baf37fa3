//! NVMe's half of transfers above the per-command limit (MDTS,
//! [`crate::ControllerOptions::max_transfer`], or 65536 blocks): building
//! each child's SQE and PRPs. The parent table, and the contract (one
//! submission, children in LBA order, one completion with the first error,
//! the buffer back after the last child), are the shared core's
//! (`core/split.rs`).
//!
//! Submission is all or nothing: the children's slots are reserved and
//! their PRPs built before any SQE is written, so a rejection
//! ([`SubmitErrorKind::QueueFull`] when fewer slots are free than children
//! are needed, a PRP rule broken in some child's range) hands the buffer
//! back with nothing sent. [`SubmitErrorKind::TransferTooLarge`] remains
//! for what no split can carry: more children than the queue's depth, or a
//! block larger than the per-command limit.

use super::{QueuePair, STREAM_MIN_OUTSTANDING};
use crate::core::error::Result;
use crate::core::io::{IoBuf, SubmitError};
use crate::core::qpair::SplitRequest;
use crate::nvme::spec::sqe::MAX_NLB;
use crate::nvme::spec::Sqe;

/// The SQE of one child: the parent's command (opcode, flags, namespace)
/// over `nlb` blocks from `slba`.
#[inline]
fn child_sqe(parent: Sqe, slba: u64, nlb: u32) -> Sqe {
    let mut s = parent;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    // NLB is 0's based; 1 <= nlb <= MAX_NLB here.
    s.cdw12 = (parent.cdw12 & !0xFFFF) | (nlb - 1);
    s
}

impl<B: IoBuf> QueuePair<B> {
    /// Submit a read or write above the per-command limit as children (see
    /// the module docs). `sqe` is the whole command, already checked
    /// (namespace, range, direction, mapping). Cold: off the per-I/O path
    /// of transfers that fit one command.
    #[cold]
    #[inline(never)]
    pub(super) fn submit_split(
        &mut self,
        sqe: Sqe,
        lba_shift: u32,
        slba: u64,
        nlb: u32,
        buf: B,
        tag: u64,
    ) -> Result<(), SubmitError<B>> {
        let per_child = (self.eng.max_xfer >> lba_shift).min(MAX_NLB as u64);
        let req = SplitRequest {
            lba: slba,
            blocks: nlb,
            shift: lba_shift,
            per_child,
            tag,
        };
        // Reserve every slot and build every PRP list before anything
        // reaches the SQ: a rejection must leave nothing half-submitted.
        let prp = self.prp;
        let (p, children) = self
            .eng
            .plan_split(req, buf, |c, buf| prp.build(buf, c.offset, c.bytes, c.slot))?;
        for (c, (prp1, prp2)) in &children {
            let cid = self.eng.trackers.slot(c.slot).cid();
            let child = child_sqe(sqe, c.lba, c.blocks);
            let stream = self.eng.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
            self.sq
                .push_with(child.with_cid(cid).with_prp(*prp1, *prp2), stream);
            self.eng.arm_child(c.slot, p, tag);
        }
        self.eng.armed_split(children);
        Ok(())
    }
}
