//! Opening a device through its VFIO cdev and attaching it to a fresh IOAS.
//!
//! The nodes: `<sysfs device>/vfio-dev/vfioN` names the cdev (it exists
//! only in a kernel with `CONFIG_VFIO_DEVICE_CDEV` and only while the device
//! is bound to vfio-pci), `/dev/vfio/devices/vfioN` is the cdev itself, and
//! `/dev/iommu` the iommufd (`CONFIG_IOMMUFD`). Each missing piece is its
//! own [`VfioError`] that says what to do.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iommufd_ioctls::IommuFd;
use vfio_ioctls::{VfioDevice, VfioIommufd};

use super::{sys, IommufdIommu};
use crate::error::{Result, VfioError};
use crate::sysfs::{can_read_write, PciDevice, SysRoots};

/// The name of `dev`'s VFIO cdev (`vfio0`), from `<sysfs device>/vfio-dev/`;
/// `None` when the kernel gave it none (no `CONFIG_VFIO_DEVICE_CDEV`, or the
/// device is not bound to vfio-pci).
pub fn cdev_name(dev: &PciDevice) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dev.path.join("vfio-dev"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("vfio"))
        .collect();
    names.sort();
    // A PCI function has exactly one.
    (names.len() == 1).then(|| names.remove(0))
}

/// `<dev>/vfio/devices/<name>`, a device cdev node.
pub fn vfio_cdev_node(roots: &SysRoots, name: &str) -> PathBuf {
    roots.dev.join("vfio/devices").join(name)
}

/// `<dev>/iommu`, the iommufd node.
pub fn iommufd_node(roots: &SysRoots) -> PathBuf {
    roots.dev.join("iommu")
}

/// The checks of the iommufd path that need no ioctl: the kernel gave the
/// device a cdev, and the cdev and `/dev/iommu` exist and are accessible.
/// Returns the cdev node.
pub(crate) fn precheck(roots: &SysRoots, dev: &PciDevice) -> Result<PathBuf> {
    let bdf = dev.bdf.to_string();
    let Some(name) = cdev_name(dev) else {
        return Err(VfioError::NoDeviceCdev {
            bdf,
            path: dev.path.join("vfio-dev"),
        });
    };
    let iommu = iommufd_node(roots);
    match can_read_write(&iommu) {
        Ok(true) => {}
        Ok(false) => return Err(VfioError::GroupPermission { bdf, path: iommu }),
        Err(_) => return Err(VfioError::NoIommufd { bdf, path: iommu }),
    }
    let node = vfio_cdev_node(roots, &name);
    match can_read_write(&node) {
        Ok(true) => Ok(node),
        Ok(false) => Err(VfioError::GroupPermission { bdf, path: node }),
        // sysfs names a cdev that devtmpfs did not create.
        Err(_) => Err(VfioError::VfioMissing { bdf, path: node }),
    }
}

/// Open a node read-write, with the errno turned into the error that says
/// what to do (`missing` for ENOENT/ENODEV).
fn open_node(bdf: &str, path: &Path, missing: VfioError, op: &'static str) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => missing,
            Some(libc::EACCES) | Some(libc::EPERM) => VfioError::GroupPermission {
                bdf: bdf.to_string(),
                path: path.to_path_buf(),
            },
            Some(libc::EBUSY) => VfioError::Busy {
                bdf: bdf.to_string(),
                path: path.to_path_buf(),
            },
            _ => VfioError::Os {
                bdf: bdf.to_string(),
                op,
                source: e,
            },
        })
}

