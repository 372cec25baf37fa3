//! Premapped mode: per-thread pools of DMA buffers mapped once.
//!
//! A [`BufPool`] carves one [`DmaRegion`] (allocated, pinned and mapped once,
//! at creation) into equal buffers. The owning thread allocates from a plain
//! local free list; a [`PoolBuf`] dropped anywhere (the owner or another
//! thread) goes back through a lock-free bounded queue that the owner drains
//! when its local list runs dry (ixy-style "the buffer returns itself on
//! drop"). The I/O path makes no IOMMU call at all.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam::queue::ArrayQueue;

use super::{
    mapped_len, next_mapper_id, DmaMapper, DmaMode, IoBuffer, MapError, MapFailed, MapKind, Mapped,
    MapperStats, Returned,
};
use crate::dma::{DmaError, DmaRegion, DmaSpace, PAGE_SIZE};
use crate::iommu::DmaDir;
use crate::iova::Iova;

/// Geometry of a [`BufPool`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Size of each buffer; a multiple of the 4 KiB controller page (the
    /// largest I/O it serves). It need not be a multiple of the host page
    /// or IOMMU granule: the pool is one region, mapped whole.
    pub buf_size: usize,
    /// Number of buffers (at least the queue depth).
    pub count: usize,
}

impl Default for PoolConfig {
    /// 128 buffers of 128 KiB (16 MiB pinned per queue): a common NVMe
    /// maximum transfer size, and a queue depth that saturates one SSD.
    fn default() -> Self {
        Self {
            buf_size: 128 << 10,
            count: 128,
        }
    }
}

struct PoolShared {
    region: DmaRegion,
    buf_size: usize,
    count: usize,
    /// Indices of buffers dropped since the owner last drained (capacity
    /// `count`, and each index is outstanding at most once, so never full).
    returned: ArrayQueue<u32>,
}

/// A pool of premapped DMA buffers owned by one thread (`Send`, not `Sync`).
pub struct BufPool {
    shared: Arc<PoolShared>,
    local: Vec<u32>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("buf_size", &self.shared.buf_size)
            .field("count", &self.shared.count)
            .field("local_free", &self.local.len())
            .field("returned", &self.shared.returned.len())
            .finish()
    }
}

impl BufPool {
    /// Allocate `cfg.count × cfg.buf_size` bytes of DMA memory in `space` and
    /// map it once (bidirectional).
    pub fn new(space: &Arc<DmaSpace>, cfg: &PoolConfig) -> Result<Self, MapError> {
        if cfg.buf_size == 0 || cfg.buf_size % PAGE_SIZE != 0 {
            return Err(MapError::Config(format!(
                "pool buffer size {} must be a non-zero multiple of {PAGE_SIZE}",
                cfg.buf_size
            )));
        }
        let count32 = u32::try_from(cfg.count)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| {
                MapError::Config(format!("pool count {} must be 1..=u32::MAX", cfg.count))
            })?;
        let total = cfg
            .buf_size
            .checked_mul(cfg.count)
            .ok_or_else(|| MapError::Config("pool size overflows usize".into()))?;
        let region = space.alloc(total, DmaDir::Bidirectional)?;
        let shared = Arc::new(PoolShared {
            region,
            buf_size: cfg.buf_size,
            count: cfg.count,
            returned: ArrayQueue::new(cfg.count),
        });
        // Hand out low indices first (pop from the end).
        let local = (0..count32).rev().collect();
        Ok(Self {
            shared,
            local,
            _not_sync: PhantomData,
        })
    }

    /// Take a free buffer.
    pub fn alloc(&mut self) -> Result<PoolBuf, MapError> {
        if self.local.is_empty() {
            while let Some(i) = self.shared.returned.pop() {
                self.local.push(i);
            }
        }
        match self.local.pop() {
            Some(index) => Ok(PoolBuf {
                shared: Arc::clone(&self.shared),
                index,
            }),
            None => Err(MapError::PoolExhausted {
                count: self.shared.count,
                buf_size: self.shared.buf_size,
            }),
        }
    }

    /// Give a buffer back without going through the shared queue (cheapest
    /// on the owning thread; buffers of other pools go to their own pool).
    pub fn put(&mut self, buf: PoolBuf) {
        if Arc::ptr_eq(&buf.shared, &self.shared) {
            let (shared, index) = buf.into_parts();
            drop(shared);
            self.local.push(index);
        }
        // else: `buf` drops here and returns itself to its own pool.
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// Buffers free right now (local list plus those returned by drop).
    pub fn free_count(&self) -> usize {
        self.local.len() + self.shared.returned.len()
    }

    /// Bytes mapped for the pool.
    pub fn mapped_bytes(&self) -> usize {
        self.shared.region.len()
    }

    fn space(&self) -> &Arc<DmaSpace> {
        self.shared.region.space()
    }
}

/// One premapped buffer; returns itself to its pool when dropped.
///
/// The memory stays mapped for the pool's lifetime, so (per the crate's DMA
/// contract) it is accessed through raw pointers and volatile copies only.
/// Buffers of one pool never overlap, so a `PoolBuf` owns its bytes: reading
/// takes `&self`, writing takes `&mut self`, and threads sharing a
/// `&PoolBuf` cannot write it:
///
/// ```compile_fail,E0596
/// use mcqio_vfio::PoolBuf;
/// fn race(buf: &PoolBuf) {
///     std::thread::scope(|s| {
///         s.spawn(|| buf.write_bytes(0, &[1]).unwrap());
///         let mut b = [0u8; 1];
///         buf.read_bytes(0, &mut b).unwrap();
///     });
/// }
/// ```
pub struct PoolBuf {
    shared: Arc<PoolShared>,
    index: u32,
}

