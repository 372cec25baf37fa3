//! Application buffers mapped per I/O: the strict and lazy DMA modes.
//!
//! A plain [`QueuePair`](crate::QueuePair) moves buffers that are already mapped for the
//! device ([`DmaBuf`](crate::DmaBuf), the *premapped* mode: no IOMMU work
//! per I/O). [`MappedQueuePair`] takes the application's own memory instead
//! ([`AppBuffer`]) and maps it for each I/O through a
//! [`QueueMapper`], in the mode chosen by
//! [`QpairOptions::mapping`](crate::QpairOptions::mapping):
//!
//! | [`MappingMode`] | per I/O | a buffer comes back |
//! |---|---|---|
//! | `Premapped` | nothing (use [`Controller::create_qpair`](crate::Controller::create_qpair)) | at completion |
//! | `Strict` | map at submission; unmap + IOTLB invalidation at completion | at completion, after its unmap returned |
//! | `Lazy { batch, max_delay }` | map at submission; unmaps queued and flushed per `batch` or after `max_delay` | after the flush that unmapped it returned |
//!
//! **A buffer is handed back only once the device can no longer reach it.**
//! A completion is delivered by [`MappedQueuePair::poll`] together with its
//! buffer, so in lazy mode a finished I/O is delivered with the flush that
//! unmapped its buffer: when `batch` I/Os have finished, when the oldest
//! waiting one is `max_delay` old (checked by `poll`, so keep polling), or
//! at once with [`MappedQueuePair::flush_mappings`]. There is no window, as
//! in Linux's non-strict mode, in which the application reuses memory the
//! device can still write.
//!
//! The premapped path is untouched by any of this: `MappedQueuePair` is a
//! separate type wrapping a queue pair of [`Mapped`] buffers, so a queue
//! pair of `DmaBuf`s pays no branch for the modes it does not use.
//!
//! It is written once for every wire: `MappedQueuePair<Q>` wraps any
//! [`BlockQueue`] — NVMe's `QueuePair<Mapped>` (the default,
//! [`Controller::create_mapped_qpair`](crate::Controller::create_mapped_qpair)) or UFS's `UfsQueuePair<Mapped>`
//! ([`UfsController::create_mapped_qpair`](crate::UfsController::create_mapped_qpair)).
//!
//! ```
//! use std::sync::Arc;
//! use mcqio::{Controller, ControllerOptions, MappingMode, QpairOptions};
//! use mcqio::vfio::{AppBuffer, Backend};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
//! let ctrl = Controller::new(backend, ControllerOptions::default())?;
//! let mut qp = ctrl.create_mapped_qpair(QpairOptions {
//!     mapping: MappingMode::Strict,
//!     ..QpairOptions::default()
//! })?;
//! let mut buf = AppBuffer::for_space(ctrl.dma(), 4096)?; // ordinary memory, not mapped
//! buf.as_mut_slice().fill(0x42);
//! qp.write(1, 0, 8, buf, 1).map_err(|e| e.kind)?;
//! qp.submit();
//! let mut done = None;
//! while done.is_none() {
//!     qp.poll(32, |c| done = Some(c))?;
//! }
//! let c = done.ok_or("no completion")?;
//! c.result?;
//! let buf = c.buf.ok_or("buffer leaked")?; // unmapped: the device cannot reach it any more
//! assert_eq!(buf.as_slice()[0], 0x42);
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use mcqio_vfio::mapping::{DEFAULT_FLUSH_BATCH, DEFAULT_FLUSH_DELAY, DEFAULT_WINDOW_LEN};
use mcqio_vfio::{
    AppBuffer, DmaDir, DmaMapper, DmaMode, IoBuffer, LazyConfig, MapError, Mapped, MapperConfig,
    MapperStats, QueueMapper, Returned, PAGE_SIZE,
};

use super::block::BlockQueue;
use super::error::{Error, Result};
use super::io::{Completion, IoError, SubmitErrorKind};

