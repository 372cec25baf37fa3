//! PCI devices as sysfs shows them.
//!
//! Everything here reads (or, for bind/unbind, writes) plain files under a
//! [`SysRoots`], so tests build a fake `/sys`, `/proc` and `/dev` in a temp
//! directory and run the same code the tools run on a real machine.
//!
//! The sysfs layout used (all paths relative to the sysfs root):
//!
//! | path | content |
//! |---|---|
//! | `bus/pci/devices/<BDF>` | the device directory (a symlink into `devices/`) |
//! | `…/<BDF>/{vendor,device,class}` | `0x1b36`, `0x0010`, `0x010802` |
//! | `…/<BDF>/driver` | symlink to `bus/pci/drivers/<name>`; absent when unbound |
//! | `…/<BDF>/iommu_group` | symlink to `kernel/iommu_groups/<N>`; absent without an IOMMU |
//! | `…/<BDF>/driver_override` | `(null)` or a driver name |
//! | `…/<BDF>/nvme/nvme<K>` | the kernel's NVMe controller, while bound to `nvme` |
//! | `kernel/iommu_groups/<N>/devices/<BDF>` | the members of a group |
//! | `bus/pci/drivers/<name>/{bind,unbind}`, `bus/pci/drivers_probe` | driver binding |

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{GroupBlocker, Result, VfioError};

/// The driver name VFIO's PCI driver registers.
pub const VFIO_PCI_DRIVER: &str = "vfio-pci";
/// The kernel's NVMe driver.
pub const NVME_DRIVER: &str = "nvme";
/// PCI class (base class + subclass) of NVMe controllers: mass storage / NVM.
pub const NVME_CLASS: u32 = 0x0108;
/// PCI class (base class + subclass) of UFS host controllers: mass storage /
/// UFS (programming interface 0x01 is UFSHCI; QEMU's `ufs` is 1b36:0013,
/// class 0x010901).
pub const UFS_CLASS: u32 = 0x0109;
/// The kernel's PCI driver for UFS host controllers, as sysfs names it
/// (`/sys/bus/pci/drivers/ufshcd`): module `ufshcd-pci` registers its
/// `pci_driver` under the name "ufshcd".
pub const UFS_DRIVER: &str = "ufshcd";

/// The storage protocol a PCI function speaks, from its class code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// An NVMe controller (class 0x0108xx).
    Nvme,
    /// A UFS host controller (class 0x0109xx).
    Ufs,
}

impl Transport {
    /// The transport of a 24-bit PCI class code, if it is one mcqio knows.
    pub fn from_class(class: u32) -> Option<Self> {
        match class >> 8 {
            NVME_CLASS => Some(Transport::Nvme),
            UFS_CLASS => Some(Transport::Ufs),
            _ => None,
        }
    }

    /// `NVMe` or `UFS`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Nvme => "NVMe",
            Transport::Ufs => "UFS",
        }
    }

    /// What a device of this transport is called (`NVMe controller`).
    pub fn device_noun(self) -> &'static str {
        match self {
            Transport::Nvme => "NVMe controller",
            Transport::Ufs => "UFS host controller",
        }
    }

    /// The kernel driver that owns such a device when VFIO does not.
    pub fn kernel_driver(self) -> &'static str {
        match self {
            Transport::Nvme => NVME_DRIVER,
            Transport::Ufs => UFS_DRIVER,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport of the PCI function at `bdf` from its class code: the one
/// place that decides whether a device is NVMe or UFS. `Ok(None)` for a
/// function of any other class; [`VfioError::NoSuchDevice`] if sysfs has none.
pub fn transport_of(roots: &SysRoots, bdf: &PciAddress) -> Result<Option<Transport>> {
    Ok(PciDevice::read(roots, bdf)?.transport())
}
/// Drivers the kernel accepts in a VFIO group besides VFIO's own.
const GROUP_FRIENDLY_DRIVERS: &[&str] = &["pci-stub"];
/// PCI class of bridges (base class 0x06): the kernel ignores their driver
/// when judging group viability.
const BRIDGE_BASE_CLASS: u32 = 0x06;

/// Where the kernel's pseudo file systems are mounted.
///
/// Defaults to `/sys`, `/proc` and `/dev`; tests point it at a temp dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoots {
    /// sysfs (`/sys`).
    pub sys: PathBuf,
    /// procfs (`/proc`).
    pub proc: PathBuf,
    /// devtmpfs (`/dev`).
    pub dev: PathBuf,
}

