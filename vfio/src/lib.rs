//! # mcqio-vfio: VFIO, DMA memory and the IOMMU
//!
//! The lowest layer of mcqio. It opens an NVMe controller through Linux VFIO
//! (container → group → device), maps its BAR0, and owns DMA memory:
//!
//! - [`Iova`] and [`IovaAllocator`]: device addresses and the allocator that
//!   hands them out from the IOMMU's valid windows.
//! - [`Iommu`]: the IOMMU seam. VFIO's type1 container implements it
//!   ([`VfioIommu`]), and so does an iommufd IO address space reached through
//!   the device's cdev ([`IommufdIommu`]); [`IommuChoice`] picks one
//!   (`auto`: iommufd where the kernel offers it). The fake IOMMU in
//!   `mcqio-fixtures` implements it for tests.
//! - [`DmaSpace`] and [`DmaRegion`]: pinned memory mapped at an IOVA, freed in
//!   the right order on drop. **Read the DMA contract in [`dma`]**: the device
//!   writes DMA memory concurrently, so no `&`/`&mut` reference is ever formed
//!   over it; access is through raw pointers and volatile copies.
//! - [`Notifier`] and [`Interrupts`]: a device's interrupt vectors as
//!   eventfds, for waiting instead of polling.
//! - [`Backend`] and [`Mmio`]: the hardware seam the engine drives.
//!   [`VfioBackend`] is the real one; [`Bar`] is BAR0 (and, via
//!   [`Bar::anonymous`], a memory-backed stand-in).
//! - [`doctor()`], [`devices`], [`bind`], [`unbind`]: set-up and diagnosis,
//!   the library side of `mcqio-perf doctor|devices|bind|unbind`.
//!
//! ## Using a real controller
//!
//! 1. The machine needs an IOMMU (VT-d/AMD-Vi enabled in the firmware,
//!    `intel_iommu=on` or `amd_iommu=on` on older kernels) and VFIO
//!    (`modprobe vfio-pci`).
//! 2. Move the controller from the kernel's `nvme` driver to `vfio-pci`:
//!    [`bind`] (`mcqio-perf bind 0000:01:00.0`). Every other device in its
//!    IOMMU group must be on `vfio-pci` or on no driver; [`devices`] shows
//!    the group and what blocks it. [`unbind`] gives it back to `nvme`.
//! 3. As a non-root user: `bind --user <name>` hands over `/dev/vfio/<group>`,
//!    and `RLIMIT_MEMLOCK` must cover the DMA memory
//!    ([`memlock_needed`]; root has `CAP_IPC_LOCK` and no limit).
//! 4. Optional: 2 MiB huge pages (`echo 512 > /proc/sys/vm/nr_hugepages`)
//!    make DMA regions cheaper to pin and map; the host's base pages are used
//!    otherwise (see [`dma`] for host page, IOMMU granule and controller page).
//! 5. [`VfioBackend::open`]`("0000:01:00.0")` and hand the backend to the
//!    engine. If anything is missing, the error says what to do, and
//!    [`doctor()`] (`mcqio-perf doctor <BDF>`) checks everything at once.
//!
//! ```no_run
//! use mcqio_vfio::{Backend, Mmio, VfioBackend};
//! let ctrl = VfioBackend::open("0000:01:00.0")?;
//! let version = ctrl.regs().read32(0x08); // NVMe VS register
//! println!("{}: NVMe {}.{}", ctrl.name(), version >> 16, (version >> 8) & 0xff);
//! # Ok::<(), mcqio_vfio::VfioError>(())
//! ```
//!
//! ## Safety contract of DMA memory
//!
//! Once mapped, a [`DmaRegion`] is shared with a device that reads and writes
//! it at any time, without the compiler knowing. Therefore:
//!
//! - no `&T`/`&mut T`/slice reference is ever created over DMA memory; use
//!   [`DmaRegion::as_ptr`] with volatile or atomic accesses, or the copying
//!   accessors ([`DmaRegion::read_bytes`], [`DmaRegion::write_obj`], …),
//!   which take `&mut DmaRegion` so that safe code never races with itself;
//! - memory stays mapped (and so allocated) until the IOMMU unmap has
//!   returned: a region unmaps, then frees its IOVA, then frees its pages, and
//!   leaks rather than frees if the unmap fails;
//! - ordering against the device (a store barrier before a doorbell store,
//!   a load barrier after observing a completion's phase bit) is the
//!   driver's job, with the per-architecture functions in [`barrier`]
//!   (`std::sync::atomic::fence` is not enough on aarch64);
//! - the IOMMU domain lives as long as any region: regions keep the
//!   [`DmaSpace`], which keeps the [`VfioIommu`], which keeps the device and
//!   container open (closed device → group → container, see [`VfioIommu`]).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod attach;
pub mod backend;
pub mod bar;
pub mod barrier;
pub mod container;
pub mod device;
pub mod dma;
pub mod doctor;
pub mod error;
pub mod iommu;
pub mod iommufd;
pub mod iova;
pub mod irq;
pub mod mapping;
pub mod memlock;
pub mod ranged;
pub mod setup;
mod sys;
pub mod sysfs;

pub use attach::{interfaces, offered, IommuChoice, IommuKind, Offered, IOMMU_ENV};
pub use backend::{Backend, DoorbellHook, Mmio};
pub use bar::{Bar, BarAccessError, BarBacking};
pub use container::VfioIommu;
pub use device::{precheck, DeviceInfo, OpenOptions, VfioBackend, DEFAULT_DMA_BUDGET};
pub use dma::{
    host_page_size, DmaError, DmaRegion, DmaSpace, HugePages, PageKind, PlainData, HUGE_PAGE_SIZE,
    PAGE_SIZE,
};
pub use doctor::{doctor, Check, CheckStatus, DoctorOptions, DoctorReport};
pub use error::{GroupBlocker, Result, VfioError};
pub use iommu::{DmaDir, Iommu, IommuCounters, IommuError, IommuStats};
pub use iommufd::IommufdIommu;
pub use iova::{Iova, IovaAllocator, IovaError, IovaRange};
pub use irq::{Interrupts, IrqError, IrqKind, Notifier};
pub use mapping::{
    AppBuffer, BufPool, DmaMapper, DmaMode, IoBuffer, LazyConfig, MapError, MapFailed, Mapped,
    MapperConfig, MapperStats, PoolBuf, PoolConfig, QueueMapper, Returned,
};
pub use memlock::{memlock_needed, MemlockStatus};
pub use ranged::{RangeCalls, Ranged};
pub use setup::{bind, devices, unbind, BindOptions, BindOutcome, NvmeController};
pub use sysfs::{PciAddress, PciDevice, SysRoots};
