//! Reads and writes above the per-command limit: one submission, several
//! child commands, one completion — the parent table, written once for
//! every wire.
//!
//! A transfer larger than the per-command limit (NVMe: MDTS, UFS: the PRDT
//! limit) is cut into children of at most that size, in LBA order, each
//! with its own tracker slot and its own descriptors (PRPs, PRDT) over its
//! byte range of the one buffer. The caller's tag and buffer stay with a
//! *parent*; a child's tracker slot holds the parent's tag (so timeout
//! reports name the caller's tag) and no buffer. The parent completes once,
//! when its last child is finished — completed by the device, aborted by a
//! timeout, or drained by a reset or `close` — with the first error any
//! child reported (else success), and only then is the buffer handed back:
//! the device can no longer touch any part of it.
//!
//! The transports build the children's commands (NVMe's
//! `nvme/pcie/qpair/split.rs`, UFS's `submit_split` in `ufs/qpair/submit.rs`, NVMe/TCP's `split` in `nvme/tcp/qpair/submit.rs`); they
//! reserve every child's slot and descriptors before posting any, so a
//! rejection leaves nothing half-submitted. `S` is what a transport keeps
//! per child while it builds them ([`Splits::scratch`]).
//!
//! Nothing here allocates after queue creation: tables are sized to the
//! queue depth, and every parent has at least one child in flight, so a
//! free parent exists whenever enough slots do.

use super::io::{IoBuf, IoError};

/// One split transfer in flight.
struct Parent<B> {
    tag: u64,
    buf: Option<B>,
    /// Children not finished yet.
    pending: u32,
    /// The first error a child reported.
    err: Option<IoError>,
    /// A child ended while the device may still access its range: the
    /// buffer is leaked, never handed back.
    leak: bool,
}

/// Where a finished command's completion goes.
pub(crate) enum Routed<B> {
    /// Not a child: deliver it as it is.
    NotChild,
    /// A child with siblings still in flight: nothing to deliver yet.
    Pending,
    /// The last child: deliver the parent (tag, result, buffer).
    Done(u64, Result<(), IoError>, Option<B>),
}

/// Parents of split transfers and the link from each child's tracker slot.
pub(crate) struct Splits<B, S> {
    parents: Box<[Parent<B>]>,
    free: Vec<u16>,
    /// Per tracker slot: 1 + the index of its parent, 0 for a command that
    /// is not a child.
    child_of: Box<[u16]>,
    /// The children of the submission being built (the core's plan and the
    /// transport's own record per child), kept to reuse its allocation.
    pub scratch: Vec<(crate::core::qpair::Child, S)>,
    /// Parents in flight: the completion path looks at `child_of` only when
    /// this is not zero.
    live: usize,
    /// Bytes of parent buffers leaked (see [`Splits::poison`]), not yet
    /// collected by the queue pair.
    leaked: u64,
}

impl<B: IoBuf, S> Splits<B, S> {
    pub fn new(depth: u16) -> Self {
        Splits {
            parents: (0..depth)
                .map(|_| Parent {
                    tag: 0,
                    buf: None,
                    pending: 0,
                    err: None,
                    leak: false,
                })
                .collect(),
            free: (0..depth).rev().collect(),
            child_of: vec![0; usize::from(depth)].into_boxed_slice(),
            scratch: Vec::with_capacity(usize::from(depth)),
            live: 0,
            leaked: 0,
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
        e.leak = false;
        self.live += 1;
        Ok(p)
    }

    /// Tracker slot `slot` carries a child of parent `p`.
    #[inline]
    pub fn link(&mut self, slot: u16, p: u16) {
        self.child_of[usize::from(slot)] = p + 1;
    }

    /// The parent of the command in tracker slot `slot`, if it is a child.
    #[inline(always)]
    pub fn parent_of(&self, slot: u16) -> Option<u16> {
        if self.live == 0 {
            return None;
        }
        match self.child_of.get(usize::from(slot)) {
            Some(&p) if p != 0 => Some(p - 1),
            _ => None,
        }
    }

    /// The buffer of parent `p` while its children are in flight: a wire
    /// that copies data (a socket) reaches a child's bytes through it.
    #[inline]
    pub fn buf_of(&self, p: u16) -> Option<&B> {
        self.parents.get(usize::from(p))?.buf.as_ref()
    }

    /// Record that the child in `slot` of parent `p` finished with
    /// `result` (its tracker slot is already freed). Returns the parent's
    /// completion (tag, buffer, result) once its last child is finished.
    pub fn child_done(
        &mut self,
        slot: u16,
        p: u16,
        result: Result<(), IoError>,
    ) -> Option<(u64, Option<B>, Result<(), IoError>)> {
        self.child_of[usize::from(slot)] = 0;
        let e = &mut self.parents[usize::from(p)];
        if let Err(err) = result {
            e.err.get_or_insert(err);
        }
        e.pending -= 1;
        if e.pending != 0 {
            return None;
        }
        let mut buf = e.buf.take();
        if e.leak {
            if let Some(b) = buf.take() {
                self.leaked += b.total_len() as u64;
                std::mem::forget(b);
            }
        }
        let out = (e.tag, buf, e.err.take().map_or(Ok(()), Err));
        self.free.push(p);
        self.live -= 1;
        Some(out)
    }

    /// The command in `slot` finished with `result` (its tracker slot is
    /// already freed): where its completion goes.
    #[inline]
    pub fn finish(&mut self, slot: u16, result: Result<(), IoError>) -> Routed<B> {
        let Some(p) = self.parent_of(slot) else {
            return Routed::NotChild;
        };
        match self.child_done(slot, p, result) {
            None => Routed::Pending,
            Some((tag, buf, result)) => Routed::Done(tag, result, buf),
        }
    }

    /// The child in `slot` is about to end while the device may still
    /// access its range of the parent's buffer: the parent's buffer will be
    /// leaked instead of handed back.
    pub fn poison(&mut self, slot: u16) {
        if let Some(p) = self.parent_of(slot) {
            self.parents[usize::from(p)].leak = true;
        }
    }

    /// Bytes leaked by poisoned parents since the last call.
    pub fn take_leaked(&mut self) -> u64 {
        std::mem::take(&mut self.leaked)
    }
}
