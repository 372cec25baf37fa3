//! `doctor`: every precondition of a VFIO run, checked and explained.
//!
//! The checks are data ([`Check`]: name, status, what was found, a one-line
//! fix), so `mcqio-perf doctor` and applications print the same diagnosis.
//! A report [`passes`](DoctorReport::passed) when no check failed: then a run
//! on that device would open it (warnings cost performance, not function).

use std::fmt;
use std::fs;
use std::path::Path;

use crate::attach::{offered, IommuChoice};
use crate::error::fmt_bytes;
use crate::iommufd::iommufd_node;
use crate::memlock::{memlock_needed, MemlockStatus};
use crate::setup::NvmeController;
use crate::sysfs::{can_read_write, PciAddress, SysRoots, VFIO_PCI_DRIVER};
use crate::HUGE_PAGE_SIZE;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckStatus {
    /// Fine.
    Pass,
    /// For information; never affects the verdict.
    Info,
    /// Works, but slower or more fragile than it could be.
    Warn,
    /// A run would fail.
    Fail,
}

impl fmt::Display for CheckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckStatus::Pass => "PASS",
            CheckStatus::Info => "INFO",
            CheckStatus::Warn => "WARN",
            CheckStatus::Fail => "FAIL",
        })
    }
}

/// One diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Short name (`iommu`, `memlock`).
    pub name: &'static str,
    /// Verdict.
    pub status: CheckStatus,
    /// What was found.
    pub detail: String,
    /// One line that fixes it, when not passing.
    pub fix: Option<String>,
}

impl Check {
    fn new(name: &'static str, status: CheckStatus, detail: impl Into<String>) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// What to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorOptions {
    /// Where `/sys`, `/proc`, `/dev` are.
    pub roots: SysRoots,
    /// The controller to check (system checks only if `None`).
    pub bdf: Option<String>,
    /// DMA memory the planned run maps (queues, PRP lists, buffers), for the
    /// memlock and huge page checks.
    pub dma_budget: u64,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        Self {
            roots: SysRoots::default(),
            bdf: None,
            dma_budget: crate::DEFAULT_DMA_BUDGET,
        }
    }
}

/// All checks of one `doctor` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorReport {
    /// The controller checked, if any.
    pub bdf: Option<String>,
    /// The checks, in the order they were made.
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// True when no check failed: a run would work.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != CheckStatus::Fail)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == CheckStatus::Fail)
    }

    /// The check named `name`, if it was made.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            writeln!(f, "[{}] {:<16} {}", c.status, c.name, c.detail)?;
            if let Some(fix) = &c.fix {
                writeln!(f, "       {:<16} fix: {fix}", "")?;
            }
        }
        let verdict = if self.passed() {
            "ready: a run would work"
        } else {
            "not ready: fix the FAIL lines above"
        };
        match &self.bdf {
            Some(b) => write!(f, "{b}: {verdict}"),
            None => write!(f, "{verdict}"),
        }
    }
}

/// Run every check. Never panics; unreadable files count as missing.
pub fn doctor(opts: &DoctorOptions) -> DoctorReport {
    let r = &opts.roots;
    let mut checks = vec![
        check_vfio(r),
        check_vfio_pci(r),
        check_type1(r),
        check_iommu(r),
    ];
    if let Some(bdf) = &opts.bdf {
        checks.extend(check_device(r, bdf));
    }
    checks.push(check_memlock(r, opts.dma_budget));
    checks.push(check_huge_pages(r, opts.dma_budget));
    checks.push(check_iommufd(r));
    DoctorReport {
        bdf: opts.bdf.clone(),
        checks,
    }
}

