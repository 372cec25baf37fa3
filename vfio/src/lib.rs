//! # mcqio-vfio: VFIO, DMA memory and the IOMMU
//!
//! The lowest layer of mcqio. It opens an NVMe controller through Linux VFIO
//! (container → group → device), maps its BAR0, and owns DMA memory:
//!
//! - [`Iova`] and [`IovaAllocator`]: device addresses and the allocator that
//!   hands them out from the IOMMU's valid windows.
//! - [`Iommu`]: the IOMMU seam. VFIO's type1 container implements it; the fake
//!   IOMMU in `mcqio-fixtures` implements it for tests.
//! - [`DmaSpace`] and [`DmaRegion`]: pinned memory mapped at an IOVA, freed in
//!   the right order on drop. **Read the DMA contract in [`dma`]**: the device
//!   writes DMA memory concurrently, so no `&`/`&mut` reference is ever formed
//!   over it; access is through raw pointers and volatile copies.
//! - [`Backend`] and [`Mmio`]: the hardware seam the engine drives.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod backend;
pub mod dma;
pub mod iommu;
pub mod iova;
pub mod mapping;

pub use backend::{Backend, DoorbellHook, Mmio};
pub use dma::{
    DmaError, DmaRegion, DmaSpace, HugePages, PageKind, PlainData, HUGE_PAGE_SIZE, PAGE_SIZE,
};
pub use iommu::{DmaDir, Iommu, IommuCounters, IommuError, IommuStats};
pub use iova::{Iova, IovaAllocator, IovaError, IovaRange};
pub use mapping::{
    AppBuffer, BufPool, DmaMapper, DmaMode, IoBuffer, LazyConfig, MapError, MapFailed, Mapped,
    MapperConfig, MapperStats, PoolBuf, PoolConfig, QueueMapper, Returned,
};
