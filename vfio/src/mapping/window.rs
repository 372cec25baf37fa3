//! A per-mapper window of IOVA space for temporary mappings.
//!
//! The window is reserved from the shared [`DmaSpace`] once, when the mapper
//! is built (the only time the space's allocator lock is taken), and
//! sub-allocated without any lock by its single owner. Sub-allocation is
//! first-fit from the bottom, so mappings made one after another are
//! IOVA-contiguous and a flush can unmap a run of them with one call.

use std::sync::Arc;

use super::{IoBuffer, MapError};
use crate::dma::{DmaSpace, PAGE_SIZE};
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
        let page = space.iommu().min_page_size().max(PAGE_SIZE);
        if len == 0 || len % page as u64 != 0 {
            return Err(MapError::Config(format!(
                "IOVA window of {len:#x} bytes must be a non-zero multiple of the IOMMU page size {page:#x}"
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

    pub(crate) fn page(&self) -> usize {
        self.page
    }

    /// Reserve `len` bytes in the window and map the start of `buf` there.
    pub(crate) fn map(
        &mut self,
        buf: &IoBuffer,
        len: usize,
        dir: DmaDir,
    ) -> Result<Iova, MapError> {
        let iova = match self.alloc.alloc(len as u64, self.page as u64) {
            Ok(i) => i,
            Err(IovaError::Exhausted { .. }) => {
                return Err(MapError::WindowFull {
                    len: len as u64,
                    window: self.len,
                })
            }
            Err(e) => return Err(e.into()),
        };
        // SAFETY: the caller moves `buf` into the `Mapped` it builds from this
        // IOVA; a mapper hands it back, or drops it, only after an unmap
        // covering `iova..+len` returned Ok, and leaks it otherwise, so the
        // host range stays allocated for the mapping's whole life. No
        // reference to the memory exists while mapped: the buffer is owned
        // by the `Mapped`, which exposes none.
        let r = unsafe { self.space.iommu().map(iova, buf.as_ptr(), len, dir) };
        if let Err(e) = r {
            self.free_range(iova, len as u64);
            return Err(e.into());
        }
        self.live += len as u64;
        Ok(iova)
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
