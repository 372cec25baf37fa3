//! [`VfioBackend`]: an NVMe controller opened through VFIO.
//!
//! [`VfioBackend::open`] runs the checks a user would otherwise discover one
//! cryptic errno at a time, each failing with a [`VfioError`] that says what
//! to do ([`precheck`]), then:
//!
//! 1. picks the IOMMU interface ([`OpenOptions::iommu`]: `auto` takes
//!    iommufd where the kernel gave the device a cdev, type1 otherwise);
//! 2. type1: opens the container (`/dev/vfio/vfio`, type1v2 extension
//!    checked), then the group and the device through `vfio-ioctls` (which
//!    checks the group is viable, attaches it and sets the type1v2 IOMMU),
//!    and reads the valid IOVA windows (`VFIO_IOMMU_GET_INFO`);
//!    iommufd: opens the device cdev, binds it to `/dev/iommu`, attaches it to
//!    a fresh IOAS and reads the IOAS's allowed ranges ([`crate::iommufd`]);
//! 4. reads vendor/device/class from config space and enables memory space
//!    and bus mastering (and disables INTx: mcqio polls),
//! 5. maps BAR0 as a [`Bar`],
//! 6. builds the [`DmaSpace`] over the container.
//!
//! Every step logs at `debug` (and the outcome at `info`), so a failing open
//! in a VM can be diagnosed from `RUST_LOG=debug` output alone.
//!
//! # Drop order
//!
//! Fields drop in declaration order: the BAR mapping first, then this
//! backend's reference to the DMA space and the [`VfioIommu`] (or
//! [`IommufdIommu`]). The device, group and container (or the device cdev,
//! the IOAS and the iommufd) close in that order, when the last
//! [`crate::DmaRegion`] is gone too, so regions can always unmap themselves.
//! Disable the controller (CC.EN = 0) before dropping the backend: closing
//! the device resets the function, but only then.

use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioError as IoctlError, VfioOps, VfioRegionInfoCap};

use crate::attach::{Attached, IommuChoice, IommuKind};
use crate::backend::{Backend, Mmio};
use crate::bar::Bar;
use crate::container::VfioIommu;
use crate::dma::{DmaSpace, HugePages};
use crate::error::{Result, VfioError};
use crate::iommufd::{self, IommufdIommu};
use crate::irq::{Interrupts, IrqError, IrqKind, Notifier};
use crate::memlock::{check_memlock, memlock_needed, MemlockStatus};
use crate::sys;
use crate::sysfs::{can_read_write, group_blockers, PciAddress, PciDevice, SysRoots};

/// PCI config space: vendor id (16 bits).
const PCI_VENDOR_ID: u64 = 0x00;
/// PCI config space: device id (16 bits).
const PCI_DEVICE_ID: u64 = 0x02;
/// PCI config space: command register (16 bits).
const PCI_COMMAND: u64 = 0x04;
/// PCI config space: revision (low byte) and 24-bit class code.
const PCI_CLASS_REVISION: u64 = 0x08;
/// Command register: respond to memory-space accesses (BAR0).
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: the device may master the bus (DMA).
const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// Command register: legacy INTx disabled (we poll).
const PCI_COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Smallest usable NVMe BAR0: the register block plus the admin doorbells.
const NVME_MIN_BAR0: u64 = 0x1008;

/// DMA memory a run is assumed to pin when no budget is given: 32 MiB.
pub const DEFAULT_DMA_BUDGET: u64 = 32 << 20;

