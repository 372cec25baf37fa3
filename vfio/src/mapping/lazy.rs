//! Lazy mode: per-queue flush queue of deferred unmaps.
//!
//! `release` does not unmap; it parks the mapping, together with the buffer
//! that owns the memory, in this mapper's flush queue. The queue is flushed
//! when it holds `batch` entries, when its oldest entry is `max_delay` old
//! (checked by `poll`), when the IOVA window runs out, or on demand. A flush
//! sorts the entries by IOVA, merges neighbours into runs, and tears all runs
//! down with a single `unmap` (one run) or `unmap_many` call. Only after that
//! call returned are the IOVAs freed and the buffers handed back. See the
//! [module docs](super) for the pinned-memory trade-off.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::map_pool_buf;
use super::strict::map_app;
use super::window::IovaWindow;
use super::{
    next_mapper_id, DmaMapper, DmaMode, IoBuffer, MapError, MapFailed, MapKind, Mapped,
    MapperStats, Returned, DEFAULT_FLUSH_BATCH, DEFAULT_FLUSH_DELAY,
};
use crate::dma::DmaSpace;
use crate::iommu::DmaDir;
use crate::iova::Iova;

/// Flush-queue policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyConfig {
    /// Flush when this many unmaps are queued (1 behaves like strict mode;
    /// at most [`MAX_FLUSH_BATCH`]).
    pub batch: usize,
    /// Flush when the oldest queued unmap is this old (checked by `poll`).
    /// [`Duration::MAX`] (or any delay the clock cannot reach) means no
    /// time limit: flush on batch only ([`LazyConfig::batch_only`]).
    pub max_delay: Duration,
}

/// The largest lazy batch: VFIO type1 holds at most 65535 mappings per
/// container (`dma_entry_limit`), so a larger batch could never fill and
/// would only size the flush queue (and the engine's request slots) for
/// entries that cannot exist.
pub const MAX_FLUSH_BATCH: usize = 65_535;

impl Default for LazyConfig {
    /// Linux's per-CPU flush-queue defaults: 256 entries, 10 ms.
    fn default() -> Self {
        Self {
            batch: DEFAULT_FLUSH_BATCH,
            max_delay: DEFAULT_FLUSH_DELAY,
        }
    }
}

impl LazyConfig {
    /// The default time limit with `batch` entries.
    pub fn with_batch(batch: usize) -> Self {
        Self {
            batch,
            ..Self::default()
        }
    }

    /// Flush when `batch` unmaps are queued, and never by time (a full
    /// window or an explicit flush still flushes).
    pub fn batch_only(batch: usize) -> Self {
        Self {
            batch,
            max_delay: Duration::MAX,
        }
    }

    /// Check the policy: `batch` in `1..=`[`MAX_FLUSH_BATCH`]. Every
    /// `max_delay` is valid.
    pub fn validate(&self) -> Result<(), MapError> {
        if (1..=MAX_FLUSH_BATCH).contains(&self.batch) {
            Ok(())
        } else {
            Err(MapError::LazyBatch {
                batch: self.batch,
                max: MAX_FLUSH_BATCH,
            })
        }
    }
}

struct Entry {
    iova: Iova,
    len: u64,
    tag: u64,
    /// `None` only under the test-only broken ordering.
    buf: Option<IoBuffer>,
}

#[derive(Copy, Clone, Debug)]
enum Cause {
    Full,
    Timed,
    Forced,
}

