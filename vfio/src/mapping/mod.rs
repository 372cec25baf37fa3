//! DMA mapping modes for the I/O path: premapped, strict and lazy.
//!
//! Every I/O needs "an IOVA and a length describing page-aligned memory" when
//! it is submitted, and "release this mapping" when it completes. How much
//! IOMMU work that costs is the application's choice, per queue pair:
//!
//! | Mode | Buffers | IOMMU work per I/O | Memory handed back |
//! |---|---|---|---|
//! | [`DmaMode::Premapped`] | [`PoolBuf`] from a per-thread [`BufPool`] mapped once | none | at completion |
//! | [`DmaMode::Strict`] | any [`AppBuffer`] | one map, one unmap, one IOTLB invalidation | at completion, after the unmap returned |
//! | [`DmaMode::Lazy`] | any [`AppBuffer`] | one map; unmaps batched per queue, contiguous IOVAs coalesced into one range | after the flush that covers it returned |
//!
//! All three sit behind one trait, [`DmaMapper`], and one enum the engine can
//! store per queue pair without dynamic dispatch, [`QueueMapper`], built from
//! a [`MapperConfig`].
//!
//! # How the engine calls a mapper
//!
//! A mapper is per queue pair (per CPU): it is `Send` but not `Sync`, takes
//! `&mut self` everywhere and shares no lock with other mappers. The only
//! shared state it touches on the I/O path is the IOMMU itself (strict and lazy
//! modes; VFIO's type1 driver holds its own lock across a map or unmap).
//!
//! 1. **Submit.** `let m = mapper.map(buf, len, dir, tag)?` takes ownership of
//!    the application buffer and returns a [`Mapped`]: [`Mapped::iova`] is the
//!    device address of byte 0, contiguous for [`Mapped::len`] bytes (a
//!    multiple of the controller page [`PAGE_SIZE`](crate::PAGE_SIZE)), so
//!    PRP entry `i` is `m.iova().add(i * PAGE_SIZE)` whatever the host page
//!    or IOMMU granule (see [Page sizes](#page-sizes)). `len` is the transfer length (at most the
//!    buffer's length; [`Mapped::transfer_len`]); `dir` is the data direction
//!    (`FromDevice` for a read command); `tag` is the engine's cookie (command
//!    id or request slot), given back with the buffer. On failure the buffer
//!    comes back inside [`MapFailed`]. [`Mapped::is_mapped_in`] tells whether
//!    the mapping belongs to the controller's DMA space (build the mapper over
//!    `Backend::dma()`). Keep `m` in the request slot until the completion.
//! 2. **Complete.** After the CQE for the command is consumed, call
//!    `mapper.release(m, &mut returned)`. Every buffer whose memory the device
//!    can no longer reach is appended to `returned` as a [`Returned`]
//!    `{ tag, buf }`, and only then may it go back to the application. In
//!    premapped and strict modes that is the buffer just released; in lazy
//!    mode it is zero buffers until the flush queue fills (then a whole batch).
//! 3. **Poll.** Call `mapper.poll(&mut returned)` on every pass of the
//!    completion-reaping loop, including passes that found no CQE: it flushes
//!    a lazy queue whose oldest entry is older than the time limit (it costs
//!    one branch when the queue is empty and one clock read otherwise).
//! 4. **Drain.** `mapper.flush(&mut returned)` forces the flush — before
//!    tearing down a queue, or when the application waits for one specific
//!    buffer. Dropping a mapper flushes too (returned buffers are then freed).
//!
//! A failed unmap — an error, or a panic unwinding through the IOMMU call —
//! leaks every buffer and IOVA the call covered (strict: the one released;
//! lazy: the whole flush queue, reported as [`MapError::FlushFailed`]), in
//! every path including `map`'s full-window flush and `Drop`: which ranges
//! were torn down is unknown, and memory the device may still reach is
//! never freed or handed back.
//!
//! ```
//! use mcqio_vfio::{AppBuffer, DmaDir, DmaMapper, Mapped, QueueMapper, Returned};
//!
//! /// Submission side: one I/O of `len` bytes into `buf` (a read command).
//! fn submit(q: &mut QueueMapper, buf: AppBuffer, len: usize, cid: u16)
//!     -> Result<Mapped, mcqio_vfio::MapFailed>
//! {
//!     let m = q.map(buf.into(), len, DmaDir::FromDevice, cid as u64)?;
//!     // PRP1 = m.iova(); PRP2 / the PRP list = m.iova().add(4096 * i), i >= 1.
//!     Ok(m)
//! }
//!
//! /// Completion side: after consuming the CQE for the request holding `m`.
//! fn complete(q: &mut QueueMapper, m: Mapped, done: &mut Vec<Returned>)
//!     -> Result<(), mcqio_vfio::MapError>
//! {
//!     q.release(m, done)?;
//!     q.poll(done)?; // also on idle passes of the reaping loop
//!     for r in done.drain(..) {
//!         // r.tag identifies the request; r.buf may go back to the app now.
//!         let _app_buffer = r.buf.into_app();
//!     }
//!     Ok(())
//! }
//! # let _ = (submit, complete);
//! ```
//!
//! A request's completion can be delivered to the application together with
//! its buffer (hold the status until the [`Returned`] with its tag appears) or
//! separately (status at once, buffer later); lazy mode's extra latency only
//! affects the former. A [`Mapped`] dropped without `release` leaks its buffer
//! and IOVA on purpose (the device may still reach them) and logs an error.
//!
//! # Lazy mode without the use-after-unmap window
//!
//! Linux's non-strict ("lazy", `DMA-FQ`) mode frees memory at unmap time and
//! only defers the IOTLB flush, so "devices may be able to access memory for
//! some time after it has been unmapped". Here the flush queue owns the
//! application buffer, and the IOVA stays allocated in the queue's window,
//! until the unmap call covering it has returned. What lazy mode costs is
//! pinned memory and latency to get a buffer back, not safety:
//!
//! - a buffer stays mapped and pinned for at most `max_delay` (default 10 ms)
//!   after its I/O completed, provided the engine polls;
//! - worst-case pinned bytes per queue held by the flush queue =
//!   `batch × largest I/O` (256 × 128 KiB = 32 MiB at the defaults for
//!   128 KiB I/Os; 1 MiB for 4 KiB I/Os), on top of the in-flight I/Os;
//! - the window must hold in-flight plus queued mappings
//!   ([`MapperConfig::window_len`]); when it is full, `map` flushes the queue
//!   synchronously and retries, as Linux does when its ring is full.
//!
//! The defaults (256 entries, 10 ms) are Linux's `IOVA_DEFAULT_FQ_SIZE` and
//! `IOVA_DEFAULT_FQ_TIMEOUT`: 256 amortises one IOTLB sync over 256 I/Os and
//! stays under VFIO type1's 512-region gather limit, so a coalesced batch is
//! one sync; 10 ms bounds how long memory stays pinned and reachable.
//!
//! Coalescing works because each mapper sub-allocates its window first-fit
//! from the bottom: I/Os mapped one after another get adjacent IOVAs, and a
//! flush frees whole runs, so the window heals back into one free range. With
//! roughly in-order completion a full batch is one range: one
//! `VFIO_IOMMU_UNMAP_DMA` for up to 512 mappings, one IOTLB sync. An I/O still
//! in flight in the middle of a batch splits it into two ranges.
//!
//! # Page sizes
//!
//! The IOMMU maps whole granules ([`DmaSpace::granule`](crate::DmaSpace::granule):
//! the largest of the host page, the IOMMU's smallest page and the 4 KiB
//! controller page). A strict or lazy mapper maps every granule the
//! transfer touches, from the granule holding byte 0 to the one holding the
//! last byte, and hands the device the IOVA of byte 0 inside that range (the
//! buffer's offset within its first granule is kept); the unmap covers the
//! same granules. Pool buffers live in a region mapped whole, so they only
//! need to start on a controller page.
//!
//! Two application buffers sharing a granule are **refused**, not
//! reference-counted: mapping a granule that holds memory the buffer does
//! not own ([`AppBuffer`] owns its allocation and nothing else) fails with
//! [`MapError::SharedGranule`] and hands the buffer back. Mapping it anyway
//! would let the device reach the neighbour's bytes (which its owner may be
//! writing through a `&mut [u8]`), and on VFIO would pin memory we do not
//! own, or fail if nothing is mapped there. [`AppBuffer::for_space`]
//! allocates whole granules, so its buffers never hit this; with a host
//! page at least as large as the IOMMU granule (every common setup), no
//! buffer does.
//!
//! # Limits of a real VFIO container
//!
//! - VFIO type1 caps the number of live mappings per container
//!   (`dma_entry_limit`, 65535 by default). Strict and lazy mappers hold one
//!   per in-flight I/O plus, in lazy mode, one per queued unmap; premapped
//!   pools hold one per pool.
//! - Pages are pinned by the map call and charged to `RLIMIT_MEMLOCK` for
//!   unprivileged processes; allocate with [`AppBuffer::for_space`] so the
//!   buffer is not also `mlock`ed (charged twice). Root (`CAP_IPC_LOCK`) is
//!   not limited.
//! - A real map call pins pages and writes page tables (microseconds), so
//!   strict and lazy pay that per I/O; only premapped avoids it.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::dma::DmaError;
use crate::iommu::{DmaDir, IommuError, IommuStats};
use crate::iova::{Iova, IovaError};

