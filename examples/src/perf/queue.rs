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

/// Why an I/O failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The kernel returned this errno (io_uring).
    Errno(i32),
    /// The transfer was shorter than asked (io_uring past the end of a file).
    Short {
        /// Bytes transferred.
        got: u32,
        /// Bytes asked for.
        want: u32,
    },
    /// The controller completed the command with an error status.
    Nvme(mcqio::NvmeStatus),
    /// The host side ended the command (abort, timeout, controller failure).
    Host(mcqio::IoError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Errno(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
            Failure::Short { got, want } => write!(f, "short transfer: {got} of {want} bytes"),
            Failure::Nvme(s) => write!(f, "NVMe status {s}"),
            Failure::Host(e) => write!(f, "{e}"),
        }
    }
}

/// The outcome of one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// It completed successfully.
    Ok,
    /// It failed.
    Failed(Failure),
    /// It failed and its buffer did not come back: the device may still
    /// access the slot's memory (a controller that could not be disabled,
    /// a withdrawal it did not confirm), so the slot must never be used
    /// again.
    Lost(Failure),
}

/// Why a queue did not take an I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushError {
    /// The queue is full; retry after reaping.
    Full,
    /// The queue refused the request itself (nothing was sent); the message says why.
    Rejected(String),
}

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
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError>;

    /// Make pushed I/Os visible to the device (ring the doorbell, enter the
    /// kernel). Blocking backends may wait here for at least one completion
    /// when `inflight > 0`; polled backends return at once.
    fn submit(&mut self, inflight: usize) -> Result<(), QueueError>;

    /// Hand every available completion to `done(slot, status)`; returns how
    /// many there were. Never blocks.
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, done: F) -> Result<usize, QueueError>;

    /// The engine's counters of this queue (doorbell stores, register
    /// loads, system-clock calls), for queues on the engine; `None` for
    /// others (io_uring, test queues).
    /// Wait at most `timeout` for completions, as the queue's wait policy
    /// says (`--wait`), delivering them as [`JobQueue::reap`] does. This
    /// default reaps once (queues that cannot wait poll).
    fn wait<F: FnMut(usize, IoStatus)>(
        &mut self,
        timeout: std::time::Duration,
        done: F,
    ) -> Result<usize, QueueError> {
        let _ = timeout;
        self.reap(done)
    }

    fn counters(&self) -> Option<mcqio::QueueCounters> {
        None
    }

    /// System calls the queue's wire made so far on the I/O path (NVMe/TCP:
    /// `sendmsg` and `recv`); 0 for wires that make none (PCIe, UFS).
    fn wire_syscalls(&self) -> u64 {
        0
    }
}

/// How job buffers are mapped for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DmaMode {
    /// Buffers allocated and mapped once per job; no IOMMU work per I/O.
    Premapped,
    /// Map before each I/O, unmap with invalidation at completion.
    Strict,
    /// Unmaps batched in per-CPU flush queues.
    Lazy,
}

impl DmaMode {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            DmaMode::Premapped => "premapped",
            DmaMode::Strict => "strict",
            DmaMode::Lazy => "lazy",
        }
    }
}