/// How a queue pair gets device addresses for its buffers
/// ([`QpairOptions::mapping`](crate::QpairOptions::mapping); see the [module docs](self)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MappingMode {
    /// Buffers are mapped already ([`DmaBuf`](crate::DmaBuf) from
    /// [`Controller::alloc_buf`](crate::Controller::alloc_buf)): no IOMMU work per I/O. For
    /// [`Controller::create_qpair`](crate::Controller::create_qpair).
    #[default]
    Premapped,
    /// Map each application buffer at submission, unmap it (with its IOTLB
    /// invalidation) at completion. For [`Controller::create_mapped_qpair`](crate::Controller::create_mapped_qpair).
    Strict,
    /// Map at submission; queue the unmaps and flush them in one call when
    /// `batch` are queued or the oldest is `max_delay` old. Buffers come back
    /// after that flush. For [`Controller::create_mapped_qpair`](crate::Controller::create_mapped_qpair).
    Lazy {
        /// Unmaps per flush (1 behaves like `Strict`; at most
        /// [`MAX_FLUSH_BATCH`](mcqio_vfio::mapping::MAX_FLUSH_BATCH)).
        batch: usize,
        /// Longest a finished I/O waits for its flush (while the queue is
        /// polled). [`Duration::MAX`] means no time limit: flush on batch
        /// only ([`MappingMode::lazy_batch_only`]).
        max_delay: Duration,
    },
}

impl MappingMode {
    /// Lazy mode with Linux's flush-queue defaults (256 unmaps, 10 ms).
    pub fn lazy() -> Self {
        MappingMode::Lazy {
            batch: DEFAULT_FLUSH_BATCH,
            max_delay: DEFAULT_FLUSH_DELAY,
        }
    }

    /// Lazy mode that flushes when `batch` unmaps are queued and never by
    /// time (a full window, [`MappedQueuePair::flush_mappings`] and close
    /// still flush).
    pub fn lazy_batch_only(batch: usize) -> Self {
        MappingMode::Lazy {
            batch,
            max_delay: Duration::MAX,
        }
    }
}

/// Why [`MappedQueuePair::read`] or [`MappedQueuePair::write`] refused an
/// I/O. Nothing was sent to the device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MappedSubmitErrorKind {
    /// The queue pair refused it (see [`SubmitErrorKind`]).
    #[error(transparent)]
    Submit(#[from] SubmitErrorKind),
    /// The buffer could not be mapped (or, after a refusal, unmapped).
    #[error("DMA mapping: {0}")]
    Map(#[from] MapError),
}

/// A refused submission: why, and the buffer handed back (`None` only if
/// unmapping it failed: the device might still reach it, so it is leaked).
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct MappedSubmitError {
    /// Why.
    pub kind: MappedSubmitErrorKind,
    /// The buffer, unchanged.
    pub buf: Option<AppBuffer>,
}

#[derive(Debug)]
enum SlotState {
    Free,
    /// Submitted; the device may use the buffer.
    InFlight,
    /// The device is done; the unmap (lazy: the flush) has not returned yet.
    Unmapping,
    /// Ready to deliver: completed and its buffer back (or leaked).
    Ready,
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    /// Bumped each time the slot is taken, so a buffer coming back late for
    /// an earlier use of the slot is never taken for the current one's.
    gen: u32,
    tag: u64,
    result: Result<(), IoError>,
    dw0: u32,
    buf: Option<AppBuffer>,
}

/// A queue pair for application buffers, mapped per I/O in strict or lazy
/// mode, over any transport's queue pair `Q`. Created by
/// [`Controller::create_mapped_qpair`](crate::Controller::create_mapped_qpair) (NVMe; [`crate::MappedQueuePair`]
/// names this type with NVMe's queue pair as the default `Q`) or
/// [`UfsController::create_mapped_qpair`](crate::UfsController::create_mapped_qpair);
/// see the [module docs](self). `Send + !Sync`, one per thread, like
/// [`QueuePair`](crate::QueuePair). The transports add their own accessors and
/// constructors (NVMe's `qid`, `stats`) in their own modules.
pub struct MappedQueuePair<Q: BlockQueue<Buf = Mapped>> {
    /// `None` only inside `close` and `drop`.
    qp: Option<Q>,
    mapper: QueueMapper,
    /// Request slots: the mapper's and the queue pair's tag is the index.
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots ready to deliver, in the order they became ready.
    ready: VecDeque<u32>,
    returned: Vec<Returned>,
    /// Set while a mapper call that may unmap runs; still set afterwards
    /// only if that call unwound (an IOMMU unmap panicked). The mapper
    /// then leaked every mapping the call covered, so the slots waiting
    /// for an unmap are settled without their buffers by the next call.
    unmap_unwound: bool,
}

impl<Q: BlockQueue<Buf = Mapped>> std::fmt::Debug for MappedQueuePair<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedQueuePair")
            .field("mode", &self.mapper.mode())
            .field("slots", &self.slots.len())
            .field("free", &self.free.len())
            .finish_non_exhaustive()
    }
}