mod buffer;
mod lazy;
mod pool;
mod strict;
mod window;

pub mod bench;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use buffer::AppBuffer;
pub use lazy::{LazyConfig, LazyMapper, MAX_FLUSH_BATCH};
pub use pool::{BufPool, PoolBuf, PoolConfig, PremappedMapper};
pub use strict::StrictMapper;

/// VFIO type1 gathers at most this many unmapped regions per IOTLB sync
/// (`VFIO_IOMMU_TLB_SYNC_MAX`); used to model invalidations per unmap call.
pub const VFIO_TLB_SYNC_MAX: u64 = 512;

/// Which mapping strategy a queue pair uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DmaMode {
    /// Buffers come from a pool mapped once; no IOMMU call per I/O.
    Premapped,
    /// Map before submission, unmap and invalidate at completion.
    Strict,
    /// Map before submission; unmaps are batched in a per-queue flush queue.
    Lazy,
}

impl DmaMode {
    /// The lowercase name used on command lines (`premapped`, `strict`, `lazy`).
    pub const fn name(self) -> &'static str {
        match self {
            DmaMode::Premapped => "premapped",
            DmaMode::Strict => "strict",
            DmaMode::Lazy => "lazy",
        }
    }
}

impl fmt::Display for DmaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DmaMode {
    type Err = MapError;
    fn from_str(s: &str) -> Result<Self, MapError> {
        match s {
            "premapped" => Ok(DmaMode::Premapped),
            "strict" => Ok(DmaMode::Strict),
            "lazy" => Ok(DmaMode::Lazy),
            _ => Err(MapError::UnknownMode(s.to_owned())),
        }
    }
}