fn non_empty_dir(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn check_vfio(r: &SysRoots) -> Check {
    let node = r.vfio_container_node();
    if node.exists() {
        Check::new(
            "vfio",
            CheckStatus::Pass,
            format!("{} present", node.display()),
        )
    } else if iommufd_node(r).exists() && r.sys.join("class/vfio-dev").exists() {
        // A kernel with neither container (CONFIG_VFIO_CONTAINER nor
        // IOMMUFD_VFIO_CONTAINER) still opens devices through iommufd.
        Check::new(
            "vfio",
            CheckStatus::Warn,
            format!(
                "{} is missing (no type1 container); devices open through iommufd and their cdevs",
                node.display()
            ),
        )
        .fix("nothing for mcqio (iommu=auto takes iommufd); CONFIG_VFIO_CONTAINER for type1")
    } else {
        Check::new(
            "vfio",
            CheckStatus::Fail,
            format!(
                "{} is missing: the VFIO module is not loaded",
                node.display()
            ),
        )
        .fix("modprobe vfio-pci   (kernel config: CONFIG_VFIO, CONFIG_VFIO_PCI)")
    }
}

fn check_vfio_pci(r: &SysRoots) -> Check {
    let d = r.pci_driver_dir(VFIO_PCI_DRIVER);
    if d.exists() {
        Check::new(
            "vfio-pci",
            CheckStatus::Pass,
            "the vfio-pci driver is registered",
        )
    } else {
        Check::new(
            "vfio-pci",
            CheckStatus::Fail,
            format!("{} is missing: vfio-pci is not loaded", d.display()),
        )
        .fix("modprobe vfio-pci")
    }
}

fn check_type1(r: &SysRoots) -> Check {
    let m = r.sys.join("module/vfio_iommu_type1");
    if m.exists() {
        let limit = fs::read_to_string(m.join("parameters/dma_entry_limit"))
            .ok()
            .map(|s| format!(" (dma_entry_limit {})", s.trim()))
            .unwrap_or_default();
        Check::new(
            "vfio_iommu_type1",
            CheckStatus::Pass,
            format!("the type1 IOMMU backend is loaded{limit}"),
        )
    } else if r.vfio_container_node().exists()
        && iommufd_node(r).exists()
        && r.sys.join("module/iommufd").exists()
    {
        // No type1 module but a container and iommufd: the container is
        // iommufd's (CONFIG_IOMMUFD_VFIO_CONTAINER), which answers type1v2.
        Check::new(
            "vfio_iommu_type1",
            CheckStatus::Info,
            "no vfio_iommu_type1: /dev/vfio/vfio is iommufd's emulation of the type1 container (CONFIG_IOMMUFD_VFIO_CONTAINER); iommu=type1 goes through it",
        )
    } else {
        Check::new(
            "vfio_iommu_type1",
            CheckStatus::Warn,
            "vfio_iommu_type1 is not listed in /sys/module (VFIO loads it on first use)",
        )
        .fix("modprobe vfio_iommu_type1")
    }
}

fn check_iommu(r: &SysRoots) -> Check {
    let units = non_empty_dir(&r.sys.join("class/iommu"));
    let groups = non_empty_dir(&r.sys.join("kernel/iommu_groups")).len();
    let noiommu = fs::read_to_string(
        r.sys
            .join("module/vfio/parameters/enable_unsafe_noiommu_mode"),
    )
    .map(|s| s.trim() == "Y")
    .unwrap_or(false);
    if !units.is_empty() && groups > 0 {
        return Check::new(
            "iommu",
            CheckStatus::Pass,
            format!("IOMMU active ({}), {groups} IOMMU groups", units.join(", ")),
        );
    }
    let tables = r.sys.join("firmware/acpi/tables");
    let dmar = tables.join("DMAR").exists();
    let ivrs = tables.join("IVRS").exists();
    let cmdline = fs::read_to_string(r.proc.join("cmdline")).unwrap_or_default();
    let mut detail =
        format!("no IOMMU is active (/sys/class/iommu is empty, {groups} IOMMU groups)");
    if noiommu {
        detail.push_str("; VFIO runs in unsafe no-IOMMU mode, which mcqio does not use");
    }
    let fix = if dmar {
        detail.push_str("; the firmware describes an Intel IOMMU (ACPI DMAR)");
        if cmdline.contains("intel_iommu=off") {
            "remove intel_iommu=off from the kernel command line and reboot"
        } else {
            "add intel_iommu=on to the kernel command line and reboot"
        }
    } else if ivrs {
        detail.push_str("; the firmware describes an AMD IOMMU (ACPI IVRS)");
        "remove amd_iommu=off / iommu=off from the kernel command line and reboot"
    } else {
        detail.push_str("; the firmware describes no IOMMU (no ACPI DMAR or IVRS table)");
        "enable VT-d / AMD-Vi (IOMMU) in the firmware setup; in a VM, give it a virtual IOMMU (QEMU: -device intel-iommu)"
    };
    Check::new("iommu", CheckStatus::Fail, detail).fix(fix)
}

fn check_device(r: &SysRoots, bdf: &str) -> Vec<Check> {
    let addr = match PciAddress::parse(bdf) {
        Ok(a) => a,
        Err(e) => {
            return vec![Check::new("device", CheckStatus::Fail, e.to_string())
                .fix("mcqio-perf devices   (lists NVMe and UFS controllers and their addresses)")]
        }
    };
    let c = match NvmeController::read(r, &addr) {
        Ok(c) => c,
        Err(e) => {
            return vec![Check::new("device", CheckStatus::Fail, e.to_string())
                .fix("mcqio-perf devices   (lists NVMe and UFS controllers and their addresses)")]
        }
    };
    let mut out = Vec::new();
    let p = &c.pci;
    let ids = format!("{:04x}:{:04x}, class {:06x}", p.vendor, p.device, p.class);
    out.push(match c.transport {
        Some(t) => Check::new(
            "device",
            CheckStatus::Pass,
            format!("{addr}: {} {ids}", t.device_noun()),
        ),
        None => Check::new(
            "device",
            CheckStatus::Fail,
            format!("{addr} is not an NVMe controller or a UFS host controller ({ids})"),
        )
        .fix("mcqio-perf devices   (lists NVMe and UFS controllers)"),
    });

    out.push(match p.driver.as_deref() {
        Some(d) if p.is_vfio() => Check::new("driver", CheckStatus::Pass, format!("bound to {d}")),
        other => {
            let mut detail = match other {
                Some(d) => format!("bound to {d}, not vfio-pci"),
                None => "bound to no driver".to_string(),
            };
            if !c.in_use.is_empty() {
                detail.push_str(&format!(
                    "; in use: {} (bind refuses without --force)",
                    c.in_use.join("; ")
                ));
            }
            Check::new("driver", CheckStatus::Fail, detail).fix(format!("mcqio-perf bind {addr}"))
        }
    });

    let Some(group) = p.iommu_group else {
        out.push(
            Check::new(
                "iommu group",
                CheckStatus::Fail,
                "the device has no IOMMU group",
            )
            .fix("turn the IOMMU on (see the `iommu` check)"),
        );
        return out;
    };
    out.push(if c.blockers.is_empty() {
        let peers = if c.group_peers.is_empty() {
            "no other devices".to_string()
        } else {
            format!(
                "also {} (bound to vfio-pci, a stub or nothing)",
                c.group_peers
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Check::new(
            "iommu group",
            CheckStatus::Pass,
            format!("group {group} is viable: {peers}"),
        )
    } else {
        let list: Vec<String> = c.blockers.iter().map(|b| b.to_string()).collect();
        Check::new(
            "iommu group",
            CheckStatus::Fail,
            format!(
                "group {group} is not viable: {} must be on vfio-pci or unbound",
                list.join(", ")
            ),
        )
        .fix(format!(
            "mcqio-perf bind <BDF> for each of {} (or unbind them from their drivers)",
            c.blockers
                .iter()
                .map(|b| b.bdf.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        ))
    });

    out.push(check_interfaces(r, p));
    let node = r.vfio_group_node(group);
    out.push(match can_read_write(&node) {
        Ok(true) => Check::new(
            "group access",
            CheckStatus::Pass,
            format!("{} is readable and writable by this user", node.display()),
        ),
        Ok(false) => Check::new(
            "group access",
            CheckStatus::Fail,
            format!("this user may not open {}", node.display()),
        )
        .fix(format!(
            "mcqio-perf bind {addr} --user $USER   (or: sudo chown $USER {})",
            node.display()
        )),
        Err(_) if p.is_vfio() => Check::new(
            "group access",
            CheckStatus::Fail,
            format!(
                "{} does not exist although the device is on vfio-pci",
                node.display()
            ),
        )
        .fix("check that devtmpfs is mounted on /dev and udev is running"),
        Err(_) => Check::new(
            "group access",
            CheckStatus::Info,
            format!(
                "{} appears once the device is bound to vfio-pci",
                node.display()
            ),
        ),
    });
    if p.is_vfio() && !c.in_use.is_empty() {
        out.push(
            Check::new(
                "busy",
                CheckStatus::Fail,
                format!("{}: a second user cannot open it", c.in_use.join("; ")),
            )
            .fix("stop that process (a VM, another mcqio run)"),
        );
    }
    out
}

fn check_memlock(r: &SysRoots, dma_budget: u64) -> Check {
    let st = MemlockStatus::current(r);
    let needed = memlock_needed(dma_budget);
    let what = format!(
        "{} locked for {} of DMA memory (the VFIO pin; no separate mlock)",
        fmt_bytes(needed),
        fmt_bytes(dma_budget)
    );
    if st.cap_ipc_lock {
        Check::new(
            "memlock",
            CheckStatus::Pass,
            format!("CAP_IPC_LOCK (e.g. root): RLIMIT_MEMLOCK does not apply; a run needs {what}"),
        )
    } else if st.allows(needed) {
        Check::new(
            "memlock",
            CheckStatus::Pass,
            format!(
                "RLIMIT_MEMLOCK is {}; a run needs {what}",
                fmt_bytes(st.limit)
            ),
        )
    } else {
        Check::new(
            "memlock",
            CheckStatus::Fail,
            format!("RLIMIT_MEMLOCK is {} but a run needs {what}", fmt_bytes(st.limit)),
        )
        .fix(format!(
            "ulimit -l {}   (persistently: `<user> - memlock {}` in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd unit)",
            needed.div_ceil(1024),
            needed.div_ceil(1024)
        ))
    }
}

/// Free 2 MiB huge pages: from the per-size sysfs pool, or /proc/meminfo
/// when the default huge page size is 2 MiB.
fn free_2m_pages(r: &SysRoots) -> Option<u64> {
    let pool = r
        .sys
        .join("kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    if let Ok(s) = fs::read_to_string(pool) {
        return s.trim().parse().ok();
    }
    let m = fs::read_to_string(r.proc.join("meminfo")).ok()?;
    let field = |k: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    (field("Hugepagesize:")? == 2048)
        .then(|| field("HugePages_Free:"))
        .flatten()
}

fn check_huge_pages(r: &SysRoots, dma_budget: u64) -> Check {
    let per = HUGE_PAGE_SIZE as u64;
    let want = dma_budget.div_ceil(per);
    let gain = "2 MiB pages pin and map 512x fewer pages per MiB and give the IOMMU 2 MiB entries (fewer IOTLB misses); without them DMA memory uses 4 KiB pages and still works";
    match free_2m_pages(r) {
        Some(free) if free >= want => Check::new(
            "huge pages",
            CheckStatus::Pass,
            format!("{free} free 2 MiB pages ({} needed)", want),
        ),
        Some(free) => Check::new(
            "huge pages",
            CheckStatus::Warn,
            format!("{free} free 2 MiB pages, {want} would hold all DMA memory; {gain}"),
        )
        .fix(format!(
            "echo {} > /proc/sys/vm/nr_hugepages   (optional)",
            want.max(1)
        )),
        None => Check::new(
            "huge pages",
            CheckStatus::Warn,
            format!("no 2 MiB huge page pool found; {gain}"),
        )
        .fix(format!(
            "echo {} > /proc/sys/vm/nr_hugepages   (optional)",
            want.max(1)
        )),
    }
}

/// What the kernel offers besides the type1 container: iommufd (`/dev/iommu`,
/// `CONFIG_IOMMUFD`) and the VFIO device cdev (`/sys/class/vfio-dev`, which
/// exists only with `CONFIG_VFIO_DEVICE_CDEV`). Either way a run works as long
/// as one of the two interfaces is there, so this is information.
fn check_iommufd(r: &SysRoots) -> Check {
    let detail = match crate::attach::interfaces(r).iommufd {
        Ok(what) => format!(
            "iommufd offered: {what}; `vfio:<BDF>` opens through it (iommu=auto), `vfio:<BDF>,iommu=type1` takes the container"
        ),
        Err(why) => format!("iommufd not offered: {why}; mcqio uses the type1 container"),
    };
    Check::new("iommufd", CheckStatus::Info, detail)
}

/// Which IOMMU interfaces `dev` can be opened through, and which `auto` takes.
fn check_interfaces(r: &SysRoots, dev: &crate::sysfs::PciDevice) -> Check {
    let o = offered(r, dev);
    let say = |x: &Result<String, String>| match x {
        Ok(what) => format!("yes ({what})"),
        Err(why) => format!("no ({why})"),
    };
    let detail = format!(
        "type1: {}; iommufd: {}; iommu=auto takes {}",
        say(&o.type1),
        say(&o.iommufd),
        IommuChoice::Auto.resolve(r, dev)
    );
    if o.type1.is_err() && o.iommufd.is_err() && dev.is_vfio() {
        Check::new("iommu interface", CheckStatus::Fail, detail)
            .fix("modprobe vfio-pci (the type1 container), or a kernel with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV")
    } else {
        Check::new("iommu interface", CheckStatus::Info, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::{Dev, FakeSys};

    #[test]
    fn this_host_without_vfio_fails_and_says_why() {
        // The build machine has no VFIO and no IOMMU; doctor must explain
        // that and fail, not panic. (If it ever runs where VFIO works, the
        // report passes and this test checks nothing further.)
        let report = doctor(&DoctorOptions {
            bdf: Some("0000:00:03.0".into()),
            ..DoctorOptions::default()
        });
        let text = report.to_string();
        assert!(!text.is_empty());
        if Path::new("/dev/vfio/vfio").exists() {
            return;
        }
        assert!(!report.passed(), "{text}");
        let vfio = report.get("vfio").unwrap();
        assert_eq!(vfio.status, CheckStatus::Fail);
        assert!(vfio.fix.as_deref().unwrap().contains("modprobe vfio-pci"));
        assert!(text.contains("not ready"), "{text}");
        // Malformed or absent addresses are checks too, not panics.
        for bdf in ["garbage", "0000:ff:1f.7"] {
            let r = doctor(&DoctorOptions {
                bdf: Some(bdf.into()),
                ..DoctorOptions::default()
            });
            assert_eq!(r.get("device").unwrap().status, CheckStatus::Fail);
        }
    }

    fn ready_tree() -> FakeSys {
        let fs = FakeSys::new();
        fs.write("dev/vfio/vfio", "");
        fs.write("dev/vfio/3", "");
        fs.write(
            "sys/module/vfio_iommu_type1/parameters/dma_entry_limit",
            "65535\n",
        );
        fs.write("sys/class/iommu/dmar0/x", "");
        fs.driver("vfio-pci");
        fs.add(Dev::nvme("0000:00:03.0", Some("vfio-pci"), Some(3)));
        fs.write("proc/self/status", "CapEff:\t0000000000004000\n");
        fs.write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
            "512\n",
        );
        fs
    }

    fn run(fs: &FakeSys, bdf: &str) -> DoctorReport {
        doctor(&DoctorOptions {
            roots: fs.roots.clone(),
            bdf: Some(bdf.into()),
            dma_budget: 32 << 20,
        })
    }

    #[test]
    fn a_ready_system_passes() {
        let fs = ready_tree();
        let r = run(&fs, "0000:00:03.0");
        assert!(r.passed(), "{r}");
        assert!(
            r.checks.iter().all(|c| c.status != CheckStatus::Warn),
            "{r}"
        );
        assert!(r.get("vfio_iommu_type1").unwrap().detail.contains("65535"));
        assert!(r.get("iommu").unwrap().detail.contains("dmar0"));
        assert!(r
            .to_string()
            .ends_with("0000:00:03.0: ready: a run would work"));
    }

    /// Issue 42: the doctor says which IOMMU interfaces the kernel offers,
    /// why one is missing, and which `auto` takes.
    #[test]
    fn says_which_iommu_interfaces_the_kernel_offers() {
        let fs = ready_tree();
        let r = run(&fs, "0000:00:03.0");
        let i = r.get("iommufd").unwrap();
        assert!(i.detail.contains("CONFIG_IOMMUFD is off"), "{r}");
        let d = r.get("iommu interface").unwrap();
        assert_eq!(d.status, CheckStatus::Info);
        assert!(d.detail.contains("type1: yes"), "{}", d.detail);
        assert!(d.detail.ends_with("iommu=auto takes type1"), "{}", d.detail);

        // /dev/iommu but no cdev support: still type1, and it says why.
        fs.write("dev/iommu", "");
        let r = run(&fs, "0000:00:03.0");
        assert!(
            r.get("iommufd")
                .unwrap()
                .detail
                .contains("CONFIG_VFIO_DEVICE_CDEV is off"),
            "{r}"
        );
        let d = r.get("iommu interface").unwrap();
        assert!(d.detail.contains("iommufd: no ("), "{}", d.detail);

        // The cdev class and the device's cdev: auto takes iommufd.
        fs.write("sys/class/vfio-dev/vfio0/dev", "");
        fs.write("sys/devices/pci0000:00/0000:00:03.0/vfio-dev/vfio0/dev", "");
        fs.write("dev/vfio/devices/vfio0", "");
        let r = run(&fs, "0000:00:03.0");
        assert!(r.passed(), "{r}");
        assert!(
            r.get("iommufd")
                .unwrap()
                .detail
                .starts_with("iommufd offered"),
            "{r}"
        );
        let d = r.get("iommu interface").unwrap();
        assert!(
            d.detail.ends_with("iommu=auto takes iommufd"),
            "{}",
            d.detail
        );

        // Without any container, a kernel with iommufd still works.
        std::fs::remove_file(fs.roots.vfio_container_node()).unwrap();
        let r = run(&fs, "0000:00:03.0");
        assert_eq!(r.get("vfio").unwrap().status, CheckStatus::Warn, "{r}");
        assert!(r.passed(), "{r}");
    }

    /// On a kernel with CONFIG_IOMMUFD_VFIO_CONTAINER, /dev/vfio/vfio is
    /// iommufd's emulation of type1 and there is no vfio_iommu_type1 to load:
    /// the doctor says so instead of asking for a modprobe that cannot work.
    #[test]
    fn the_iommufd_compat_container_is_not_a_missing_module() {
        let fs = ready_tree();
        std::fs::remove_dir_all(fs.roots.sys.join("module/vfio_iommu_type1")).unwrap();
        fs.write("dev/iommu", "");
        fs.write(
            "sys/module/iommufd/parameters/allow_unsafe_interrupts",
            "N\n",
        );
        let r = run(&fs, "0000:00:03.0");
        let t = r.get("vfio_iommu_type1").unwrap();
        assert_eq!(t.status, CheckStatus::Info, "{r}");
        assert!(t.detail.contains("iommufd's emulation"), "{}", t.detail);
        assert!(t.fix.is_none(), "{r}");
    }

    /// Issue 13 item 6: a UFS host controller is a device doctor knows.
    #[test]
    fn a_ufs_host_controller_is_recognised() {
        let fs = ready_tree();
        fs.add(Dev::ufs("0000:00:04.0", Some("vfio-pci"), Some(4)));
        fs.write("dev/vfio/4", "");
        let r = run(&fs, "0000:00:04.0");
        let d = r.get("device").unwrap();
        assert_eq!(d.status, CheckStatus::Pass, "{r}");
        assert!(
            d.detail.contains("UFS host controller 1b36:0013"),
            "{}",
            d.detail
        );
        fs.add(Dev {
            class: 0x010601,
            ..Dev::ufs("0000:00:05.0", None, Some(5))
        });
        let r = run(&fs, "0000:00:05.0");
        let d = r.get("device").unwrap();
        assert_eq!(d.status, CheckStatus::Fail);
        assert!(d
            .detail
            .contains("not an NVMe controller or a UFS host controller"));
    }

    #[test]
    fn names_each_missing_piece_with_a_fix() {
        let fs = FakeSys::new();
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), None));
        fs.write("sys/firmware/acpi/tables/DMAR", "");
        fs.write(
            "proc/meminfo",
            "HugePages_Free:        0\nHugepagesize:       2048 kB\n",
        );
        fs.write("proc/self/status", "CapEff:\t0000000000004000\n");
        let r = run(&fs, "0000:00:03.0");
        assert!(!r.passed());
        let failed: Vec<&str> = r.failures().map(|c| c.name).collect();
        assert_eq!(
            failed,
            ["vfio", "vfio-pci", "iommu", "driver", "iommu group"]
        );
        assert!(r
            .get("iommu")
            .unwrap()
            .fix
            .as_deref()
            .unwrap()
            .contains("intel_iommu=on"));
        assert_eq!(
            r.get("driver").unwrap().fix.as_deref(),
            Some("mcqio-perf bind 0000:00:03.0")
        );
        let hp = r.get("huge pages").unwrap();
        assert_eq!(hp.status, CheckStatus::Warn);
        assert!(
            hp.detail.contains("0 free 2 MiB pages, 16 would hold"),
            "{}",
            hp.detail
        );
        assert!(hp
            .fix
            .as_deref()
            .unwrap()
            .contains("echo 16 > /proc/sys/vm/nr_hugepages"));
        for c in r.failures() {
            assert!(c.fix.is_some(), "{} has no fix", c.name);
        }
    }

    #[test]
    fn group_blockers_and_permissions() {
        let fs = ready_tree();
        fs.add(Dev {
            bdf: "0000:00:03.1",
            class: 0x0c0330,
            vendor: 0x8086,
            device: 0x1e31,
            driver: Some("xhci_hcd"),
            group: Some(3),
        });
        let r = run(&fs, "0000:00:03.0");
        let g = r.get("iommu group").unwrap();
        assert_eq!(g.status, CheckStatus::Fail);
        assert!(
            g.detail.contains("0000:00:03.1 (bound to xhci_hcd)"),
            "{}",
            g.detail
        );
        assert!(!r.passed());
    }

    #[test]
    fn process_holding_the_group_is_reported() {
        let fs = ready_tree();
        fs.write("proc/99/comm", "qemu-system-x86\n");
        std::fs::create_dir_all(fs.roots.proc.join("99/fd")).unwrap();
        std::os::unix::fs::symlink("/dev/vfio/3", fs.roots.proc.join("99/fd/3")).unwrap();
        let r = run(&fs, "0000:00:03.0");
        let b = r.get("busy").unwrap();
        assert_eq!(b.status, CheckStatus::Fail);
        assert!(
            b.detail.contains("pid 99 (qemu-system-x86)"),
            "{}",
            b.detail
        );
    }
}
