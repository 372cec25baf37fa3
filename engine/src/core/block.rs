//! [`BlockQueue`]: the block operations every wire's queue pair
//! offers, and what is built on them once: the blocking helpers.
//!
//! NVMe's [`QueuePair`](crate::QueuePair) and
//! [`TcpQueuePair`](crate::nvme::tcp::TcpQueuePair) and UFS's
//! [`UfsQueuePair`](crate::ufs::UfsQueuePair) each implement it, so code
//! written against `Q: BlockQueue` — [`run_per_core`](super::per_core::run_per_core),
//! [`MappedQueuePair`](super::mapped::MappedQueuePair), the blocking
//! helpers here, an application's job loop — runs on any wire. The
//! trait is resolved statically (generics): nothing is dispatched
//! dynamically per I/O, and each method is the queue pair's own inherent
//! method (`#[inline]`), so going through the trait costs nothing.
//!
//! ```
//! use mcqio::core::block::BlockQueue;
//! use mcqio::{Completion, IoBuf};
//!
//! /// Submit `bufs` as reads of one block each and wait for all of them,
//! /// on any transport.
//! fn read_all<Q: BlockQueue>(qp: &mut Q, at: Q::Addr, bufs: Vec<Q::Buf>) -> usize {
//!     let mut ok = 0;
//!     let n = bufs.len();
//!     for (i, b) in bufs.into_iter().enumerate() {
//!         qp.read(at, i as u64, 1, b, i as u64).map_err(|e| e.kind).unwrap();
//!     }
//!     qp.submit();
//!     let mut done = 0;
//!     while done < n {
//!         done += qp
//!             .poll(32, |c: Completion<Q::Buf>| ok += c.result.is_ok() as usize)
//!             .unwrap();
//!     }
//!     ok
//! }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use std::sync::Arc;
//! # use mcqio::vfio::{Backend, DmaDir};
//! // NVMe: the address is a namespace id.
//! let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
//! let ctrl = mcqio::Controller::new(backend, Default::default())?;
//! let mut qp = ctrl.create_qpair(Default::default())?;
//! let bufs = (0..4).map(|_| ctrl.alloc_buf(512, DmaDir::Bidirectional)).collect::<Result<_, _>>()?;
//! assert_eq!(read_all(&mut qp, 1u32, bufs), 4);
//! // UFS: the address is a logical unit.
//! let cfg = mcqio_fixtures::ufs::UfsConfig::default();
//! let backend: Arc<dyn Backend> = mcqio_fixtures::ufs::FakeUfs::new(cfg)?;
//! let ctrl = mcqio::UfsController::new(backend, Default::default())?;
//! let mut qp = ctrl.create_qpair(Default::default())?;
//! let bufs = (0..4).map(|_| ctrl.alloc_buf(4096, DmaDir::Bidirectional)).collect::<Result<_, _>>()?;
//! assert_eq!(read_all(&mut qp, 0u8, bufs), 4);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio_vfio::{DmaDir, DmaSpace};

use super::error::{Error, Result};
use super::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
pub use super::qpair::wait::{Interrupt, SleepOn};

/// A namespace (NVMe) or logical unit (UFS), as every wire describes it:
/// what a frontend (the fio engine, a ublk server) needs to expose it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockUnit {
    /// The address queue pairs take (an NVMe namespace id; a UFS LUN).
    pub id: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Whether reads and writes can reach it (see `Namespace::usable`,
    /// `LogicalUnit::usable`).
    pub usable: bool,
}

impl BlockUnit {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// A controller's view as a block device, the same on every wire: its
/// namespaces or logical units.
pub trait BlockDevice {
    /// Every namespace or logical unit the engine can address, by id.
    fn units(&self) -> Vec<BlockUnit>;