/// Everything needed to build a [`QueueMapper`] for one queue pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapperConfig {
    /// The mapping mode.
    pub mode: DmaMode,
    /// Pool geometry (premapped mode).
    pub pool: PoolConfig,
    /// Bytes of IOVA space reserved per mapper for temporary mappings (strict
    /// and lazy modes). Must hold every in-flight mapping plus, in lazy mode,
    /// every queued one: `(queue depth + batch) × largest I/O`.
    pub window_len: u64,
    /// Flush-queue policy (lazy mode).
    pub lazy: LazyConfig,
}

/// Default per-queue IOVA window: 256 MiB, room for (1024 in flight + 256
/// queued) × 128 KiB I/Os plus slack. IOVA space is cheap (39 to 48 bits).
pub const DEFAULT_WINDOW_LEN: u64 = 256 << 20;

impl Default for MapperConfig {
    fn default() -> Self {
        Self {
            mode: DmaMode::Lazy,
            pool: PoolConfig::default(),
            window_len: DEFAULT_WINDOW_LEN,
            lazy: LazyConfig::default(),
        }
    }
}

impl MapperConfig {
    /// The defaults with `mode`.
    pub fn with_mode(mode: DmaMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }
}

/// Why a mapping operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// An application buffer was given to a premapped mapper.
    #[error("this queue is in premapped mode and only accepts buffers from its pool: allocate with `BufPool::alloc`, or choose the strict or lazy DMA mode for application buffers")]
    NotPremapped,
    /// A pool buffer belongs to another DMA space (another device or container).
    #[error("pool buffer belongs to a different DMA space (another device or IOMMU container): allocate it from this queue's pool")]
    ForeignPool,
    /// A [`Mapped`] was released to a mapper that did not create it.
    #[error("mapping at IOVA {iova} was released to a mapper that did not create it; release it to the queue that submitted it (the buffer is leaked to stay safe)")]
    ForeignMapping {
        /// The mapping's IOVA.
        iova: Iova,
    },
    /// Transfer length zero or longer than the buffer.
    #[error(
        "transfer of {len} bytes does not fit a {buf_len}-byte buffer (must be 1..={buf_len})"
    )]
    BadLength {
        /// Requested transfer length.
        len: usize,
        /// Buffer length.
        buf_len: usize,
    },
    /// The per-queue IOVA window has no room even after a flush.
    #[error("per-queue IOVA window of {window:#x} bytes is full ({len:#x} bytes asked): raise MapperConfig::window_len or lower the queue depth / lazy batch")]
    WindowFull {
        /// Bytes asked for.
        len: u64,
        /// Window size.
        window: u64,
    },
    /// The pool has no free buffer.
    #[error("DMA buffer pool exhausted ({count} buffers of {buf_size} bytes): return buffers or raise PoolConfig::count")]
    PoolExhausted {
        /// Buffers in the pool.
        count: usize,
        /// Size of each.
        buf_size: usize,
    },
    /// The transfer touches an IOMMU granule that holds memory the buffer
    /// does not own (module docs, "Page sizes").
    #[error("buffer at {ptr:#x} (+{len:#x} bytes) shares a {granule:#x}-byte IOMMU page with memory it does not own: allocate it with AppBuffer::for_space, which allocates whole IOMMU pages")]
    SharedGranule {
        /// Host address of the buffer.
        ptr: usize,
        /// Bytes of the transfer.
        len: usize,
        /// The space's granule.
        granule: usize,
    },
    /// A configuration value is out of range.
    #[error("invalid DMA mapper configuration: {0}")]
    Config(String),
    /// A lazy batch outside `1..=max` ([`LazyConfig::validate`]).
    #[error("lazy flush batch of {batch} is out of range: use 1..={max} (no VFIO container holds more mappings)")]
    LazyBatch {
        /// The batch asked for.
        batch: usize,
        /// [`MAX_FLUSH_BATCH`].
        max: usize,
    },
    /// A lazy flush's unmap failed: every mapping the flush queue held is
    /// leaked (buffers and IOVAs kept), as the device may still reach
    /// them. Whoever waited for one of those buffers will never get it.
    #[error("lazy flush of {leaked} mappings failed, their buffers are leaked: {source}")]
    FlushFailed {
        /// Mappings (and buffers) leaked.
        leaked: usize,
        /// What the IOMMU said.
        #[source]
        source: IommuError,
    },
    /// An unknown mode name.
    #[error("unknown DMA mode {0:?}: use premapped, strict or lazy")]
    UnknownMode(String),
    /// The IOMMU failed.
    #[error(transparent)]
    Iommu(#[from] IommuError),
    /// DMA memory could not be allocated.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// IOVA space could not be reserved.
    #[error(transparent)]
    Iova(#[from] IovaError),
}

/// A failed [`DmaMapper::map`]: the error plus the buffer, handed back.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct MapFailed {
    /// What went wrong.
    #[source]
    pub error: MapError,
    /// The buffer, unchanged and not mapped.
    pub buf: IoBuffer,
}

