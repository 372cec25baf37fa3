//! [`VfioIommu`]: the VFIO type1 container as an [`Iommu`](crate::Iommu).
//!
//! It owns the open VFIO device together with its container, because the
//! IOMMU domain only exists while a group is attached: if the device (and so
//! the group) were closed while DMA regions are still mapped, the kernel would
//! tear the domain down and every later unmap would fail. Holding both here
//! means a [`crate::DmaRegion`] (which holds the `DmaSpace`, which holds this)
//! keeps the domain alive until it has unmapped itself.
//!
//! Drop order (explicit, in [`VfioIommu`]'s `Drop`): the device fd is closed
//! first, which lets `vfio-ioctls` detach the group from the container and
//! close it; the container closes last, when its final `Arc` goes. Closing in
//! another order makes the kernel answer `EBUSY`.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use vfio_ioctls::{VfioContainer, VfioDevice};

use crate::iommu::DmaDir;
use crate::iova::{Iova, IovaRange};
use crate::ranged::{RangeCalls, Ranged};
use crate::sys;

/// Lowest IOVA handed out: the first 64 KiB stay unmapped so a zero or tiny
/// address in a command (a classic driver bug) faults instead of reaching memory.
pub const IOVA_FLOOR: u64 = 0x1_0000;
/// Top of the fallback IOVA space: 39 bits, which every x86 and Arm IOMMU
/// with 3-level tables covers.
pub const FALLBACK_IOVA_TOP: u64 = 1 << 39;
/// The x86 MSI window, `[0xfee00000, 0xfeefffff]`, which DMA must not target.
pub const MSI_WINDOW: IovaRange = IovaRange::from_inclusive(0xfee0_0000, 0xfeef_ffff);
/// Regions the type1 driver unmaps per IOTLB sync
/// (`VFIO_IOMMU_TLB_SYNC_MAX` in `drivers/vfio/vfio_iommu_type1.c`).
pub const TYPE1_REGIONS_PER_SYNC: u64 = 512;

/// The IOVA windows to use when the kernel does not report any (before
/// Linux 5.4): `[64 KiB, 2^39)` without the x86 MSI window.
pub fn fallback_iova_ranges() -> Vec<IovaRange> {
    vec![
        IovaRange::new(IOVA_FLOOR, MSI_WINDOW.start),
        IovaRange::new(MSI_WINDOW.end, FALLBACK_IOVA_TOP),
    ]
}

/// Trim the kernel's windows to start at [`IOVA_FLOOR`]; use the fallback if
/// the kernel gave none or none remains.
pub fn usable_iova_ranges(reported: Option<&[IovaRange]>) -> Vec<IovaRange> {
    let Some(reported) = reported else {
        return fallback_iova_ranges();
    };
    let out: Vec<IovaRange> = reported
        .iter()
        .map(|r| IovaRange::new(r.start.max(IOVA_FLOOR), r.end))
        .filter(|r| !r.is_empty())
        .collect();
    if out.is_empty() {
        fallback_iova_ranges()
    } else {
        out
    }
}

/// Merge exactly adjacent ranges (after sorting by address) into runs, each
/// with the number of ranges it covers.
///
/// Overlapping or duplicate ranges are not merged (unmapping them is an error
/// the kernel reports as a short unmap).
pub fn coalesce(ranges: &[(Iova, u64)]) -> Vec<(Iova, u64, u64)> {
    let mut sorted: Vec<(Iova, u64)> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
    sorted.sort_unstable_by_key(|r| r.0);
    let mut runs: Vec<(Iova, u64, u64)> = Vec::with_capacity(sorted.len());
    for (iova, len) in sorted {
        match runs.last_mut() {
            Some((start, run_len, n)) if start.raw().checked_add(*run_len) == Some(iova.raw()) => {
                *run_len += len;
                *n += 1;
            }
            _ => runs.push((iova, len, 1)),
        }
    }
    runs
}

/// A VFIO type1v2 container with its device attached, usable as an [`Iommu`](crate::Iommu)
/// (through [`Ranged`], which it shares with iommufd).
pub type VfioIommu = Ranged<Type1Container>;

