//! DMA memory: pinned host pages mapped into an IOMMU.
//!
//! [`DmaSpace`] pairs an [`Iommu`] with an [`IovaAllocator`]. [`DmaSpace::alloc`]
//! returns a [`DmaRegion`]: anonymous memory (2 MiB huge pages when the system
//! has them free, 4 KiB pages otherwise), locked, mapped at a fresh IOVA. Drop
//! unmaps it from the IOMMU first, then returns the IOVA, then frees the
//! memory — in that order, so the device can never reach freed memory.
//!
//! # The DMA memory contract
//!
//! The device reads and writes a mapped region concurrently with the CPU. A
//! Rust `&[u8]` or `&mut [u8]` over it would promise the compiler that nobody
//! else changes (or reads) the bytes, which is false, so creating one is
//! undefined behaviour. `DmaRegion` therefore never hands out references: it
//! hands out raw pointers ([`DmaRegion::as_ptr`]) and copies in and out with
//! volatile accesses ([`DmaRegion::read_bytes`], [`DmaRegion::write_bytes`],
//! [`DmaRegion::read_obj`], [`DmaRegion::write_obj`]). Those copies take
//! `&mut DmaRegion`, so on the CPU side two threads never reach the same
//! bytes through safe code ([`DmaRegion`] docs). Ordering against the
//! device (fences before doorbells, after phase checks) is the caller's job.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::iommu::{DmaDir, Iommu, IommuError};
use crate::iova::{Iova, IovaAllocator, IovaError};

/// 4 KiB: the base page and the NVMe memory page size we use.
pub const PAGE_SIZE: usize = 4096;
/// 2 MiB: the huge page size we try first.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Why DMA memory could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// Anonymous memory could not be mapped.
    #[error("cannot allocate {len} bytes of DMA memory: {source}")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// Memory could not be locked (pinned).
    #[error("cannot lock {len} bytes of DMA memory ({source}); RLIMIT_MEMLOCK is {limit}: raise it (ulimit -l, or /etc/security/limits.conf) — run `mcqio-perf doctor` for details")]
    Lock {
        /// Bytes asked for.
        len: usize,
        /// The current soft RLIMIT_MEMLOCK, in a readable form.
        limit: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// No IOVA space for the region.
    #[error(transparent)]
    Iova(#[from] IovaError),
    /// The IOMMU refused the mapping.
    #[error(transparent)]
    Iommu(#[from] IommuError),
    /// A zero-length request.
    #[error("zero-length DMA allocation")]
    ZeroLength,
    /// Out-of-bounds access to a region.
    #[error("access of {len} bytes at offset {offset} is outside a {size}-byte DMA region")]
    OutOfBounds {
        /// Offset into the region.
        offset: usize,
        /// Access length.
        len: usize,
        /// Region size.
        size: usize,
    },
}

/// Which page size backs a region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// 2 MiB hugetlb pages.
    Huge2M,
    /// Ordinary 4 KiB pages.
    Base4K,
}

/// Page-size policy of a [`DmaSpace`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Try 2 MiB pages for allocations of 2 MiB or more, fall back to 4 KiB.
    Prefer,
    /// Always use 4 KiB pages.
    Never,
}

/// Anonymous, locked host memory that owns its mapping (the one place that
/// `mmap`s and `munmap`s memory for DMA regions and application buffers).
#[derive(Debug)]
pub(crate) struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    kind: PageKind,
}

// SAFETY: `HostMemory` is an owned anonymous mapping; it hands out only raw
// pointers, and every access through them is in `unsafe` code of its owners
// (`DmaRegion`'s accessors need `&mut DmaRegion`; `AppBuffer` writes need
// `&mut AppBuffer`), so moving or sharing the owner between threads cannot
// create a data race by itself.
unsafe impl Send for HostMemory {}
// SAFETY: see `Send`; `&HostMemory` exposes nothing but the pointer and length.
unsafe impl Sync for HostMemory {}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