/// A buffer the I/O path can transfer to or from.
#[derive(Debug)]
pub enum IoBuffer {
    /// A premapped pool buffer (no IOMMU work).
    Pool(PoolBuf),
    /// Application memory, mapped per I/O.
    App(AppBuffer),
}

impl IoBuffer {
    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        match self {
            IoBuffer::Pool(b) => b.len(),
            IoBuffer::App(b) => b.len(),
        }
    }

    /// Always false: buffers are at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Host address of byte 0.
    pub fn as_ptr(&self) -> NonNull<u8> {
        match self {
            IoBuffer::Pool(b) => b.as_ptr(),
            IoBuffer::App(b) => b.as_ptr(),
        }
    }

    /// The memory the buffer owns, `(start address, length)`; nothing else
    /// shares it (see [`AppBuffer`]).
    pub(crate) fn owned(&self) -> (usize, usize) {
        match self {
            IoBuffer::Pool(b) => (b.as_ptr().as_ptr() as usize, b.len()),
            IoBuffer::App(b) => b.owned(),
        }
    }

    /// The application buffer, if this is one.
    pub fn into_app(self) -> Option<AppBuffer> {
        match self {
            IoBuffer::App(b) => Some(b),
            IoBuffer::Pool(_) => None,
        }
    }

    /// The pool buffer, if this is one.
    pub fn into_pool(self) -> Option<PoolBuf> {
        match self {
            IoBuffer::Pool(b) => Some(b),
            IoBuffer::App(_) => None,
        }
    }
}

