//! The per-job queue seam: what a job needs from a device.
//!
//! A job owns one [`JobQueue`] (an NVMe queue pair or an io_uring) with one
//! I/O buffer per slot (`slot < depth`). The job loop is generic over the
//! queue type, so each device gets its own monomorphised loop and there is no
//! dynamic dispatch per I/O: the only `match` on the device kind happens once
//! when the job starts.

use std::ptr::NonNull;

use crate::workload::Op;

/// An I/O as the job asks for it; the namespace is fixed per queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoReq {
    /// Read or write.
    pub op: Op,
    /// First logical block.
    pub slba: u64,
    /// Number of logical blocks (≥ 1).
    pub nlb: u32,
}

/// The outcome of one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// It completed successfully.
    Ok,
    /// The device or kernel reported an error; the code is device-specific
    /// (an NVMe status field, or a negative errno for io_uring).
    Failed(i32),
}

/// The queue refused an I/O because it is full; retry after reaping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// A fatal queue error (the queue is unusable).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QueueError(pub String);

/// One job's queue to a device, with a buffer per slot.
pub trait JobQueue {
    /// Number of slots (the queue depth this queue can keep in flight).
    fn depth(&self) -> usize;

    /// Bytes of buffer per slot.
    fn buffer_len(&self) -> usize;

    /// Host address of slot `slot`'s buffer. The CPU may touch the buffer
    /// only while the slot is not in flight, and only through raw pointers
    /// (the device writes it concurrently otherwise).
    fn buffer(&self, slot: usize) -> NonNull<u8>;

    /// Queue `req` for slot `slot`. It reaches the device at the next
    /// [`JobQueue::submit`]. `slot` must not be in flight.
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), QueueFull>;

    /// Make pushed I/Os visible to the device (ring the doorbell, enter the
    /// kernel). Blocking backends may wait here for at least one completion
    /// when `inflight > 0`; polled backends return at once.
    fn submit(&mut self, inflight: usize) -> Result<(), QueueError>;

    /// Hand every available completion to `done(slot, status)`; returns how
    /// many there were. Never blocks.
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, done: F) -> Result<usize, QueueError>;
}