/// Open `dev` through its cdev, bind it to a new iommufd, attach it to a
/// fresh IOAS and read the IOAS's allowed ranges.
pub(crate) fn open(roots: &SysRoots, dev: &PciDevice) -> Result<IommufdIommu> {
    let bdf = dev.bdf.to_string();
    let node = precheck(roots, dev)?;
    let iommu_node = iommufd_node(roots);
    let iommufd = open_node(
        &bdf,
        &iommu_node,
        VfioError::NoIommufd {
            bdf: bdf.clone(),
            path: iommu_node.clone(),
        },
        "open /dev/iommu",
    )?;
    let cdev = open_node(
        &bdf,
        &node,
        VfioError::VfioMissing {
            bdf: bdf.clone(),
            path: node.clone(),
        },
        "open the VFIO device cdev",
    )?;
    let vfio = |op, source| VfioError::Vfio {
        bdf: bdf.clone(),
        op,
        source,
    };
    let iommufd = Arc::new(
        VfioIommufd::new(Arc::new(IommuFd::new_from_fd(iommufd)), None, None)
            .map_err(|e| vfio("IOMMU_IOAS_ALLOC (a fresh IO address space)", e))?,
    );
    log::debug!(
        "{bdf}: /dev/iommu open, IOAS {} allocated",
        iommufd.ioas().id()
    );
    let device = VfioDevice::new_from_fd(cdev, iommufd.clone(), true).map_err(|e| {
        vfio(
            "VFIO_DEVICE_BIND_IOMMUFD + VFIO_DEVICE_ATTACH_IOMMUFD_PT (is the group open through /dev/vfio/vfio by another process?)",
            e,
        )
    })?;
    log::debug!(
        "{bdf}: {} bound to the iommufd and attached to the IOAS",
        node.display()
    );
    let fd = std::os::fd::AsRawFd::as_raw_fd(iommufd.iommufd().as_ref());
    let geometry =
        sys::ioas_iova_ranges(fd, iommufd.ioas().id()).map_err(|source: io::Error| {
            VfioError::Os {
                bdf: bdf.clone(),
                op: "IOMMU_IOAS_IOVA_RANGES",
                source,
            }
        })?;
    Ok(IommufdIommu::attached(
        device,
        iommufd,
        dev.path.clone(),
        node,
        geometry,
    ))
}

#[cfg(test)]
mod tests {
    use crate::attach::{offered, IommuChoice, IommuKind};
    use crate::device::{OpenOptions, VfioBackend};
    use crate::error::VfioError;
    use crate::sysfs::fake::{Dev, FakeSys};
    use crate::sysfs::PciDevice;

    const BDF: &str = "0000:00:02.0";

    fn opts(fs: &FakeSys, iommu: IommuChoice) -> OpenOptions {
        OpenOptions {
            roots: fs.roots.clone(),
            dma_budget: 0,
            iommu,
            ..OpenOptions::default()
        }
    }

    /// A device on vfio-pci in group 2, with the group node; `cdev` adds
    /// what a kernel with CONFIG_VFIO_DEVICE_CDEV shows in sysfs.
    fn vfio_device(fs: &FakeSys, cdev: bool) {
        fs.write("dev/vfio/vfio", "");
        fs.write("dev/vfio/2", "");
        let real = fs.add(Dev::nvme(BDF, Some("vfio-pci"), Some(2)));
        if cdev {
            std::fs::create_dir_all(real.join("vfio-dev/vfio0")).unwrap();
            // The class exists on every kernel with CONFIG_VFIO_DEVICE_CDEV.
            std::fs::create_dir_all(fs.roots.sys.join("class/vfio-dev/vfio0")).unwrap();
        }
    }