fn memlock_limit() -> String {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, owned `rl`.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return "unknown".into();
    }
    if rl.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} KiB", rl.rlim_cur / 1024)
    }
}

impl HostMemory {
    /// Start of the mapping.
    #[inline]
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping (a multiple of the page size).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn new(len: usize, policy: HugePages, lock: bool) -> Result<Self, DmaError> {
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        if policy == HugePages::Prefer && len >= HUGE_PAGE_SIZE {
            let hlen = round_up(len, HUGE_PAGE_SIZE);
            if let Ok(m) = Self::mmap(
                hlen,
                libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
                PageKind::Huge2M,
                lock,
            ) {
                return Ok(m);
            }
            // No free huge pages: fall through to base pages, never fail here.
        }
        Self::mmap(round_up(len, PAGE_SIZE), 0, PageKind::Base4K, lock)
    }

    fn mmap(len: usize, extra: libc::c_int, kind: PageKind, lock: bool) -> Result<Self, DmaError> {
        // SAFETY: an anonymous private mapping with a null hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DmaError::Alloc {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        let mem = HostMemory {
            ptr: NonNull::new(p.cast()).expect("mmap returned null without MAP_FIXED"),
            len,
            kind,
        };
        if !lock {
            return Ok(mem);
        }
        // SAFETY: `mem.ptr..+len` is the mapping just created and owned by `mem`.
        if unsafe { libc::mlock(p, len) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(DmaError::Lock {
                len,
                limit: memlock_limit(),
                source,
            });
        }
        Ok(mem)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr..+len` is the mapping this value created and still owns;
        // every IOMMU mapping of it was removed before (DmaRegion::drop order).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An IOMMU domain plus its IOVA allocator: where DMA regions come from.
///
/// Every space has a process-unique [`id`](DmaSpace::id). Something that
/// must name its space without keeping it alive (a [`Mapped`](crate::Mapped))
/// records the id, not the address: a space dropped and another allocated at
/// the same address are different IOMMU domains.
pub struct DmaSpace {
    id: u64,
    iommu: Arc<dyn Iommu>,
    iova: Mutex<IovaAllocator>,
    huge: HugePages,
}

impl std::fmt::Debug for DmaSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaSpace")
            .field("id", &self.id)
            .field("huge", &self.huge)
            .finish_non_exhaustive()
    }
}

/// Source of [`DmaSpace::id`]s. 64 bits cannot wrap in any process lifetime
/// (one new space per nanosecond would take 584 years).
static NEXT_SPACE_ID: AtomicU64 = AtomicU64::new(1);

impl DmaSpace {
    /// A DMA space over `iommu`, allocating IOVAs from its valid ranges.
    pub fn new(iommu: Arc<dyn Iommu>, huge: HugePages) -> Arc<Self> {
        let ranges = iommu.valid_ranges();
        Arc::new(Self {
            id: NEXT_SPACE_ID.fetch_add(1, Ordering::Relaxed),
            iommu,
            iova: Mutex::new(IovaAllocator::new(&ranges)),
            huge,
        })
    }

    /// This space's process-unique id (never 0, never reused).
    #[inline]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The IOMMU behind this space.
    pub fn iommu(&self) -> &Arc<dyn Iommu> {
        &self.iommu
    }

    /// Allocate, pin and map `len` bytes (rounded up to the page size).
    pub fn alloc(self: &Arc<Self>, len: usize, dir: DmaDir) -> Result<DmaRegion, DmaError> {
        let mem = HostMemory::new(len, self.huge, !self.iommu.pins_pages())?;
        let align = match mem.kind {
            PageKind::Huge2M => HUGE_PAGE_SIZE,
            PageKind::Base4K => PAGE_SIZE,
        } as u64;
        let iova = self.alloc_iova(mem.len as u64, align)?;
        // SAFETY: `mem` is owned by the region we build below and outlives the
        // mapping: DmaRegion::drop unmaps before `mem` is dropped.
        if let Err(e) = unsafe { self.iommu.map(iova, mem.ptr, mem.len, dir) } {
            let _ = self.free_iova(iova, mem.len as u64);
            return Err(e.into());
        }
        Ok(DmaRegion {
            space: Arc::clone(self),
            mem: ManuallyDrop::new(mem),
            iova,
            dir,
        })
    }

    /// Reserve an IOVA range without mapping anything (for per-queue windows
    /// of temporary mappings).
    pub fn alloc_iova(&self, len: u64, align: u64) -> Result<Iova, IovaError> {
        self.iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(len, align)
    }

    /// Return an IOVA range reserved with [`DmaSpace::alloc_iova`].
    pub fn free_iova(&self, iova: Iova, len: u64) -> Result<(), IovaError> {
        self.iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(iova, len)
    }
}

/// Pinned host memory mapped at an IOVA; unmapped and freed on drop.
///
/// See the module docs for why this type hands out no references.
///
/// # Who may touch the bytes
///
/// Every accessor that reads or writes the region's bytes takes `&mut self`:
/// on the CPU side a region has one user at a time, so safe code cannot race
/// with itself (a volatile access racing with another access is a data race
/// like any other). A shared `&DmaRegion` (or an `Arc<DmaRegion>`, as inside
/// a `DmaBuf` or a buffer pool) gives addresses and sizes only; whoever
/// shares a region and touches its memory does it through
/// [`as_ptr`](Self::as_ptr) in `unsafe` code that states why no other access
/// overlaps.
///
/// ```
/// use mcqio_vfio::{DmaError, DmaRegion};
/// fn stamp(region: &mut DmaRegion) -> Result<u32, DmaError> {
///     region.write_obj(0, 7u32)?;
///     region.read_obj(0)
/// }
/// # let _ = stamp;
/// ```
///
/// Two threads sharing a region can therefore not write it through safe code:
///
/// ```compile_fail,E0596
/// use std::sync::Arc;
/// use mcqio_vfio::DmaRegion;
/// fn race(region: Arc<DmaRegion>) {
///     let other = Arc::clone(&region);
///     let t = std::thread::spawn(move || other.write_bytes(0, &[1]));
///     region.write_bytes(0, &[2]).unwrap();
///     t.join().unwrap().unwrap();
/// }
/// ```
///
/// nor read it while another thread may write it:
///
/// ```compile_fail,E0596
/// use mcqio_vfio::DmaRegion;
/// fn peek(region: &DmaRegion) -> u32 {
///     region.read_obj(0).unwrap()
/// }
/// ```
pub struct DmaRegion {
    space: Arc<DmaSpace>,
    mem: ManuallyDrop<HostMemory>,
    iova: Iova,
    dir: DmaDir,
}

impl std::fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRegion")
            .field("iova", &self.iova)
            .field("len", &self.mem.len)
            .field("pages", &self.mem.kind)
            .field("dir", &self.dir)
            .finish()
    }
}

