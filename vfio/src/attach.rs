//! Which IOMMU interface a device is opened through: the type1 container or
//! iommufd.
//!
//! [`IommuChoice`] is what the user asks for (`vfio:BDF,iommu=auto|type1|iommufd`,
//! or [`OpenOptions::iommu`](crate::OpenOptions::iommu)); [`IommuKind`] is
//! what was opened; [`offered`] says which interfaces the running kernel
//! offers for a device, and why one is missing (for `auto`, for
//! `mcqio-perf devices` and for the doctor).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use vfio_ioctls::VfioDevice;

use crate::container::VfioIommu;
use crate::iommu::Iommu;
use crate::iommufd::{cdev_name, iommufd_node, IommufdIommu};
use crate::sysfs::{PciDevice, SysRoots};

/// The environment variable that gives [`IommuChoice`]'s default, for tools
/// that open devices without a device-string option (the guest test
/// binaries): `type1`, `iommufd` or `auto`.
pub const IOMMU_ENV: &str = "MCQIO_VFIO_IOMMU";

/// Which IOMMU interface to open a device through.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum IommuChoice {
    /// iommufd where the kernel gave the device a cdev and `/dev/iommu`
    /// exists, the type1 container otherwise.
    #[default]
    Auto,
    /// The legacy VFIO container (`/dev/vfio/vfio` + the group), type1v2.
    /// On a kernel with `CONFIG_IOMMUFD_VFIO_CONTAINER` that container is
    /// iommufd's emulation of it.
    Type1,
    /// The device cdev bound to an iommufd IOAS.
    Iommufd,
}

impl IommuChoice {
    /// The choice named by [`IOMMU_ENV`], or `Auto` when it is unset or empty.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(IOMMU_ENV) {
            Ok(v) if !v.is_empty() => v.parse().map_err(|e| format!("{IOMMU_ENV}: {e}")),
            _ => Ok(Self::Auto),
        }
    }

    /// Resolve `Auto` for `dev` (the other two stay as they are).
    pub fn resolve(self, roots: &SysRoots, dev: &PciDevice) -> IommuKind {
        match self {
            Self::Type1 => IommuKind::Type1,
            Self::Iommufd => IommuKind::Iommufd,
            Self::Auto if offered(roots, dev).iommufd.is_ok() => IommuKind::Iommufd,
            Self::Auto => IommuKind::Type1,
        }
    }
}

impl FromStr for IommuChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "type1" => Ok(Self::Type1),
            "iommufd" => Ok(Self::Iommufd),
            _ => Err(format!(
                "`{s}` is not an IOMMU interface: use auto, type1 or iommufd"
            )),
        }
    }
}

impl fmt::Display for IommuChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Type1 => "type1",
            Self::Iommufd => "iommufd",
        })
    }
}

/// The IOMMU interface a device was opened through.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IommuKind {
    /// The VFIO type1 container.
    Type1,
    /// An iommufd IOAS.
    Iommufd,
}

impl fmt::Display for IommuKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Type1 => "type1",
            Self::Iommufd => "iommufd",
        })
    }
}

/// Which interfaces the running kernel offers for a device: `Ok` with what
/// is there, `Err` with why it is missing and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offered {
    /// The type1 container: `/dev/vfio/vfio` and the device's group node.
    pub type1: Result<String, String>,
    /// iommufd: the device's cdev and `/dev/iommu`.
    pub iommufd: Result<String, String>,
}

/// What the kernel offers for `dev` (see [`Offered`]). Only looks at nodes,
/// opens nothing.
pub fn offered(roots: &SysRoots, dev: &PciDevice) -> Offered {
    let container = roots.vfio_container_node();
    let type1 = match dev.iommu_group {
        None => Err("no IOMMU group (the IOMMU is off)".to_string()),
        Some(_) if !container.exists() => Err(format!(
            "{} is missing (no VFIO, or a kernel without CONFIG_VFIO_CONTAINER and CONFIG_IOMMUFD_VFIO_CONTAINER)",
            container.display()
        )),
        Some(g) => {
            let node = roots.vfio_group_node(g);
            if node.exists() || !dev.is_vfio() {
                Ok(format!("{} + {}", container.display(), node.display()))
            } else {
                Err(format!("{} is missing", node.display()))
            }
        }
    };
    let iommu = iommufd_node(roots);
    let iommufd = if !iommu.exists() {
        Err(format!(
            "{} is missing: the kernel has no CONFIG_IOMMUFD (no Debian kernel enables it)",
            iommu.display()
        ))
    } else if !dev.is_vfio() {
        Err("the device has a cdev only while bound to vfio-pci".to_string())
    } else {
        match cdev_name(dev) {
            Some(name) => Ok(format!(
                "{} + {}",
                iommu.display(),
                crate::iommufd::vfio_cdev_node(roots, &name).display()
            )),
            None => Err(format!(
                "{} is missing: the kernel has no CONFIG_VFIO_DEVICE_CDEV",
                dev.path.join("vfio-dev").display()
            )),
        }
    };
    Offered { type1, iommufd }
}

/// The opened IOMMU side of a device: the device fd with its container or
/// its IOAS.
#[derive(Debug)]
pub(crate) enum Attached {
    Type1(Arc<VfioIommu>),
    Iommufd(Arc<IommufdIommu>),
}

impl Attached {
    pub(crate) fn device(&self) -> &VfioDevice {
        match self {
            Self::Type1(t) => t.device(),
            Self::Iommufd(i) => i.device(),
        }
    }

    pub(crate) fn iommu(&self) -> Arc<dyn Iommu> {
        match self {
            Self::Type1(t) => t.clone(),
            Self::Iommufd(i) => i.clone(),
        }
    }

    pub(crate) fn kind(&self) -> IommuKind {
        match self {
            Self::Type1(_) => IommuKind::Type1,
            Self::Iommufd(_) => IommuKind::Iommufd,
        }
    }
}
