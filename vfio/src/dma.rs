//! DMA memory: pinned host pages mapped into an IOMMU.
//!
//! [`DmaSpace`] pairs an [`Iommu`] with an [`IovaAllocator`]. [`DmaSpace::alloc`]
//! returns a [`DmaRegion`]: anonymous memory (2 MiB huge pages when the system
//! has them free, the host's base pages otherwise), locked, mapped at a fresh
//! IOVA. Drop unmaps it from the IOMMU first, then returns the IOVA, then
//! frees the memory — in that order, so the device can never reach freed
//! memory.
//!
//! # Three page sizes
//!
//! - The **controller page** ([`PAGE_SIZE`], 4 KiB): NVMe's memory page size
//!   (CC.MPS = 0). PRP entries, queue bases and PRP lists are in these units,
//!   whatever the host does.
//! - The **host page** ([`host_page_size`]): what `mmap` hands out — 4 KiB on
//!   x86, 4, 16 or 64 KiB on arm64 (Android uses 16 KiB).
//! - The **IOMMU granule** ([`Iommu::min_page_size`]): the smallest unit a
//!   map or unmap may cover, at an IOVA and host address aligned to it (VFIO
//!   type1 refuses anything else); 64 KiB on an SMMU set up that way.
//!
//! A space rounds every allocation up to, and aligns its host address and
//! IOVA to, the largest of the three ([`DmaSpace::granule`]), so one 16 KiB
//! host page holds four controller pages and a 64 KiB region is one IOMMU
//! page. [`DmaSpace::with_host_page_size`] lets tests on a 4 KiB-page machine
//! run with the rounding and alignment of a 16 KiB or 64 KiB kernel.
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
//! The memory itself is a [`memmap2::MmapRaw`], which never gives out
//! references either.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memmap2::{MmapOptions, MmapRaw};

use crate::iommu::{DmaDir, Iommu, IommuError};
use crate::iova::{Iova, IovaAllocator, IovaError};

/// 4 KiB: the NVMe controller's memory page (CC.MPS = 0), the unit of PRP
/// entries. Not the host's page size: see [`host_page_size`].
pub const PAGE_SIZE: usize = 4096;
/// 2 MiB: the huge page size we try first.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;
/// `log2(HUGE_PAGE_SIZE)`, the page-size field of `MAP_HUGETLB` (`MAP_HUGE_2MB`).
const HUGE_PAGE_SHIFT: u8 = 21;

/// The largest base page of a Linux kernel we run on (arm64 with 64 KiB pages).
const MAX_HOST_PAGE_SIZE: usize = 64 << 10;

/// The host's base page size (`sysconf(_SC_PAGESIZE)`), read once and cached.
///
/// 4 KiB on x86-64; 4, 16 or 64 KiB on arm64, depending on the kernel.
pub fn host_page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a system constant; it has no preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        match usize::try_from(v) {
            Ok(p) if p.is_power_of_two() => p,
            // Cannot happen on Linux (POSIX requires the value). If it did,
            // rounding to the largest base page any supported kernel uses
            // is correct on all of them, only wasteful.
            _ => MAX_HOST_PAGE_SIZE,
        }
    })
}

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
    /// A page size (host page override, or the IOMMU's reported granule)
    /// that is not a power of two.
    #[error("page size {page:#x} is not a power of two")]
    BadPageSize {
        /// The size given.
        page: usize,
    },
    /// The allocation, rounded up to its page size, does not fit the address space.
    #[error("DMA allocation of {len} bytes overflows when rounded up to {align}-byte pages")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The page size it is rounded to.
        align: usize,
    },
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
    /// The host's base pages ([`host_page_size`]: 4, 16 or 64 KiB).
    Base,
}

/// Page-size policy of a [`DmaSpace`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Try 2 MiB pages for allocations of 2 MiB or more, fall back to base pages.
    Prefer,
    /// Always use the host's base pages.
    Never,
}