/// How to open a controller.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Where sysfs/procfs/devfs are (for the pre-checks; the VFIO nodes
    /// themselves are always `/dev/vfio/*`).
    pub roots: SysRoots,
    /// Page-size policy of the DMA space.
    pub huge_pages: HugePages,
    /// Bytes of DMA memory the run will map; checked against
    /// `RLIMIT_MEMLOCK` up front (see [`memlock_needed`]). 0 skips the check.
    pub dma_budget: u64,
    /// Refuse devices whose PCI class is not NVMe (0x0108xx).
    pub require_nvme: bool,
    /// The IOMMU interface to open the device through. The default is
    /// [`IOMMU_ENV`](crate::attach::IOMMU_ENV)'s value, `auto` without it.
    pub iommu: IommuChoice,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            roots: SysRoots::default(),
            huge_pages: HugePages::Prefer,
            dma_budget: DEFAULT_DMA_BUDGET,
            require_nvme: true,
            iommu: IommuChoice::from_env().unwrap_or_else(|e| {
                log::warn!("{e}; using auto");
                IommuChoice::Auto
            }),
        }
    }
}

/// What was found out about an opened controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// PCI address.
    pub bdf: PciAddress,
    /// Vendor id (from config space).
    pub vendor: u16,
    /// Device id (from config space).
    pub device: u16,
    /// 24-bit class code (from config space).
    pub class: u32,
    /// IOMMU group.
    pub iommu_group: u32,
    /// Size of BAR0 as VFIO reports it.
    pub bar0_size: u64,
    /// How much of BAR0 is mapped (less than the size when the MSI-X table
    /// in BAR0 may not be mapped).
    pub bar0_mapped: usize,
    /// The IOMMU interface the device was opened through.
    pub iommu: IommuKind,
}

/// Run every check that can be made before touching VFIO; returns the
/// device as sysfs shows it, and its group.
///
/// Checks, in order: the device exists (and is NVMe if required), VFIO is
/// loaded (type1: `/dev/vfio/vfio`), the IOMMU gave it a group, it is bound
/// to vfio-pci, its group is viable, `/dev/vfio/<group>` (iommufd: the device
/// cdev and `/dev/iommu`) is accessible, `RLIMIT_MEMLOCK` covers the DMA
/// budget.
pub fn precheck(bdf: &PciAddress, opts: &OpenOptions) -> Result<(PciDevice, u32)> {
    precheck_for(bdf, opts).map(|(dev, group, _)| (dev, group))
}

/// [`precheck`], also saying which interface `opts.iommu` resolved to.
fn precheck_for(bdf: &PciAddress, opts: &OpenOptions) -> Result<(PciDevice, u32, IommuKind)> {
    let roots = &opts.roots;
    let b = bdf.to_string();
    let dev = PciDevice::read(roots, bdf)?;
    log::debug!(
        "{b}: {:04x}:{:04x} class {:06x}, driver {:?}, group {:?}",
        dev.vendor,
        dev.device,
        dev.class,
        dev.driver,
        dev.iommu_group
    );
    if opts.require_nvme && !dev.is_nvme() {
        return Err(VfioError::NotNvme {
            bdf: b,
            class: dev.class,
        });
    }
    let kind = opts.iommu.resolve(roots, &dev);
    let container = roots.vfio_container_node();
    if kind == IommuKind::Type1 && !container.exists() {
        return Err(VfioError::VfioMissing {
            bdf: b,
            path: container,
        });
    }
    let Some(group) = dev.iommu_group else {
        return Err(VfioError::NoIommu {
            bdf: b,
            path: dev.path.join("iommu_group"),
        });
    };
    if !dev.is_vfio() {
        return Err(VfioError::NotBoundToVfio {
            bdf: b,
            driver: dev.driver,
        });
    }
    let blockers = group_blockers(roots, &dev)?;
    if !blockers.is_empty() {
        return Err(VfioError::GroupNotViable {
            bdf: b,
            group,
            blockers,
        });
    }
    let node = roots.vfio_group_node(group);
    match (kind, can_read_write(&node)) {
        (IommuKind::Iommufd, _) => drop(iommufd::precheck(roots, &dev)?),
        (_, Ok(true)) => {}
        (_, Ok(false)) => return Err(VfioError::GroupPermission { bdf: b, path: node }),
        // Bound to vfio-pci but no node: devtmpfs/udev did not create it.
        (_, Err(_)) => {
            return Err(VfioError::VfioMissing { bdf: b, path: node });
        }
    }
    if opts.dma_budget > 0 {
        check_memlock(
            &b,
            MemlockStatus::current(roots),
            memlock_needed(opts.dma_budget),
        )?;
    }
    Ok((dev, group, kind))
}

