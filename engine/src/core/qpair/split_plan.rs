//! The split planner: a read or write above the per-command limit planned,
//! reserved and refused all or nothing, once for every wire (the parent
//! table itself is `core::split_table`).

use super::Engine;
use crate::core::io::{IoBuf, SubmitError, SubmitErrorKind};

/// One child of a split transfer, as the core planned it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Child {
    /// Its tracker slot (reserved).
    pub slot: u16,
    /// Its first block.
    pub lba: u64,
    /// Its blocks.
    pub blocks: u32,
    /// Its byte range in the parent's buffer.
    pub offset: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// A read or write above the per-command limit (see `crate::core::split_table`).
#[derive(Copy, Clone, Debug)]
pub(crate) struct SplitRequest {
    /// First block of the whole transfer.
    pub lba: u64,
    /// Its blocks.
    pub blocks: u32,
    /// log2 of the block size.
    pub shift: u32,
    /// The most blocks one child may carry (0: one block is already above
    /// the per-command limit).
    pub per_child: u64,
    /// The caller's tag.
    pub tag: u64,
}

impl<B: IoBuf, S> Engine<B, S> {
    /// Plan a split transfer and reserve it, all or nothing: the checks
    /// (no more children than the depth, a buffer large enough, a free slot
    /// for every child), then for each child a slot and the wire's
    /// descriptors (`build`, given the child and the buffer; its `Err`
    /// refuses the whole transfer), then the parent. Nothing reaches the
    /// device here. On success the children are in the returned list
    /// (pass it back to [`Engine::armed_split`] once the wire posted them)
    /// with the parent's index; on refusal every slot is free again and the
    /// buffer comes back.
    #[cold]
    #[allow(clippy::type_complexity)]
    pub fn plan_split(
        &mut self,
        r: SplitRequest,
        buf: B,
        mut build: impl FnMut(&Child, &B) -> std::result::Result<S, SubmitErrorKind>,
    ) -> std::result::Result<(u16, Vec<(Child, S)>), SubmitError<B>> {
        let bytes = u64::from(r.blocks) << r.shift;
        let depth = self.trackers.depth() as u64;
        let children = match r.per_child {
            // A single block is larger than one command may carry.
            0 => u64::MAX,
            n => u64::from(r.blocks).div_ceil(n),
        };
        let refuse = |kind, buf| Err(SubmitError { kind, buf });
        if children > depth {
            // A block above the per-command limit reports that limit, not 0.
            let max = match r.per_child {
                0 => self.max_xfer,
                n => (n << r.shift).saturating_mul(depth),
            };
            return refuse(SubmitErrorKind::TransferTooLarge { bytes, max }, buf);
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
        if self.trackers.depth() - self.trackers.outstanding() < children as usize {
            return refuse(SubmitErrorKind::QueueFull, buf);
        }
        let mut scratch = std::mem::take(&mut self.splits.scratch);
        scratch.clear();
        let mut failed = None;
        for i in 0..children {
            let Some(slot) = self.trackers.alloc() else {
                failed = Some(SubmitErrorKind::QueueFull);
                break;
            };
            let first = i * r.per_child;
            let blocks = r.per_child.min(u64::from(r.blocks) - first) as u32;
            let c = Child {
                slot,
                lba: r.lba + first,
                blocks,
                offset: first << r.shift,
                bytes: u64::from(blocks) << r.shift,
            };
            match build(&c, &buf) {
                Ok(w) => scratch.push((c, w)),
                Err(kind) => {
                    self.trackers.unreserve(slot);
                    failed = Some(kind);
                    break;
                }
            }
        }
        let parent = match failed {
            Some(kind) => Err((kind, buf)),
            // Not expected (a parent is free whenever slots are): refuse
            // rather than lose track.
            None => self
                .splits
                .start(r.tag, buf, children as u32)
                .map_err(|buf| (SubmitErrorKind::QueueFull, buf)),
        };
        match parent {
            Ok(p) => Ok((p, scratch)),
            Err((kind, buf)) => {
                for (c, _) in scratch.iter().rev() {
                    self.trackers.unreserve(c.slot);
                }
                self.splits.scratch = scratch;
                refuse(kind, buf)
            }
        }
    }

    /// The child in `slot` of parent `p` was posted: arm it under the
    /// caller's `tag`.
    #[inline]
    pub fn arm_child(&mut self, slot: u16, p: u16, tag: u64) {
        self.splits.link(slot, p);
        self.arm(slot, tag, None);
    }

    /// Every child of a planned split was posted and armed: keep the list's
    /// allocation for the next split.
    #[inline]
    pub fn armed_split(&mut self, scratch: Vec<(Child, S)>) {
        self.splits.scratch = scratch;
    }
}