/// Anonymous, locked host memory that owns its mapping (the one place that
/// maps memory for DMA regions and application buffers).
///
/// The usable part starts at `ptr`, aligned to what the caller asked for;
/// when that is more than the host page, the mapping is larger by up to one
/// alignment unit and the slack around `ptr..ptr+len` stays mapped (and
/// owned) but unused, so nothing else can ever be placed in those pages.
#[derive(Debug)]
pub(crate) struct HostMemory {
    /// The whole mapping; unmapped when dropped. Never gives out references.
    map: MmapRaw,
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

fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_next_multiple_of(to)
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
    /// Start of the usable memory (aligned as asked).
    #[inline]
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the usable memory (a multiple of the alignment asked for).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The whole mapping this value owns, as `(start address, length)`:
    /// `ptr()..ptr()+len()` plus any alignment slack around it.
    #[inline]
    pub(crate) fn owned(&self) -> (usize, usize) {
        (self.map.as_ptr() as usize, self.map.len())
    }

    /// `len` bytes (rounded up to `align`, a power of two of at least the
    /// host page) at an `align`-aligned address; 2 MiB huge pages when the
    /// policy prefers them, `len` is at least 2 MiB and `align` allows.
    pub(crate) fn new(
        len: usize,
        policy: HugePages,
        lock: bool,
        align: usize,
    ) -> Result<Self, DmaError> {
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let align = align.max(host_page_size());
        if !align.is_power_of_two() {
            return Err(DmaError::BadPageSize { page: align });
        }
        if policy == HugePages::Prefer && len >= HUGE_PAGE_SIZE && align <= HUGE_PAGE_SIZE {
            if let Some(hlen) = round_up(len, HUGE_PAGE_SIZE) {
                if let Ok(m) = Self::mmap(hlen, HUGE_PAGE_SIZE, PageKind::Huge2M, lock) {
                    return Ok(m);
                }
            }
            // No free huge pages: fall through to base pages, never fail here.
        }
        let blen = round_up(len, align).ok_or(DmaError::TooLarge { len, align })?;
        Self::mmap(blen, align, PageKind::Base, lock)
    }

    fn mmap(len: usize, align: usize, kind: PageKind, lock: bool) -> Result<Self, DmaError> {
        // Base pages come host-page aligned: reserve room to slide the start
        // to `align` when that is coarser. Huge pages come aligned to their size.
        let slack = match kind {
            PageKind::Base => align - host_page_size().min(align),
            PageKind::Huge2M => 0,
        };
        let total = len
            .checked_add(slack)
            .ok_or(DmaError::TooLarge { len, align })?;
        let mut opts = MmapOptions::new();
        opts.len(total).populate();
        if kind == PageKind::Huge2M {
            opts.huge(Some(HUGE_PAGE_SHIFT));
        }
        // An anonymous private mapping: memmap2 passes no address hint and
        // no MAP_FIXED, and converting to `MmapRaw` right away means no
        // reference to the bytes is ever formed.
        let map = MmapRaw::from(
            opts.map_anon()
                .map_err(|source| DmaError::Alloc { len: total, source })?,
        );
        let base = map.as_mut_ptr();
        let offset = align.wrapping_sub(base as usize) & (align - 1);
        if offset > slack {
            // The kernel placed base pages off the host page, or huge pages
            // off their size: never seen, but the slice below needs it.
            return Err(DmaError::Alloc {
                len: total,
                source: std::io::Error::other(format!(
                    "mmap returned {base:p}, which cannot be aligned to {align:#x} within the mapping"
                )),
            });
        }
        // SAFETY: `offset <= slack` (checked above), so `base + offset .. +
        // len` lies inside the `total = len + slack`-byte mapping.
        let p = unsafe { base.add(offset) };
        let mem = HostMemory {
            ptr: NonNull::new(p).ok_or_else(|| DmaError::Alloc {
                len: total,
                source: std::io::Error::other("mmap returned a null mapping"),
            })?,
            map,
            len,
            kind,
        };
        if !lock {
            return Ok(mem);
        }
        // Only the usable part is locked (charged to RLIMIT_MEMLOCK); the
        // slack is never mapped for DMA.
        // SAFETY: `p..+len` lies in the mapping owned by `mem` (see above).
        if unsafe { libc::mlock(p.cast(), len) } != 0 {
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

// Drop: `MmapRaw` unmaps the whole mapping (which also unlocks it). Every
// IOMMU mapping of it was removed before (DmaRegion::drop order; mappers
// drop an AppBuffer only after its unmap returned).

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
    /// The host page size used for rounding and alignment.
    host_page: usize,
    /// max(host page, IOMMU granule, controller page); see [`DmaSpace::granule`].
    granule: usize,
}

impl std::fmt::Debug for DmaSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaSpace")
            .field("id", &self.id)
            .field("huge", &self.huge)
            .field("host_page", &self.host_page)
            .field("granule", &self.granule)
            .finish_non_exhaustive()
    }
}

