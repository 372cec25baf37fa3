//! # The shared core: what every wire uses, written once
//!
//! Nothing here knows a wire format. NVMe ([`crate::nvme`]) and UFS
//! ([`crate::ufs`]) build their commands, ring their doorbells and reap
//! their completions; the core owns what every transport shares:
//!
//! - `tracker`: command slots with generations (a stale or duplicate
//!   completion never reaches a command in flight) and their ages.
//! - [`block`]: the [`BlockQueue`](block::BlockQueue) trait every wire's
//!   queue pair implements (read, write, flush, deallocate, submit, poll,
//!   close), and the blocking helpers written once on it.
//! - [`error`]: the control path's [`Error`](error::Error), one type for
//!   every transport.
//! - `deliver`: exactly-once delivery when the device stops answering
//!   (end every outstanding command, leak a buffer the device may own).
//! - [`io`]: the I/O API: [`DmaBuf`](io::DmaBuf), the [`IoBuf`](io::IoBuf)
//!   trait, [`IoSeg`](io::IoSeg), [`Completion`](io::Completion),
//!   [`IoError`](io::IoError), [`SubmitError`](io::SubmitError).
//! - `state`: the controller state word (failure, reset, epoch) and the
//!   fail → disable → leak rule, one encoding for every wire.
//! - `split`: the parent table of transfers above the per-command limit,
//!   split into child commands that complete once.
//! - [`mapped`]: application buffers mapped per I/O (strict and lazy DMA modes).
//! - [`per_core`]: one queue pair per core on pinned threads.
//! - `qpair`: the queue pair's lifecycle written once — the `Engine` state
//!   every wire's queue pair embeds, and the `Wire` trait whose provided
//!   methods are the submit gate, the poll skeleton, recovery after a
//!   reset and the one completion budget.
//! - [`timeout`]: the [`TimeoutPolicy`](timeout::TimeoutPolicy), the coarse
//!   clock, and the scan that finds expired commands; `clock`: the coarse
//!   clock read through the CPU's counter (few system-clock calls).

pub mod asyncio;
pub mod block;
pub(crate) mod clock;
pub(crate) mod deliver;
pub mod error;
pub mod io;
pub mod mapped;
pub mod per_core;
pub(crate) mod qpair;
pub(crate) mod ring;
pub(crate) mod split_table;
pub(crate) mod state;
pub mod timeout;
pub(crate) mod tracker;