impl From<AppBuffer> for IoBuffer {
    fn from(b: AppBuffer) -> Self {
        IoBuffer::App(b)
    }
}

impl From<PoolBuf> for IoBuffer {
    fn from(b: PoolBuf) -> Self {
        IoBuffer::Pool(b)
    }
}

/// How a [`Mapped`] got its IOVA (decides what `release` must do).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum MapKind {
    /// A pool buffer: mapped for the pool's lifetime, nothing to undo.
    Premapped,
    /// A temporary mapping in the mapper's window.
    Window,
}

/// A buffer mapped for one I/O; give it back with [`DmaMapper::release`].
///
/// Holds the buffer, so the application cannot touch it while the device may.
#[must_use = "a Mapped must be released to its mapper, or its buffer is leaked"]
pub struct Mapped {
    pub(crate) iova: Iova,
    /// Bytes from `iova` the device may use. The IOMMU mapping behind a
    /// window mapping covers the whole granules of `buf`'s first `len`
    /// bytes; `release` recomputes that range from the buffer rather than
    /// storing it (this value moves through the queue on every I/O).
    pub(crate) len: usize,
    pub(crate) transfer_len: usize,
    pub(crate) dir: DmaDir,
    pub(crate) tag: u64,
    pub(crate) kind: MapKind,
    pub(crate) mapper: u32,
    /// [`DmaSpace::id`](crate::DmaSpace::id) of the space the mapping lives
    /// in. Not its address: the `Mapped` does not keep the space alive, and
    /// a later space may be allocated where this one was.
    pub(crate) space: u64,
    pub(crate) buf: Option<IoBuffer>,
}

impl fmt::Debug for Mapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapped")
            .field("iova", &self.iova)
            .field("len", &self.len)
            .field("transfer_len", &self.transfer_len)
            .field("dir", &self.dir)
            .field("tag", &self.tag)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Mapped {
    /// Device address of byte 0; the mapping is IOVA-contiguous for `len()` bytes.
    #[inline]
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Length the device may use from [`iova`](Self::iova): the transfer
    /// length rounded up to the controller page ([`PAGE_SIZE`](crate::PAGE_SIZE)).
    /// The IOMMU mapping behind it covers whole granules and may be larger.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The transfer length given to `map` (at most `len()`).
    #[inline]
    pub fn transfer_len(&self) -> usize {
        self.transfer_len
    }

    /// Whether the mapping lives in `space` (the controller's DMA space); an
    /// IOVA from another space means nothing to this device.
    #[inline]
    pub fn is_mapped_in(&self, space: &crate::DmaSpace) -> bool {
        self.space == space.id()
    }

    /// Always false.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Host address of byte 0 (the buffer the mapping covers; `None` only
    /// for a mapping whose buffer was already taken back).
    #[inline]
    pub fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.buf.as_ref().map(IoBuffer::as_ptr)
    }

    /// The direction the device may move data.
    #[inline]
    pub fn dir(&self) -> DmaDir {
        self.dir
    }

    /// The engine's cookie given to `map`.
    #[inline]
    pub fn tag(&self) -> u64 {
        self.tag
    }

    pub(crate) fn kind(&self) -> MapKind {
        self.kind
    }

    pub(crate) fn mapper(&self) -> u32 {
        self.mapper
    }

    /// Host address of the buffer's byte 0 and the memory it owns.
    pub(crate) fn host(&self) -> Option<(usize, (usize, usize))> {
        self.buf
            .as_ref()
            .map(|b| (b.as_ptr().as_ptr() as usize, b.owned()))
    }

    /// Take the buffer out, disarming the leak-on-drop.
    pub(crate) fn take_buf(&mut self) -> IoBuffer {
        self.buf
            .take()
            .expect("Mapped always holds its buffer until released")
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // The device may still reach the memory through the IOMMU: leaking
            // the buffer (and its IOVA) is the only safe thing to do here.
            log::error!(
                "Mapped at IOVA {} ({} bytes) dropped without DmaMapper::release: leaking its buffer",
                self.iova,
                self.len
            );
            std::mem::forget(buf);
        }
    }
}

