//! What an [`IoFuture`](super::IoFuture) submits: a read or write with
//! its buffer ([`Data`]), or a command without data ([`NoData`]).

use crate::core::block::BlockQueue;
use crate::core::io::{SubmitError, SubmitErrorKind};
/// What an [`IoFuture`](super::IoFuture) submits: a read or write with its buffer
/// ([`Data`]), or a command without data ([`NoData`]). Sealed: the
/// driver's own commands only.
pub trait Command<Q: BlockQueue>: sealed::Sealed + Sized {
    /// What a refused submission hands back: the buffer, or `()`.
    type Refused;
    /// Submit with `tag` (no doorbell); a refusal gives the command back
    /// (to retry after `QueueFull`).
    #[doc(hidden)]
    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)>;
    /// The refusal the future resolves to.
    #[doc(hidden)]
    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<Self::Refused>;
}

mod sealed {
    pub trait Sealed {}
    impl<A, B> Sealed for super::Data<A, B> {}
    impl<A> Sealed for super::NoData<A> {}
}

/// A read or write and its buffer, before submission.
pub struct Data<A, B> {
    at: A,
    lba: u64,
    blocks: u32,
    buf: B,
    read: bool,
}

impl<A, B> Data<A, B> {
    pub(super) fn new(at: A, lba: u64, blocks: u32, buf: B, read: bool) -> Self {
        Data {
            at,
            lba,
            blocks,
            buf,
            read,
        }
    }
}

impl<Q: BlockQueue> Command<Q> for Data<Q::Addr, Q::Buf> {
    type Refused = Q::Buf;

    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)> {
        let Data {
            at,
            lba,
            blocks,
            buf,
            read,
        } = self;
        let r = if read {
            qp.read(at, lba, blocks, buf, tag)
        } else {
            qp.write(at, lba, blocks, buf, tag)
        };
        r.map_err(|e| {
            (
                e.kind,
                Data {
                    at,
                    lba,
                    blocks,
                    buf: e.buf,
                    read,
                },
            )
        })
    }

    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<Q::Buf> {
        SubmitError {
            kind,
            buf: self.buf,
        }
    }
}

/// A command without data (flush, deallocate), before submission.
#[derive(Clone, Copy, Debug)]
pub enum NoData<A> {
    /// Flush the volatile write cache of `at`.
    Flush {
        /// The namespace or logical unit.
        at: A,
    },
    /// Deallocate `blocks` blocks at `lba` of `at`.
    Deallocate {
        /// The namespace or logical unit.
        at: A,
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
    },
}

impl<Q: BlockQueue> Command<Q> for NoData<Q::Addr> {
    type Refused = ();

    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)> {
        let r = match self {
            NoData::Flush { at } => qp.flush(at, tag),
            NoData::Deallocate { at, lba, blocks } => qp.deallocate(at, lba, blocks, tag),
        };
        r.map_err(|e| (e.kind, self))
    }

    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<()> {
        SubmitError { kind, buf: () }
    }
}