/// Most IOVA space one queue's window reserves (its size is otherwise
/// slots × the per-command transfer limit).
const MAX_WINDOW: u64 = 4 << 30;
const WINDOW_ALIGN: u64 = 2 << 20;

impl<Q: BlockQueue<Buf = Mapped>> MappedQueuePair<Q> {
    /// Refuse `Premapped` and a lazy batch outside
    /// `1..=`[`MAX_FLUSH_BATCH`](mcqio_vfio::mapping::MAX_FLUSH_BATCH)
    /// before a queue is made.
    pub(crate) fn check_mode(mapping: &MappingMode) -> Result<(DmaMode, LazyConfig)> {
        Ok(match *mapping {
            MappingMode::Premapped => {
                return Err(Error::InvalidOption(
                    "create_mapped_qpair needs MappingMode::Strict or Lazy; premapped queue pairs take DmaBufs: use create_qpair".into(),
                ))
            }
            MappingMode::Strict => (DmaMode::Strict, LazyConfig::default()),
            MappingMode::Lazy { batch, max_delay } => {
                let cfg = LazyConfig { batch, max_delay };
                cfg.validate()
                    .map_err(|e| Error::InvalidOption(format!("MappingMode::Lazy: {e}")))?;
                (DmaMode::Lazy, cfg)
            }
        })
    }

    /// Wrap `qp` (a queue pair of [`Mapped`] buffers in `space`, whose
    /// controller moves at most `max_transfer` bytes per command) with a
    /// mapper in `mapping` mode (strict or lazy).
    pub(crate) fn new(
        qp: Q,
        space: &Arc<mcqio_vfio::DmaSpace>,
        max_transfer: u64,
        mapping: &MappingMode,
    ) -> Result<Self> {
        let (mode, lazy) = Self::check_mode(mapping)?;
        let queued = if mode == DmaMode::Lazy { lazy.batch } else { 0 };
        let slots = qp.depth().saturating_add(queued);
        let window = (slots as u64 + 1)
            .saturating_mul(max_transfer.max(PAGE_SIZE as u64))
            .clamp(DEFAULT_WINDOW_LEN, MAX_WINDOW)
            .next_multiple_of(WINDOW_ALIGN);
        let cfg = MapperConfig {
            mode,
            window_len: window,
            lazy,
            ..MapperConfig::default()
        };
        let mapper = QueueMapper::new(space, &cfg)
            .map_err(|e| Error::InvalidOption(format!("building the {mode} DMA mapper: {e}")))?;
        Ok(MappedQueuePair {
            qp: Some(qp),
            mapper,
            slots: (0..slots)
                .map(|_| Slot {
                    state: SlotState::Free,
                    gen: 0,
                    tag: 0,
                    result: Ok(()),
                    dw0: 0,
                    buf: None,
                })
                .collect(),
            free: (0..slots as u32).rev().collect(),
            ready: VecDeque::with_capacity(slots),
            returned: Vec::with_capacity(slots),
            unmap_unwound: false,
        })
    }

    fn qp(&mut self) -> &mut Q {
        match self.qp.as_mut() {
            Some(qp) => qp,
            None => unreachable!("only close and drop take the queue pair out"),
        }
    }

    /// The underlying queue pair (for its own counters).
    pub fn queue_pair(&self) -> Option<&Q> {
        self.qp.as_ref()
    }

    /// The mapper's counters (maps, unmap calls, invalidations, pinned bytes).
    pub fn mapper_stats(&self) -> MapperStats {
        self.mapper.stats()
    }

    /// The DMA mode (strict or lazy).
    pub fn mode(&self) -> DmaMode {
        self.mapper.mode()
    }