/// Source of [`DmaSpace::id`]s. 64 bits cannot wrap in any process lifetime
/// (one new space per nanosecond would take 584 years).
static NEXT_SPACE_ID: AtomicU64 = AtomicU64::new(1);

impl DmaSpace {
    /// A DMA space over `iommu`, allocating IOVAs from its valid ranges, with
    /// this host's page size ([`host_page_size`]).
    pub fn new(iommu: Arc<dyn Iommu>, huge: HugePages) -> Arc<Self> {
        Self::build(iommu, huge, host_page_size())
    }

    /// Like [`DmaSpace::new`], but round and align as if the host page were
    /// `host_page` bytes (a power of two; never less than the real page).
    ///
    /// On a 4 KiB-page machine this gives the layout a 16 KiB or 64 KiB
    /// arm64 kernel produces — every region a whole number of such pages, at
    /// host addresses and IOVAs aligned to them — so tests cover it without
    /// such a kernel. The memory still comes from the real `mmap` (placed
    /// at the coarser alignment), so it does not model how that kernel's
    /// allocator, huge pages or VFIO behave.
    pub fn with_host_page_size(
        iommu: Arc<dyn Iommu>,
        huge: HugePages,
        host_page: usize,
    ) -> Result<Arc<Self>, DmaError> {
        if !host_page.is_power_of_two() {
            return Err(DmaError::BadPageSize { page: host_page });
        }
        Ok(Self::build(iommu, huge, host_page.max(host_page_size())))
    }