/// The open VFIO device with its type1v2 container: the fds the type1 range
/// calls go to, and what `VFIO_IOMMU_GET_INFO` reported.
pub struct Type1Container {
    device: ManuallyDrop<VfioDevice>,
    container: Arc<VfioContainer>,
    container_fd: RawFd,
    sysfs_path: PathBuf,
    reported: Option<Vec<IovaRange>>,
    pgsizes: Option<u64>,
    dma_avail: Option<u32>,
}

impl std::fmt::Debug for Type1Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Type1Container")
            .field("sysfs_path", &self.sysfs_path)
            .field("pgsizes", &self.pgsizes.map(|p| format!("{p:#x}")))
            .field("dma_avail", &self.dma_avail)
            .finish_non_exhaustive()
    }
}

impl VfioIommu {
    /// Wrap an open device and its container (whose IOMMU `vfio-ioctls` set
    /// to type1v2 when the group was attached) and read the IOMMU's geometry.
    pub(crate) fn attached(
        device: VfioDevice,
        container: Arc<VfioContainer>,
        sysfs_path: PathBuf,
    ) -> Self {
        let container_fd = container.as_raw_fd();
        let info = match sys::iommu_get_info(container_fd) {
            Ok(i) => i,
            Err(e) => {
                log::warn!("VFIO_IOMMU_GET_INFO failed ({e}); using the default IOVA windows");
                sys::IommuInfo::default()
            }
        };
        if info.iova_ranges.is_none() {
            log::info!("the kernel reports no IOVA ranges (Linux < 5.4?); using [0x10000, 2^39) minus the MSI window");
        }
        let ranges = usable_iova_ranges(info.iova_ranges.as_deref());
        log::debug!(
            "IOMMU: page sizes {:?}, IOVA windows {:?}, DMA mappings available {:?}",
            info.pgsizes.map(|p| format!("{p:#x}")),
            ranges,
            info.dma_avail
        );
        let min_page = match info.pgsizes {
            Some(p) if p != 0 => 1usize << p.trailing_zeros(),
            // Not reported: type1 never maps below the host page.
            _ => crate::host_page_size(),
        };
        let calls = Type1Container {
            device: ManuallyDrop::new(device),
            container,
            container_fd,
            sysfs_path,
            reported: info.iova_ranges,
            pgsizes: info.pgsizes,
            dma_avail: info.dma_avail,
        };
        Ranged::new(calls, ranges, min_page)
    }

    /// The open VFIO device.
    pub fn device(&self) -> &VfioDevice {
        &self.calls().device
    }

    /// The container (the fd IOMMU mappings are made on).
    pub fn container(&self) -> &Arc<VfioContainer> {
        &self.calls().container
    }

    /// The IOVA windows the kernel reported (`None` before Linux 5.4).
    pub fn reported_ranges(&self) -> Option<&[IovaRange]> {
        self.calls().reported.as_deref()
    }

    /// The IOMMU page-size bitmap, if reported.
    pub fn page_sizes(&self) -> Option<u64> {
        self.calls().pgsizes
    }

    /// How many DMA mappings the container still accepted when opened
    /// (`vfio_iommu_type1.dma_entry_limit`), if reported.
    pub fn dma_mappings_available(&self) -> Option<u32> {
        self.calls().dma_avail
    }
}

// SAFETY: `unmap` returns Ok only when VFIO_IOMMU_UNMAP_DMA has returned; the
// type1 driver invalidates the IOTLB (iommu_iotlb_sync) before unpinning and
// before the ioctl returns, so the device can no longer reach the memory.
unsafe impl RangeCalls for Type1Container {
    unsafe fn map(
        &self,
        iova: u64,
        vaddr: NonNull<u8>,
        len: u64,
        dir: DmaDir,
    ) -> std::io::Result<()> {
        // SAFETY: the caller upholds `RangeCalls::map`'s contract, which is
        // `sys::map_dma`'s.
        unsafe { sys::map_dma(self.container_fd, iova, vaddr, len, dir) }
    }