impl Default for SysRoots {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            proc: "/proc".into(),
            dev: "/dev".into(),
        }
    }
}

impl SysRoots {
    /// All three roots under one directory (`<base>/sys`, `<base>/proc`, `<base>/dev`).
    pub fn under(base: impl AsRef<Path>) -> Self {
        let b = base.as_ref();
        Self {
            sys: b.join("sys"),
            proc: b.join("proc"),
            dev: b.join("dev"),
        }
    }

    /// `<sys>/bus/pci/devices/<BDF>`.
    pub fn pci_device_dir(&self, bdf: &PciAddress) -> PathBuf {
        self.sys.join("bus/pci/devices").join(bdf.to_string())
    }

    /// `<sys>/bus/pci/drivers/<name>`.
    pub fn pci_driver_dir(&self, name: &str) -> PathBuf {
        self.sys.join("bus/pci/drivers").join(name)
    }

    /// `<dev>/vfio/vfio`, the container node.
    pub fn vfio_container_node(&self) -> PathBuf {
        self.dev.join("vfio/vfio")
    }

    /// `<dev>/vfio/<group>`, a group node.
    pub fn vfio_group_node(&self, group: u32) -> PathBuf {
        self.dev.join("vfio").join(group.to_string())
    }
}

/// A PCI address: domain, bus, device, function (`0000:00:03.0`).
///
/// Parsing validates every field, so a `PciAddress` is always safe to join
/// into a sysfs path.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..32).
    pub device: u8,
    /// Function number (0..8).
    pub function: u8,
}

impl PciAddress {
    /// Parse `DDDD:BB:DD.F` (or `BB:DD.F`, domain 0).
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || VfioError::InvalidAddress {
            input: s.to_string(),
        };
        let hex = |f: &str, max_digits: usize| -> Result<u32> {
            if f.is_empty() || f.len() > max_digits || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(f, 16).map_err(|_| bad())
        };
        let t = s.trim();
        let (rest, func) = t.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, dev) = match parts[..] {
            [d, b, v] => (hex(d, 8)?, hex(b, 2)?, hex(v, 2)?),
            [b, v] => (0, hex(b, 2)?, hex(v, 2)?),
            _ => return Err(bad()),
        };
        let function = hex(func, 1)?;
        if dev >= 32 || function >= 8 {
            return Err(bad());
        }
        Ok(Self {
            domain,
            bus: bus as u8,
            device: dev as u8,
            function: function as u8,
        })
    }
}