impl DmaRegion {
    /// The device-visible address of byte 0.
    #[inline]
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Host pointer to byte 0. Access through it must be volatile or otherwise
    /// synchronised with the device (module docs).
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.mem.ptr
    }

    /// Size in bytes (a multiple of the page size).
    #[inline]
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always false: regions are never empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Which pages back the region.
    pub fn page_kind(&self) -> PageKind {
        self.mem.kind
    }

    /// The direction the region was mapped with.
    pub fn dir(&self) -> DmaDir {
        self.dir
    }

    /// The space the region belongs to.
    pub fn space(&self) -> &Arc<DmaSpace> {
        &self.space
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.mem.len => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len,
                size: self.mem.len,
            }),
        }
    }

    /// Copy `dst.len()` bytes out of the region starting at `offset`.
    ///
    /// Takes `&mut self` although it only reads: a read racing with another
    /// thread's write is as much a data race as two writes (type docs).
    pub fn read_bytes(&mut self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, dst.len())?;
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: bounds checked above; the region is mapped for `self`'s
            // lifetime; `&mut self` means no other CPU-side access through
            // this region's accessors overlaps (shared holders only get
            // pointers, type docs); a volatile byte read never forms a
            // reference to memory the device may write.
            *b = unsafe { self.mem.ptr.as_ptr().add(offset + i).read_volatile() };
        }
        Ok(())
    }

    /// Copy `src` into the region starting at `offset`.
    pub fn write_bytes(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.check(offset, src.len())?;
        for (i, b) in src.iter().enumerate() {
            // SAFETY: bounds checked above; see `read_bytes`.
            unsafe { self.mem.ptr.as_ptr().add(offset + i).write_volatile(*b) };
        }
        Ok(())
    }

    /// Read a plain-data value at `offset` (unaligned allowed).
    ///
    /// `T` must be valid for any bit pattern (integers, `#[repr(C)]` structs of
    /// them). `&mut self` for the same reason as [`read_bytes`](Self::read_bytes).
    pub fn read_obj<T: Copy + PlainData>(&mut self, offset: usize) -> Result<T, DmaError> {
        self.check(offset, std::mem::size_of::<T>())?;
        // SAFETY: bounds checked; `T: PlainData` is valid for every bit pattern;
        // `&mut self` excludes overlapping CPU access (see `read_bytes`); the
        // volatile read copies without forming a reference.
        Ok(unsafe { std::ptr::read_volatile(self.mem.ptr.as_ptr().add(offset).cast::<T>()) })
    }

    /// Write a plain-data value at `offset`.
    pub fn write_obj<T: Copy + PlainData>(&mut self, offset: usize, v: T) -> Result<(), DmaError> {
        self.check(offset, std::mem::size_of::<T>())?;
        // SAFETY: bounds checked; see `read_obj`.
        unsafe { std::ptr::write_volatile(self.mem.ptr.as_ptr().add(offset).cast::<T>(), v) };
        Ok(())
    }

    /// Fill the whole region with `byte`.
    pub fn fill(&mut self, byte: u8) {
        let word = u64::from_ne_bytes([byte; 8]);
        let base = self.mem.ptr.as_ptr().cast::<u64>();
        for i in 0..self.mem.len / 8 {
            // SAFETY: the mapping is page-aligned and a multiple of 8 bytes long,
            // owned by `self`; `&mut self` excludes overlapping CPU access
            // (see `read_bytes`); volatile stores form no reference.
            unsafe { base.add(i).write_volatile(word) };
        }
    }
}