    /// I/Os submitted and not yet delivered by `poll` (in flight, or waiting
    /// for their unmap).
    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Read `nlb` blocks from `slba` of `nsid` (NVMe namespace, UFS logical
    /// unit) into `buf` (which must hold `nlb` blocks). The buffer comes
    /// back in the completion.
    pub fn read(
        &mut self,
        nsid: Q::Addr,
        slba: u64,
        nlb: u32,
        buf: AppBuffer,
        tag: u64,
    ) -> Result<(), MappedSubmitError> {
        self.submit_io(false, nsid, slba, nlb, buf, tag)
    }

    /// Write `nlb` blocks at `slba` of `nsid` from `buf`.
    pub fn write(
        &mut self,
        nsid: Q::Addr,
        slba: u64,
        nlb: u32,
        buf: AppBuffer,
        tag: u64,
    ) -> Result<(), MappedSubmitError> {
        self.submit_io(true, nsid, slba, nlb, buf, tag)
    }

    fn submit_io(
        &mut self,
        write: bool,
        nsid: Q::Addr,
        slba: u64,
        nlb: u32,
        buf: AppBuffer,
        tag: u64,
    ) -> Result<(), MappedSubmitError> {
        let refuse = |kind: SubmitErrorKind, buf| MappedSubmitError {
            kind: kind.into(),
            buf: Some(buf),
        };
        if nlb == 0 {
            return Err(refuse(SubmitErrorKind::ZeroLength, buf));
        }
        let Some(shift) = self.qp().block_shift(nsid) else {
            return Err(refuse(Q::unknown(nsid), buf));
        };
        // nlb < 2^32 and shift <= 63 - 32 for any block size a namespace
        // can report (bring-up checks its size fits 64 bits); saturate anyway.
        let len = u64::from(nlb).checked_shl(shift).unwrap_or(u64::MAX);
        if len > buf.len() as u64 {
            let available = buf.len() as u64;
            return Err(refuse(
                SubmitErrorKind::BufferTooSmall {
                    needed: len,
                    available,
                },
                buf,
            ));
        }
        if self.qp().is_full() {
            return Err(refuse(SubmitErrorKind::QueueFull, buf));
        }
        self.settle_unwound();
        // Taken off the free list only once mapped: a map that fails, or
        // unwinds, leaves it free.
        let Some(&slot) = self.free.last() else {
            return Err(refuse(SubmitErrorKind::QueueFull, buf));
        };
        let s = &mut self.slots[slot as usize];
        s.gen = s.gen.wrapping_add(1);
        let key = key(slot, s.gen);
        let dir = if write {
            DmaDir::ToDevice
        } else {
            DmaDir::FromDevice
        };
        // Lazy: a full window makes `map` flush synchronously.
        self.unmap_unwound = true;
        let mapped = self.mapper.map(IoBuffer::App(buf), len as usize, dir, key);
        self.unmap_unwound = false;
        let m = match mapped {
            Ok(m) => m,
            Err(f) => {
                if matches!(f.error, MapError::FlushFailed { .. }) {
                    // The flush leaked every queued mapping: the I/Os
                    // waiting for it end now, without their buffers.
                    settle(&mut self.slots, &mut self.ready, &mut self.returned, true);
                }
                return Err(MappedSubmitError {
                    kind: f.error.into(),
                    buf: f.buf.into_app(),
                });
            }
        };
        self.free.pop();
        let qp = self.qp();
        let r = if write {
            qp.write(nsid, slba, nlb, m, key)
        } else {
            qp.read(nsid, slba, nlb, m, key)
        };
        match r {
            Ok(()) => {
                let s = &mut self.slots[slot as usize];
                s.state = SlotState::InFlight;
                s.tag = tag;
                Ok(())
            }
            Err(e) => {
                // Never submitted: unmap it now (lazy: flush) and hand it back.
                let kind = e.kind;
                let s = &mut self.slots[slot as usize];
                s.state = SlotState::Unmapping;
                // Only seen if the unmap below unwinds (then it is delivered).
                s.result = Err(IoError::Aborted);
                s.tag = tag;
                self.unmap_unwound = true;
                let mut r = self.mapper.release(e.into_buf(), &mut self.returned);
                if r.is_ok() {
                    r = self.mapper.flush(&mut self.returned);
                }
                self.unmap_unwound = false;
                settle(
                    &mut self.slots,
                    &mut self.ready,
                    &mut self.returned,
                    r.is_err(),
                );
                // Ready now: its buffer is back, or leaked by the failed unmap.
                if let Some(pos) = self.ready.iter().position(|&x| x == slot) {
                    self.ready.remove(pos);
                }
                let s = &mut self.slots[slot as usize];
                s.result = Ok(());
                let buf = s.buf.take();
                if matches!(s.state, SlotState::Ready) {
                    s.state = SlotState::Free;
                    self.free.push(slot);
                }
                Err(MappedSubmitError {
                    kind: match r {
                        Ok(()) => kind.into(),
                        Err(u) => u.into(),
                    },
                    buf,
                })
            }
        }
    }

    /// Ring the doorbell for what was queued since the last call.
    pub fn submit(&mut self) -> bool {
        self.qp().submit()
    }

    /// An unmap unwound during an earlier call: settle what it leaked.
    fn settle_unwound(&mut self) {
        if std::mem::take(&mut self.unmap_unwound) {
            settle(&mut self.slots, &mut self.ready, &mut self.returned, true);
        }
    }

    /// Hand every ready slot to `f`, oldest first. Each slot is taken off
    /// the ready list and freed before `f` sees it, so if `f` panics the
    /// rest stay ready for the next `poll`, `flush_mappings` or `close`
    /// (as the core tracker does with its slots).
    fn deliver<F: FnMut(Completion<AppBuffer>)>(&mut self, f: &mut F) -> usize {
        let mut n = 0;
        while let Some(slot) = self.ready.pop_front() {
            let s = &mut self.slots[slot as usize];
            s.state = SlotState::Free;
            let result = std::mem::replace(&mut s.result, Ok(()));
            let c = Completion {
                tag: s.tag,
                result,
                buf: s.buf.take(),
                dw0: s.dw0,
            };
            self.free.push(slot);
            n += 1;
            f(c);
        }
        n
    }

    /// Reap up to `max` completions from the device, unmap their buffers
    /// (lazy: queue the unmaps, flushing when due), and call `f` once for
    /// every I/O whose buffer is back — which in lazy mode can be a whole
    /// batch of earlier I/Os, more than `max`. Returns how many were
    /// delivered. Call it also when nothing is expected: it runs the lazy
    /// time limit.
    ///
    /// `c.buf` is `None` only when the device might still reach the buffer
    /// (a queue that could not be deleted, a failed unmap): it is leaked.
    /// A failed unmap is also returned as [`Error::Mapping`], after the
    /// completions were delivered. A lazy flush that fails leaks every
    /// buffer it held, so all the I/Os that waited for it are delivered
    /// then, without their buffers — also when the flush ran inside
    /// [`read`](Self::read)/[`write`](Self::write) because the IOVA window
    /// was full (that submission is refused with
    /// [`MapError::FlushFailed`]).
    ///
    /// Panics: if `f` panics, the completions not yet handed to it stay
    /// ready for the next `poll`, `flush_mappings` or `close`; none is
    /// lost. If an IOMMU unmap panics, the mappings it covered are leaked,
    /// and the I/Os waiting for them are delivered by the next call,
    /// without their buffers.
    pub fn poll<F: FnMut(Completion<AppBuffer>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        self.settle_unwound();
        let mut unmap_err = None;
        let polled = {
            let Self {
                qp,
                mapper,
                slots,
                ready,
                returned,
                unmap_unwound,
                ..
            } = self;
            let qp = match qp.as_mut() {
                Some(qp) => qp,
                None => unreachable!("only close and drop take the queue pair out"),
            };
            qp.poll(max, |c| {
                on_device_done(
                    c,
                    mapper,
                    slots,
                    ready,
                    returned,
                    unmap_unwound,
                    &mut unmap_err,
                )
            })
        };
        self.unmap_unwound = true;
        let flushed = self.mapper.poll(&mut self.returned);
        self.unmap_unwound = false;
        if let Err(e) = flushed {
            unmap_err.get_or_insert(e);
            settle(&mut self.slots, &mut self.ready, &mut self.returned, true);
        }
        settle(&mut self.slots, &mut self.ready, &mut self.returned, false);
        let n = self.deliver(&mut f);
        polled?;
        match unmap_err {
            Some(e) => Err(Error::Mapping(e)),
            None => Ok(n),
        }
    }

    /// Unmap everything the lazy flush queue holds now and deliver those
    /// I/Os (a no-op in strict mode). For when the application waits for a
    /// particular buffer and cannot wait for the batch or the time limit.
    pub fn flush_mappings<F: FnMut(Completion<AppBuffer>)>(&mut self, mut f: F) -> Result<usize> {
        self.settle_unwound();
        self.unmap_unwound = true;
        let r = self.mapper.flush(&mut self.returned);
        self.unmap_unwound = false;
        settle(
            &mut self.slots,
            &mut self.ready,
            &mut self.returned,
            r.is_err(),
        );
        let n = self.deliver(&mut f);
        r.map_err(Error::Mapping)?;
        Ok(n)
    }

    /// Delete the queue (see [`QueuePair::close`](crate::QueuePair::close)), unmap every buffer and
    /// deliver every I/O not yet delivered, each exactly once.
    pub fn close(mut self, mut f: impl FnMut(Completion<AppBuffer>)) -> Result<()> {
        self.shut_down(&mut f)
    }

    fn shut_down<F: FnMut(Completion<AppBuffer>)>(&mut self, f: &mut F) -> Result<()> {
        self.settle_unwound();
        let mut unmap_err = None;
        let closed = match self.qp.take() {
            Some(qp) => {
                let Self {
                    mapper,
                    slots,
                    ready,
                    returned,
                    unmap_unwound,
                    ..
                } = self;
                qp.close(|c| {
                    on_device_done(
                        c,
                        mapper,
                        slots,
                        ready,
                        returned,
                        unmap_unwound,
                        &mut unmap_err,
                    )
                })
            }
            None => Ok(()),
        };
        self.settle_unwound();
        self.unmap_unwound = true;
        let r = self.mapper.flush(&mut self.returned);
        self.unmap_unwound = false;
        settle(
            &mut self.slots,
            &mut self.ready,
            &mut self.returned,
            r.is_err(),
        );
        if let Err(e) = r {
            unmap_err.get_or_insert(e);
        }
        self.deliver(f);
        closed?;
        match unmap_err {
            Some(e) => Err(Error::Mapping(e)),
            None => Ok(()),
        }
    }
}

/// A command finished on the device: record its result and release its
/// mapping; the slot becomes ready when its buffer is back.
fn on_device_done(
    c: Completion<Mapped>,
    mapper: &mut QueueMapper,
    slots: &mut [Slot],
    ready: &mut VecDeque<u32>,
    returned: &mut Vec<Returned>,
    unmap_unwound: &mut bool,
    unmap_err: &mut Option<MapError>,
) {
    if std::mem::take(unmap_unwound) {
        // An earlier release in this close unwound (see the field).
        settle(slots, ready, returned, true);
    }
    let slot = (c.tag & u64::from(u32::MAX)) as usize;
    let Some(s) = slots.get_mut(slot) else {
        return; // the queue pair only hands back tags we gave it
    };
    s.result = c.result;
    s.dw0 = c.dw0;
    s.state = SlotState::Unmapping;
    match c.buf {
        Some(m) => {
            *unmap_unwound = true;
            let released = mapper.release(m, returned);
            *unmap_unwound = false;
            if let Err(e) = released {
                // Every mapping the failed unmap covered is leaked: this
                // one (strict) or the whole flush queue (lazy).
                settle(slots, ready, returned, true);
                unmap_err.get_or_insert(e);
            }
        }
        None => {
            // The queue leaked it (the device may still own it).
            s.state = SlotState::Ready;
            ready.push_back(slot as u32);
        }
    }
}

/// The mapper's and the queue pair's tag for a slot: index and generation.
fn key(slot: u32, gen: u32) -> u64 {
    u64::from(gen) << 32 | u64::from(slot)
}

/// Move the buffers the mapper handed back into their slots, which become
/// ready. After a failed unmap (`unmap_failed`), a slot still waiting for its
/// buffer will never get it (the mapper leaked every mapping the call
/// covered, so the device cannot reach reused memory): it becomes ready
/// without one.
fn settle(
    slots: &mut [Slot],
    ready: &mut VecDeque<u32>,
    returned: &mut Vec<Returned>,
    unmap_failed: bool,
) {
    for r in returned.drain(..) {
        let slot = (r.tag & u64::from(u32::MAX)) as u32;
        let gen = (r.tag >> 32) as u32;
        match slots.get_mut(slot as usize) {
            Some(s) if s.gen == gen && matches!(s.state, SlotState::Unmapping) => {
                s.buf = r.buf.into_app();
                s.state = SlotState::Ready;
                ready.push_back(slot);
            }
            // Unmapped, so safe to free; nobody waits for it any more.
            _ => drop(r.buf),
        }
    }
    if unmap_failed {
        for (i, s) in slots.iter_mut().enumerate() {
            if matches!(s.state, SlotState::Unmapping) {
                s.state = SlotState::Ready;
                ready.push_back(i as u32);
            }
        }
    }
}

impl<Q: BlockQueue<Buf = Mapped>> Drop for MappedQueuePair<Q> {
    /// Closes the queue and unmaps every buffer; the buffers are freed.
    fn drop(&mut self) {
        if let Err(e) = self.shut_down(&mut |_| {}) {
            log::warn!("closing a mapped queue pair: {e}");
        }
    }
}