    fn unmap(&self, iova: u64, len: u64) -> std::io::Result<u64> {
        sys::unmap_dma(self.container_fd, iova, len)
    }

    fn syncs(&self, n: u64) -> u64 {
        // The kernel syncs the IOTLB once per up to 512 regions of a call.
        n.div_ceil(TYPE1_REGIONS_PER_SYNC)
    }

    fn map_hint(&self, errno: i32) -> &'static str {
        match errno {
            libc::ENOMEM => " — pinned pages count against RLIMIT_MEMLOCK: raise it (`mcqio-perf doctor`)",
            libc::ENOSPC => " — the container's mapping budget (vfio_iommu_type1.dma_entry_limit) is used up: use larger regions",
            libc::EEXIST => " — the IOVA range is already mapped",
            libc::EINVAL => " — address or length not aligned to the IOMMU page size, or outside the valid IOVA windows",
            _ => "",
        }
    }
}

impl Drop for Type1Container {
    fn drop(&mut self) {
        // Device before group before container. `VfioDevice::drop` closes the
        // device fd, then detaches and closes the group; it looks the group up
        // through `<sysfs>/iommu_group` and panics if that link is gone (the
        // device was hot-removed). Leak the handles in that case: a leaked fd
        // is better than a panic in drop (an abort during unwinding).
        if self.sysfs_path.join("iommu_group").exists() {
            // SAFETY: dropped exactly once, here; not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.device) };
        } else {
            log::error!(
                "{} vanished (hot-removed?); leaking its VFIO device and group fds",
                self.sysfs_path.display()
            );
        }
        // `self.container` drops after this body; with the device's own
        // reference gone, that is the last one and /dev/vfio/vfio closes.
        log::debug!(
            "{}: VFIO device closed, closing the container",
            self.sysfs_path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_adjacent_ranges_only() {
        let r = [
            (Iova(0x3000), 0x1000),
            (Iova(0x1000), 0x1000),
            (Iova(0x2000), 0x1000),
            (Iova(0x10000), 0x2000),
            (Iova(0x12000), 0x1000),
            (Iova(0x20000), 0x1000),
            (Iova(0x30000), 0),
        ];
        assert_eq!(
            coalesce(&r),
            vec![
                (Iova(0x1000), 0x3000, 3),
                (Iova(0x10000), 0x3000, 2),
                (Iova(0x20000), 0x1000, 1)
            ]
        );
        // Overlaps stay separate so the kernel's short unmap reveals them.
        assert_eq!(
            coalesce(&[(Iova(0x1000), 0x2000), (Iova(0x2000), 0x1000)]),
            vec![(Iova(0x1000), 0x2000, 1), (Iova(0x2000), 0x1000, 1)]
        );
        assert!(coalesce(&[]).is_empty());
    }

    #[test]
    fn fallback_windows_skip_the_msi_hole_and_low_page() {
        let f = usable_iova_ranges(None);
        assert_eq!(
            f,
            vec![
                IovaRange::new(0x1_0000, 0xfee0_0000),
                IovaRange::new(0xfef0_0000, 1 << 39)
            ]
        );
        let mut a = crate::IovaAllocator::new(&f);
        let big = a.alloc(0xfee0_0000 - 0x1_0000, 4096).unwrap();
        assert_eq!(big, Iova(0x1_0000));
        assert!(a.alloc(4096, 4096).unwrap().raw() >= 0xfef0_0000);
    }

    #[test]
    fn reported_windows_are_floored() {
        let k = [
            IovaRange::from_inclusive(0, 0xfedf_ffff),
            IovaRange::from_inclusive(0xfef0_0000, 0xff_ffff_ffff),
        ];
        assert_eq!(
            usable_iova_ranges(Some(&k)),
            vec![
                IovaRange::new(0x1_0000, 0xfee0_0000),
                IovaRange::new(0xfef0_0000, 0x100_0000_0000)
            ]
        );
        // A window entirely under the floor vanishes; none left → fallback.
        assert_eq!(
            usable_iova_ranges(Some(&[IovaRange::new(0, 0x8000)])),
            fallback_iova_ranges()
        );
    }
}