/// An NVMe controller driven through VFIO: BAR0 plus a DMA space.
pub struct VfioBackend {
    // Field order is drop order: BAR mapping, then DMA space, then the IOMMU
    // (device → group → container); see the module docs.
    bar: Bar,
    dma: Arc<DmaSpace>,
    iommu: Attached,
    info: DeviceInfo,
    name: String,
    /// The interrupt index routed to notifiers and the notifiers, kept
    /// alive while the kernel may signal them.
    irqs: Mutex<Option<(u32, Vec<Arc<Notifier>>)>>,
}

impl std::fmt::Debug for VfioBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioBackend")
            .field("info", &self.info)
            .field("bar", &self.bar)
            .field("iommu", &self.iommu)
            .finish_non_exhaustive()
    }
}

impl VfioBackend {
    /// Open the controller at `bdf` (`0000:00:03.0`) with default options.
    pub fn open(bdf: &str) -> Result<Self> {
        Self::open_with(bdf, &OpenOptions::default())
    }

    /// Open the controller at `bdf` with `opts`.
    pub fn open_with(bdf: &str, opts: &OpenOptions) -> Result<Self> {
        let addr = PciAddress::parse(bdf)?;
        let b = addr.to_string();
        let (dev, group, kind) = precheck_for(&addr, opts)?;
        log::debug!("{b}: pre-checks passed (group {group}, {kind})");

        let iommu = match kind {
            IommuKind::Type1 => Attached::Type1(Arc::new(open_type1(&addr, opts, &dev, group)?)),
            IommuKind::Iommufd => Attached::Iommufd(Arc::new(iommufd::open(&opts.roots, &dev)?)),
        };
        let (vendor, device_id, class) = enable_device(&addr, iommu.device())?;
        let (bar, bar0_size) = map_bar0(&addr, iommu.device())?;
        let dma = DmaSpace::new(iommu.iommu(), opts.huge_pages);
        let info = DeviceInfo {
            bdf: addr,
            vendor,
            device: device_id,
            class,
            iommu_group: group,
            bar0_size,
            bar0_mapped: bar.len(),
            iommu: kind,
        };
        log::info!(
            "{b}: opened through VFIO {kind} ({vendor:04x}:{device_id:04x}, group {group}, BAR0 {:#x} bytes, {:#x} mapped, IOVA windows {:?})",
            bar0_size,
            bar.len(),
            dma.iommu().valid_ranges()
        );
        Ok(Self {
            bar,
            dma,
            iommu,
            info,
            name: format!("vfio:{b}"),
            irqs: Mutex::new(None),
        })
    }

    /// What was learnt while opening.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// BAR0.
    pub fn bar(&self) -> &Bar {
        &self.bar
    }

    /// The type1 container, if the device was opened through it.
    pub fn type1(&self) -> Option<&Arc<VfioIommu>> {
        match &self.iommu {
            Attached::Type1(t) => Some(t),
            Attached::Iommufd(_) => None,
        }
    }

    /// The iommufd IOAS, if the device was opened through it.
    pub fn iommufd(&self) -> Option<&Arc<IommufdIommu>> {
        match &self.iommu {
            Attached::Iommufd(i) => Some(i),
            Attached::Type1(_) => None,
        }
    }

    /// The IOMMU interface the device was opened through.
    pub fn iommu_kind(&self) -> IommuKind {
        self.iommu.kind()
    }

    /// Read `buf.len()` bytes of PCI config space at `offset`.
    pub fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        config_read(&self.info.bdf, self.iommu.device(), offset, buf)
    }

    /// Write `buf` to PCI config space at `offset`.
    pub fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        config_write(&self.info.bdf, self.iommu.device(), offset, buf)
    }
}

impl Backend for VfioBackend {
    fn regs(&self) -> &dyn Mmio {
        &self.bar
    }

    fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn interrupts(&self) -> Option<&dyn Interrupts> {
        Some(self)
    }
}

/// Open the type1 container, then the group and the device through it.
fn open_type1(
    addr: &PciAddress,
    opts: &OpenOptions,
    dev: &PciDevice,
    group: u32,
) -> Result<VfioIommu> {
    let container = VfioContainer::new(None)
        .map_err(|e| map_open_error(addr, opts, group, "open container", e))?;
    let container = Arc::new(container);
    log::debug!("{addr}: container open, type1v2 supported");
    let ops: Arc<dyn VfioOps> = container.clone();
    let device = VfioDevice::new(&dev.path, ops, false)
        .map_err(|e| map_open_error(addr, opts, group, "open group and device", e))?;
    log::debug!("{addr}: group {group} attached, IOMMU type1v2 set, device fd open");
    Ok(VfioIommu::attached(device, container, dev.path.clone()))
}

/// VFIO's interrupt indexes, best first, with the kind each gives.
fn irq_index(dev: &VfioDevice) -> Option<(u32, IrqKind)> {
    let count = |i| dev.get_irq_info(i).map_or(0, |q| q.count);
    [
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_PCI_MSI_IRQ_INDEX,
        VFIO_PCI_INTX_IRQ_INDEX,
    ]
    .into_iter()
    .find(|&i| count(i) > 0)
    .map(|i| {
        let vectors = count(i);
        let kind = match i {
            VFIO_PCI_MSIX_IRQ_INDEX => IrqKind::MsiX { vectors },
            VFIO_PCI_MSI_IRQ_INDEX => IrqKind::Msi { vectors },
            _ => IrqKind::Intx,
        };
        (i, kind)
    })
}

impl VfioBackend {
    /// Set or clear the PCI command register's Interrupt Disable bit.
    fn intx_disable(&self, disable: bool) -> std::result::Result<(), IrqError> {
        let dev = self.iommu.device();
        let bdf = &self.info.bdf;
        let io = |e: VfioError| IrqError::Config(e.to_string());
        let cmd = config_u16(bdf, dev, PCI_COMMAND).map_err(io)?;
        let want = if disable {
            cmd | PCI_COMMAND_INTX_DISABLE
        } else {
            cmd & !PCI_COMMAND_INTX_DISABLE
        };
        if want != cmd {
            config_write(bdf, dev, PCI_COMMAND, &want.to_le_bytes()).map_err(io)?;
        }
        Ok(())
    }
}

impl Interrupts for VfioBackend {
    fn kind(&self) -> IrqKind {
        irq_index(self.iommu.device()).map_or(IrqKind::None, |(_, k)| k)
    }

    fn route(&self, notifiers: &[Arc<Notifier>]) -> std::result::Result<(), IrqError> {
        let dev = self.iommu.device();
        let (index, kind) = irq_index(dev).ok_or(IrqError::Unsupported)?;
        if notifiers.len() > kind.vectors() as usize {
            return Err(IrqError::TooMany {
                asked: notifiers.len(),
                have: kind.vectors(),
            });
        }
        let mut routed = self.irqs.lock().unwrap_or_else(|p| p.into_inner());
        // vfio-pci sets the vector count when it enables MSI/MSI-X: a new
        // count needs a disable first.
        if let Some((old, _)) = routed.take() {
            dev.disable_irq(old).map_err(|source| IrqError::Vfio {
                op: "disable interrupts",
                source,
            })?;
            if old == VFIO_PCI_INTX_IRQ_INDEX {
                // Back to how open left it: INTx disabled.
                self.intx_disable(true)?;
            }
        }
        if notifiers.is_empty() {
            return Ok(());
        }
        dev.enable_irq(index, notifiers.iter().map(|n| n.event_fd()).collect())
            .map_err(|source| IrqError::Vfio {
                op: "route interrupts to eventfds",
                source,
            })?;
        if index == VFIO_PCI_INTX_IRQ_INDEX {
            // Open set the command register's Interrupt Disable (a polled
            // driver wants no INTx), and vfio-pci keeps the line masked
            // while it is set: clear it, or nothing is ever delivered.
            self.intx_disable(false)?;
        }
        *routed = Some((index, notifiers.to_vec()));
        log::debug!(
            "{}: {} {kind:?} vector(s) routed to eventfds",
            self.name,
            notifiers.len()
        );
        Ok(())
    }