impl std::fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuf")
            .field("index", &self.index)
            .field("iova", &self.iova())
            .field("len", &self.len())
            .finish()
    }
}

impl PoolBuf {
    fn offset(&self) -> usize {
        self.index as usize * self.shared.buf_size
    }

    /// Device address of byte 0.
    #[inline]
    pub fn iova(&self) -> Iova {
        self.shared.region.iova().add(self.offset() as u64)
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.shared.buf_size
    }

    /// Always false.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Index of the buffer in its pool.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Host pointer to byte 0 (volatile access only; see type docs).
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        // SAFETY: `offset() < region.len()` because `index < count` and the
        // region is `count × buf_size` bytes, so the result stays inside the
        // region's allocation and is non-null.
        unsafe { self.shared.region.as_ptr().add(self.offset()) }
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len,
                size: self.len(),
            }),
        }
    }

    /// Copy bytes out of the buffer.
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, dst.len())?;
        // SAFETY: bounds checked against this buffer, which lies inside the
        // pool's live region (`as_ptr`). Buffers of a pool never overlap and
        // the pool's region exposes no byte access (shared `DmaRegion`), so
        // the only writer of these bytes is whoever holds this `PoolBuf` by
        // `&mut` (or a device, only while a `Mapped` owns it): none can run
        // during this `&self` borrow. No reference to the memory is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copy bytes into the buffer (`&mut self`: see the type docs).
    pub fn write_bytes(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked; `&mut self` makes this the only access to
        // the buffer's bytes (see `read_bytes`). No reference is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.as_ptr().as_ptr().add(offset),
                src.len(),
            )
        };
        Ok(())
    }

    /// Split into the pool handle and index without running `Drop`.
    fn into_parts(self) -> (Arc<PoolShared>, u32) {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so reading the Arc out
        // moves it (the reference count stays balanced).
        let shared = unsafe { std::ptr::read(&me.shared) };
        (shared, me.index)
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if self.shared.returned.push(self.index).is_err() {
            // Cannot happen (capacity = count, each index outstanding once);
            // losing one buffer is the safe outcome if it ever did.
            log::error!("DMA pool return queue full; buffer {} lost", self.index);
        }
    }
}

/// The I/O-path handling of a pool buffer, shared by every mode: check it
/// belongs to `space`, take its IOVA, make no IOMMU call.
pub(crate) fn map_pool_buf(
    space: &Arc<DmaSpace>,
    buf: PoolBuf,
    len: usize,
    dir: DmaDir,
    tag: u64,
    mapper: u32,
    stats: &mut MapperStats,
) -> Result<Mapped, MapFailed> {
    if !Arc::ptr_eq(buf.shared.region.space(), space) {
        return Err(MapFailed {
            error: MapError::ForeignPool,
            buf: IoBuffer::Pool(buf),
        });
    }
    let transfer_len = len;
    // Controller pages: the pool's region is mapped whole already.
    let len = match mapped_len(buf.len(), len, PAGE_SIZE) {
        Ok(l) => l,
        Err(error) => {
            return Err(MapFailed {
                error,
                buf: IoBuffer::Pool(buf),
            })
        }
    };
    stats.premapped_ios += 1;
    Ok(Mapped {
        iova: buf.iova(),
        len,
        transfer_len,
        dir,
        tag,
        kind: MapKind::Premapped,
        mapper,
        space: space.id(),
        buf: Some(IoBuffer::Pool(buf)),
    })
}

/// Premapped mode: only pool buffers, zero IOMMU calls per I/O.
pub struct PremappedMapper {
    pool: BufPool,
    id: u32,
    stats: MapperStats,
}

impl std::fmt::Debug for PremappedMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PremappedMapper")
            .field("pool", &self.pool)
            .finish()
    }
}

impl PremappedMapper {
    /// A mapper owning a fresh pool in `space`.
    pub fn new(space: &Arc<DmaSpace>, cfg: &PoolConfig) -> Result<Self, MapError> {
        let pool = BufPool::new(space, cfg)?;
        let mut stats = MapperStats::default();
        stats.pin(pool.mapped_bytes() as u64);
        stats.maps = 1;
        Ok(Self {
            pool,
            id: next_mapper_id(),
            stats,
        })
    }

    /// The pool to allocate I/O buffers from.
    pub fn pool(&mut self) -> &mut BufPool {
        &mut self.pool
    }
}

impl DmaMapper for PremappedMapper {
    fn mode(&self) -> DmaMode {
        DmaMode::Premapped
    }

    #[inline]
    fn map(
        &mut self,
        buf: IoBuffer,
        len: usize,
        dir: DmaDir,
        tag: u64,
    ) -> Result<Mapped, MapFailed> {
        match buf {
            IoBuffer::Pool(b) => map_pool_buf(
                self.pool.shared.region.space(),
                b,
                len,
                dir,
                tag,
                self.id,
                &mut self.stats,
            ),
            app @ IoBuffer::App(_) => Err(MapFailed {
                error: MapError::NotPremapped,
                buf: app,
            }),
        }
    }

    #[inline]
    fn release(&mut self, mut m: Mapped, out: &mut Vec<Returned>) -> Result<(), MapError> {
        if m.mapper() != self.id {
            return Err(MapError::ForeignMapping { iova: m.iova() });
        }
        let tag = m.tag();
        let buf = m.take_buf();
        out.push(Returned { tag, buf });
        Ok(())
    }

    fn stats(&self) -> MapperStats {
        MapperStats {
            iommu: self.pool.space().iommu().counters().snapshot(),
            ..self.stats
        }
    }
}
