//! A per-mapper window of IOVA space for temporary mappings.
//!
//! The window is reserved from the shared [`DmaSpace`] once, when the mapper
//! is built (the only time the space's allocator lock is taken), and
//! sub-allocated without any lock by its single owner. Sub-allocation is
//! first-fit from the bottom, so mappings made one after another are
//! IOVA-contiguous and a flush can unmap a run of them with one call.

use std::sync::Arc;

use super::{IoBuffer, MapError, Mapped};
use crate::dma::DmaSpace;
use crate::iommu::DmaDir;
use crate::iova::{Iova, IovaAllocator, IovaError, IovaRange};

/// Alignment of the window itself: 2 MiB, the span of one last-level IOMMU
/// page table, so two queues' windows never share a leaf table.
const WINDOW_ALIGN: u64 = 2 << 20;

pub(crate) struct IovaWindow {
    space: Arc<DmaSpace>,
    base: Iova,
    len: u64,
    alloc: IovaAllocator,
    page: usize,
    /// Bytes sub-allocated and not yet freed (mapped, or leaked after an
    /// IOMMU failure); the window goes back to the space only at zero.
    live: u64,
}

impl IovaWindow {
    pub(crate) fn new(space: &Arc<DmaSpace>, len: u64) -> Result<Self, MapError> {
        let page = space.granule();
        if len == 0 || !page.is_power_of_two() || len % page as u64 != 0 {
            return Err(MapError::Config(format!(
                "IOVA window of {len:#x} bytes must be a non-zero multiple of the DMA space's granule {page:#x}"
            )));
        }
        let base = space.alloc_iova(len, WINDOW_ALIGN.max(page as u64))?;
        Ok(Self {
            space: Arc::clone(space),
            base,
            len,
            alloc: IovaAllocator::new(&[IovaRange::new(base.raw(), base.raw() + len)]),
            page,
            live: 0,
        })
    }

    pub(crate) fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    /// Map the granules the first `len` bytes of `buf` touch at a fresh
    /// range of the window. Returns the device address of `buf`'s byte 0
    /// (the range's start plus `buf`'s offset in its first granule) and the
    /// mapped length; [`IovaWindow::mapping_of`] gives the range to unmap.
    pub(crate) fn map(
        &mut self,
        buf: &IoBuffer,
        len: usize,
        dir: DmaDir,
    ) -> Result<(Iova, u64), MapError> {
        let ptr = buf.as_ptr().as_ptr() as usize;
        let Some((host, span)) = granule_span(ptr, len, buf.owned(), self.page) else {
            return Err(MapError::SharedGranule {
                ptr,
                len,
                granule: self.page,
            });
        };
        let offset = ptr - host;
        // Derived from `buf`'s pointer (same allocation); not null, as it is
        // inside `buf`'s own mapping.
        let host_ptr = std::ptr::NonNull::new(buf.as_ptr().as_ptr().wrapping_sub(offset)).ok_or(
            MapError::SharedGranule {
                ptr,
                len,
                granule: self.page,
            },
        )?;
        let iova = match self.alloc.alloc(span as u64, self.page as u64) {
            Ok(i) => i,
            Err(IovaError::Exhausted { .. }) => {
                return Err(MapError::WindowFull {
                    len: span as u64,
                    window: self.len,
                })
            }
            Err(e) => return Err(e.into()),
        };
        // SAFETY: `host..host+span` lies inside the allocation `buf` owns
        // (`granule_span` checked it against `buf.owned()`), so no other
        // buffer's memory is in it. The caller moves `buf` into the `Mapped`
        // it builds from this IOVA; a mapper hands it back, or drops it, only
        // after an unmap covering `iova..+span` returned Ok, and leaks it
        // otherwise, so the host range stays allocated for the mapping's
        // whole life. No reference to the memory exists while mapped: the
        // buffer is owned by the `Mapped`, which exposes none.
        let r = unsafe { self.space.iommu().map(iova, host_ptr, span, dir) };
        if let Err(e) = r {
            self.free_range(iova, span as u64);
            return Err(e.into());
        }
        self.live += span as u64;
        Ok((iova.add(offset as u64), span as u64))
    }

    /// The IOMMU mapping behind `m` (made by [`IovaWindow::map`]):
    /// `(start, length)`, recomputed from its buffer exactly as `map`
    /// computed it. An error (cannot happen for a mapping of this window)
    /// leaves the buffer in `m`, which leaks it on drop.
    pub(crate) fn mapping_of(&self, m: &Mapped) -> Result<(Iova, u64), MapError> {
        let (ptr, owned) = m
            .host()
            .ok_or(MapError::ForeignMapping { iova: m.iova() })?;
        let (host, span) = granule_span(ptr, m.len(), owned, self.page)
            .ok_or(MapError::ForeignMapping { iova: m.iova() })?;
        let start = m
            .iova()
            .raw()
            .checked_sub((ptr - host) as u64)
            .ok_or(MapError::ForeignMapping { iova: m.iova() })?;
        Ok((Iova(start), span as u64))
    }

    /// Return `[iova, iova+len)` (one or more whole, unmapped mappings).
    pub(crate) fn unmapped(&mut self, iova: Iova, len: u64) {
        self.free_range(iova, len);
        self.live -= len;
    }

    fn free_range(&mut self, iova: Iova, len: u64) {
        if let Err(e) = self.alloc.free(iova, len) {
            // A bookkeeping bug; keeping the range allocated is the safe side.
            log::error!("IOVA window free of {iova}+{len:#x} failed: {e}");
        }
    }
}

/// The whole `granule`s (a power of two) that `[ptr, ptr+len)` touches, as
/// `(first host address, length)`, if they all lie inside the allocation
/// `owned = (start, length)`; `None` if one holds memory outside it (or
/// the arithmetic overflows).
pub(crate) fn granule_span(
    ptr: usize,
    len: usize,
    owned: (usize, usize),
    granule: usize,
) -> Option<(usize, usize)> {
    let start = ptr & !(granule - 1);
    let end = ptr.checked_add(len)?.checked_next_multiple_of(granule)?;
    let owned_end = owned.0.checked_add(owned.1)?;
    (len > 0 && start >= owned.0 && end <= owned_end).then_some((start, end - start))
}

impl Drop for IovaWindow {
    fn drop(&mut self) {
        if self.live == 0 {
            if let Err(e) = self.space.free_iova(self.base, self.len) {
                log::error!("returning IOVA window {}: {e}", self.base);
            }
        } else {
            // Mappings are still live (a leaked Mapped or a failed unmap): the
            // IOVAs must not be handed to anyone else.
            log::error!(
                "IOVA window at {} dropped with {:#x} bytes still mapped: leaking the window",
                self.base,
                self.live
            );
        }
    }
}