    fn unroute(&self) -> std::result::Result<(), IrqError> {
        self.route(&[])
    }

    fn unmask(&self) -> std::result::Result<(), IrqError> {
        let routed = self.irqs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((VFIO_PCI_INTX_IRQ_INDEX, _)) = *routed {
            self.iommu
                .device()
                .unmask_irq(VFIO_PCI_INTX_IRQ_INDEX)
                .map_err(|source| IrqError::Vfio {
                    op: "unmask INTx",
                    source,
                })?;
        }
        Ok(())
    }
}

/// Turn a `vfio-ioctls` error during open into the error that says what to do.
fn map_open_error(
    bdf: &PciAddress,
    opts: &OpenOptions,
    group: u32,
    op: &'static str,
    e: IoctlError,
) -> VfioError {
    let b = bdf.to_string();
    log::debug!("{b}: {op} failed: {e:?}");
    let group_node = opts.roots.vfio_group_node(group);
    let io_kind = |err: &std::io::Error| err.raw_os_error();
    match e {
        IoctlError::OpenContainer(err) => match io_kind(&err) {
            Some(libc::ENOENT) | Some(libc::ENODEV) => VfioError::VfioMissing {
                bdf: b,
                path: "/dev/vfio/vfio".into(),
            },
            Some(libc::EACCES) | Some(libc::EPERM) => VfioError::GroupPermission {
                bdf: b,
                path: "/dev/vfio/vfio".into(),
            },
            _ => VfioError::Os {
                bdf: b,
                op: "open /dev/vfio/vfio",
                source: err,
            },
        },
        IoctlError::OpenGroup(err, _) => match io_kind(&err) {
            Some(libc::EACCES) | Some(libc::EPERM) => VfioError::GroupPermission {
                bdf: b,
                path: group_node,
            },
            Some(libc::EBUSY) => VfioError::Busy {
                bdf: b,
                path: group_node,
            },
            Some(libc::ENOENT) => VfioError::NotBoundToVfio {
                bdf: b,
                driver: PciDevice::read(&opts.roots, bdf)
                    .ok()
                    .and_then(|d| d.driver),
            },
            _ => VfioError::Os {
                bdf: b,
                op: "open the VFIO group",
                source: err,
            },
        },
        IoctlError::GroupViable => {
            let blockers = PciDevice::read(&opts.roots, bdf)
                .and_then(|d| group_blockers(&opts.roots, &d))
                .unwrap_or_default();
            VfioError::GroupNotViable {
                bdf: b,
                group,
                blockers,
            }
        }
        IoctlError::VfioApiVersion
        | IoctlError::VfioExtension
        | IoctlError::VfioInvalidType
        | IoctlError::VfioType1V2 => VfioError::NoType1v2 {
            bdf: b,
            reason: e.to_string(),
        },
        IoctlError::ContainerSetIOMMU(ref err) => VfioError::NoType1v2 {
            bdf: b,
            reason: format!("VFIO_SET_IOMMU: {err}"),
        },
        IoctlError::GroupGetDeviceFD(ref err) if err.errno() == libc::EBUSY => VfioError::Busy {
            bdf: b,
            path: group_node,
        },
        IoctlError::InvalidPath => VfioError::NoIommu {
            bdf: b.clone(),
            path: opts.roots.pci_device_dir(bdf).join("iommu_group"),
        },
        other => VfioError::Vfio {
            bdf: b,
            op,
            source: other,
        },
    }
}