/// Marker for types valid for every bit pattern, with no padding or pointers.
///
/// # Safety
///
/// Implement only for `#[repr(C)]`/primitive types without padding whose every
/// bit pattern is a valid value.
pub unsafe trait PlainData: Copy + 'static {}

macro_rules! plain {
    ($($t:ty),*) => { $(
        // SAFETY: primitive integer: every bit pattern is valid, no padding.
        unsafe impl PlainData for $t {}
    )* };
}
plain!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);
// SAFETY: arrays of plain data are plain data (no padding between elements).
unsafe impl<T: PlainData, const N: usize> PlainData for [T; N] {}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        // Order matters: unmap (the device can no longer reach the pages), then
        // release the IOVA for reuse, then free the pages.
        let len = self.mem.len as u64;
        match self.space.iommu.unmap(self.iova, len) {
            Ok(()) => {
                let _ = self.space.free_iova(self.iova, len);
                // SAFETY: `mem` is dropped exactly once, here, after the unmap.
                unsafe { ManuallyDrop::drop(&mut self.mem) };
            }
            Err(e) => {
                // The IOMMU may still point at the pages: leak them (and the
                // IOVA) rather than hand memory the device can reach back to
                // the system.
                log::error!("leaking DMA region at {}: {e}", self.iova);
            }
        }
    }
}
