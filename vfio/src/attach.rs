//! Which IOMMU interface a device is opened through: the type1 container or
//! iommufd.
//!
//! [`IommuChoice`] is what the user asks for (`vfio:BDF,iommu=auto|type1|iommufd`,
//! or [`OpenOptions::iommu`](crate::OpenOptions::iommu)); [`IommuKind`] is
//! what was opened; [`offered`] says which interfaces the running kernel
//! offers for a device, and why one is missing (for `auto`, for
//! `mcqio-perf devices` and for the doctor).

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use vfio_ioctls::VfioDevice;

use crate::container::VfioIommu;
use crate::iommu::Iommu;
use crate::iommufd::{cdev_name, iommufd_node, IommufdIommu};
use crate::sysfs::{can_read_write, PciDevice, SysRoots};

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

/// How this process could reach a node: `Ok` when it may open it read-write,
/// `Err` with the reason and the fix (`grant`) otherwise.
fn reachable(node: &Path, grant: &str) -> Result<(), String> {
    match can_read_write(node) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "this user may not open {}: {grant}",
            node.display()
        )),
        Err(_) => Err(format!("{} is missing", node.display())),
    }
}

/// What the running kernel offers before any device is looked at (for
/// `mcqio-perf devices`): the type1 container (`/dev/vfio/vfio`, from
/// `vfio_iommu_type1` or from iommufd's emulation of it) and iommufd
/// (`/dev/iommu` and the VFIO device cdev class), each `Err` with why it is
/// missing — the kernel option, the module, this user's access — and the
/// fix. Only looks at nodes, opens nothing.
pub fn interfaces(roots: &SysRoots) -> Offered {
    let container = roots.vfio_container_node();
    let iommu = iommufd_node(roots);
    let type1 = if !container.exists() {
        Err(format!(
            "{} is missing: modprobe vfio-pci (kernel: CONFIG_VFIO_CONTAINER, or CONFIG_IOMMUFD_VFIO_CONTAINER)",
            container.display()
        ))
    } else {
        reachable(&container, "sudo chmod 0666 it (its default mode)").map(|()| {
            let by = if roots.sys.join("module/vfio_iommu_type1").exists() {
                "vfio_iommu_type1"
            } else if iommu.exists() && roots.sys.join("module/iommufd").exists() {
                "iommufd's emulation of it"
            } else {
                "vfio_iommu_type1 once loaded"
            };
            format!("{} ({by})", container.display())
        })
    };
    let cdevs = roots.sys.join("class/vfio-dev");
    let iommufd = if !iommu.exists() {
        Err(format!(
            "{} is missing: CONFIG_IOMMUFD is off (as in every Debian kernel; fixtures/vm/kernel/build.sh builds one with it)",
            iommu.display()
        ))
    } else if !cdevs.exists() {
        Err(format!(
            "{} is missing: CONFIG_VFIO_DEVICE_CDEV is off, or vfio-pci is not loaded (modprobe vfio-pci)",
            cdevs.display()
        ))
    } else {
        reachable(
            &iommu,
            "sudo setfacl -m u:$USER:rw /dev/iommu (or a udev rule giving it a group)",
        )
        .map(|()| format!("{} + device cdevs", iommu.display()))
    };
    Offered { type1, iommufd }
}

/// What the kernel offers for `dev` (see [`Offered`]): the nodes exist and
/// this process may open them. Only looks at nodes, opens nothing.
pub fn offered(roots: &SysRoots, dev: &PciDevice) -> Offered {
    let system = interfaces(roots);
    let grant = format!("mcqio-perf bind {} --user $USER", dev.bdf);
    let container = roots.vfio_container_node();
    let type1 = match dev.iommu_group {
        None => Err("no IOMMU group (the IOMMU is off)".to_string()),
        Some(g) => system.type1.and_then(|_| {
            let node = roots.vfio_group_node(g);
            // The group node appears when the device is bound to vfio-pci.
            if dev.is_vfio() {
                reachable(&node, &grant)?;
            }
            Ok(format!("{} + {}", container.display(), node.display()))
        }),
    };
    let iommufd = match system.iommufd {
        Err(why) => Err(why),
        Ok(_) if !dev.is_vfio() => {
            Err("the device has a cdev only while bound to vfio-pci".to_string())
        }
        Ok(_) => match cdev_name(dev) {
            Some(name) => {
                let node = crate::iommufd::vfio_cdev_node(roots, &name);
                // Denied access is a reason to take type1; a node sysfs
                // names but devtmpfs lacks is left for the open to report.
                match reachable(&node, &grant) {
                    Err(why) if node.exists() => Err(why),
                    _ => Ok(format!(
                        "{} + {}",
                        iommufd_node(roots).display(),
                        node.display()
                    )),
                }
            }
            None => Err(format!(
                "{} is missing: CONFIG_VFIO_DEVICE_CDEV is off",
                dev.path.join("vfio-dev").display()
            )),
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::FakeSys;

    /// Issue 42: what the kernel offers, named by the option or module that
    /// is missing, for `mcqio-perf devices` before any device is looked at.
    #[test]
    fn interfaces_name_what_is_missing_and_who_serves_the_container() {
        let fs = FakeSys::new();
        let o = interfaces(&fs.roots);
        let t = o.type1.unwrap_err();
        assert!(t.contains("modprobe vfio-pci"), "{t}");
        assert!(t.contains("CONFIG_VFIO_CONTAINER"), "{t}");
        let i = o.iommufd.unwrap_err();
        assert!(i.contains("CONFIG_IOMMUFD is off"), "{i}");

        fs.write("dev/vfio/vfio", "");
        fs.write(
            "sys/module/vfio_iommu_type1/parameters/dma_entry_limit",
            "65535\n",
        );
        fs.write("dev/iommu", "");
        let o = interfaces(&fs.roots);
        assert!(
            o.type1.as_ref().unwrap().ends_with("(vfio_iommu_type1)"),
            "{o:?}"
        );
        let i = o.iommufd.unwrap_err();
        assert!(i.contains("CONFIG_VFIO_DEVICE_CDEV is off"), "{i}");

        fs.write("sys/class/vfio-dev/vfio0/dev", "");
        assert!(interfaces(&fs.roots)
            .iommufd
            .unwrap()
            .contains("device cdevs"));

        // The compat kernel: a container, no type1 module, iommufd loaded.
        let fs = FakeSys::new();
        fs.write("dev/vfio/vfio", "");
        fs.write("dev/iommu", "");
        fs.write(
            "sys/module/iommufd/parameters/allow_unsafe_interrupts",
            "N\n",
        );
        let t = interfaces(&fs.roots).type1.unwrap();
        assert!(t.ends_with("(iommufd's emulation of it)"), "{t}");
    }
}