    /// The one with `id`, if any.
    fn unit(&self, id: u32) -> Option<BlockUnit> {
        self.units().into_iter().find(|u| u.id == id)
    }
}

/// The block operations of a queue pair, the same on every transport.
///
/// Semantics (every wire): a submission moves its buffer in and the
/// buffer comes back in exactly one [`Completion`] from
/// [`poll`](Self::poll) or [`close`](Self::close), or at once in the
/// [`SubmitError`] of a refused submission; [`submit`](Self::submit) rings
/// one doorbell per batch. Buffers may be vectored (`Vec<B>` is an
/// [`IoBuf`]): each segment becomes PRP entries (NVMe) or PRDT entries
/// (UFS).
pub trait BlockQueue {
    /// Where a command goes: an NVMe namespace id (`u32`), a UFS logical
    /// unit number (`u8`). Errors name it as a namespace id (`u32`).
    type Addr: Copy + Into<u32>;
    /// The buffers this queue pair moves.
    type Buf: IoBuf;

    /// Read `blocks` logical blocks from `lba` of `at` into `buf`.
    fn read(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> Result<(), SubmitError<Self::Buf>>;

    /// Write `blocks` logical blocks at `lba` of `at` from `buf`.
    fn write(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        buf: Self::Buf,
        tag: u64,
    ) -> Result<(), SubmitError<Self::Buf>>;

    /// Flush the volatile write cache of `at` (NVMe Flush, SCSI
    /// SYNCHRONIZE CACHE).
    fn flush(&mut self, at: Self::Addr, tag: u64) -> Result<(), SubmitError<()>>;

    /// Deallocate `blocks` blocks from `lba` of `at` (NVMe Dataset
    /// Management deallocate, SCSI UNMAP). No buffer.
    fn deallocate(
        &mut self,
        at: Self::Addr,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> Result<(), SubmitError<()>>;

    /// Ring the doorbell once for everything queued since the last ring.
    /// Returns whether a doorbell was written.
    fn submit(&mut self) -> bool;

    /// Deliver up to `max` completions to `f`; returns how many.
    fn poll<F: FnMut(Completion<Self::Buf>)>(&mut self, max: usize, f: F) -> Result<usize>;

    /// Poll until something completes or `timeout` passes (`None`: no
    /// limit), sleeping on the queue's interrupt where its wait policy
    /// says so (see [`crate::WaitPolicy`]); completions reach `f` through
    /// `poll`. Returns how many (0: the timeout passed, or nothing is
    /// outstanding). `max` = 0 is refused ([`Error::InvalidOption`]): such
    /// a wait could deliver nothing, so nothing but its limit could end
    /// it (`poll(0)` rings without waiting). This default spins.
    fn wait<F: FnMut(Completion<Self::Buf>)>(
        &mut self,
        max: usize,
        timeout: Option<std::time::Duration>,
        mut f: F,
    ) -> Result<usize> {
        if max == 0 {
            return Err(crate::core::qpair::wait::no_completion_asked());
        }
        let start = std::time::Instant::now();
        loop {
            let n = self.poll(max, &mut f)?;
            if n > 0 || self.outstanding() == 0 || timeout.is_some_and(|t| start.elapsed() >= t) {
                return Ok(n);
            }
            std::hint::spin_loop();
        }
    }

    /// What the queue's sleep waits on (`None`: the queue is polled only,
    /// policy [`Poll`](crate::WaitPolicy::Poll)), for a driver that
    /// watches its descriptor for `POLLIN` (epoll, io_uring, an async
    /// reactor) and sleeps through [`arm_sleep`](Self::arm_sleep): an
    /// eventfd its device's interrupt signals (it may be shared with other
    /// queues), or a readiness (NVMe/TCP: the queue's epoll set holding its
    /// connection's socket). The descriptor stays the same for the queue's
    /// life, across resets and reconnects.
    fn interrupt(&self) -> Option<Interrupt> {
        None
    }

    /// For a driver that sleeps somewhere else than [`wait`](Self::wait)
    /// (an async reactor: `AsyncQueue::tokio`): steps 2 and 3 of a
    /// sleeping wait. When the wait policy says sleep now, arm the queue's
    /// interrupt (clear its notifier; a level-triggered line is also
    /// acknowledged and unmasked; a socket's next poll is made to receive)
    /// and return what to sleep on; the caller then polls once more (or it
    /// may miss a completion posted before the arm), and only if that poll
    /// found nothing sleeps until [`SleepOn::interrupt`]'s descriptor is
    /// readable, for at most [`SleepOn::slice`], then calls
    /// [`slept`](Self::slept). `None`: poll again instead — the queue has no
    /// interrupt (policy [`Poll`](crate::WaitPolicy::Poll)), or a hybrid
    /// spin is still running. This default never sleeps.
    fn arm_sleep(&mut self) -> Option<SleepOn> {
        None
    }

    /// After a sleep [`arm_sleep`](Self::arm_sleep) prepared; `woken`:
    /// the interrupt ended it. A sleep that ran out its slice keeps the
    /// queue's timeouts due and looks at the controller's health, as
    /// [`wait`](Self::wait) does (nobody polled meanwhile).
    fn slept(&mut self, woken: bool) {
        let _ = woken;
    }

    /// Commands that may be outstanding at once.
    fn depth(&self) -> usize;

    /// Commands submitted and not yet completed.
    fn outstanding(&self) -> usize;

    /// Whether a submission now would fail with `QueueFull`.
    fn is_full(&self) -> bool {
        self.outstanding() >= self.depth()
    }

    /// Largest transfer per command in bytes (larger ones are split).
    fn max_transfer(&self) -> u64;

    /// log2 of the block size of `at`, `None` if there is no such
    /// namespace or logical unit.
    fn block_shift(&self, at: Self::Addr) -> Option<u32>;

    /// The refusal for an address that names nothing, in the wire's words
    /// (NVMe: an unknown namespace; UFS: an unknown LUN).
    fn unknown(at: Self::Addr) -> SubmitErrorKind {
        SubmitErrorKind::UnknownNamespace { nsid: at.into() }
    }

    /// The counters every wire keeps (commands, doorbell stores, register
    /// loads, system-clock calls), for tools that report per-I/O costs.
    fn counters(&self) -> crate::core::qpair::QueueCounters {
        crate::core::qpair::QueueCounters::default()
    }

    /// Finish the queue pair: every command still in flight ends exactly
    /// once through `f`.
    fn close<F: FnMut(Completion<Self::Buf>)>(self, f: F) -> Result<()>
    where
        Self: Sized;
}

/// Tag of the commands the blocking helpers submit.
pub(crate) const BLOCKING_TAG: u64 = u64::MAX;

/// What the blocking helpers need beyond [`BlockQueue`]: the queue pair's
/// bounce buffer (used when it moves [`DmaBuf`]s) and limits. Implemented
/// by every wire's queue pair.
pub(crate) trait Blocking: BlockQueue {
    /// The queue pair's bounce buffer (kept between calls).
    fn bounce(&mut self) -> &mut Option<DmaBuf>;
    /// Where bounce buffers are allocated.
    fn space(&self) -> &Arc<DmaSpace>;
    /// How long a blocking call waits for its completion.
    fn blocking_timeout(&self) -> Duration;
    /// Most bytes one command may move with blocks of `1 << shift` bytes.
    fn command_limit(&self, shift: u32) -> u64 {
        let _ = shift;
        self.max_transfer()
    }
    /// Catch up with a controller reset or failure before submitting (an
    /// idle queue loses nothing by it).
    fn blocking_sync(&mut self) -> Result<()> {
        Ok(())
    }
}

fn idle<Q: Blocking>(q: &mut Q) -> Result<()> {
    let out = q.outstanding();
    if out != 0 {
        return Err(Error::QueueBusy { outstanding: out });
    }
    q.blocking_sync()
}

/// Check a blocking transfer of `len` bytes to `at` and size the bounce
/// buffer; returns the block shift and the bytes per command.
fn prepare<Q: Blocking<Buf = DmaBuf>>(q: &mut Q, at: Q::Addr, len: usize) -> Result<(u32, u64)> {
    idle(q)?;
    let shift = q.block_shift(at).ok_or(Error::Submit(Q::unknown(at)))?;
    if len == 0 {
        return Err(Error::Submit(SubmitErrorKind::ZeroLength));
    }
    let block = 1u64 << shift;
    if len as u64 & (block - 1) != 0 {
        return Err(Error::Submit(SubmitErrorKind::BufferTooSmall {
            needed: (len as u64).div_ceil(block) * block,
            available: len as u64,
        }));
    }
    let max = q.command_limit(shift);
    let chunk = max & !(block - 1);
    if chunk == 0 {
        // One block is more than a command may move: nothing to split.
        return Err(Error::Submit(SubmitErrorKind::TransferTooLarge {
            bytes: block,
            max,
        }));
    }
    let want = chunk.min(len as u64);
    if q.bounce().as_ref().is_none_or(|b| (b.len() as u64) < want) {
        *q.bounce() = None;
        let b = DmaBuf::alloc(q.space(), want as usize, DmaDir::Bidirectional)?;
        *q.bounce() = Some(b);
    }
    Ok((shift, chunk))
}

/// Ring, and poll until the one blocking command completes.
fn wait<Q: Blocking>(q: &mut Q) -> Result<Completion<Q::Buf>> {
    q.submit();
    let deadline = Instant::now() + q.blocking_timeout();
    let mut spins = 0u32;
    loop {
        let mut done = None;
        q.poll(1, |c| done = Some(c))?;
        if let Some(c) = done {
            return Ok(c);
        }
        spins = spins.wrapping_add(1);
        if spins % 64 == 0 {
            if Instant::now() >= deadline {
                // The bounce buffer stays with the command until it
                // completes or the queue is closed.
                return Err(Error::Io(IoError::TimedOut));
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Wait for a blocking data command: its bounce buffer, or its error.
fn wait_data<Q: Blocking<Buf = DmaBuf>>(q: &mut Q) -> Result<DmaBuf> {
    let c = wait(q)?;
    match (c.result, c.buf) {
        (Ok(()), Some(buf)) => Ok(buf),
        (Err(e), buf) => {
            // No buffer: the device may still own it and it was leaked; a
            // new one is allocated on next use.
            *q.bounce() = buf;
            Err(Error::Io(e))
        }
        (Ok(()), None) => Err(Error::Io(IoError::ControllerFailed)),
    }
}

/// Refused before submission: the bounce buffer comes back.
fn refused<Q: Blocking<Buf = DmaBuf>>(q: &mut Q, e: SubmitError<DmaBuf>) -> Error {
    *q.bounce() = Some(e.buf);
    Error::Submit(e.kind)
}

/// Read `dst.len()` bytes (whole blocks) from `lba` of `at` and wait.
pub(crate) fn read_blocking<Q: Blocking<Buf = DmaBuf>>(
    q: &mut Q,
    at: Q::Addr,
    lba: u64,
    dst: &mut [u8],
) -> Result<()> {
    let (shift, chunk) = prepare(q, at, dst.len())?;
    let mut lba = lba;
    for part in dst.chunks_mut(chunk as usize) {
        let blocks = (part.len() >> shift) as u32;
        // The bounce buffer may be longer than the part: the command
        // covers only the bytes it moves.
        let buf = q.bounce().take().expect("prepared");
        if let Err(e) = q.read(at, lba, blocks, buf, BLOCKING_TAG) {
            return Err(refused(q, e));
        }
        let buf = wait_data(q)?;
        buf.read_at(0, part)?;
        *q.bounce() = Some(buf);
        lba += u64::from(blocks);
    }
    Ok(())
}

/// Write `src` (whole blocks) at `lba` of `at` and wait.
pub(crate) fn write_blocking<Q: Blocking<Buf = DmaBuf>>(
    q: &mut Q,
    at: Q::Addr,
    lba: u64,
    src: &[u8],
) -> Result<()> {
    let (shift, chunk) = prepare(q, at, src.len())?;
    let mut lba = lba;
    for part in src.chunks(chunk as usize) {
        let blocks = (part.len() >> shift) as u32;
        let mut buf = q.bounce().take().expect("prepared");
        buf.write_at(0, part)?;
        if let Err(e) = q.write(at, lba, blocks, buf, BLOCKING_TAG) {
            return Err(refused(q, e));
        }
        let buf = wait_data(q)?;
        *q.bounce() = Some(buf);
        lba += u64::from(blocks);
    }
    Ok(())
}

/// Flush `at` and wait.
pub(crate) fn flush_blocking<Q: Blocking>(q: &mut Q, at: Q::Addr) -> Result<()> {
    idle(q)?;
    q.flush(at, BLOCKING_TAG)?;
    let c = wait(q)?;
    c.result.map_err(Error::Io)
}
