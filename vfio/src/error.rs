//! Errors of the VFIO path and of the setup tools (devices, bind, doctor).
//!
//! Every variant says what went wrong *and what to do about it*, and ends by
//! pointing at `mcqio-perf doctor <BDF>`, which runs all the checks at once.
//! The variants carry the data (paths, drivers, limits) so applications can
//! print their own text too.

use std::fmt;
use std::path::PathBuf;

use crate::dma::DmaError;

/// Result of the VFIO layer.
pub type Result<T, E = VfioError> = std::result::Result<T, E>;

/// Another device in an IOMMU group that keeps the group from being viable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBlocker {
    /// Its PCI address.
    pub bdf: String,
    /// The driver it is bound to.
    pub driver: String,
}

impl fmt::Display for GroupBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (bound to {})", self.bdf, self.driver)
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn driver_name(d: &Option<String>) -> String {
    match d {
        Some(d) => format!("the `{d}` driver"),
        None => "no driver".into(),
    }
}

/// Human-readable byte count (`64 KiB`, `8 MiB`, `unlimited`).
pub fn fmt_bytes(bytes: u64) -> String {
    if bytes == u64::MAX {
        return "unlimited".into();
    }
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut v = bytes;
    while unit + 1 < UNITS.len() && v >= 1024 && v % 1024 == 0 {
        v /= 1024;
        unit += 1;
    }
    format!("{v} {}", UNITS[unit])
}

