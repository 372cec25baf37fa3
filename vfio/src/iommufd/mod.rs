//! [`IommufdIommu`]: an iommufd IO address space (IOAS) as an [`Iommu`](crate::Iommu).
//!
//! The modern VFIO interface: the device is opened through its own cdev
//! (`/dev/vfio/devices/vfioN`) instead of a group, bound to an iommufd
//! (`/dev/iommu`, `VFIO_DEVICE_BIND_IOMMUFD`) and attached to an IOAS
//! (`VFIO_DEVICE_ATTACH_IOMMUFD_PT`); mappings are made on the IOAS
//! (`IOMMU_IOAS_MAP`/`IOMMU_IOAS_UNMAP`), and its allowed IOVA ranges come
//! from `IOMMU_IOAS_IOVA_RANGES` after the attach (an attach narrows them to
//! what the device's IOMMU can reach, without the MSI window and reserved
//! regions).
//!
//! It is a sibling of the type1 container ([`crate::VfioIommu`]): both are a
//! [`Ranged`] over their own range calls, so the IOVA windows, the coalesced
//! unmaps and the counters are one piece of code, and so is everything above
//! the [`crate::Iommu`] trait — the
//! [`crate::DmaSpace`], the strict, lazy and premapped [`crate::DmaMode`]s,
//! the batched unmaps and the rule that memory whose unmap failed is leaked,
//! never freed — is the same code on both. The device itself is a
//! `vfio-ioctls` [`VfioDevice`] either way, so config space, BAR0's mmap and
//! the interrupt eventfds (MSI-X, MSI, INTx) go through the same calls.
//!
//! Drop order: the device is closed first (which detaches it from the IOAS),
//! then the IOAS is destroyed and the iommufd closed, when the last `Arc` of
//! `VfioIommufd` goes. As with type1, a [`crate::DmaRegion`] holds the
//! `DmaSpace`, which holds this, so the IOAS outlives every mapping.

mod ioas;
mod open;
pub mod sys;

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use vfio_ioctls::{VfioDevice, VfioIommufd};

use crate::container::usable_iova_ranges;
use crate::iommu::DmaDir;
use crate::iova::IovaRange;
use crate::ranged::{RangeCalls, Ranged};

pub use open::{cdev_name, iommufd_node, vfio_cdev_node};
pub(crate) use open::{open, precheck};

/// An iommufd IOAS with its device attached, usable as an [`Iommu`](crate::Iommu)
/// (through [`Ranged`], which it shares with the type1 container).
pub type IommufdIommu = Ranged<IommufdIoas>;

/// The device opened through its cdev, bound to an iommufd and attached to
/// an IOAS: the fds the iommufd range calls go to, and what the IOAS reported.
pub struct IommufdIoas {
    device: ManuallyDrop<VfioDevice>,
    iommufd: Arc<VfioIommufd>,
    fd: RawFd,
    id: u32,
    sysfs_path: PathBuf,
    cdev: PathBuf,
    reported: Vec<IovaRange>,
    alignment: u64,
}

impl std::fmt::Debug for IommufdIoas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IommufdIoas")
            .field("cdev", &self.cdev)
            .field("ioas", &self.id)
            .field("alignment", &format_args!("{:#x}", self.alignment))
            .finish_non_exhaustive()
    }
}

impl IommufdIommu {
    /// Wrap a device bound to `iommufd` and attached to its IOAS, whose
    /// geometry was read after the attach.
    fn attached(
        device: VfioDevice,
        iommufd: Arc<VfioIommufd>,
        sysfs_path: PathBuf,
        cdev: PathBuf,
        geometry: sys::IoasGeometry,
    ) -> Self {
        let ranges = usable_iova_ranges(Some(&geometry.ranges));
        log::debug!(
            "IOAS {}: IOVA alignment {:#x}, allowed ranges {:?}",
            iommufd.ioas().id(),
            geometry.alignment,
            geometry.ranges
        );
        // The IOVA alignment is at most the host page; DmaSpace rounds up to
        // the host page anyway, so the granule is the larger.
        let min_page = (geometry.alignment as usize).max(crate::host_page_size());
        let calls = IommufdIoas {
            fd: iommufd.iommufd().as_raw_fd(),
            id: iommufd.ioas().id(),
            device: ManuallyDrop::new(device),
            iommufd,
            sysfs_path,
            cdev,
            reported: geometry.ranges,
            alignment: geometry.alignment,
        };
        Ranged::new(calls, ranges, min_page)
    }

    /// The open VFIO device (through its cdev).
    pub fn device(&self) -> &VfioDevice {
        &self.calls().device
    }

    /// The iommufd and the IOAS (the fd and object mappings are made on).
    pub fn iommufd(&self) -> &Arc<VfioIommufd> {
        &self.calls().iommufd
    }

    /// The device cdev that was opened (`/dev/vfio/devices/vfioN`).
    pub fn cdev(&self) -> &std::path::Path {
        &self.calls().cdev
    }

    /// The IOAS's object id in the iommufd.
    pub fn ioas_id(&self) -> u32 {
        self.calls().id
    }

    /// The allowed IOVA ranges as the kernel reported them after the attach.
    pub fn reported_ranges(&self) -> &[IovaRange] {
        &self.calls().reported
    }

    /// The alignment the kernel requires of a map's IOVA and length.
    pub fn iova_alignment(&self) -> u64 {
        self.calls().alignment
    }
}

// SAFETY: `unmap` returns Ok only when IOMMU_IOAS_UNMAP returned; iommufd
// unmaps every attached domain and syncs its IOTLB (iommu_unmap) before it
// unpins the pages and before the ioctl returns, so the device can no longer
// reach the memory.
unsafe impl RangeCalls for IommufdIoas {
    unsafe fn map(
        &self,
        iova: u64,
        vaddr: NonNull<u8>,
        len: u64,
        dir: DmaDir,
    ) -> std::io::Result<()> {
        // SAFETY: the caller upholds `RangeCalls::map`'s contract, which is
        // `sys::ioas_map`'s.
        unsafe { sys::ioas_map(self.fd, self.id, iova, vaddr, len, dir) }
    }

    fn unmap(&self, iova: u64, len: u64) -> std::io::Result<u64> {
        sys::ioas_unmap(self.fd, self.id, iova, len)
    }

    fn syncs(&self, n: u64) -> u64 {
        ioas::syncs(n)
    }

    fn map_hint(&self, errno: i32) -> &'static str {
        ioas::map_hint(errno)
    }

    fn unmap_hint(&self, errno: i32) -> &'static str {
        ioas::unmap_hint(errno)
    }
}

impl Drop for IommufdIoas {
    fn drop(&mut self) {
        // Device first: `VfioDevice::drop` detaches it from the IOAS and
        // panics if that fails, which it does once the device is gone
        // (hot-removed). Leak the fd then: better than a panic in drop.
        if self.sysfs_path.exists() {
            // SAFETY: dropped exactly once, here; not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.device) };
        } else {
            log::error!(
                "{} vanished (hot-removed?); leaking its VFIO device fd",
                self.sysfs_path.display()
            );
        }
        // `self.iommufd` drops after this body: the IOAS is destroyed and
        // /dev/iommu closed with its last reference.
        log::debug!(
            "{}: VFIO device cdev closed, destroying IOAS {}",
            self.cdev.display(),
            self.id
        );
    }
}