fn config_region(bdf: &PciAddress, dev: &VfioDevice, offset: u64, len: usize) -> Result<u64> {
    let size = dev.get_region_size(VFIO_PCI_CONFIG_REGION_INDEX);
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => {
            Ok(dev.get_region_offset(VFIO_PCI_CONFIG_REGION_INDEX) + offset)
        }
        _ => Err(VfioError::Os {
            bdf: bdf.to_string(),
            op: "PCI config access",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset:#x} exceed the {size:#x}-byte config space"),
            ),
        }),
    }
}

fn config_read(bdf: &PciAddress, dev: &VfioDevice, offset: u64, buf: &mut [u8]) -> Result<()> {
    use std::os::fd::AsRawFd;
    let at = config_region(bdf, dev, offset, buf.len())?;
    sys::pread_exact(dev.as_raw_fd(), buf, at).map_err(|source| VfioError::Os {
        bdf: bdf.to_string(),
        op: "PCI config read",
        source,
    })
}

fn config_write(bdf: &PciAddress, dev: &VfioDevice, offset: u64, buf: &[u8]) -> Result<()> {
    use std::os::fd::AsRawFd;
    let at = config_region(bdf, dev, offset, buf.len())?;
    sys::pwrite_all(dev.as_raw_fd(), buf, at).map_err(|source| VfioError::Os {
        bdf: bdf.to_string(),
        op: "PCI config write",
        source,
    })
}

fn config_u16(bdf: &PciAddress, dev: &VfioDevice, offset: u64) -> Result<u16> {
    let mut b = [0u8; 2];
    config_read(bdf, dev, offset, &mut b)?;
    Ok(u16::from_le_bytes(b))
}

/// Read ids and class; enable memory space and bus mastering, disable INTx.
fn enable_device(bdf: &PciAddress, dev: &VfioDevice) -> Result<(u16, u16, u32)> {
    let vendor = config_u16(bdf, dev, PCI_VENDOR_ID)?;
    let device = config_u16(bdf, dev, PCI_DEVICE_ID)?;
    let mut cr = [0u8; 4];
    config_read(bdf, dev, PCI_CLASS_REVISION, &mut cr)?;
    let class = u32::from_le_bytes(cr) >> 8;
    let cmd = config_u16(bdf, dev, PCI_COMMAND)?;
    let want = cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE;
    if want != cmd {
        config_write(bdf, dev, PCI_COMMAND, &want.to_le_bytes())?;
    }
    let now = config_u16(bdf, dev, PCI_COMMAND)?;
    log::debug!("{bdf}: config {vendor:04x}:{device:04x} class {class:06x}, command {cmd:#06x} -> {now:#06x}");
    if now & (PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER) != PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER {
        return Err(VfioError::Os {
            bdf: bdf.to_string(),
            op: "enable memory space and bus mastering",
            source: std::io::Error::other(format!(
                "PCI command register reads {now:#06x} after writing {want:#06x}"
            )),
        });
    }
    Ok((vendor, device, class))
}

