//! Queue pairs: rings, doorbells, trackers.
//!
//! - `sq`: the submission ring and its tail doorbell (batched: one store per flush).
//! - `cq`: the completion ring, phase-bit polling, one head doorbell per poll.
//! - tags (CID = slot | generation) are the shared core's `crate::core::tracker`.
//! - [`pair`]: [`QueuePair`], the public per-thread I/O object.
//! - `split.rs` (a child module of `pair`, for the queue's internals):
//!   transfers above the per-command limit as child commands that complete
//!   once.

pub(crate) mod cq;
pub(crate) mod doorbell;
pub mod pair;
pub(crate) mod sq;

pub use crate::core::timeout::Outstanding;
pub use pair::{QpairOptions, QpairStats, QueuePair};

/// NVMe memory page size used by mcqio (CC.MPS = 0).
pub const PAGE_SIZE: u64 = 4096;
pub(crate) const PAGE_SHIFT: u32 = 12;
pub(crate) const PAGE_MASK: u64 = PAGE_SIZE - 1;
