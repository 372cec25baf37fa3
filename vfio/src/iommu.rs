//! The IOMMU seam.
//!
//! [`Iommu`] is what the DMA layer needs from an IOMMU: map a pinned host range
//! at an IOVA, unmap (one range or many with a single invalidation), and report
//! the valid IOVA windows. The VFIO type1 container implements it for real
//! hardware; `mcqio-fixtures` implements it with a fake that enforces mappings
//! and counts invalidations.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::iova::{Iova, IovaRange};

/// Which way the device may move data through a mapping.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DmaDir {
    /// The device only reads (host-to-device, e.g. a write command's data).
    ToDevice,
    /// The device only writes (device-to-host, e.g. a read command's data).
    FromDevice,
    /// The device reads and writes (queues, PRP lists, bounce buffers).
    Bidirectional,
}

impl DmaDir {
    /// Whether the device may read through a mapping with this direction.
    pub const fn device_reads(self) -> bool {
        matches!(self, DmaDir::ToDevice | DmaDir::Bidirectional)
    }

    /// Whether the device may write through a mapping with this direction.
    pub const fn device_writes(self) -> bool {
        matches!(self, DmaDir::FromDevice | DmaDir::Bidirectional)
    }
}

/// Why an IOMMU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IommuError {
    /// The map call failed.
    #[error("IOMMU map of {len:#x} bytes at IOVA {iova} failed: {reason}")]
    Map {
        /// Target IOVA.
        iova: Iova,
        /// Length.
        len: usize,
        /// What the IOMMU said.
        reason: String,
    },
    /// The unmap call failed.
    #[error("IOMMU unmap of {len:#x} bytes at IOVA {iova} failed: {reason}")]
    Unmap {
        /// Target IOVA.
        iova: Iova,
        /// Length.
        len: u64,
        /// What the IOMMU said.
        reason: String,
    },
    /// The device behind this IOMMU is gone.
    #[error("the IOMMU domain is gone (device removed or container closed)")]
    Gone,
}

/// Counters every IOMMU keeps, so tools can show what a DMA mode costs.
#[derive(Debug, Default)]
pub struct IommuCounters {
    /// Successful map calls.
    pub maps: AtomicU64,
    /// Ranges unmapped (one per mapping torn down).
    pub unmapped_ranges: AtomicU64,
    /// Unmap calls made to the IOMMU (a batched call counts once).
    pub unmap_calls: AtomicU64,
    /// IOTLB invalidations (syncs) performed.
    pub invalidations: AtomicU64,
    /// Bytes currently mapped.
    pub mapped_bytes: AtomicU64,
}

/// A point-in-time copy of [`IommuCounters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IommuStats {
    /// Successful map calls.
    pub maps: u64,
    /// Ranges unmapped.
    pub unmapped_ranges: u64,
    /// Unmap calls.
    pub unmap_calls: u64,
    /// IOTLB invalidations.
    pub invalidations: u64,
    /// Bytes currently mapped.
    pub mapped_bytes: u64,
}

impl IommuCounters {
    /// Copy the counters.
    pub fn snapshot(&self) -> IommuStats {
        IommuStats {
            maps: self.maps.load(Ordering::Relaxed),
            unmapped_ranges: self.unmapped_ranges.load(Ordering::Relaxed),
            unmap_calls: self.unmap_calls.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            mapped_bytes: self.mapped_bytes.load(Ordering::Relaxed),
        }
    }

    /// Record a successful map of `len` bytes.
    pub fn on_map(&self, len: u64) {
        self.maps.fetch_add(1, Ordering::Relaxed);
        self.mapped_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Record one unmap call that tore down `ranges` mappings totalling `len` bytes
    /// with `invalidations` IOTLB syncs.
    pub fn on_unmap(&self, ranges: u64, len: u64, invalidations: u64) {
        self.unmap_calls.fetch_add(1, Ordering::Relaxed);
        self.unmapped_ranges.fetch_add(ranges, Ordering::Relaxed);
        self.invalidations
            .fetch_add(invalidations, Ordering::Relaxed);
        self.mapped_bytes.fetch_sub(len, Ordering::Relaxed);
    }
}

/// An IOMMU domain that DMA memory is mapped into.
///
/// # Safety
///
/// Implementors: after `unmap` or `unmap_many` returns `Ok`, the device must no longer be
/// able to reach the unmapped host memory through the IOMMU (the IOTLB has
/// been invalidated). Callers rely on this to free or reuse the memory.
pub unsafe trait Iommu: Send + Sync {
    /// Map `len` bytes of host memory at `vaddr` to `iova`.
    ///
    /// # Safety
    ///
    /// `vaddr..vaddr+len` must stay allocated (not unmapped or reused by the
    /// allocator) until a successful unmap covering it. The device reads and
    /// writes it concurrently with the CPU, so no `&`/`&mut` reference may be
    /// created over it while mapped (see the crate docs).
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError>;

    /// Unmap everything in `[iova, iova+len)` and invalidate the IOTLB.
    ///
    /// The range may cover several earlier mappings but must not split one.
    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError>;

    /// Unmap several ranges. The default makes one call per range; an IOMMU
    /// that can gather invalidations (VFIO type1 gathers up to 512 regions per
    /// IOTLB sync for one call) overrides this to coalesce contiguous ranges.
    fn unmap_many(&self, ranges: &[(Iova, u64)]) -> Result<(), IommuError> {
        ranges
            .iter()
            .try_for_each(|&(iova, len)| self.unmap(iova, len))
    }

    /// The IOVA windows the device may use (holes such as the MSI window excluded).
    fn valid_ranges(&self) -> Vec<IovaRange>;

    /// The smallest page the IOMMU maps (the granule of `map`/`unmap`): a
    /// map or unmap must cover a multiple of it, at an IOVA and host address
    /// aligned to it. The default is the host page ([`crate::host_page_size`]),
    /// which VFIO type1 never goes below; an arm64 SMMU may report more
    /// (64 KiB). [`crate::DmaSpace`] rounds to the larger of the two.
    fn min_page_size(&self) -> usize {
        crate::host_page_size()
    }

    /// Counters for maps, unmaps and invalidations.
    fn counters(&self) -> &IommuCounters;

    /// Whether `map` itself pins the pages (VFIO type1 does). When it does,
    /// [`crate::DmaSpace`] skips its own `mlock`: both count against
    /// `RLIMIT_MEMLOCK`, so locking twice would halve what a non-root user can map.
    fn pins_pages(&self) -> bool {
        false
    }
}