/// Map BAR0: the whole region, or, when VFIO reports sparse mmap areas (the
/// MSI-X table in BAR0 may not be mapped), the area at offset 0, which holds
/// the registers and doorbells.
fn map_bar0(bdf: &PciAddress, dev: &VfioDevice) -> Result<(Bar, u64)> {
    use std::os::fd::AsRawFd;
    let idx = VFIO_PCI_BAR0_REGION_INDEX;
    let bar_err = |reason: String| VfioError::Bar {
        bdf: bdf.to_string(),
        reason,
    };
    let size = dev.get_region_size(idx);
    let flags = dev.get_region_flags(idx);
    let offset = dev.get_region_offset(idx);
    if size < NVME_MIN_BAR0 {
        return Err(bar_err(format!(
            "BAR0 is {size:#x} bytes, smaller than an NVMe register block with doorbells ({NVME_MIN_BAR0:#x})"
        )));
    }
    if flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
        return Err(bar_err(format!(
            "VFIO does not allow mmap of BAR0 (region flags {flags:#x}); is it an I/O-port BAR?"
        )));
    }
    let caps = dev.get_region_caps(idx);
    let msix_mappable = caps.contains(&VfioRegionInfoCap::MsixMappable);
    let sparse = caps.iter().find_map(|c| match c {
        VfioRegionInfoCap::SparseMmap(s) => Some(s.areas.clone()),
        _ => None,
    });
    let len = match (&sparse, msix_mappable) {
        (Some(areas), false) => {
            let first = areas.iter().find(|a| a.offset == 0).ok_or_else(|| {
                bar_err(format!("no mmap-able area at offset 0 (areas {areas:?})"))
            })?;
            if first.size < NVME_MIN_BAR0 {
                return Err(bar_err(format!(
                    "the mmap-able part at offset 0 is only {:#x} bytes",
                    first.size
                )));
            }
            log::debug!(
                "{bdf}: BAR0 is sparse ({areas:?}); mapping the first {:#x} bytes",
                first.size
            );
            first.size
        }
        _ => size,
    };
    let len = usize::try_from(len).map_err(|_| bar_err(format!("BAR0 size {len:#x} too large")))?;
    let bar = Bar::map_device(dev.as_raw_fd(), idx, offset, len).map_err(|e| {
        bar_err(format!(
            "mmap of {len:#x} bytes at fd offset {offset:#x}: {e}"
        ))
    })?;
    Ok((bar, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::{Dev, FakeSys};

    fn opts(fs: &FakeSys) -> OpenOptions {
        OpenOptions {
            roots: fs.roots.clone(),
            dma_budget: 0,
            ..OpenOptions::default()
        }
    }

    fn with_vfio(fs: &FakeSys) {
        fs.write("dev/vfio/vfio", "");
    }

    #[test]
    fn nonexistent_address_names_sysfs_path_and_fix() {
        let fs = FakeSys::new();
        let e = VfioBackend::open_with("0000:42:00.0", &opts(&fs)).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, VfioError::NoSuchDevice { .. }));
        assert!(
            m.contains(&format!(
                "{}/bus/pci/devices/0000:42:00.0 does not exist",
                fs.roots.sys.display()
            )),
            "{m}"
        );
        assert!(m.contains("mcqio-perf devices"), "{m}");
        assert!(m.ends_with("run `mcqio-perf doctor 0000:42:00.0`"), "{m}");
        // And on the real /sys of this machine too (no such device here).
        let real = VfioBackend::open("0000:ff:1f.7").unwrap_err();
        assert!(
            matches!(real, VfioError::NoSuchDevice { ref path, .. } if path.starts_with("/sys/bus/pci/devices")),
            "{real}"
        );
    }

    #[test]
    fn malformed_address_is_rejected_before_sysfs() {
        let e = VfioBackend::open("not-a-bdf").unwrap_err();
        assert!(matches!(e, VfioError::InvalidAddress { .. }), "{e}");
    }

    #[test]
    fn bound_to_nvme_names_driver_and_bind_fix() {
        let fs = FakeSys::new();
        with_vfio(&fs);
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), Some(3)));
        let e = VfioBackend::open_with("0000:00:03.0", &opts(&fs)).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, VfioError::NotBoundToVfio { ref driver, .. } if driver.as_deref() == Some("nvme"))
        );
        assert!(
            m.contains("bound to the `nvme` driver, not vfio-pci"),
            "{m}"
        );
        assert!(m.contains("`mcqio-perf bind 0000:00:03.0`"), "{m}");
    }

    #[test]
    fn missing_vfio_is_reported() {
        let fs = FakeSys::new();
        fs.add(Dev::nvme("0000:00:03.0", Some("vfio-pci"), Some(3)));
        let e = VfioBackend::open_with("0000:00:03.0", &opts(&fs)).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, VfioError::VfioMissing { .. }), "{m}");
        assert!(m.contains("dev/vfio/vfio does not exist"), "{m}");
        assert!(m.contains("modprobe vfio-pci"), "{m}");
    }

    #[test]
    fn no_iommu_group_means_no_iommu() {
        let fs = FakeSys::new();
        with_vfio(&fs);
        fs.add(Dev::nvme("0000:00:03.0", Some("nvme"), None));
        let e = VfioBackend::open_with("0000:00:03.0", &opts(&fs)).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, VfioError::NoIommu { .. }), "{m}");
        assert!(m.contains("intel_iommu=on"), "{m}");
    }

    #[test]
    fn group_not_viable_lists_the_other_devices() {
        let fs = FakeSys::new();
        with_vfio(&fs);
        fs.add(Dev::nvme("0000:00:03.0", Some("vfio-pci"), Some(9)));
        fs.add(Dev::nvme("0000:00:04.0", Some("nvme"), Some(9)));
        fs.add(Dev {
            bdf: "0000:00:04.1",
            class: 0x0c0330,
            vendor: 0x8086,
            device: 0x1e31,
            driver: Some("xhci_hcd"),
            group: Some(9),
        });
        // Unbound and stub-bound members do not block.
        fs.add(Dev::nvme("0000:00:05.0", None, Some(9)));
        fs.add(Dev::nvme("0000:00:06.0", Some("pci-stub"), Some(9)));
        let e = VfioBackend::open_with("0000:00:03.0", &opts(&fs)).unwrap_err();
        let m = e.to_string();
        match &e {
            VfioError::GroupNotViable {
                group, blockers, ..
            } => {
                assert_eq!(*group, 9);
                let b: Vec<_> = blockers.iter().map(|b| b.bdf.as_str()).collect();
                assert_eq!(b, ["0000:00:04.0", "0000:00:04.1"]);
            }
            _ => panic!("{m}"),
        }
        assert!(
            m.contains("0000:00:04.0 (bound to nvme), 0000:00:04.1 (bound to xhci_hcd) are not"),
            "{m}"
        );
    }

    #[test]
    fn missing_group_node_and_memlock_are_checked() {
        let fs = FakeSys::new();
        with_vfio(&fs);
        fs.add(Dev::nvme("0000:00:03.0", Some("vfio-pci"), Some(4)));
        let e = VfioBackend::open_with("0000:00:03.0", &opts(&fs)).unwrap_err();
        assert!(
            matches!(e, VfioError::VfioMissing { ref path, .. } if path.ends_with("vfio/4")),
            "{e}"
        );
        fs.write("dev/vfio/4", "");
        fs.write("proc/self/status", "CapEff:\t0000000000000000\n");
        let mut o = opts(&fs);
        // More than any real limit but "unlimited".
        o.dma_budget = u64::MAX / 4;
        let r = precheck(&"0000:00:03.0".parse().unwrap(), &o);
        // The limit is this process's real one: unlimited hosts pass.
        if MemlockStatus::current(&fs.roots).allows(memlock_needed(o.dma_budget)) {
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, VfioError::Memlock { .. }), "{e}");
        }
        o.dma_budget = 0;
        let (dev, group) = precheck(&"0000:00:03.0".parse().unwrap(), &o).unwrap();
        assert_eq!((dev.bdf.to_string().as_str(), group), ("0000:00:03.0", 4));
    }

    #[test]
    fn non_nvme_devices_are_refused_unless_allowed() {
        let fs = FakeSys::new();
        with_vfio(&fs);
        fs.add(Dev {
            bdf: "0000:00:07.0",
            class: 0x020000,
            vendor: 0x8086,
            device: 0x10d3,
            driver: Some("vfio-pci"),
            group: Some(2),
        });
        fs.write("dev/vfio/2", "");
        let e = VfioBackend::open_with("0000:00:07.0", &opts(&fs)).unwrap_err();
        assert!(
            matches!(
                e,
                VfioError::NotNvme {
                    class: 0x020000,
                    ..
                }
            ),
            "{e}"
        );
        let mut o = opts(&fs);
        o.require_nvme = false;
        assert!(precheck(&"0000:00:07.0".parse().unwrap(), &o).is_ok());
    }
}
