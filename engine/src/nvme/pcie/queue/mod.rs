//! The rings of NVMe over PCIe: what the queue pair
//! ([`super::qpair::QueuePair`]) and the admin queue share.
//!
//! - `sq`: the submission ring and its tail doorbell (batched: one store per flush).
//! - `cq`: the completion ring, phase-bit polling, one head doorbell per poll.
//! - `doorbell`: a doorbell register, with its shadow slot.
//!
//! Tags (CID = slot | generation) are the shared core's `crate::core::tracker`.

pub(crate) mod cq;
pub(crate) mod doorbell;
pub(crate) mod sq;

/// NVMe memory page size used by mcqio (CC.MPS = 0).
pub const PAGE_SIZE: u64 = 4096;
pub(crate) const PAGE_SHIFT: u32 = 12;
pub(crate) const PAGE_MASK: u64 = PAGE_SIZE - 1;
