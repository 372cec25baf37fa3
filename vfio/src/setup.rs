//! Listing NVMe controllers and UFS host controllers and moving them between
//! the kernel's driver (`nvme`, `ufshcd-pci`) and `vfio-pci`: the library
//! side of `mcqio-perf devices`, `bind` and `unbind`. Which of the two a PCI
//! function is comes from its class code alone
//! ([`crate::sysfs::transport_of`]).
//!
//! Binding uses the kernel's `driver_override` mechanism: write `vfio-pci` to
//! the device's `driver_override`, unbind it from its current driver, and ask
//! the bus to probe it again (`drivers_probe`), which now only matches
//! `vfio-pci`. Unbinding clears the override and probes again, so the
//! ordinary driver (`nvme`) takes it back and its namespaces reappear.
//!
//! Both refuse, unless forced, while the controller is in use: a namespace or
//! partition mounted, used as swap, held by device-mapper/md, or open by a
//! process (`bind`); the VFIO group open by a process (`unbind`, whose sysfs
//! write would otherwise block until that process lets go).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{GroupBlocker, Result, VfioError};
use crate::sysfs::{
    group_blockers, group_members, is_vfio_driver, pci_devices, read_attr, PciAddress, PciDevice,
    SysRoots, Transport, NVME_DRIVER, VFIO_PCI_DRIVER,
};

/// How long [`bind`]/[`unbind`] wait for the new driver to show up in sysfs
/// and for `/dev/vfio/<group>` to appear (probing is synchronous for
/// `drivers_probe`, but a driver may defer it, and udev may still be
/// creating or changing the node).
const SETTLE_WAIT: Duration = Duration::from_secs(3);
/// Poll interval while waiting.
const SETTLE_POLL: Duration = Duration::from_millis(10);

/// Poll `done` until it holds or `limit` has passed; returns its last value.
fn settle(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let mut waited = Duration::ZERO;
    loop {
        if done() {
            return true;
        }
        if waited >= limit {
            return false;
        }
        std::thread::sleep(SETTLE_POLL);
        waited += SETTLE_POLL;
    }
}

/// An NVMe controller as `mcqio-perf devices` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeController {
    /// The PCI function (address, ids, class, driver, IOMMU group).
    pub pci: PciDevice,
    /// NVMe or UFS (from the class code); `None` for another device read
    /// by address.
    pub transport: Option<Transport>,
    /// NUMA node of the device, if the platform reports one.
    pub numa_node: Option<u32>,
    /// Other devices in the same IOMMU group.
    pub group_peers: Vec<PciAddress>,
    /// Peers that keep the group from being viable.
    pub blockers: Vec<GroupBlocker>,
    /// Kernel controller names while bound to `nvme` (`nvme0`).
    pub kernel_names: Vec<String>,
    /// Block devices of its namespaces while bound to `nvme` (`nvme0n1`).
    pub namespaces: Vec<String>,
    /// Why taking it from its current user would hurt (mounts, swap,
    /// holders, open handles); empty when idle.
    pub in_use: Vec<String>,
}

impl NvmeController {
    /// Whether VFIO can use it as far as the IOMMU is concerned: it has a
    /// group and nothing else in the group blocks it.
    pub fn group_viable(&self) -> bool {
        self.pci.iommu_group.is_some() && self.blockers.is_empty()
    }

