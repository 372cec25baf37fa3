//! [`Ranged`]: an [`Iommu`] over the two calls both VFIO interfaces offer —
//! map an IOVA range, unmap an IOVA range and say how much went.
//!
//! The type1 container (`VFIO_IOMMU_MAP_DMA`/`UNMAP_DMA`, [`crate::VfioIommu`])
//! and an iommufd IOAS (`IOMMU_IOAS_MAP`/`UNMAP`, [`crate::IommufdIommu`]) differ
//! in their ioctls, in how many IOTLB syncs an unmap costs and in what an errno
//! means; everything else is written once here: the usable IOVA windows, one
//! unmap call per run of exactly adjacent ranges ([`coalesce`]), the check that
//! the kernel unmapped the whole run ("only so many bytes were mapped there"),
//! `ENODEV` as a vanished device, and the counters. The mapping modes above
//! the [`Iommu`] trait (strict, lazy, premapped, and the rule that memory whose
//! unmap failed is leaked) are the same code on both for the same reason.
//!
//! [`RangeCalls`] is the seam: each interface implements it on the struct
//! that owns its file descriptors (and closes them in the right order on
//! drop), and the unit tests implement it with in-process address spaces.

use std::fmt;
use std::io;
use std::ptr::NonNull;

use crate::container::coalesce;
use crate::iommu::{DmaDir, Iommu, IommuCounters, IommuError};
use crate::iova::{Iova, IovaRange};

/// The range calls of one IOMMU interface.
///
/// # Safety
///
/// Implementors: after `unmap` returns `Ok(n)`, the device can no longer
/// reach the `n` bytes unmapped (the IOTLB has been synced before the call
/// returned), as [`Iommu`]'s contract requires.
pub unsafe trait RangeCalls: Send + Sync {
    /// Map `vaddr..vaddr+len` at the fixed `iova` for `dir`.
    ///
    /// # Safety
    ///
    /// As [`Iommu::map`]: the memory stays allocated until an unmap covering
    /// it succeeds, and no reference is formed over it meanwhile.
    unsafe fn map(&self, iova: u64, vaddr: NonNull<u8>, len: u64, dir: DmaDir) -> io::Result<()>;

    /// Unmap every mapping inside `[iova, iova+len)`; the bytes unmapped.
    fn unmap(&self, iova: u64, len: u64) -> io::Result<u64>;

    /// IOTLB syncs one `unmap` call of `n` whole mappings costs.
    fn syncs(&self, n: u64) -> u64;

    /// What a map's errno means on this interface (` — …`, or empty).
    fn map_hint(&self, errno: i32) -> &'static str;

    /// What an unmap's errno means on this interface (` — …`, or empty).
    fn unmap_hint(&self, _errno: i32) -> &'static str {
        ""
    }
}

/// An IOMMU domain reached through [`RangeCalls`].
pub struct Ranged<C> {
    calls: C,
    ranges: Vec<IovaRange>,
    min_page: usize,
    counters: IommuCounters,
}

impl<C: fmt::Debug> fmt::Debug for Ranged<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ranged")
            .field("calls", &self.calls)
            .field("ranges", &self.ranges)
            .field("min_page", &format_args!("{:#x}", self.min_page))
            .finish_non_exhaustive()
    }
}

impl<C: RangeCalls> Ranged<C> {
    /// A domain whose usable IOVA windows are `ranges` (already floored, see
    /// [`crate::container::usable_iova_ranges`]) and whose smallest mapping
    /// granule is `min_page`.
    pub fn new(calls: C, ranges: Vec<IovaRange>, min_page: usize) -> Self {
        Self {
            calls,
            ranges,
            min_page,
            counters: IommuCounters::default(),
        }
    }

    /// The interface's own part (its file descriptors and what it reported).
    pub fn calls(&self) -> &C {
        &self.calls
    }

    /// Unmap `[iova, iova+len)`, which covers `n` whole mappings, with one call.
    fn unmap_run(&self, iova: Iova, len: u64, n: u64) -> Result<(), IommuError> {
        match self.calls.unmap(iova.raw(), len) {
            Ok(done) if done == len => {
                self.counters.on_unmap(n, len, self.calls.syncs(n));
                Ok(())
            }
            Ok(done) => {
                // Which mappings went is unknown; count the call and bytes.
                self.counters.on_unmap(0, done, u64::from(done > 0));
                Err(IommuError::Unmap {
                    iova,
                    len,
                    reason: format!("only {done:#x} bytes were mapped there"),
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Err(IommuError::Gone),
            Err(e) => Err(IommuError::Unmap {
                iova,
                len,
                reason: format!(
                    "{e}{}",
                    self.calls.unmap_hint(e.raw_os_error().unwrap_or(0))
                ),
            }),
        }
    }
}

// SAFETY: `unmap`/`unmap_many` return Ok only when every `RangeCalls::unmap`
// returned the full length, after which the device cannot reach that memory
// (`RangeCalls`' contract).
unsafe impl<C: RangeCalls> Iommu for Ranged<C> {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError> {
        // SAFETY: the caller upholds `Iommu::map`'s contract, which is
        // `RangeCalls::map`'s.
        match unsafe { self.calls.map(iova.raw(), vaddr, len as u64, dir) } {
            Ok(()) => {
                self.counters.on_map(len as u64);
                Ok(())
            }
            Err(e) => Err(IommuError::Map {
                iova,
                len,
                reason: format!("{e}{}", self.calls.map_hint(e.raw_os_error().unwrap_or(0))),
            }),
        }
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError> {
        if len == 0 {
            return Ok(());
        }
        self.unmap_run(iova, len, 1)
    }

    /// One unmap call per run of exactly adjacent ranges: both interfaces
    /// unmap every whole mapping inside a range, so the kernel tears the run
    /// down in one call (type1 also gathers its IOTLB sync).
    fn unmap_many(&self, ranges: &[(Iova, u64)]) -> Result<(), IommuError> {
        coalesce(ranges)
            .into_iter()
            .try_for_each(|(iova, len, n)| self.unmap_run(iova, len, n))
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        self.ranges.clone()
    }

    fn min_page_size(&self) -> usize {
        self.min_page
    }

    fn counters(&self) -> &IommuCounters {
        &self.counters
    }

    fn pins_pages(&self) -> bool {
        // Both pin every page they map and charge it to locked_vm
        // (VFIO_IOMMU_MAP_DMA; IOMMU_IOAS_MAP with iommufd's default
        // accounting).
        true
    }
}
