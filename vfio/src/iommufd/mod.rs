//! [`IommufdIommu`]: an iommufd IO address space (IOAS) as an [`Iommu`].
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
//! It is a sibling of the type1 container ([`crate::VfioIommu`]) behind the
//! same [`Iommu`] trait, so everything above that trait — the
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

use crate::iommu::{DmaDir, Iommu, IommuCounters, IommuError};
use crate::iova::{Iova, IovaRange};

pub use ioas::{map_reason, Ioas, IoasCalls};
pub use open::{cdev_name, iommufd_node, vfio_cdev_node};
pub(crate) use open::{open, precheck};

/// An iommufd IOAS with its device attached, usable as an [`Iommu`].
pub struct IommufdIommu {
    device: ManuallyDrop<VfioDevice>,
    iommufd: Arc<VfioIommufd>,
    ioas: Ioas<KernelIoas>,
    sysfs_path: PathBuf,
    cdev: PathBuf,
}

impl std::fmt::Debug for IommufdIommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IommufdIommu")
            .field("cdev", &self.cdev)
            .field("ioas", &self.ioas)
            .finish_non_exhaustive()
    }
}

impl IommufdIommu {
    /// Wrap a device bound to `iommufd` and attached to its IOAS, whose
    /// geometry was read after the attach.
    fn new(
        device: VfioDevice,
        iommufd: Arc<VfioIommufd>,
        sysfs_path: PathBuf,
        cdev: PathBuf,
        geometry: sys::IoasGeometry,
    ) -> Self {
        let calls = KernelIoas {
            fd: iommufd.iommufd().as_raw_fd(),
            id: iommufd.ioas().id(),
        };
        Self {
            device: ManuallyDrop::new(device),
            iommufd,
            ioas: Ioas::new(calls, geometry),
            sysfs_path,
            cdev,
        }
    }

    /// The open VFIO device (through its cdev).
    pub fn device(&self) -> &VfioDevice {
        &self.device
    }

    /// The iommufd and the IOAS (the fd and object mappings are made on).
    pub fn iommufd(&self) -> &Arc<VfioIommufd> {
        &self.iommufd
    }

    /// The device cdev that was opened (`/dev/vfio/devices/vfioN`).
    pub fn cdev(&self) -> &std::path::Path {
        &self.cdev
    }

    /// The IOAS's object id in the iommufd.
    pub fn ioas_id(&self) -> u32 {
        self.ioas.calls().id
    }

    /// The allowed IOVA ranges as the kernel reported them after the attach.
    pub fn reported_ranges(&self) -> &[IovaRange] {
        self.ioas.reported_ranges()
    }

    /// The alignment the kernel requires of a map's IOVA and length.
    pub fn iova_alignment(&self) -> u64 {
        self.ioas.iova_alignment()
    }
}

/// An IOAS of an open iommufd: the calls go to the kernel.
#[derive(Debug)]
struct KernelIoas {
    fd: RawFd,
    id: u32,
}

// SAFETY: `unmap` returns Ok only when IOMMU_IOAS_UNMAP returned; iommufd
// unmaps every attached domain and syncs its IOTLB (iommu_unmap) before it
// unpins the pages and before the ioctl returns, so the device can no longer
// reach the memory.
unsafe impl IoasCalls for KernelIoas {
    unsafe fn map(
        &self,
        iova: u64,
        vaddr: NonNull<u8>,
        len: u64,
        dir: DmaDir,
    ) -> std::io::Result<()> {
        // SAFETY: the caller upholds `IoasCalls::map`'s contract, which is
        // `sys::ioas_map`'s.
        unsafe { sys::ioas_map(self.fd, self.id, iova, vaddr, len, dir) }
    }

    fn unmap(&self, iova: u64, len: u64) -> std::io::Result<u64> {
        sys::ioas_unmap(self.fd, self.id, iova, len)
    }
}

// SAFETY: every method forwards to the `Ioas`, whose `Iommu` impl keeps the
// contract; the device and the IOAS stay open while `self` lives.
unsafe impl Iommu for IommufdIommu {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError> {
        // SAFETY: the caller upholds `Iommu::map`'s contract.
        unsafe { self.ioas.map(iova, vaddr, len, dir) }
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError> {
        self.ioas.unmap(iova, len)
    }

    fn unmap_many(&self, ranges: &[(Iova, u64)]) -> Result<(), IommuError> {
        self.ioas.unmap_many(ranges)
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        self.ioas.valid_ranges()
    }

    fn min_page_size(&self) -> usize {
        self.ioas.min_page_size()
    }

    fn counters(&self) -> &IommuCounters {
        self.ioas.counters()
    }

    fn pins_pages(&self) -> bool {
        self.ioas.pins_pages()
    }
}

impl Drop for IommufdIommu {
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
            self.ioas_id()
        );
    }
}