impl FromStr for PciAddress {
    type Err = VfioError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Read a sysfs attribute, trimmed. `Ok(None)` if it does not exist.
pub(crate) fn read_attr(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parse `0x1b36`-style hex.
pub(crate) fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// The last component of a symlink's target (`…/drivers/nvme` → `nvme`).
pub(crate) fn link_name(path: &Path) -> io::Result<Option<String>> {
    match fs::read_link(path) {
        Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the calling process (effective ids) may open `path` read+write.
/// `Err` if it does not exist or cannot be checked.
pub fn can_read_write(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path that lives across the call.
    let r = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::R_OK | libc::W_OK,
            libc::AT_EACCESS,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => Ok(false),
        _ => Err(e),
    }
}

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// Its address.
    pub bdf: PciAddress,
    /// Its sysfs directory.
    pub path: PathBuf,
    /// PCI vendor id.
    pub vendor: u16,
    /// PCI device id.
    pub device: u16,
    /// 24-bit class code (base class, subclass, programming interface).
    pub class: u32,
    /// The bound driver, if any.
    pub driver: Option<String>,
    /// The IOMMU group, if the IOMMU is on.
    pub iommu_group: Option<u32>,
}

impl PciDevice {
    /// Read the device at `bdf`; [`VfioError::NoSuchDevice`] if sysfs has none.
    pub fn read(roots: &SysRoots, bdf: &PciAddress) -> Result<Self> {
        let path = roots.pci_device_dir(bdf);
        let b = bdf.to_string();
        if !path.exists() {
            return Err(VfioError::NoSuchDevice { bdf: b, path });
        }
        let io_err = |op, p: PathBuf| {
            let b = b.clone();
            move |source| VfioError::Sysfs {
                bdf: b,
                op,
                path: p,
                source,
            }
        };
        let attr = |name: &str| -> Result<u32> {
            let p = path.join(name);
            let v = read_attr(&p).map_err(io_err("read", p.clone()))?;
            Ok(v.as_deref().and_then(parse_hex).unwrap_or(0))
        };
        let driver_link = path.join("driver");
        let group_link = path.join("iommu_group");
        Ok(Self {
            bdf: *bdf,
            vendor: attr("vendor")? as u16,
            device: attr("device")? as u16,
            class: attr("class")?,
            driver: link_name(&driver_link).map_err(io_err("read", driver_link))?,
            iommu_group: link_name(&group_link)
                .map_err(io_err("read", group_link))?
                .and_then(|g| g.parse().ok()),
            path,
        })
    }

    /// Whether this is an NVMe controller (class 0x0108xx).
    pub fn is_nvme(&self) -> bool {
        self.transport() == Some(Transport::Nvme)
    }

    /// NVMe or UFS, from the class code; `None` for any other device.
    pub fn transport(&self) -> Option<Transport> {
        Transport::from_class(self.class)
    }

    /// Whether the device is bound to a VFIO driver.
    pub fn is_vfio(&self) -> bool {
        self.driver.as_deref().is_some_and(is_vfio_driver)
    }

    /// Whether this device, as bound now, lets its IOMMU group be viable.
    pub fn group_friendly(&self) -> bool {
        match self.driver.as_deref() {
            None => true,
            Some(d) => {
                is_vfio_driver(d)
                    || GROUP_FRIENDLY_DRIVERS.contains(&d)
                    || self.class >> 16 == BRIDGE_BASE_CLASS
            }
        }
    }
}

/// `vfio-pci` and its vendor variants (`nvme-vfio-pci`, …).
pub fn is_vfio_driver(name: &str) -> bool {
    name.contains("vfio")
}

/// All PCI functions in IOMMU group `group`, sorted by address.
pub fn group_members(roots: &SysRoots, group: u32) -> Result<Vec<PciDevice>> {
    let dir = roots
        .sys
        .join("kernel/iommu_groups")
        .join(group.to_string())
        .join("devices");
    let rd = fs::read_dir(&dir).map_err(|source| VfioError::Sysfs {
        bdf: String::new(),
        op: "read",
        path: dir.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Non-PCI members (rare: platform devices) cannot be judged here.
        if let Ok(addr) = PciAddress::parse(&name) {
            if let Ok(d) = PciDevice::read(roots, &addr) {
                out.push(d);
            }
        }
    }
    out.sort_by_key(|d| d.bdf);
    Ok(out)
}

/// The other devices of `dev`'s group that keep it from being viable.
///
/// Empty when the group would be viable once `dev` itself is on vfio-pci.
pub fn group_blockers(roots: &SysRoots, dev: &PciDevice) -> Result<Vec<GroupBlocker>> {
    let Some(group) = dev.iommu_group else {
        return Ok(Vec::new());
    };
    Ok(group_members(roots, group)?
        .into_iter()
        .filter(|m| m.bdf != dev.bdf && !m.group_friendly())
        .map(|m| GroupBlocker {
            bdf: m.bdf.to_string(),
            driver: m.driver.unwrap_or_default(),
        })
        .collect())
}

/// Every PCI function sysfs lists, sorted by address.
pub fn pci_devices(roots: &SysRoots) -> Result<Vec<PciDevice>> {
    let dir = roots.sys.join("bus/pci/devices");
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(VfioError::Sysfs {
                bdf: String::new(),
                op: "read",
                path: dir,
                source,
            })
        }
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        if let Ok(addr) = PciAddress::parse(&e.file_name().to_string_lossy()) {
            out.push(PciDevice::read(roots, &addr)?);
        }
    }
    out.sort_by_key(|d| d.bdf);
    Ok(out)
}

/// A fake sysfs/procfs/devfs tree in a temp dir, for tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temp dir removed on drop, with helpers that lay out kernel files.
    pub struct FakeSys {
        pub base: PathBuf,
        pub roots: SysRoots,
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.base);
        }
    }

    /// A fake NVMe/other device description.
    pub struct Dev<'a> {
        pub bdf: &'a str,
        pub class: u32,
        pub vendor: u16,
        pub device: u16,
        pub driver: Option<&'a str>,
        pub group: Option<u32>,
    }

    impl<'a> Dev<'a> {
        pub fn nvme(bdf: &'a str, driver: Option<&'a str>, group: Option<u32>) -> Self {
            Self {
                bdf,
                class: 0x010802,
                vendor: 0x1b36,
                device: 0x0010,
                driver,
                group,
            }
        }

        /// QEMU's UFS host controller (1b36:0013, class 0x010901).
        pub fn ufs(bdf: &'a str, driver: Option<&'a str>, group: Option<u32>) -> Self {
            Self {
                bdf,
                class: 0x010901,
                vendor: 0x1b36,
                device: 0x0013,
                driver,
                group,
            }
        }
    }

    impl FakeSys {
        pub fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let base = std::env::temp_dir().join(format!(
                "mcqio-vfio-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&base);
            let roots = SysRoots::under(&base);
            for d in [
                roots.sys.join("bus/pci/devices"),
                roots.sys.join("bus/pci/drivers"),
                roots.sys.join("kernel/iommu_groups"),
                roots.sys.join("devices/pci0000:00"),
                roots.sys.join("block"),
                roots.proc.clone(),
                roots.dev.clone(),
            ] {
                fs::create_dir_all(d).unwrap();
            }
            fs::write(roots.sys.join("bus/pci/drivers_probe"), "").unwrap();
            fs::write(roots.proc.join("mounts"), "").unwrap();
            Self { base, roots }
        }

        /// Create `<sys>/bus/pci/drivers/<name>` with empty bind/unbind files.
        pub fn driver(&self, name: &str) {
            let d = self.roots.pci_driver_dir(name);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("bind"), "").unwrap();
            fs::write(d.join("unbind"), "").unwrap();
        }

        pub fn add(&self, dev: Dev<'_>) -> PathBuf {
            let real = self.roots.sys.join("devices/pci0000:00").join(dev.bdf);
            fs::create_dir_all(&real).unwrap();
            fs::write(real.join("vendor"), format!("{:#06x}\n", dev.vendor)).unwrap();
            fs::write(real.join("device"), format!("{:#06x}\n", dev.device)).unwrap();
            fs::write(real.join("class"), format!("{:#08x}\n", dev.class)).unwrap();
            fs::write(real.join("driver_override"), "(null)\n").unwrap();
            symlink(&real, self.roots.sys.join("bus/pci/devices").join(dev.bdf)).unwrap();
            if let Some(drv) = dev.driver {
                self.driver(drv);
                symlink(self.roots.pci_driver_dir(drv), real.join("driver")).unwrap();
            }
            if let Some(g) = dev.group {
                let gdir = self
                    .roots
                    .sys
                    .join("kernel/iommu_groups")
                    .join(g.to_string());
                fs::create_dir_all(gdir.join("devices")).unwrap();
                symlink(&real, gdir.join("devices").join(dev.bdf)).unwrap();
                symlink(&gdir, real.join("iommu_group")).unwrap();
            }
            real
        }

        /// Give a device bound to `nvme` a kernel controller and namespaces
        /// (`nvme<ctrl>n1..`), each with `dev` numbers `259:<minor>`.
        pub fn nvme_namespaces(&self, bdf: &str, ctrl: u32, namespaces: &[&str]) {
            let real = self.roots.sys.join("devices/pci0000:00").join(bdf);
            let cdir = real.join("nvme").join(format!("nvme{ctrl}"));
            fs::create_dir_all(&cdir).unwrap();
            for (i, ns) in namespaces.iter().enumerate() {
                let nsdir = cdir.join(ns);
                fs::create_dir_all(nsdir.join("holders")).unwrap();
                fs::write(nsdir.join("dev"), format!("259:{}\n", i * 8)).unwrap();
                symlink(&nsdir, self.roots.sys.join("block").join(ns)).unwrap();
            }
        }

        pub fn write(&self, rel: &str, content: &str) {
            let p = self.base.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }

        pub fn read(&self, rel: &str) -> String {
            fs::read_to_string(self.base.join(rel)).unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Dev, FakeSys};
    use super::*;

    #[test]
    fn parses_and_prints_addresses() {
        let a = PciAddress::parse("0000:00:03.0").unwrap();
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0, 3, 0));
        assert_eq!(a.to_string(), "0000:00:03.0");
        assert_eq!(
            PciAddress::parse("3b:00.1").unwrap().to_string(),
            "0000:3b:00.1"
        );
        // VMD domains have five digits.
        assert_eq!(
            "10000:e1:00.0".parse::<PciAddress>().unwrap().to_string(),
            "10000:e1:00.0"
        );
        for bad in [
            "",
            "0000:00:03",
            "0000:00:20.0",
            "0000:00:03.8",
            "../../etc:00:03.0",
            "0000:000:03.0",
            "0000:00:03.0.1",
            "zz:00.0",
        ] {
            let e = PciAddress::parse(bad).unwrap_err();
            assert!(matches!(e, VfioError::InvalidAddress { .. }), "{bad}");
        }
    }

    #[test]
    fn reads_a_device_and_its_group() {
        let fs = FakeSys::new();
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), Some(5)));
        fs.add(Dev {
            bdf: "0000:00:03.1",
            class: 0x020000,
            vendor: 0x8086,
            device: 0x10d3,
            driver: Some("e1000e"),
            group: Some(5),
        });
        fs.add(Dev {
            bdf: "0000:00:02.0",
            class: 0x060400,
            vendor: 0x8086,
            device: 0x1234,
            driver: Some("pcieport"),
            group: Some(5),
        });
        let a = PciAddress::parse("0000:00:03.0").unwrap();
        let d = PciDevice::read(&fs.roots, &a).unwrap();
        assert_eq!(d.vendor, 0x1b36);
        assert_eq!(d.device, 0x0010);
        assert!(d.is_nvme());
        assert_eq!(d.driver.as_deref(), Some("nvme"));
        assert_eq!(d.iommu_group, Some(5));
        let members = group_members(&fs.roots, 5).unwrap();
        assert_eq!(members.len(), 3);
        // The bridge does not block; the NIC does.
        let b = group_blockers(&fs.roots, &d).unwrap();
        assert_eq!(
            b,
            vec![GroupBlocker {
                bdf: "0000:00:03.1".into(),
                driver: "e1000e".into()
            }]
        );
        assert_eq!(pci_devices(&fs.roots).unwrap().len(), 3);
    }

    /// Issue 13 item 6: NVMe and UFS are told apart by class code only.
    #[test]
    fn transport_comes_from_the_class_code() {
        let fs = FakeSys::new();
        fs.add(Dev::nvme("0000:00:03.0", None, None));
        fs.add(Dev::ufs("0000:00:04.0", Some("ufshcd"), Some(4)));
        fs.add(Dev {
            class: 0x010601, // SATA AHCI: storage, but neither
            ..Dev::nvme("0000:00:05.0", None, None)
        });
        let t = |b: &str| transport_of(&fs.roots, &PciAddress::parse(b).unwrap()).unwrap();
        assert_eq!(t("0000:00:03.0"), Some(Transport::Nvme));
        assert_eq!(t("0000:00:04.0"), Some(Transport::Ufs));
        assert_eq!(t("0000:00:05.0"), None);
        assert!(matches!(
            transport_of(&fs.roots, &PciAddress::parse("0000:00:09.0").unwrap()),
            Err(VfioError::NoSuchDevice { .. })
        ));
        assert_eq!(Transport::Ufs.kernel_driver(), "ufshcd");
        assert_eq!(Transport::from_class(0x010802), Some(Transport::Nvme));
        assert_eq!(Transport::from_class(0x010901), Some(Transport::Ufs));
    }

    #[test]
    fn missing_device_is_typed() {
        let fs = FakeSys::new();
        let a = PciAddress::parse("0000:09:00.0").unwrap();
        match PciDevice::read(&fs.roots, &a).unwrap_err() {
            VfioError::NoSuchDevice { path, .. } => {
                assert!(path.ends_with("bus/pci/devices/0000:09:00.0"))
            }
            e => panic!("{e}"),
        }
    }
}