/// Why opening a controller, or a setup step, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfioError {
    /// The PCI address is malformed.
    #[error("`{input}` is not a PCI address: expected DOMAIN:BUS:DEVICE.FUNCTION in hex, like 0000:00:03.0; list NVMe controllers with `mcqio-perf devices`, or run `mcqio-perf doctor`")]
    InvalidAddress {
        /// What was given.
        input: String,
    },

    /// No PCI device at that address.
    #[error("no PCI device {bdf}: {} does not exist; check the address with `mcqio-perf devices` (or `lspci -D`); run `mcqio-perf doctor {bdf}`", .path.display())]
    NoSuchDevice {
        /// The address.
        bdf: String,
        /// The sysfs directory that was looked for.
        path: PathBuf,
    },

    /// The device is not an NVMe controller (PCI class 0x0108).
    #[error("PCI device {bdf} has class {class:#08x}, not an NVMe controller (0x0108xx); pick an NVMe controller from `mcqio-perf devices`; run `mcqio-perf doctor {bdf}`")]
    NotNvme {
        /// The address.
        bdf: String,
        /// Its 24-bit class code.
        class: u32,
    },

    /// The kernel has no IOMMU enabled, so devices have no IOMMU group.
    #[error("PCI device {bdf} has no IOMMU group ({} is missing): the IOMMU is off; enable VT-d/AMD-Vi in the firmware and boot with `intel_iommu=on` (Intel) or `amd_iommu=on` (AMD); run `mcqio-perf doctor {bdf}`", .path.display())]
    NoIommu {
        /// The address.
        bdf: String,
        /// The missing `iommu_group` link.
        path: PathBuf,
    },

    /// The kernel has no VFIO (`/dev/vfio/vfio` is missing).
    #[error("VFIO is missing: {} does not exist; load it with `modprobe vfio-pci` (kernel config CONFIG_VFIO_PCI); run `mcqio-perf doctor {bdf}`", .path.display())]
    VfioMissing {
        /// The address being opened.
        bdf: String,
        /// The missing container node.
        path: PathBuf,
    },

    /// The device is bound to another driver (or none).
    #[error("PCI device {bdf} is bound to {}, not vfio-pci; hand it to VFIO with `mcqio-perf bind {bdf}` (as root); run `mcqio-perf doctor {bdf}`", driver_name(.driver))]
    NotBoundToVfio {
        /// The address.
        bdf: String,
        /// Its current driver, if any.
        driver: Option<String>,
    },

    /// Other devices in the IOMMU group are bound to host drivers.
    #[error("IOMMU group {group} of {bdf} is not viable: every device in a group must be bound to vfio-pci or to no driver, but {} {} not; bind them with `mcqio-perf bind <BDF>` or unbind them (`echo <BDF> > /sys/bus/pci/devices/<BDF>/driver/unbind`); run `mcqio-perf doctor {bdf}`", list(.blockers), if .blockers.len() == 1 { "is" } else { "are" })]
    GroupNotViable {
        /// The address.
        bdf: String,
        /// The IOMMU group number.
        group: u32,
        /// The devices that block it.
        blockers: Vec<GroupBlocker>,
    },

    /// The group node exists but this user may not open it.
    #[error("permission denied on {}: grant this user access with `mcqio-perf bind {bdf} --user $USER` (or `chown $USER {}`) and raise its locked-memory limit; run `mcqio-perf doctor {bdf}`", .path.display(), .path.display())]
    GroupPermission {
        /// The address.
        bdf: String,
        /// The `/dev/vfio/<group>` node.
        path: PathBuf,
    },

    /// Another process holds the group or the device open.
    #[error("{} is busy: the device is already open (by a VM, another mcqio run, or this process); close it first, or find the holder with `fuser -v {}`; run `mcqio-perf doctor {bdf}`", .path.display(), .path.display())]
    Busy {
        /// The address.
        bdf: String,
        /// The node that is busy.
        path: PathBuf,
    },

    /// The container does not offer the type1v2 IOMMU.
    #[error("the VFIO container does not support the type1v2 IOMMU ({reason}); load it with `modprobe vfio_iommu_type1` and make sure the IOMMU is on; run `mcqio-perf doctor {bdf}`")]
    NoType1v2 {
        /// The address.
        bdf: String,
        /// What VFIO said.
        reason: String,
    },

    /// iommufd was asked for, but the kernel has none (`/dev/iommu` is missing).
    #[error("iommufd is missing: {} does not exist; the kernel needs CONFIG_IOMMUFD (`modprobe iommufd`; no Debian kernel enables it; fixtures/vm/kernel/build.sh builds a guest kernel that does), or open through the type1 container with `vfio:{bdf},iommu=type1`; run `mcqio-perf doctor {bdf}`", .path.display())]
    NoIommufd {
        /// The address being opened.
        bdf: String,
        /// The missing `/dev/iommu`.
        path: PathBuf,
    },

    /// iommufd was asked for, but the kernel gave the device no VFIO cdev.
    #[error("{bdf} has no VFIO device cdev ({} is missing): the kernel needs CONFIG_VFIO_DEVICE_CDEV (no Debian kernel enables it; fixtures/vm/kernel/build.sh builds a guest kernel that does) and the device must be bound to vfio-pci; or open through the type1 container with `vfio:{bdf},iommu=type1`; run `mcqio-perf doctor {bdf}`", .path.display())]
    NoDeviceCdev {
        /// The address being opened.
        bdf: String,
        /// The missing `<sysfs device>/vfio-dev` directory.
        path: PathBuf,
    },

    /// `RLIMIT_MEMLOCK` is too low for the DMA memory that will be pinned.
    #[error("RLIMIT_MEMLOCK is {} but {} must be locked for DMA memory: raise it with `ulimit -l {}` (or a `memlock` line in /etc/security/limits.conf, `LimitMEMLOCK=` for systemd units), or run as root; run `mcqio-perf doctor {bdf}`", fmt_bytes(*.current), fmt_bytes(*.needed), .needed.div_ceil(1024))]
    Memlock {
        /// The address.
        bdf: String,
        /// The current soft limit in bytes (`u64::MAX` when unlimited).
        current: u64,
        /// Bytes needed.
        needed: u64,
    },

    /// BAR0 cannot be used.
    #[error("BAR0 of {bdf} cannot be mapped: {reason}; run `mcqio-perf doctor {bdf}`")]
    Bar {
        /// The address.
        bdf: String,
        /// Why.
        reason: String,
    },

    /// Another VFIO call failed.
    #[error("VFIO {op} failed for {bdf}: {source}; run `mcqio-perf doctor {bdf}`")]
    Vfio {
        /// The address.
        bdf: String,
        /// What was being done.
        op: &'static str,
        /// What `vfio-ioctls` said.
        source: vfio_ioctls::VfioError,
    },

    /// A system call failed.
    #[error("{op} failed for {bdf}: {source}; run `mcqio-perf doctor {bdf}`")]
    Os {
        /// The address.
        bdf: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },

    /// A sysfs/procfs file could not be read or written.
    #[error("cannot {op} {}: {source}{}; run `mcqio-perf doctor {bdf}`", .path.display(), if .source.kind() == std::io::ErrorKind::PermissionDenied { " (run as root)" } else { "" })]
    Sysfs {
        /// The address concerned.
        bdf: String,
        /// `read` or `write`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// `bind` refused because the kernel is using the controller.
    #[error("refusing to take {bdf} from the kernel: {}; unmount/stop them first, or pass `--force` if you are sure (the data on it is then unreachable to the kernel until `mcqio-perf unbind {bdf}`); run `mcqio-perf doctor {bdf}`", .reasons.join("; "))]
    InUse {
        /// The address.
        bdf: String,
        /// What uses it (mounts, holders, swap, open handles).
        reasons: Vec<String>,
    },

    /// A needed kernel driver is not registered.
    #[error("the `{driver}` PCI driver is not loaded ({} is missing): load it with `modprobe {module}`; run `mcqio-perf doctor {bdf}`", .path.display())]
    DriverMissing {
        /// The address.
        bdf: String,
        /// The driver name (`vfio-pci`, `nvme`).
        driver: String,
        /// The module to load.
        module: String,
        /// The missing driver directory.
        path: PathBuf,
    },

    /// The driver change did not take.
    #[error("{bdf} should now be bound to `{expected}` but is bound to {}; check `dmesg` for the probe error; run `mcqio-perf doctor {bdf}`", driver_name(.actual))]
    RebindFailed {
        /// The address.
        bdf: String,
        /// The driver we asked for.
        expected: String,
        /// The driver it has now.
        actual: Option<String>,
    },

    /// `--user` names no user.
    #[error("no user named `{user}` (give a login name or a numeric uid); run `mcqio-perf doctor {bdf}`")]
    NoSuchUser {
        /// The address.
        bdf: String,
        /// The name given.
        user: String,
    },

    /// DMA memory for the controller could not be set up.
    #[error("{source}; run `mcqio-perf doctor {bdf}`")]
    Dma {
        /// The address.
        bdf: String,
        /// The DMA error.
        source: DmaError,
    },
}