    /// Read one controller (NVMe or not) and everything known about its use.
    pub fn read(roots: &SysRoots, bdf: &PciAddress) -> Result<Self> {
        let pci = PciDevice::read(roots, bdf)?;
        let numa_node = read_attr(&pci.path.join("numa_node"))
            .ok()
            .flatten()
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        let (group_peers, blockers) = match pci.iommu_group {
            Some(g) => (
                group_members(roots, g)?
                    .into_iter()
                    .map(|m| m.bdf)
                    .filter(|b| b != bdf)
                    .collect(),
                group_blockers(roots, &pci)?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        let (kernel_names, namespaces) = kernel_block_devices(&pci.path);
        let mut in_use = block_usage(roots, &namespaces);
        if pci.is_vfio() {
            if let Some(g) = pci.iommu_group {
                let node = format!("/dev/vfio/{g}");
                in_use.extend(
                    open_by(roots, |t| t == node)
                        .into_iter()
                        .map(|(pid, comm, path)| format!("pid {pid} ({comm}) has {path} open")),
                );
            }
        }
        Ok(Self {
            transport: pci.transport(),
            pci,
            numa_node,
            group_peers,
            blockers,
            kernel_names,
            namespaces,
            in_use,
        })
    }
}

/// Every NVMe controller (PCI class 0x0108xx) and UFS host controller
/// (0x0109xx), sorted by address.
///
/// Works without root as far as sysfs and procfs let it (open handles of
/// other users' processes are then invisible).
pub fn devices(roots: &SysRoots) -> Result<Vec<NvmeController>> {
    pci_devices(roots)?
        .into_iter()
        .filter(|d| d.transport().is_some())
        .map(|d| NvmeController::read(roots, &d.bdf))
        .collect()
}

/// The kernel controller names and namespace block devices of a device
/// bound to `nvme`, from `<dev>/nvme/<ctrl>/`.
///
/// With native multipath the per-path nodes are `nvme<S>c<C>n<N>` and the
/// block device is `nvme<S>n<N>`.
fn kernel_block_devices(dev: &Path) -> (Vec<String>, Vec<String>) {
    let mut ctrls = Vec::new();
    let mut ns = BTreeSet::new();
    let Ok(rd) = fs::read_dir(dev.join("nvme")) else {
        return (ctrls, Vec::new());
    };
    for c in rd.flatten() {
        let cname = c.file_name().to_string_lossy().into_owned();
        if let Ok(inner) = fs::read_dir(c.path()) {
            for e in inner.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if let Some(block) = namespace_block_name(&n) {
                    ns.insert(block);
                }
            }
        }
        ctrls.push(cname);
    }
    ctrls.sort();
    (ctrls, ns.into_iter().collect())
}

/// `nvme0n1` → `nvme0n1`; `nvme0c1n2` → `nvme0n2`; anything else → None.
fn namespace_block_name(n: &str) -> Option<String> {
    let rest = n.strip_prefix("nvme")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (head, nsid) = rest.split_once('n')?;
    if !digits(nsid) {
        return None;
    }
    let subsys = match head.split_once('c') {
        Some((s, c)) if digits(s) && digits(c) => s,
        None if digits(head) => head,
        _ => return None,
    };
    Some(format!("nvme{subsys}n{nsid}"))
}

/// The block devices of `namespaces` and their partitions, with dev numbers.
fn block_nodes(roots: &SysRoots, namespaces: &[String]) -> Vec<(String, Option<String>, PathBuf)> {
    let mut out = Vec::new();
    for ns in namespaces {
        let dir = roots.sys.join("block").join(ns);
        let devno = |d: &Path| read_attr(&d.join("dev")).ok().flatten();
        out.push((ns.clone(), devno(&dir), dir.clone()));
        if let Ok(rd) = fs::read_dir(&dir) {
            let mut parts: Vec<_> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(ns.as_str()) && n.len() > ns.len())
                .collect();
            parts.sort();
            for p in parts {
                let pd = dir.join(&p);
                out.push((p, devno(&pd), pd));
            }
        }
    }
    out
}

/// Why the namespaces are in use: mounts, swap, holders, open handles.
fn block_usage(roots: &SysRoots, namespaces: &[String]) -> Vec<String> {
    let nodes = block_nodes(roots, namespaces);
    if nodes.is_empty() {
        return Vec::new();
    }
    let mut why = BTreeSet::new();
    let by_name = |dev: &str| -> Option<&str> {
        let base = dev.strip_prefix("/dev/")?;
        nodes
            .iter()
            .find(|(n, _, _)| n == base)
            .map(|(n, _, _)| n.as_str())
    };
    if let Ok(m) = fs::read_to_string(roots.proc.join("mounts")) {
        for line in m.lines() {
            let mut f = line.split_whitespace();
            if let (Some(dev), Some(mp)) = (f.next(), f.next()) {
                if let Some(n) = by_name(dev) {
                    why.insert(format!("{n} is mounted on {}", unescape_mount(mp)));
                }
            }
        }
    }
    // mountinfo names the device by number, which also catches mounts made
    // through another name (a /dev/disk/by-* link).
    if let Ok(m) = fs::read_to_string(roots.proc.join("self/mountinfo")) {
        for line in m.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 4 {
                if let Some((n, _, _)) = nodes.iter().find(|(_, d, _)| d.as_deref() == Some(f[2])) {
                    why.insert(format!("{n} is mounted on {}", unescape_mount(f[4])));
                }
            }
        }
    }
    if let Ok(s) = fs::read_to_string(roots.proc.join("swaps")) {
        for line in s.lines().skip(1) {
            if let Some(n) = line.split_whitespace().next().and_then(by_name) {
                why.insert(format!("{n} is used as swap"));
            }
        }
    }
    for (n, _, dir) in &nodes {
        if let Ok(rd) = fs::read_dir(dir.join("holders")) {
            for h in rd.flatten() {
                why.insert(format!(
                    "{n} is held by {}",
                    h.file_name().to_string_lossy()
                ));
            }
        }
    }
    let paths: Vec<String> = nodes.iter().map(|(n, _, _)| format!("/dev/{n}")).collect();
    for (pid, comm, path) in open_by(roots, |t| paths.iter().any(|p| p == t)) {
        why.insert(format!("pid {pid} ({comm}) has {path} open"));
    }
    why.into_iter().collect()
}

