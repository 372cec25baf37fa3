//! Queue pairs: rings, doorbells, trackers.
//!
//! - `sq`: the submission ring and its tail doorbell (batched: one store per flush).
//! - `cq`: the completion ring, phase-bit polling, one head doorbell per poll.
//! - tags (CID = slot | generation) are the shared core's `crate::core::tracker`.
//! - [`pair`]: [`QueuePair`], the public per-thread I/O object, one file
//!   per concern: `submit` (checks, SQEs, the tail doorbell), `prp` (data
//!   pointers), `split` (transfers above the per-command limit as child
//!   commands that complete once), `reap` (polling the CQ), `recover`
//!   (after a reset or failure, timeouts), `teardown` (close, `Drop`),
//!   `blocking` (the blocking helpers and [`BlockQueue`](crate::core::block::BlockQueue)).

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