impl VfioError {
    /// The PCI address the error concerns (empty for a malformed address).
    pub fn bdf(&self) -> &str {
        use VfioError::*;
        match self {
            InvalidAddress { .. } => "",
            NoSuchDevice { bdf, .. }
            | NotNvme { bdf, .. }
            | NoIommu { bdf, .. }
            | VfioMissing { bdf, .. }
            | NotBoundToVfio { bdf, .. }
            | GroupNotViable { bdf, .. }
            | GroupPermission { bdf, .. }
            | Busy { bdf, .. }
            | NoType1v2 { bdf, .. }
            | NoIommufd { bdf, .. }
            | NoDeviceCdev { bdf, .. }
            | Memlock { bdf, .. }
            | Bar { bdf, .. }
            | Vfio { bdf, .. }
            | Os { bdf, .. }
            | Sysfs { bdf, .. }
            | InUse { bdf, .. }
            | DriverMissing { bdf, .. }
            | RebindFailed { bdf, .. }
            | NoSuchUser { bdf, .. }
            | Dma { bdf, .. } => bdf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_ends_with_doctor() {
        let bdf = "0000:00:03.0".to_string();
        let errs = [
            VfioError::NoSuchDevice {
                bdf: bdf.clone(),
                path: "/sys/bus/pci/devices/0000:00:03.0".into(),
            },
            VfioError::NotBoundToVfio {
                bdf: bdf.clone(),
                driver: None,
            },
            VfioError::Busy {
                bdf: bdf.clone(),
                path: "/dev/vfio/7".into(),
            },
            VfioError::Sysfs {
                bdf: bdf.clone(),
                op: "write",
                path: "/sys/x".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            },
        ];
        for e in errs {
            let m = e.to_string();
            assert!(m.ends_with("run `mcqio-perf doctor 0000:00:03.0`"), "{m}");
            assert_eq!(e.bdf(), bdf);
        }
        let m = VfioError::InvalidAddress { input: "x".into() }.to_string();
        assert!(m.ends_with("run `mcqio-perf doctor`"), "{m}");
    }

    #[test]
    fn unbound_device_says_no_driver() {
        let m = VfioError::NotBoundToVfio {
            bdf: "0000:00:03.0".into(),
            driver: None,
        }
        .to_string();
        assert!(m.contains("bound to no driver"), "{m}");
        assert!(m.contains("mcqio-perf bind 0000:00:03.0"), "{m}");
    }

    #[test]
    fn byte_formatting() {
        assert_eq!(fmt_bytes(8 << 20), "8 MiB");
        assert_eq!(fmt_bytes(65536), "64 KiB");
        assert_eq!(fmt_bytes(1000), "1000 B");
        assert_eq!(fmt_bytes(3 << 30), "3 GiB");
        assert_eq!(fmt_bytes(u64::MAX), "unlimited");
        assert_eq!(fmt_bytes(1536), "1536 B");
    }
}
