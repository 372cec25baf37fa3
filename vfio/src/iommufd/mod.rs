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

mod open;
pub mod sys;

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use vfio_ioctls::{VfioDevice, VfioIommufd};

use crate::container::{coalesce, usable_iova_ranges};
use crate::iommu::{DmaDir, Iommu, IommuCounters, IommuError};
use crate::iova::{Iova, IovaRange};

pub use open::{cdev_name, iommufd_node, vfio_cdev_node};
pub(crate) use open::{open, precheck};

/// An iommufd IOAS with its device attached, usable as an [`Iommu`].
pub struct IommufdIommu {
    device: ManuallyDrop<VfioDevice>,
    iommufd: Arc<VfioIommufd>,
    fd: RawFd,
    ioas: u32,
    sysfs_path: PathBuf,
    cdev: PathBuf,
    ranges: Vec<IovaRange>,
    reported: Vec<IovaRange>,
    alignment: u64,
    counters: IommuCounters,
}

impl std::fmt::Debug for IommufdIommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IommufdIommu")
            .field("cdev", &self.cdev)
            .field("ioas", &self.ioas)
            .field("ranges", &self.ranges)
            .field("alignment", &format_args!("{:#x}", self.alignment))
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
        let fd = iommufd.iommufd().as_raw_fd();
        let ioas = iommufd.ioas().id();
        let ranges = usable_iova_ranges(Some(&geometry.ranges));
        log::debug!(
            "iommufd IOAS {ioas}: IOVA alignment {:#x}, allowed ranges {:?}",
            geometry.alignment,
            geometry.ranges
        );
        Self {
            device: ManuallyDrop::new(device),
            iommufd,
            fd,
            ioas,
            sysfs_path,
            cdev,
            ranges,
            reported: geometry.ranges,
            alignment: geometry.alignment,
            counters: IommuCounters::default(),
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
        self.ioas
    }

    /// The allowed IOVA ranges as the kernel reported them after the attach.
    pub fn reported_ranges(&self) -> &[IovaRange] {
        &self.reported
    }

    /// The alignment the kernel requires of a map's IOVA and length.
    pub fn iova_alignment(&self) -> u64 {
        self.alignment
    }

    /// Unmap `[iova, iova+len)`, which covers `n` whole mappings, with one ioctl.
    fn unmap_run(&self, iova: Iova, len: u64, n: u64) -> Result<(), IommuError> {
        match sys::ioas_unmap(self.fd, self.ioas, iova.raw(), len) {
            Ok(done) if done == len => {
                // iommufd tears each mapping (an "area") down with its own
                // iommu_unmap, and each of those syncs the IOTLB.
                self.counters.on_unmap(n, len, n);
                Ok(())
            }
            Ok(done) => {
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
                reason: unmap_reason(&e),
            }),
        }
    }
}

/// The errno of a failed `IOMMU_IOAS_MAP`, with what to do about it.
pub fn map_reason(e: &std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            " — iommufd charges pinned pages to RLIMIT_MEMLOCK: raise it (`mcqio-perf doctor`)"
        }
        Some(libc::EEXIST) => " — the IOVA range is already mapped",
        Some(libc::EINVAL) => " — address or length not aligned to the IOAS's IOVA alignment",
        Some(libc::ENOENT) => " — outside the IOAS's allowed IOVA ranges, or the IOAS is gone",
        _ => "",
    };
    format!("{e}{hint}")
}

/// The errno of a failed `IOMMU_IOAS_UNMAP`, with what it means.
fn unmap_reason(e: &std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) => " — nothing was mapped there",
        Some(libc::EINVAL) => " — the range splits a mapping",
        _ => "",
    };
    format!("{e}{hint}")
}

// SAFETY: after `unmap`/`unmap_many` return Ok, IOMMU_IOAS_UNMAP has returned
// with the full length unmapped; iommufd unmaps every attached domain and
// syncs its IOTLB (iommu_unmap) before it unpins the pages and before the
// ioctl returns, so the device can no longer reach the memory.
unsafe impl Iommu for IommufdIommu {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError> {
        // SAFETY: the caller upholds `Iommu::map`'s contract, which is
        // `sys::ioas_map`'s.
        match unsafe { sys::ioas_map(self.fd, self.ioas, iova.raw(), vaddr, len as u64, dir) } {
            Ok(()) => {
                self.counters.on_map(len as u64);
                Ok(())
            }
            Err(e) => Err(IommuError::Map {
                iova,
                len,
                reason: map_reason(&e),
            }),
        }
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError> {
        if len == 0 {
            return Ok(());
        }
        self.unmap_run(iova, len, 1)
    }

    /// One `IOMMU_IOAS_UNMAP` per run of exactly adjacent ranges (a range
    /// that covers whole mappings unmaps all of them).
    fn unmap_many(&self, ranges: &[(Iova, u64)]) -> Result<(), IommuError> {
        coalesce(ranges)
            .into_iter()
            .try_for_each(|(iova, len, n)| self.unmap_run(iova, len, n))
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        self.ranges.clone()
    }

    fn min_page_size(&self) -> usize {
        // The IOVA alignment is at most the host page; DmaSpace rounds up to
        // the host page anyway, so report the larger.
        (self.alignment as usize).max(crate::host_page_size())
    }

    fn counters(&self) -> &IommuCounters {
        &self.counters
    }

    fn pins_pages(&self) -> bool {
        // IOMMU_IOAS_MAP pins every page it maps, charged to the user's
        // locked_vm (iommufd's default accounting).
        true
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
            self.ioas
        );
    }
}