/// A buffer the device can no longer reach, with the tag it was mapped with.
#[derive(Debug)]
pub struct Returned {
    /// The tag given to [`DmaMapper::map`].
    pub tag: u64,
    /// The buffer, safe to hand back to the application.
    pub buf: IoBuffer,
}

/// Per-mapper counters (plain integers: a mapper is single-threaded).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MapperStats {
    /// IOMMU map calls made.
    pub maps: u64,
    /// I/Os that used a premapped pool buffer (no IOMMU call).
    pub premapped_ios: u64,
    /// Mappings torn down.
    pub unmaps: u64,
    /// Unmap calls made to the IOMMU (`unmap` or `unmap_many` each count once).
    pub unmap_calls: u64,
    /// IOVA ranges passed to those calls after coalescing contiguous mappings.
    pub unmap_ranges: u64,
    /// IOTLB invalidations the unmaps imply under VFIO type1's model: one per
    /// range, plus one per further [`VFIO_TLB_SYNC_MAX`] mappings gathered in it.
    pub invalidations: u64,
    /// Lazy flushes because the queue reached its batch size.
    pub flushes_full: u64,
    /// Lazy flushes because the oldest entry reached the time limit.
    pub flushes_timed: u64,
    /// Lazy flushes forced by `flush`, a full window or drop.
    pub flushes_forced: u64,
    /// Bytes this mapper currently keeps mapped (in flight, queued, or a pool).
    pub bytes_pinned: u64,
    /// High-water mark of `bytes_pinned`.
    pub peak_bytes_pinned: u64,
    /// Bytes held by the lazy flush queue right now (part of `bytes_pinned`).
    pub queued_bytes: u64,
    /// The IOMMU's own counters (shared by every mapper on it).
    pub iommu: IommuStats,
}

impl MapperStats {
    pub(crate) fn pin(&mut self, bytes: u64) {
        self.bytes_pinned += bytes;
        self.peak_bytes_pinned = self.peak_bytes_pinned.max(self.bytes_pinned);
    }

    pub(crate) fn unpin(&mut self, bytes: u64) {
        self.bytes_pinned = self.bytes_pinned.saturating_sub(bytes);
    }

    /// Record one unmap call over `ranges`, each `(mappings in range, bytes)`.
    pub(crate) fn on_unmap_call(&mut self, ranges: impl Iterator<Item = (u64, u64)>) {
        self.unmap_calls += 1;
        for (mappings, bytes) in ranges {
            self.unmap_ranges += 1;
            self.unmaps += mappings;
            self.invalidations += mappings.div_ceil(VFIO_TLB_SYNC_MAX).max(1);
            self.unpin(bytes);
        }
    }
}

/// The I/O path's view of a DMA mapping strategy. See the module docs for
/// the calling sequence.
pub trait DmaMapper: Send {
    /// The mode this mapper implements.
    fn mode(&self) -> DmaMode;

    /// Make the first `len` bytes of `buf` reachable by the device for one I/O.
    fn map(
        &mut self,
        buf: IoBuffer,
        len: usize,
        dir: DmaDir,
        tag: u64,
    ) -> Result<Mapped, MapFailed>;

    /// The I/O using `m` completed: tear the mapping down (now or in a later
    /// flush) and append every buffer the device can no longer reach to `out`.
    fn release(&mut self, m: Mapped, out: &mut Vec<Returned>) -> Result<(), MapError>;

    /// Time-based work: flush a lazy queue whose oldest entry is older than
    /// the time limit. Call on every pass of the completion loop. Modes that
    /// defer nothing (premapped, strict) keep the default no-op.
    fn poll(&mut self, _out: &mut Vec<Returned>) -> Result<(), MapError> {
        Ok(())
    }