/// Lazy mode: one map per I/O, unmaps batched and coalesced per queue.
///
/// `Send` but not `Sync`: one per queue pair / CPU, sharing no lock with the
/// others. Pool buffers are accepted too and cost nothing.
pub struct LazyMapper {
    win: IovaWindow,
    id: u32,
    cfg: LazyConfig,
    queue: Vec<Entry>,
    /// When the oldest queued entry must be flushed.
    deadline: Option<Instant>,
    /// Buffers freed by a flush that `map` had to run; handed out next call.
    ready: Vec<Returned>,
    /// Scratch for a flush: coalesced `(iova, len)` runs and mappings per run.
    runs: Vec<(Iova, u64)>,
    run_mappings: Vec<u64>,
    stats: MapperStats,
    /// Test-only broken ordering: hand buffers back before their flush.
    release_before_flush: bool,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for LazyMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyMapper")
            .field("cfg", &self.cfg)
            .field("queued", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl LazyMapper {
    /// A mapper with its own `window_len`-byte IOVA window in `space`.
    pub fn new(space: &Arc<DmaSpace>, window_len: u64, cfg: LazyConfig) -> Result<Self, MapError> {
        cfg.validate()?;
        Ok(Self {
            win: IovaWindow::new(space, window_len)?,
            id: next_mapper_id(),
            queue: Vec::with_capacity(cfg.batch),
            runs: Vec::with_capacity(cfg.batch),
            run_mappings: Vec::with_capacity(cfg.batch),
            cfg,
            deadline: None,
            ready: Vec::new(),
            stats: MapperStats::default(),
            release_before_flush: false,
            _not_sync: PhantomData,
        })
    }

    /// The policy.
    pub fn config(&self) -> &LazyConfig {
        &self.cfg
    }

    /// Unmaps waiting in the flush queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Deliberately break the ordering guarantee: hand each buffer back at
    /// `release`, before the flush that unmaps it (Linux non-strict style).
    /// Exists only so tests can show that their checks catch it.
    ///
    /// # Safety
    ///
    /// Buffers handed back early are still mapped: the caller must keep each
    /// one alive (not drop it) until a flush after its release returned, and
    /// must expect the device to change its bytes until then.
    #[cfg(any(test, feature = "test-utils"))]
    #[doc(hidden)]
    pub unsafe fn set_release_before_flush_for_tests(&mut self, on: bool) {
        self.release_before_flush = on;
    }

    fn flush_now(&mut self, cause: Cause, out: &mut Vec<Returned>) -> Result<(), MapError> {
        self.deadline = None;
        if self.queue.is_empty() {
            return Ok(());
        }
        match cause {
            Cause::Full => self.stats.flushes_full += 1,
            Cause::Timed => self.stats.flushes_timed += 1,
            Cause::Forced => self.stats.flushes_forced += 1,
        }
        // Coalesce: sorted by IOVA, a mapping that starts where the previous
        // run ends extends it (mappings never overlap, so runs never split one).
        self.queue.sort_unstable_by_key(|e| e.iova);
        self.runs.clear();
        self.run_mappings.clear();
        for e in &self.queue {
            match (self.runs.last_mut(), self.run_mappings.last_mut()) {
                (Some((start, len)), Some(n)) if start.raw() + *len == e.iova.raw() => {
                    *len += e.len;
                    *n += 1;
                }
                _ => {
                    self.runs.push((e.iova, e.len));
                    self.run_mappings.push(1);
                }
            }
        }
        // Until the unmap returns Ok, which runs were torn down is unknown:
        // the queue is held by a guard that leaks every buffer (and, as
        // the window is never told, every IOVA) if the call fails or
        // unwinds, rather than let the device reach freed memory.
        let mut held = LeakIfNotUnmapped(std::mem::take(&mut self.queue));
        self.stats.queued_bytes = 0;
        let iommu = self.win.space().iommu();
        let r = if let [(iova, len)] = self.runs[..] {
            iommu.unmap(iova, len)
        } else {
            iommu.unmap_many(&self.runs)
        };
        if let Err(source) = r {
            let leaked = held.0.len();
            log::error!("lazy flush of {leaked} mappings failed, leaking their buffers: {source}");
            drop(held);
            return Err(MapError::FlushFailed { leaked, source });
        }
        // Disarm: the entries go back (emptied below), the guard holds none.
        self.queue = std::mem::take(&mut held.0);
        // The unmap returned: the device can no longer reach any of it. Only
        // now do the IOVAs and the buffers go back.
        for &(iova, len) in &self.runs {
            self.win.unmapped(iova, len);
        }
        self.stats.on_unmap_call(
            self.run_mappings
                .iter()
                .zip(&self.runs)
                .map(|(&n, &(_, len))| (n, len)),
        );
        for e in self.queue.drain(..) {
            if let Some(buf) = e.buf {
                out.push(Returned { tag: e.tag, buf });
            }
        }
        Ok(())
    }
}

impl DmaMapper for LazyMapper {
    fn mode(&self) -> DmaMode {
        DmaMode::Lazy
    }

    fn map(
        &mut self,
        buf: IoBuffer,
        len: usize,
        dir: DmaDir,
        tag: u64,
    ) -> Result<Mapped, MapFailed> {
        let buf = match buf {
            IoBuffer::Pool(b) => {
                return map_pool_buf(self.win.space(), b, len, dir, tag, self.id, &mut self.stats)
            }
            app => app,
        };
        match map_app(&mut self.win, buf, len, dir, tag, self.id, &mut self.stats) {
            Err(MapFailed {
                error: MapError::WindowFull { .. },
                buf,
            }) if !self.queue.is_empty() => {
                // Queued unmaps hold window space: flush synchronously (the
                // freed buffers wait in `ready`) and try once more.
                let mut ready = std::mem::take(&mut self.ready);
                let r = self.flush_now(Cause::Forced, &mut ready);
                self.ready = ready;
                if let Err(error) = r {
                    return Err(MapFailed { error, buf });
                }
                map_app(&mut self.win, buf, len, dir, tag, self.id, &mut self.stats)
            }
            other => other,
        }
    }

    fn release(&mut self, mut m: Mapped, out: &mut Vec<Returned>) -> Result<(), MapError> {
        if m.mapper() != self.id {
            return Err(MapError::ForeignMapping { iova: m.iova() });
        }
        out.append(&mut self.ready);
        let tag = m.tag();
        if m.kind() == MapKind::Premapped {
            out.push(Returned {
                tag,
                buf: m.take_buf(),
            });
            return Ok(());
        }
        let (map_iova, map_len) = self.win.mapping_of(&m)?;
        let buf = m.take_buf();
        let buf = if self.release_before_flush {
            out.push(Returned { tag, buf });
            None
        } else {
            Some(buf)
        };
        self.stats.queued_bytes += map_len;
        self.queue.push(Entry {
            iova: map_iova,
            len: map_len,
            tag,
            buf,
        });
        if self.queue.len() >= self.cfg.batch {
            self.flush_now(Cause::Full, out)?;
        } else if self.queue.len() == 1 {
            // The clock is read once per batch, when its first entry
            // arrives. A delay the clock cannot reach is no time limit.
            self.deadline = Instant::now().checked_add(self.cfg.max_delay);
        }
        Ok(())
    }

    #[inline]
    fn poll(&mut self, out: &mut Vec<Returned>) -> Result<(), MapError> {
        if !self.ready.is_empty() {
            out.append(&mut self.ready);
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => self.flush_now(Cause::Timed, out),
            _ => Ok(()),
        }
    }

    fn flush(&mut self, out: &mut Vec<Returned>) -> Result<(), MapError> {
        out.append(&mut self.ready);
        self.flush_now(Cause::Forced, out)
    }

    fn stats(&self) -> MapperStats {
        MapperStats {
            iommu: self.win.space().iommu().counters().snapshot(),
            ..self.stats
        }
    }
}

/// Holds a flush's entries while their unmap runs: dropped while still
/// holding any (the unmap failed, or panicked and is unwinding), it leaks
/// their buffers, which the device may still reach.
struct LeakIfNotUnmapped(Vec<Entry>);

impl Drop for LeakIfNotUnmapped {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        if std::thread::panicking() {
            log::error!(
                "an IOMMU unmap of {} lazily queued mappings panicked: leaking their buffers",
                self.0.len()
            );
        }
        for entry in self.0.drain(..) {
            std::mem::forget(entry.buf);
        }
    }
}

impl Drop for LazyMapper {
    fn drop(&mut self) {
        // Unmap what is queued before the window goes; the buffers are then
        // unreachable by the device and are freed here. If the unmap fails
        // or panics, `flush_now` leaks them instead (and the window, which
        // still holds their IOVAs).
        let mut out = Vec::new();
        if let Err(e) = self.flush_now(Cause::Forced, &mut out) {
            log::error!("flushing lazy DMA queue on drop: {e}");
        }
    }
}