/// `/proc/mounts` escapes spaces and such as `\040`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (i + 3 < b.len() && b[i] == b'\\')
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Processes with an open fd whose link target matches: (pid, comm, target).
/// Only processes this user may inspect are seen.
fn open_by(roots: &SysRoots, matches: impl Fn(&str) -> bool) -> Vec<(u32, String, String)> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(&roots.proc) else {
        return out;
    };
    let me = std::process::id();
    for p in rd.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me && roots.proc == Path::new("/proc") {
            continue;
        }
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(t) = fs::read_link(fd.path()) {
                let t = t.to_string_lossy().into_owned();
                if matches(&t) {
                    let comm = read_attr(&p.path().join("comm"))
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| "?".into());
                    out.push((pid, comm, t));
                    break;
                }
            }
        }
    }
    out
}

/// Options of [`bind`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindOptions {
    /// Bind even if the kernel is using the controller (mounted, swap,
    /// held, open), or if it is not an NVMe controller.
    pub force: bool,
    /// Give this user (login name or numeric uid) `/dev/vfio/<group>`, and
    /// the device's cdev `/dev/vfio/devices/vfioN` where the kernel has one
    /// (iommufd; `/dev/iommu` itself is shared by every device and is left
    /// to the administrator, as `mcqio-perf doctor` says).
    pub user: Option<String>,
}

/// What [`bind`] or [`unbind`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOutcome {
    /// The controller.
    pub bdf: PciAddress,
    /// Driver before.
    pub previous_driver: Option<String>,
    /// Driver now.
    pub driver: Option<String>,
    /// Whether anything changed (false: it already had that driver).
    pub changed: bool,
    /// The IOMMU group.
    pub group: Option<u32>,
    /// `/dev/vfio/<group>`, after a bind.
    pub group_node: Option<PathBuf>,
    /// The device's VFIO cdev (`/dev/vfio/devices/vfioN`), after a bind on
    /// a kernel with `CONFIG_VFIO_DEVICE_CDEV` (the iommufd path).
    pub cdev_node: Option<PathBuf>,
    /// The uid the group node (and the cdev) was given to (`--user`).
    pub granted_uid: Option<u32>,
    /// Group peers that still keep the group from being viable: VFIO will
    /// refuse to open it until they are unbound or bound to vfio-pci too.
    pub blockers: Vec<GroupBlocker>,
    /// What used the controller when `force` overrode the refusal.
    pub forced_over: Vec<String>,
}

fn write_attr(bdf: &str, path: &Path, value: &str) -> Result<()> {
    log::debug!("{bdf}: write {:?} to {}", value, path.display());
    // Truncation is ignored by sysfs (every write is a whole new value) and
    // makes a fake tree in a test behave the same way.
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| VfioError::Sysfs {
            bdf: bdf.to_string(),
            op: "write",
            path: path.to_path_buf(),
            source,
        })
}

/// Hand the controller at `bdf` to `vfio-pci`.
///
/// Refuses ([`VfioError::InUse`]) while the kernel uses it, unless
/// `opts.force`. Idempotent: a controller already on vfio-pci is left alone
/// (but `opts.user` is still applied). Needs root.
pub fn bind(roots: &SysRoots, bdf: &str, opts: &BindOptions) -> Result<BindOutcome> {
    let addr = PciAddress::parse(bdf)?;
    let previous = start_bind(roots, &addr, opts)?;
    finish_bind(roots, &addr, opts, previous, SETTLE_WAIT)
}

