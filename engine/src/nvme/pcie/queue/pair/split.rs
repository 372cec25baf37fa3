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

use super::*;

/// NVMe's record per child being built (the shared parent table's `S`):
/// slot, PRP1, PRP2.
pub(super) type SplitChild = (u16, u64, u64);

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
        let bytes = (nlb as u64) << lba_shift;
        let per_child = (self.eng.max_xfer >> lba_shift).min(MAX_NLB as u64);
        let depth = self.eng.trackers.depth() as u64;
        let children = if per_child == 0 {
            // A single block is larger than one command may carry.
            u64::MAX
        } else {
            (nlb as u64).div_ceil(per_child)
        };
        if children > depth {
            // A block above the per-command limit (a namespace marked
            // unusable) reports that limit, not 0.
            let max = match per_child {
                0 => self.eng.max_xfer,
                n => (n << lba_shift).saturating_mul(depth),
            };
            return Err(SubmitError {
                kind: SubmitErrorKind::TransferTooLarge { bytes, max },
                buf,
            });
        }
        let available = buf.total_len() as u64;
        if available < bytes {
            return Err(SubmitError {
                kind: SubmitErrorKind::BufferTooSmall {
                    needed: bytes,
                    available,
                },
                buf,
            });
        }
        if self.eng.trackers.depth() - self.eng.trackers.outstanding() < children as usize {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        // Reserve every slot and build every PRP list before anything
        // reaches the SQ: a rejection must leave nothing half-submitted.
        let mut scratch = std::mem::take(&mut self.eng.splits.scratch);
        scratch.clear();
        let child_bytes = per_child << lba_shift;
        let mut failed = None;
        for i in 0..children {
            let Some(slot) = self.eng.trackers.alloc() else {
                failed = Some(SubmitErrorKind::QueueFull);
                break;
            };
            let off = i * child_bytes;
            let len = child_bytes.min(bytes - off);
            match self.build_prp(&buf, off, len, slot) {
                Ok((prp1, prp2)) => scratch.push((slot, prp1, prp2)),
                Err(kind) => {
                    self.eng.trackers.unreserve(slot);
                    failed = Some(kind);
                    break;
                }
            }
        }
        if let Some(kind) = failed {
            for &(slot, _, _) in scratch.iter().rev() {
                self.eng.trackers.unreserve(slot);
            }
            self.eng.splits.scratch = scratch;
            return Err(SubmitError { kind, buf });
        }
        let p = match self.eng.splits.start(tag, buf, children as u32) {
            Ok(p) => p,
            Err(buf) => {
                // Unreachable: every parent in flight holds at least one of
                // the `depth` slots, and `children` slots were free.
                for &(slot, _, _) in scratch.iter().rev() {
                    self.eng.trackers.unreserve(slot);
                }
                self.eng.splits.scratch = scratch;
                return Err(SubmitError {
                    kind: SubmitErrorKind::QueueFull,
                    buf,
                });
            }
        };
        for (i, &(slot, prp1, prp2)) in scratch.iter().enumerate() {
            let i = i as u64;
            let len = child_bytes.min(bytes - i * child_bytes);
            let cid = self.eng.trackers.slot(slot).cid;
            let child = child_sqe(sqe, slba + i * per_child, (len >> lba_shift) as u32);
            let stream = self.eng.trackers.outstanding() > STREAM_MIN_OUTSTANDING;
            self.sq
                .push_with(child.with_cid(cid).with_prp(prp1, prp2), stream);
            self.eng.splits.link(slot, p);
            self.eng
                .trackers
                .arm(slot, tag, None, self.eng.timeouts.now_ms);
        }
        self.eng.submitted += children;
        self.eng.splits.scratch = scratch;
        Ok(())
    }
}