    fn build(iommu: Arc<dyn Iommu>, huge: HugePages, host_page: usize) -> Arc<Self> {
        let ranges = iommu.valid_ranges();
        // A granule that is not a power of two (a broken `Iommu`) is kept
        // and refused by every allocation with a typed error.
        let granule = host_page.max(iommu.min_page_size()).max(PAGE_SIZE);
        Arc::new(Self {
            id: NEXT_SPACE_ID.fetch_add(1, Ordering::Relaxed),
            iommu,
            iova: Mutex::new(IovaAllocator::new(&ranges)),
            huge,
            host_page,
            granule,
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

    /// The host page size this space rounds to ([`host_page_size`], or the
    /// size given to [`DmaSpace::with_host_page_size`]).
    #[inline]
    pub fn host_page_size(&self) -> usize {
        self.host_page
    }

    /// The unit of every allocation and mapping in this space: the largest
    /// of the host page, the IOMMU's granule ([`Iommu::min_page_size`]) and
    /// the controller page ([`PAGE_SIZE`]). Regions are a multiple of it
    /// long, at host addresses and IOVAs aligned to it.
    #[inline]
    pub fn granule(&self) -> usize {
        self.granule
    }

    fn checked_granule(&self) -> Result<usize, DmaError> {
        if self.granule.is_power_of_two() {
            Ok(self.granule)
        } else {
            Err(DmaError::BadPageSize { page: self.granule })
        }
    }

    /// Allocate, pin and map `len` bytes (rounded up to the
    /// [granule](Self::granule), or to 2 MiB when huge pages back it).
    pub fn alloc(self: &Arc<Self>, len: usize, dir: DmaDir) -> Result<DmaRegion, DmaError> {
        let granule = self.checked_granule()?;
        let mem = HostMemory::new(len, self.huge, !self.iommu.pins_pages(), granule)?;
        let align = match mem.kind {
            PageKind::Huge2M => HUGE_PAGE_SIZE.max(granule),
            PageKind::Base => granule,
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
    /// of temporary mappings). `len` and `align` are raised to whole
    /// [granules](Self::granule) (a mapping placed in the range must be
    /// granule-aligned anyway); free the range with the same `len`.
    pub fn alloc_iova(&self, len: u64, align: u64) -> Result<Iova, IovaError> {
        let g = self.granule as u64;
        let (len, align) = match (len.checked_next_multiple_of(g), align.max(g)) {
            (Some(l), a) if g.is_power_of_two() => (l, a),
            _ => return Err(IovaError::InvalidRequest { len, align }),
        };
        self.iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(len, align)
    }

    /// Return an IOVA range reserved with [`DmaSpace::alloc_iova`] (the same
    /// `len` that was asked for).
    pub fn free_iova(&self, iova: Iova, len: u64) -> Result<(), IovaError> {
        let len = len
            .checked_next_multiple_of(self.granule as u64)
            .ok_or(IovaError::NotAllocated { iova, len })?;
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

    /// Size in bytes (a multiple of the space's [granule](DmaSpace::granule)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::testing::CountingIommu;

    const K: usize = 1024;

    fn space_over(granule: usize) -> (Arc<CountingIommu>, Arc<DmaSpace>) {
        let iommu = Arc::new(CountingIommu::new().with_min_page_size(granule));
        let space = DmaSpace::new(iommu.clone(), HugePages::Never);
        (iommu, space)
    }

    fn check_layout(r: &DmaRegion, asked: usize, unit: usize) {
        assert!(r.len() >= asked && r.len() % unit == 0, "{r:?}: length");
        assert!(r.iova().is_aligned(unit as u64), "{r:?}: IOVA");
        assert_eq!(
            r.as_ptr().as_ptr() as usize % unit,
            0,
            "{r:?}: host address"
        );
    }

    /// Issue 15 item 4: on an IOMMU with a 16 or 64 KiB granule (an arm64
    /// SMMU) every region is whole granules at aligned host addresses and
    /// IOVAs — before, lengths and addresses were 4 KiB-based and every map
    /// was refused — and dropping it leaves nothing mapped.
    #[test]
    fn regions_on_a_large_granule_iommu_are_whole_granules() {
        for granule in [16 * K, 64 * K] {
            let (iommu, space) = space_over(granule);
            let mut regions = Vec::new();
            for asked in [1, 4 * K, granule + 1, 3 * granule - 4 * K, 2 << 20] {
                let mut r = space
                    .alloc(asked, DmaDir::Bidirectional)
                    .unwrap_or_else(|e| panic!("{asked} bytes on a {granule}-byte granule: {e}"));
                check_layout(&r, asked, granule);
                let pattern: Vec<u8> = (0..r.len()).map(|i| (i % 251) as u8).collect();
                r.write_bytes(0, &pattern).unwrap();
                let mut seen = vec![0u8; r.len()];
                iommu.device_read(r.iova(), &mut seen).unwrap();
                assert!(seen == pattern, "the device sees the region's bytes");
                regions.push(r);
            }
            assert_eq!(space.granule(), granule);
            drop(regions);
            assert_eq!(iommu.live_mappings(), 0, "dropping unmaps everything");
            assert_eq!(iommu.counters().snapshot().mapped_bytes, 0);
            assert_eq!(iommu.faults(), 0);
        }
    }

    /// Issue 15 item 4: a space can round and align as a 16 or 64 KiB-page
    /// kernel would, on this machine, even over a 4 KiB-granule IOMMU.
    #[test]
    fn a_larger_host_page_rounds_and_aligns_regions() {
        for page in [16 * K, 64 * K] {
            let iommu = Arc::new(CountingIommu::new());
            let space =
                DmaSpace::with_host_page_size(iommu.clone(), HugePages::Never, page).unwrap();
            assert_eq!((space.host_page_size(), space.granule()), (page, page));
            let r = space.alloc(PAGE_SIZE, DmaDir::ToDevice).unwrap();
            check_layout(&r, PAGE_SIZE, page);
            assert_eq!(r.len(), page, "one controller page takes a whole host page");
            assert_eq!(r.page_kind(), PageKind::Base);
            let iova = space.alloc_iova(1, 1).unwrap();
            assert!(
                iova.is_aligned(page as u64),
                "IOVA windows are whole pages too"
            );
            space.free_iova(iova, 1).unwrap();
            drop(r);
            assert_eq!(iommu.live_mappings(), 0);
        }
        // Never below the real page, and never a non-power of two.
        let iommu: Arc<dyn Iommu> = Arc::new(CountingIommu::new());
        let small = DmaSpace::with_host_page_size(iommu.clone(), HugePages::Never, 1).unwrap();
        assert_eq!(small.host_page_size(), host_page_size());
        assert!(matches!(
            DmaSpace::with_host_page_size(iommu, HugePages::Never, 12 * K),
            Err(DmaError::BadPageSize { page }) if page == 12 * K
        ));
    }

    #[test]
    fn host_page_size_is_the_kernels() {
        // SAFETY: sysconf has no preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        assert_eq!(host_page_size() as libc::c_long, v);
        assert!(host_page_size().is_power_of_two());
    }

    /// An `Iommu` reporting a granule that is not a power of two gets typed
    /// errors, not misaligned maps.
    #[test]
    fn a_bad_iommu_granule_is_a_typed_error() {
        let (_iommu, space) = space_over(12 * K);
        assert!(matches!(
            space.alloc(4 * K, DmaDir::ToDevice),
            Err(DmaError::BadPageSize { page }) if page == 12 * K
        ));
        assert!(space.alloc_iova(4096, 4096).is_err());
    }

    /// Huge pages are unchanged: 2 MiB-aligned at 2 MiB (when the system
    /// has any free; otherwise base pages at the granule).
    #[test]
    fn huge_or_base_pages_on_a_large_granule() {
        let iommu = Arc::new(CountingIommu::new().with_min_page_size(64 * K));
        let space = DmaSpace::new(iommu.clone(), HugePages::Prefer);
        let r = space.alloc(2 << 20, DmaDir::Bidirectional).unwrap();
        match r.page_kind() {
            PageKind::Huge2M => check_layout(&r, 2 << 20, HUGE_PAGE_SIZE),
            PageKind::Base => check_layout(&r, 2 << 20, 64 * K),
        }
        drop(r);
        assert_eq!(iommu.live_mappings(), 0);
    }

    /// Issue 27 item 9 (e): the public `free_iova` refuses a range the
    /// space never handed out (the MSI hole), so no later reservation can
    /// land there.
    #[test]
    fn free_iova_of_the_msi_hole_is_not_allocated() {
        let iommu = Arc::new(CountingIommu::new().with_ranges(vec![
            crate::IovaRange::new(0x10_0000, 0xfee0_0000),
            crate::IovaRange::new(0xfef0_0000, 1 << 40),
        ]));
        let space = DmaSpace::new(Arc::clone(&iommu) as Arc<dyn Iommu>, HugePages::Never);
        let hole = Iova(0xfee0_0000);
        assert_eq!(
            space.free_iova(hole, 0x10_0000),
            Err(IovaError::NotAllocated {
                iova: hole,
                len: 0x10_0000
            })
        );
        let low = space.alloc_iova(0xfed0_0000, 4096).unwrap();
        let next = space.alloc_iova(0x10_0000, 4096).unwrap();
        assert!(
            next.raw() >= 0xfef0_0000,
            "reserved inside the MSI hole: {next:?}"
        );
        space.free_iova(next, 0x10_0000).unwrap();
        space.free_iova(low, 0xfed0_0000).unwrap();
    }
}