/// Checks and sysfs writes of [`bind`]; returns the earlier state.
fn start_bind(
    roots: &SysRoots,
    addr: &PciAddress,
    opts: &BindOptions,
) -> Result<(Option<String>, bool, Vec<String>)> {
    let b = addr.to_string();
    let ctrl = NvmeController::read(roots, addr)?;
    let dev = &ctrl.pci;
    if ctrl.transport.is_none() && !opts.force {
        return Err(VfioError::NotNvme {
            bdf: b,
            class: dev.class,
        });
    }
    if dev.iommu_group.is_none() {
        return Err(VfioError::NoIommu {
            bdf: b,
            path: dev.path.join("iommu_group"),
        });
    }
    let vfio_dir = roots.pci_driver_dir(VFIO_PCI_DRIVER);
    if !vfio_dir.exists() {
        return Err(VfioError::DriverMissing {
            bdf: b,
            driver: VFIO_PCI_DRIVER.into(),
            module: "vfio-pci".into(),
            path: vfio_dir,
        });
    }
    if dev.is_vfio() {
        log::info!(
            "{b}: already bound to {}",
            dev.driver.as_deref().unwrap_or("")
        );
        return Ok((dev.driver.clone(), false, Vec::new()));
    }
    let mut forced_over = Vec::new();
    if !ctrl.in_use.is_empty() {
        if !opts.force {
            return Err(VfioError::InUse {
                bdf: b,
                reasons: ctrl.in_use,
            });
        }
        log::warn!("{b}: binding despite: {}", ctrl.in_use.join("; "));
        forced_over = ctrl.in_use.clone();
    }
    write_attr(&b, &dev.path.join("driver_override"), VFIO_PCI_DRIVER)?;
    if dev.driver.is_some() {
        write_attr(&b, &dev.path.join("driver/unbind"), &b)?;
    }
    write_attr(&b, &roots.sys.join("bus/pci/drivers_probe"), &b)?;
    Ok((dev.driver.clone(), true, forced_over))
}

/// Verification, group node and `--user` part of [`bind`].
fn finish_bind(
    roots: &SysRoots,
    addr: &PciAddress,
    opts: &BindOptions,
    (previous, changed, forced_over): (Option<String>, bool, Vec<String>),
    wait: Duration,
) -> Result<BindOutcome> {
    let b = addr.to_string();
    settle(wait, || {
        PciDevice::read(roots, addr).is_ok_and(|d| d.is_vfio())
    });
    let dev = PciDevice::read(roots, addr)?;
    if !dev.is_vfio() {
        return Err(VfioError::RebindFailed {
            bdf: b,
            expected: VFIO_PCI_DRIVER.into(),
            actual: dev.driver,
        });
    }
    let group = dev.iommu_group;
    let node = group.map(|g| roots.vfio_group_node(g));
    let cdev_node =
        crate::iommufd::cdev_name(&dev).map(|n| crate::iommufd::vfio_cdev_node(roots, &n));
    let uid = match &opts.user {
        Some(user) => Some(lookup_uid(user).ok_or_else(|| VfioError::NoSuchUser {
            bdf: b.clone(),
            user: user.clone(),
        })?),
        None => None,
    };
    let mut granted_uid = None;
    for n in node.iter().chain(cdev_node.iter()) {
        settle(wait, || n.exists());
        if let Some(uid) = uid {
            std::os::unix::fs::chown(n, Some(uid), None).map_err(|source| VfioError::Sysfs {
                bdf: b.clone(),
                op: "chown",
                path: n.clone(),
                source,
            })?;
            log::info!("{b}: {} now belongs to uid {uid}", n.display());
            granted_uid = Some(uid);
        }
    }
    let blockers = group_blockers(roots, &dev)?;
    Ok(BindOutcome {
        bdf: *addr,
        previous_driver: previous,
        driver: dev.driver,
        changed,
        group,
        group_node: node,
        cdev_node,
        granted_uid,
        blockers,
        forced_over,
    })
}

/// A login name or numeric uid → uid.
fn lookup_uid(user: &str) -> Option<u32> {
    if let Ok(uid) = user.parse::<u32>() {
        return Some(uid);
    }
    let name = std::ffi::CString::new(user).ok()?;
    let mut pwd = std::mem::MaybeUninit::<libc::passwd>::uninit();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call: `name` is NUL-terminated,
    // `pwd` and `buf` are writable and `buf.len()` is its size; on success
    // `result` points to `pwd`.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            pwd.as_mut_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: getpwnam_r succeeded and `result` is non-null, so it filled `pwd`.
    Some(unsafe { pwd.assume_init() }.pw_uid)
}

