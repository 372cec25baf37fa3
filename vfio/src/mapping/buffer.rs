//! [`AppBuffer`]: page-aligned, locked application memory for strict and lazy modes.

use std::ptr::NonNull;

use crate::dma::{DmaError, HostMemory, HugePages};

/// Page-aligned anonymous memory owned by the application, populated at
/// allocation and locked with `mlock` (unless the IOMMU pins mapped pages
/// itself, see [`AppBuffer::for_space`]) so it stays resident.
///
/// An IOMMU maps whole granules ([`DmaSpace::granule`](crate::DmaSpace::granule)),
/// so a mapper maps every granule the transfer touches. It refuses
/// ([`MapError::SharedGranule`](crate::MapError::SharedGranule)) when one of
/// those granules holds memory the buffer does not own: that memory could be
/// another buffer's, which the device could then reach. [`AppBuffer::for_space`]
/// allocates whole granules, so its buffers are always accepted;
/// [`AppBuffer::new`] allocates host pages, which suffices whenever the
/// IOMMU granule is not larger than the host page (the usual case).
///
/// A strict or lazy mapper takes the buffer by value for the duration of an
/// I/O and hands it back only after the IOMMU mapping is gone, so whoever
/// holds an `AppBuffer` holds memory the device cannot reach: that is why,
/// unlike DMA regions, it can give out ordinary slices.
pub struct AppBuffer {
    mem: HostMemory,
}

// `Send`/`Sync` come from `HostMemory`: the buffer exclusively owns its
// anonymous mapping (no other handle to the pages exists outside a mapper that
// holds the buffer by value), and `&AppBuffer` only allows reads through
// `as_slice`; writes need `&mut`.

impl std::fmt::Debug for AppBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppBuffer")
            .field("ptr", &self.mem.ptr())
            .field("len", &self.mem.len())
            .finish()
    }
}

impl AppBuffer {
    /// Allocate `len` bytes (rounded up to the host page,
    /// [`host_page_size`](crate::host_page_size)), zeroed, populated and locked.
    pub fn new(len: usize) -> Result<Self, DmaError> {
        Self::with_lock(len, true)
    }

    /// A buffer for mapping into `space`: whole [granules](crate::DmaSpace::granule)
    /// of it (`len` rounded up, granule-aligned), so no other memory shares
    /// an IOMMU page with it; locked with `mlock` only when the IOMMU does
    /// not pin mapped pages itself. VFIO type1 pins and charges
    /// `RLIMIT_MEMLOCK` at map time, so an `mlock` on top would count every
    /// byte twice against the limit of a non-root process.
    pub fn for_space(space: &crate::DmaSpace, len: usize) -> Result<Self, DmaError> {
        Ok(Self {
            mem: HostMemory::new(
                len,
                HugePages::Never,
                !space.iommu().pins_pages(),
                space.granule(),
            )?,
        })
    }

    /// Allocate `len` bytes (rounded up to the host page, always base
    /// pages), zeroed and populated; `mlock`ed when `lock` is true.
    pub fn with_lock(len: usize, lock: bool) -> Result<Self, DmaError> {
        Ok(Self {
            mem: HostMemory::new(len, HugePages::Never, lock, crate::host_page_size())?,
        })
    }

    /// The memory this buffer owns, `(start address, length)`: its bytes
    /// plus any alignment slack around them (never shared with anything).
    pub(crate) fn owned(&self) -> (usize, usize) {
        self.mem.owned()
    }

    /// Length in bytes (a multiple of the page size it was allocated with).
    #[inline]
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Always false: a buffer is at least one page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Host address of byte 0 (aligned to the page size it was allocated with).
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.mem.ptr()
    }

    /// The bytes. Not mapped for DMA while you can call this (see type docs).
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live and initialised (zero-filled anonymous
        // memory); the holder of the buffer is its only user and no IOMMU
        // mapping of it exists while the holder has it (type docs).
        unsafe { std::slice::from_raw_parts(self.mem.ptr().as_ptr(), self.mem.len()) }
    }

    /// The bytes, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr().as_ptr(), self.mem.len()) }
    }
}

// Drop: `HostMemory` unmaps the pages. Mappers only drop or return an
// AppBuffer after its IOMMU unmap returned; a failed unmap leaks the buffer.