    /// Flush everything queued now (a no-op for modes that defer nothing).
    fn flush(&mut self, _out: &mut Vec<Returned>) -> Result<(), MapError> {
        Ok(())
    }

    /// Counters.
    fn stats(&self) -> MapperStats;
}

// Mappers move to their queue's thread; buffers cross threads freely.
const _: () = {
    const fn send<T: Send>() {}
    send::<QueueMapper>();
    send::<IoBuffer>();
    send::<Mapped>();
};

static NEXT_MAPPER_ID: AtomicU32 = AtomicU32::new(1);

/// A process-unique id, so a [`Mapped`] cannot be released to a stranger.
pub(crate) fn next_mapper_id() -> u32 {
    NEXT_MAPPER_ID.fetch_add(1, Ordering::Relaxed)
}

/// Check a transfer length against a buffer and round it up to `page` (the
/// controller page: what the device may touch through PRP entries).
pub(crate) fn mapped_len(buf_len: usize, len: usize, page: usize) -> Result<usize, MapError> {
    if len == 0 || len > buf_len {
        return Err(MapError::BadLength { len, buf_len });
    }
    let rounded = len.div_ceil(page) * page;
    if rounded > buf_len {
        return Err(MapError::BadLength {
            len: rounded,
            buf_len,
        });
    }
    Ok(rounded)
}

/// One mapper per queue pair, in whichever mode was configured; dispatches by
/// `match`, so the I/O path pays no virtual call.
#[derive(Debug)]
pub enum QueueMapper {
    /// Premapped mode.
    Premapped(PremappedMapper),
    /// Strict mode.
    Strict(StrictMapper),
    /// Lazy mode.
    Lazy(LazyMapper),
}

impl QueueMapper {
    /// Build a mapper for one queue pair on `space`.
    pub fn new(
        space: &std::sync::Arc<crate::DmaSpace>,
        cfg: &MapperConfig,
    ) -> Result<Self, MapError> {
        Ok(match cfg.mode {
            DmaMode::Premapped => QueueMapper::Premapped(PremappedMapper::new(space, &cfg.pool)?),
            DmaMode::Strict => QueueMapper::Strict(StrictMapper::new(space, cfg.window_len)?),
            DmaMode::Lazy => {
                QueueMapper::Lazy(LazyMapper::new(space, cfg.window_len, cfg.lazy.clone())?)
            }
        })
    }

    /// The pool, in premapped mode.
    pub fn pool(&mut self) -> Option<&mut BufPool> {
        match self {
            QueueMapper::Premapped(m) => Some(m.pool()),
            _ => None,
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $m:ident => $e:expr) => {
        match $self {
            QueueMapper::Premapped($m) => $e,
            QueueMapper::Strict($m) => $e,
            QueueMapper::Lazy($m) => $e,
        }
    };
}

impl DmaMapper for QueueMapper {
    fn mode(&self) -> DmaMode {
        dispatch!(self, m => m.mode())
    }

    #[inline]
    fn map(
        &mut self,
        buf: IoBuffer,
        len: usize,
        dir: DmaDir,
        tag: u64,
    ) -> Result<Mapped, MapFailed> {
        dispatch!(self, m => m.map(buf, len, dir, tag))
    }

    #[inline]
    fn release(&mut self, m: Mapped, out: &mut Vec<Returned>) -> Result<(), MapError> {
        dispatch!(self, x => x.release(m, out))
    }

    #[inline]
    fn poll(&mut self, out: &mut Vec<Returned>) -> Result<(), MapError> {
        dispatch!(self, m => m.poll(out))
    }

    fn flush(&mut self, out: &mut Vec<Returned>) -> Result<(), MapError> {
        dispatch!(self, m => m.flush(out))
    }

    fn stats(&self) -> MapperStats {
        dispatch!(self, m => m.stats())
    }
}

/// Default lazy time limit (Linux `IOVA_DEFAULT_FQ_TIMEOUT`).
pub const DEFAULT_FLUSH_DELAY: Duration = Duration::from_millis(10);
/// Default lazy batch (Linux `IOVA_DEFAULT_FQ_SIZE` entries per CPU).
pub const DEFAULT_FLUSH_BATCH: usize = 256;