/// Give the controller at `bdf` back to the kernel's driver for its
/// transport: `nvme`, or `ufshcd-pci` for a UFS host controller.
///
/// Refuses ([`VfioError::InUse`]) while a process has its VFIO group open
/// (the unbind would block until it closes), unless `force`. Idempotent.
/// Needs root.
pub fn unbind(roots: &SysRoots, bdf: &str, force: bool) -> Result<BindOutcome> {
    let addr = PciAddress::parse(bdf)?;
    let previous = start_unbind(roots, &addr, force)?;
    finish_unbind(roots, &addr, previous, SETTLE_WAIT)
}

fn start_unbind(
    roots: &SysRoots,
    addr: &PciAddress,
    force: bool,
) -> Result<(Option<String>, bool, Vec<String>)> {
    let b = addr.to_string();
    let ctrl = NvmeController::read(roots, addr)?;
    let dev = &ctrl.pci;
    let kernel = kernel_driver(dev);
    let nvme_dir = roots.pci_driver_dir(kernel);
    if !nvme_dir.exists() {
        return Err(VfioError::DriverMissing {
            bdf: b,
            driver: kernel.into(),
            module: kernel.replace('-', "_"),
            path: nvme_dir,
        });
    }
    if dev.driver.as_deref() == Some(kernel) {
        log::info!("{b}: already bound to {kernel}");
        return Ok((dev.driver.clone(), false, Vec::new()));
    }
    let mut forced_over = Vec::new();
    if dev.driver.as_deref().is_some_and(is_vfio_driver) && !ctrl.in_use.is_empty() {
        if !force {
            return Err(VfioError::InUse {
                bdf: b,
                reasons: ctrl.in_use,
            });
        }
        forced_over = ctrl.in_use.clone();
    }
    // An empty line clears the override.
    write_attr(&b, &dev.path.join("driver_override"), "\n")?;
    if dev.driver.is_some() {
        write_attr(&b, &dev.path.join("driver/unbind"), &b)?;
    }
    write_attr(&b, &roots.sys.join("bus/pci/drivers_probe"), &b)?;
    Ok((dev.driver.clone(), true, forced_over))
}

fn finish_unbind(
    roots: &SysRoots,
    addr: &PciAddress,
    (previous, changed, forced_over): (Option<String>, bool, Vec<String>),
    wait: Duration,
) -> Result<BindOutcome> {
    settle(wait, || {
        PciDevice::read(roots, addr).is_ok_and(|d| d.driver.as_deref() == Some(kernel_driver(&d)))
    });
    let dev = PciDevice::read(roots, addr)?;
    let kernel = kernel_driver(&dev);
    if dev.driver.as_deref() != Some(kernel) {
        return Err(VfioError::RebindFailed {
            bdf: addr.to_string(),
            expected: kernel.into(),
            actual: dev.driver,
        });
    }
    Ok(BindOutcome {
        bdf: *addr,
        previous_driver: previous,
        driver: dev.driver,
        changed,
        group: dev.iommu_group,
        group_node: None,
        cdev_node: None,
        granted_uid: None,
        blockers: Vec::new(),
        forced_over,
    })
}