    #[test]
    fn no_cdev_in_sysfs_names_the_kernel_option_and_type1() {
        let fs = FakeSys::new();
        vfio_device(&fs, false);
        fs.write("dev/iommu", "");
        let e = VfioBackend::open_with(BDF, &opts(&fs, IommuChoice::Iommufd)).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, VfioError::NoDeviceCdev { ref path, .. } if path.ends_with("vfio-dev")),
            "{m}"
        );
        assert!(m.contains("CONFIG_VFIO_DEVICE_CDEV"), "{m}");
        assert!(m.contains("`vfio:0000:00:02.0,iommu=type1`"), "{m}");
        assert!(m.ends_with("run `mcqio-perf doctor 0000:00:02.0`"), "{m}");
    }

    #[test]
    fn no_dev_iommu_names_config_iommufd() {
        let fs = FakeSys::new();
        vfio_device(&fs, true);
        let e = VfioBackend::open_with(BDF, &opts(&fs, IommuChoice::Iommufd)).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, VfioError::NoIommufd { ref path, .. } if path.ends_with("dev/iommu")),
            "{m}"
        );
        assert!(m.contains("CONFIG_IOMMUFD"), "{m}");
        assert!(m.contains("iommu=type1"), "{m}");
    }

    #[test]
    fn cdev_named_in_sysfs_but_missing_in_dev_is_reported() {
        let fs = FakeSys::new();
        vfio_device(&fs, true);
        fs.write("dev/iommu", "");
        let e = VfioBackend::open_with(BDF, &opts(&fs, IommuChoice::Iommufd)).unwrap_err();
        assert!(
            matches!(e, VfioError::VfioMissing { ref path, .. } if path.ends_with("vfio/devices/vfio0")),
            "{e}"
        );
    }

    #[test]
    fn the_ioctls_run_only_on_real_nodes() {
        // Every node present, but as plain files: the first ioctl
        // (IOMMU_IOAS_ALLOC on "/dev/iommu") fails, typed, and nothing leaks
        // or panics.
        let fs = FakeSys::new();
        vfio_device(&fs, true);
        fs.write("dev/iommu", "");
        fs.write("dev/vfio/devices/vfio0", "");
        let e = VfioBackend::open_with(BDF, &opts(&fs, IommuChoice::Iommufd)).unwrap_err();
        assert!(
            matches!(e, VfioError::Vfio { op, .. } if op.starts_with("IOMMU_IOAS_ALLOC")),
            "{e}"
        );
    }

    #[test]
    fn auto_takes_iommufd_only_where_the_kernel_offers_it() {
        let fs = FakeSys::new();
        vfio_device(&fs, false);
        let dev = PciDevice::read(&fs.roots, &BDF.parse().unwrap()).unwrap();
        assert_eq!(IommuChoice::Auto.resolve(&fs.roots, &dev), IommuKind::Type1);
        let o = offered(&fs.roots, &dev);
        assert!(o.type1.is_ok(), "{o:?}");
        assert!(o.iommufd.unwrap_err().contains("CONFIG_IOMMUFD"));
        fs.write("dev/iommu", "");
        let o = offered(&fs.roots, &dev);
        assert!(o.iommufd.unwrap_err().contains("CONFIG_VFIO_DEVICE_CDEV"));
        assert_eq!(IommuChoice::Auto.resolve(&fs.roots, &dev), IommuKind::Type1);

        let fs = FakeSys::new();
        vfio_device(&fs, true);
        fs.write("dev/iommu", "");
        let dev = PciDevice::read(&fs.roots, &BDF.parse().unwrap()).unwrap();
        assert_eq!(
            IommuChoice::Auto.resolve(&fs.roots, &dev),
            IommuKind::Iommufd
        );
        assert!(offered(&fs.roots, &dev)
            .iommufd
            .unwrap()
            .ends_with("vfio/devices/vfio0"));
        // An explicit choice is never overridden.
        assert_eq!(
            IommuChoice::Type1.resolve(&fs.roots, &dev),
            IommuKind::Type1
        );
        // Auto on a kernel without the container goes to iommufd without
        // asking for /dev/vfio/vfio.
        std::fs::remove_file(fs.roots.vfio_container_node()).unwrap();
        assert!(offered(&fs.roots, &dev).type1.is_err());
        let e = VfioBackend::open_with(BDF, &opts(&fs, IommuChoice::Auto)).unwrap_err();
        assert!(
            matches!(e, VfioError::VfioMissing { ref path, .. } if path.ends_with("devices/vfio0")),
            "{e}"
        );
    }

    #[test]
    fn choices_parse_and_print() {
        for c in [IommuChoice::Auto, IommuChoice::Type1, IommuChoice::Iommufd] {
            assert_eq!(c.to_string().parse::<IommuChoice>(), Ok(c));
        }
        let e = "vfio".parse::<IommuChoice>().unwrap_err();
        assert!(e.contains("auto, type1 or iommufd"), "{e}");
    }
}
