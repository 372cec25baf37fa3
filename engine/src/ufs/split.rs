//! Reads and writes above the per-command limit: one submission, several
//! child commands, one completion — the same contract as NVMe's split
//! (`crate::nvme::queue::pair`): children of at most the limit, in LBA order,
//! each with its own tracker slot and PRDT over its byte range of the one
//! buffer; the caller's tag and buffer stay with a *parent*; the parent
//! completes once, when its last child is finished, with the first error
//! any child reported, and only then is the buffer handed back.
//!
//! Nothing here is UFS-specific: it is the transport-independent half of
//! splitting (the other half, building each child's command, lives with the
//! queue pair). Nothing allocates after queue creation: tables are sized to
//! the queue depth, and every parent has at least one child in flight, so
//! a free parent exists whenever enough slots do.

use crate::core::io::IoError;

struct Parent<B> {
    tag: u64,
    buf: Option<B>,
    pending: u32,
    err: Option<IoError>,
}

/// Where a finished command's completion goes.
pub(crate) enum Routed<B> {
    /// Not a child: deliver it as it is.
    NotChild,
    /// A child with siblings still in flight: nothing to deliver yet.
    Pending,
    /// The last child: deliver the parent.
    Done(u64, Result<(), IoError>, Option<B>),
}

pub(crate) struct Splits<B> {
    parents: Box<[Parent<B>]>,
    free: Vec<u16>,
    /// Per tracker slot: 1 + parent index, 0 when not a child.
    child_of: Box<[u16]>,
    /// (slot, PRDT entries, LBA, blocks) of the children being built.
    pub scratch: Vec<(u16, u16, u64, u32)>,
    live: usize,
}

impl<B> Splits<B> {
    pub fn new(depth: u16) -> Self {
        Splits {
            parents: (0..depth)
                .map(|_| Parent {
                    tag: 0,
                    buf: None,
                    pending: 0,
                    err: None,
                })
                .collect(),
            free: (0..depth).rev().collect(),
            child_of: vec![0; usize::from(depth)].into_boxed_slice(),
            scratch: Vec::with_capacity(usize::from(depth)),
            live: 0,
        }
    }

    /// Whether any split transfer is in flight (the completion path looks
    /// at the tables only then).
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.live != 0
    }

    /// A parent for `children` children (≥ 1) holding `tag` and `buf`. The
    /// caller reserved `children` tracker slots, so a parent is free; if
    /// not, `buf` comes back.
    pub fn start(&mut self, tag: u64, buf: B, children: u32) -> Result<u16, B> {
        let Some(p) = self.free.pop() else {
            return Err(buf);
        };
        let e = &mut self.parents[usize::from(p)];
        e.tag = tag;
        e.buf = Some(buf);
        e.pending = children;
        e.err = None;
        self.live += 1;
        Ok(p)
    }

    /// Tracker slot `slot` carries a child of parent `p`.
    pub fn link(&mut self, slot: u16, p: u16) {
        self.child_of[usize::from(slot)] = p + 1;
    }

    /// The command in `slot` finished with `result` (its tracker slot is
    /// already freed).
    #[inline]
    pub fn finish(&mut self, slot: u16, result: Result<(), IoError>) -> Routed<B> {
        let link = std::mem::take(&mut self.child_of[usize::from(slot)]);
        if link == 0 {
            return Routed::NotChild;
        }
        let p = link - 1;
        let e = &mut self.parents[usize::from(p)];
        if let Err(err) = result {
            e.err.get_or_insert(err);
        }
        e.pending -= 1;
        if e.pending > 0 {
            return Routed::Pending;
        }
        let out = Routed::Done(e.tag, e.err.take().map_or(Ok(()), Err), e.buf.take());
        self.free.push(p);
        self.live -= 1;
        out
    }
}