/// The kernel driver `unbind` hands a device back to (`nvme` for a
/// device of another class bound with `--force`).
fn kernel_driver(dev: &PciDevice) -> &'static str {
    dev.transport()
        .map_or(NVME_DRIVER, Transport::kernel_driver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::{Dev, FakeSys};
    use std::os::unix::fs::symlink;

    /// What the kernel does after a successful probe: re-point `driver`.
    fn kernel_rebinds(fs: &FakeSys, bdf: &str, driver: &str) {
        let link = fs
            .roots
            .sys
            .join("devices/pci0000:00")
            .join(bdf)
            .join("driver");
        let _ = std::fs::remove_file(&link);
        fs.driver(driver);
        symlink(fs.roots.pci_driver_dir(driver), link).unwrap();
    }

    fn two_controllers() -> FakeSys {
        let fs = FakeSys::new();
        fs.driver("vfio-pci");
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), Some(3)));
        fs.nvme_namespaces("0000:00:03.0", 0, &["nvme0n1"]);
        fs.add(Dev {
            device: 0xa80a,
            vendor: 0x144d,
            ..Dev::nvme("0000:01:00.0", Some("vfio-pci"), Some(7))
        });
        fs.add(Dev {
            bdf: "0000:01:00.1",
            class: 0x020000,
            vendor: 0x8086,
            device: 0x1533,
            driver: Some("igb"),
            group: Some(7),
        });
        // Not NVMe: must not be listed.
        fs.add(Dev {
            bdf: "0000:00:02.0",
            class: 0x030000,
            vendor: 0x1234,
            device: 0x1111,
            driver: None,
            group: Some(2),
        });
        fs
    }

    #[test]
    fn lists_nvme_controllers_with_groups_and_blockers() {
        let fs = two_controllers();
        fs.write(
            "proc/mounts",
            "/dev/nvme0n1p2 /mnt/my\\040data ext4 rw 0 0\nproc /proc proc rw 0 0\n",
        );
        std::fs::create_dir_all(fs.roots.sys.join("block/nvme0n1/nvme0n1p2/holders")).unwrap();
        fs.write("sys/block/nvme0n1/nvme0n1p2/dev", "259:2\n");
        let list = devices(&fs.roots).unwrap();
        assert_eq!(list.len(), 2);
        let a = &list[0];
        assert_eq!(a.pci.bdf.to_string(), "0000:00:03.0");
        assert_eq!(a.pci.driver.as_deref(), Some("nvme"));
        assert_eq!(a.pci.iommu_group, Some(3));
        assert!(a.group_viable());
        assert_eq!(a.kernel_names, ["nvme0"]);
        assert_eq!(a.namespaces, ["nvme0n1"]);
        assert_eq!(a.in_use, ["nvme0n1p2 is mounted on /mnt/my data"]);
        let b = &list[1];
        assert_eq!((b.pci.vendor, b.pci.device), (0x144d, 0xa80a));
        assert_eq!(b.pci.iommu_group, Some(7));
        assert!(!b.group_viable());
        assert_eq!(b.group_peers.len(), 1);
        assert_eq!(b.blockers[0].to_string(), "0000:01:00.1 (bound to igb)");
        assert!(b.in_use.is_empty());
    }

    #[test]
    fn detects_holders_swap_and_open_handles() {
        let fs = two_controllers();
        std::fs::create_dir_all(fs.roots.sys.join("block/nvme0n1/holders/dm-0")).unwrap();
        fs.write(
            "proc/swaps",
            "Filename Type Size Used Priority\n/dev/nvme0n1 partition 1 0 -2\n",
        );
        fs.write("proc/4242/comm", "fio\n");
        std::fs::create_dir_all(fs.roots.proc.join("4242/fd")).unwrap();
        symlink("/dev/nvme0n1", fs.roots.proc.join("4242/fd/5")).unwrap();
        fs.write(
            "proc/self/mountinfo",
            "22 1 259:0 / /srv rw - xfs /dev/disk/by-label/x rw\n",
        );
        let c = NvmeController::read(&fs.roots, &"0000:00:03.0".parse().unwrap()).unwrap();
        assert_eq!(
            c.in_use,
            [
                "nvme0n1 is held by dm-0",
                "nvme0n1 is mounted on /srv",
                "nvme0n1 is used as swap",
                "pid 4242 (fio) has /dev/nvme0n1 open",
            ]
        );
    }

    #[test]
    fn bind_writes_override_unbind_and_probe() {
        let fs = two_controllers();
        let addr: PciAddress = "0000:00:03.0".parse().unwrap();
        let opts = BindOptions {
            force: false,
            user: Some(effective_uid().to_string()),
        };
        let state = start_bind(&fs.roots, &addr, &opts).unwrap();
        let dev = "sys/devices/pci0000:00/0000:00:03.0";
        assert_eq!(fs.read(&format!("{dev}/driver_override")), "vfio-pci");
        assert_eq!(fs.read("sys/bus/pci/drivers/nvme/unbind"), "0000:00:03.0");
        assert_eq!(fs.read("sys/bus/pci/drivers_probe"), "0000:00:03.0");
        assert_eq!(fs.read("sys/bus/pci/drivers/vfio-pci/bind"), "");
        // The kernel did not move it (in this fake): the whole call says so.
        let e = finish_bind(&fs.roots, &addr, &opts, state.clone(), Duration::ZERO).unwrap_err();
        assert!(
            matches!(e, VfioError::RebindFailed { ref actual, .. } if actual.as_deref() == Some("nvme")),
            "{e}"
        );
        assert!(e.to_string().contains("dmesg"), "{e}");
        // Now as the kernel would: vfio-pci probed it and made the node.
        kernel_rebinds(&fs, "0000:00:03.0", "vfio-pci");
        fs.write("dev/vfio/3", "");
        let out = finish_bind(&fs.roots, &addr, &opts, state, Duration::ZERO).unwrap();
        assert_eq!(out.previous_driver.as_deref(), Some("nvme"));
        assert_eq!(out.driver.as_deref(), Some("vfio-pci"));
        assert!(out.changed);
        assert_eq!(out.group, Some(3));
        assert_eq!(out.group_node, Some(fs.roots.vfio_group_node(3)));
        assert_eq!(out.granted_uid, Some(effective_uid()));
        assert_eq!(out.cdev_node, None);
        assert!(out.blockers.is_empty());
        // On a kernel with VFIO device cdevs the cdev is granted too.
        fs.write(&format!("{dev}/vfio-dev/vfio0/dev"), "");
        fs.write("dev/vfio/devices/vfio0", "");
        let out = bind(&fs.roots, "0000:00:03.0", &opts).unwrap();
        assert_eq!(out.cdev_node, Some(fs.roots.dev.join("vfio/devices/vfio0")));
        assert_eq!(out.granted_uid, Some(effective_uid()));
        // Binding again changes nothing.
        let again = bind(&fs.roots, "0000:00:03.0", &BindOptions::default()).unwrap();
        assert!(!again.changed);
    }

    fn effective_uid() -> u32 {
        // The owner of a file we just created is our effective uid.
        use std::os::unix::fs::MetadataExt;
        let p = std::env::temp_dir().join(format!("mcqio-uid-{}", std::process::id()));
        std::fs::write(&p, "").unwrap();
        let uid = std::fs::metadata(&p).unwrap().uid();
        let _ = std::fs::remove_file(p);
        uid
    }

    #[test]
    fn bind_refuses_when_mounted_unless_forced() {
        let fs = two_controllers();
        fs.write("proc/mounts", "/dev/nvme0n1 / ext4 rw 0 0\n");
        let e = bind(&fs.roots, "0000:00:03.0", &BindOptions::default()).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, VfioError::InUse { .. }), "{m}");
        assert!(m.contains("nvme0n1 is mounted on /"), "{m}");
        assert!(m.contains("--force"), "{m}");
        // Nothing was written.
        let dev = "sys/devices/pci0000:00/0000:00:03.0";
        assert_eq!(fs.read(&format!("{dev}/driver_override")), "(null)\n");
        assert_eq!(fs.read("sys/bus/pci/drivers/nvme/unbind"), "");
        assert_eq!(fs.read("sys/bus/pci/drivers_probe"), "");
        // --force goes ahead and records what it overrode.
        let forced = BindOptions {
            force: true,
            user: None,
        };
        let (_, changed, over) =
            start_bind(&fs.roots, &"0000:00:03.0".parse().unwrap(), &forced).unwrap();
        assert!(changed);
        assert_eq!(over, ["nvme0n1 is mounted on /"]);
        assert_eq!(fs.read("sys/bus/pci/drivers/nvme/unbind"), "0000:00:03.0");
    }

    #[test]
    fn bind_needs_vfio_pci_and_an_iommu() {
        let fs = FakeSys::new();
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), Some(3)));
        fs.add(Dev::nvme("0000:00:04.0", Some("nvme"), None));
        let e = bind(&fs.roots, "0000:00:03.0", &BindOptions::default()).unwrap_err();
        assert!(e.to_string().contains("modprobe vfio-pci"), "{e}");
        let e = bind(&fs.roots, "0000:00:04.0", &BindOptions::default()).unwrap_err();
        assert!(matches!(e, VfioError::NoIommu { .. }), "{e}");
        let e = bind(&fs.roots, "0000:00:05.0", &BindOptions::default()).unwrap_err();
        assert!(matches!(e, VfioError::NoSuchDevice { .. }), "{e}");
    }

    /// Issue 13 item 6: UFS host controllers are listed with their
    /// transport, bound to vfio-pci, and given back to `ufshcd` (the PCI driver that module `ufshcd-pci` registers).
    #[test]
    fn ufs_host_controllers_are_listed_bound_and_unbound() {
        let fs = two_controllers();
        fs.add(Dev::ufs("0000:00:05.0", Some("ufshcd"), Some(5)));
        let list = devices(&fs.roots).unwrap();
        let t: Vec<(String, Option<Transport>)> = list
            .iter()
            .map(|c| (c.pci.bdf.to_string(), c.transport))
            .collect();
        assert_eq!(
            t,
            [
                ("0000:00:03.0".to_string(), Some(Transport::Nvme)),
                ("0000:00:05.0".to_string(), Some(Transport::Ufs)),
                ("0000:01:00.0".to_string(), Some(Transport::Nvme)),
            ]
        );
        let addr: PciAddress = "0000:00:05.0".parse().unwrap();
        let state = start_bind(&fs.roots, &addr, &BindOptions::default()).unwrap();
        assert_eq!(fs.read("sys/bus/pci/drivers/ufshcd/unbind"), "0000:00:05.0");
        kernel_rebinds(&fs, "0000:00:05.0", "vfio-pci");
        fs.write("dev/vfio/5", "");
        let out = finish_bind(
            &fs.roots,
            &addr,
            &BindOptions::default(),
            state,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(out.previous_driver.as_deref(), Some("ufshcd"));
        // Back: the kernel's UFS driver, not nvme (which is not even loaded).
        let state = start_unbind(&fs.roots, &addr, false).unwrap();
        assert!(matches!(
            finish_unbind(&fs.roots, &addr, state.clone(), Duration::ZERO),
            Err(VfioError::RebindFailed { ref expected, .. }) if expected == "ufshcd"
        ));
        kernel_rebinds(&fs, "0000:00:05.0", "ufshcd");
        let out = finish_unbind(&fs.roots, &addr, state, Duration::ZERO).unwrap();
        assert_eq!(out.driver.as_deref(), Some("ufshcd"));
    }

    #[test]
    fn unbind_clears_override_and_reprobes() {
        let fs = two_controllers();
        fs.driver("nvme");
        let addr: PciAddress = "0000:01:00.0".parse().unwrap();
        let dev = "sys/devices/pci0000:00/0000:01:00.0";
        fs.write(&format!("{dev}/driver_override"), "vfio-pci\n");
        let state = start_unbind(&fs.roots, &addr, false).unwrap();
        assert_eq!(fs.read(&format!("{dev}/driver_override")), "\n");
        assert_eq!(
            fs.read("sys/bus/pci/drivers/vfio-pci/unbind"),
            "0000:01:00.0"
        );
        assert_eq!(fs.read("sys/bus/pci/drivers_probe"), "0000:01:00.0");
        assert!(matches!(
            finish_unbind(&fs.roots, &addr, state.clone(), Duration::ZERO),
            Err(VfioError::RebindFailed { .. })
        ));
        kernel_rebinds(&fs, "0000:01:00.0", "nvme");
        let out = finish_unbind(&fs.roots, &addr, state, Duration::ZERO).unwrap();
        assert_eq!(out.previous_driver.as_deref(), Some("vfio-pci"));
        assert_eq!(out.driver.as_deref(), Some("nvme"));
        assert!(!unbind(&fs.roots, "0000:01:00.0", false).unwrap().changed);
    }

    #[test]
    fn unbind_refuses_while_the_group_is_open() {
        let fs = two_controllers();
        fs.driver("nvme");
        fs.write("proc/77/comm", "mcqio-perf\n");
        std::fs::create_dir_all(fs.roots.proc.join("77/fd")).unwrap();
        symlink("/dev/vfio/7", fs.roots.proc.join("77/fd/9")).unwrap();
        let e = unbind(&fs.roots, "0000:01:00.0", false).unwrap_err();
        assert!(
            e.to_string()
                .contains("pid 77 (mcqio-perf) has /dev/vfio/7 open"),
            "{e}"
        );
        assert_eq!(fs.read("sys/bus/pci/drivers_probe"), "");
    }

    #[test]
    fn namespace_names() {
        assert_eq!(namespace_block_name("nvme0n1").as_deref(), Some("nvme0n1"));
        assert_eq!(
            namespace_block_name("nvme2c3n4").as_deref(),
            Some("nvme2n4")
        );
        for bad in ["nvme0", "power", "nvme0n", "nvmexn1", "nvme0c1", "ng0n1"] {
            assert_eq!(namespace_block_name(bad), None, "{bad}");
        }
    }
}
