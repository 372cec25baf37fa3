//! # The shared core: what both transports use, written once
//!
//! Nothing here knows a wire format. NVMe ([`crate::nvme`]) and UFS
//! ([`crate::ufs`]) build their commands, ring their doorbells and reap
//! their completions; the core owns what every transport shares:
//!
//! - `tracker`: command slots with generations (a stale or duplicate
//!   completion never reaches a command in flight) and their ages.
//! - [`io`]: the I/O API: [`DmaBuf`](io::DmaBuf), the [`IoBuf`](io::IoBuf)
//!   trait, [`IoSeg`](io::IoSeg), [`Completion`](io::Completion),
//!   [`IoError`](io::IoError), [`SubmitError`](io::SubmitError).
//! - [`mapped`]: application buffers mapped per I/O (strict and lazy DMA modes).
//! - [`per_core`]: one queue pair per core on pinned threads.

pub mod io;
pub mod mapped;
pub mod per_core;
pub(crate) mod tracker;
