//! I/O virtual addresses and the IOVA allocator.
//!
//! An [`Iova`] is the address a device uses for DMA. It is a newtype so it can
//! never be confused with a host virtual address. [`IovaAllocator`] hands out
//! aligned IOVA ranges from the windows the IOMMU reports as valid, coalesces
//! freed ranges so space is reused, and fails with a typed error when no range
//! fits.

use std::collections::BTreeMap;
use std::fmt;

/// An I/O virtual address: what the device puts on the bus.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct Iova(pub u64);

impl Iova {
    /// The raw 64-bit value, as written into PRPs and queue base registers.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// This address plus a byte offset.
    #[inline]
    pub const fn add(self, offset: u64) -> Iova {
        Iova(self.0 + offset)
    }

    /// Whether the address is a multiple of `align` (a power of two).
    #[inline]
    pub const fn is_aligned(self, align: u64) -> bool {
        self.0 & (align - 1) == 0
    }
}

impl fmt::Debug for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Iova({:#x})", self.0)
    }
}

impl fmt::Display for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A half-open window `[start, end)` of usable IOVA space.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IovaRange {
    /// First usable address.
    pub start: u64,
    /// One past the last usable address.
    pub end: u64,
}

impl IovaRange {
    /// A window from `start` (inclusive) to `end` (exclusive).
    pub const fn new(start: u64, end: u64) -> Self {
        Self { start, end }
    }

    /// Convert from the kernel's inclusive `[start, last]` form.
    pub const fn from_inclusive(start: u64, last: u64) -> Self {
        Self {
            start,
            end: last.saturating_add(1),
        }
    }

    /// Size in bytes.
    pub const fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the window is empty.
    pub const fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Why an IOVA allocation or free failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IovaError {
    /// No free range of the requested size and alignment is left.
    #[error("IOVA space exhausted: no free range of {len:#x} bytes aligned to {align:#x} ({free:#x} bytes free in total, largest free range {largest:#x})")]
    Exhausted {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
        /// Total free bytes.
        free: u64,
        /// Largest free range.
        largest: u64,
    },
    /// Length zero, or alignment not a power of two.
    #[error("invalid IOVA request: length {len:#x}, alignment {align:#x} (length must be non-zero, alignment a power of two)")]
    InvalidRequest {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
    },
    /// A free of a range that is not (wholly) allocated.
    #[error("IOVA range {iova}+{len:#x} was not allocated")]
    NotAllocated {
        /// Start of the range.
        iova: Iova,
        /// Its length.
        len: u64,
    },
}

/// First-fit allocator over a set of valid IOVA windows.
///
/// Free space is kept as a map from start to end; allocation takes the
/// lowest-addressed free range that fits after alignment, and `free` merges
/// the returned range with its neighbours so fragmentation heals. `free`
/// accepts only a range that lies inside one valid window and is wholly
/// allocated: a hole between windows (x86's MSI window) or space beyond
/// them was never owned, and must never become allocatable.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    free: BTreeMap<u64, u64>,
    /// The valid windows (merged, start to end), as at creation.
    windows: BTreeMap<u64, u64>,
    allocated: u64,
}

impl IovaAllocator {
    /// An allocator over `ranges` (overlaps are merged; empty windows ignored).
    pub fn new(ranges: &[IovaRange]) -> Self {
        let mut a = Self {
            free: BTreeMap::new(),
            windows: BTreeMap::new(),
            allocated: 0,
        };
        for r in ranges.iter().filter(|r| !r.is_empty()) {
            a.insert_free(r.start, r.end);
        }
        a.windows = a.free.clone();
        a
    }

    /// Allocate `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<Iova, IovaError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(IovaError::InvalidRequest { len, align });
        }
        let mut found = None;
        for (&start, &end) in &self.free {
            let Some(aligned) = start.checked_add(align - 1).map(|v| v & !(align - 1)) else {
                continue;
            };
            if aligned.checked_add(len).is_some_and(|e| e <= end) {
                found = Some((start, end, aligned));
                break;
            }
        }
        let Some((start, end, aligned)) = found else {
            return Err(IovaError::Exhausted {
                len,
                align,
                free: self.free_bytes(),
                largest: self.free.iter().map(|(s, e)| e - s).max().unwrap_or(0),
            });
        };
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned);
        }
        if aligned + len < end {
            self.free.insert(aligned + len, end);
        }
        self.allocated += len;
        Ok(Iova(aligned))
    }

    /// Return `[iova, iova+len)` to the free space. It must have been
    /// allocated (wholly): inside one valid window and free of no byte;
    /// anything else is [`IovaError::NotAllocated`] and changes nothing.
    pub fn free(&mut self, iova: Iova, len: u64) -> Result<(), IovaError> {
        let start = iova.0;
        let not_allocated = IovaError::NotAllocated { iova, len };
        let Some(end) = start.checked_add(len).filter(|_| len > 0) else {
            return Err(not_allocated);
        };
        // Inside one window and overlapping no free range = wholly allocated.
        let in_window = self
            .windows
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &w_end)| end <= w_end);
        if !in_window || self.overlaps_free(start, end) {
            return Err(not_allocated);
        }
        self.insert_free(start, end);
        self.allocated = self.allocated.saturating_sub(len);
        Ok(())
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }

    fn overlaps_free(&self, start: u64, end: u64) -> bool {
        // The free range starting at or before `start`, and the first one after it.
        let before = self.free.range(..=start).next_back();
        let after = self.free.range(start..).next();
        before.is_some_and(|(_, &e)| e > start) || after.is_some_and(|(&s, _)| s < end)
    }

    fn insert_free(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.free.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.free.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.free.range(start..).next() {
            if s > end {
                break;
            }
            end = end.max(e);
            self.free.remove(&s);
        }
        self.free.insert(start, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn aligned_allocations_respect_windows() {
        let mut a = IovaAllocator::new(&[IovaRange::new(0x1000, 0x10_0000)]);
        let x = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(x, Iova(0x1000));
        let y = a.alloc(0x2000, 0x1_0000).unwrap();
        assert!(y.is_aligned(0x1_0000));
        assert!(y.raw() >= 0x2000);
        assert!(y.raw() + 0x2000 <= 0x10_0000);
    }

    #[test]
    fn reuses_freed_space_and_coalesces() {
        let mut a = IovaAllocator::new(&[IovaRange::new(0, 4 * MB)]);
        let v: Vec<_> = (0..4).map(|_| a.alloc(MB, 4096).unwrap()).collect();
        assert!(a.alloc(4096, 4096).is_err());
        // Free two neighbours; a 2 MiB request must now fit in the merged hole.
        a.free(v[1], MB).unwrap();
        a.free(v[2], MB).unwrap();
        assert_eq!(a.alloc(2 * MB, 4096).unwrap(), v[1]);
        assert_eq!(a.allocated_bytes(), 4 * MB);
    }

    #[test]
    fn exhaustion_is_a_typed_error() {
        let mut a = IovaAllocator::new(&[IovaRange::new(0, MB)]);
        a.alloc(MB / 2, 4096).unwrap();
        let e = a.alloc(MB, 4096).unwrap_err();
        assert!(
            matches!(e, IovaError::Exhausted { free, largest, .. } if free == MB / 2 && largest == MB / 2)
        );
        assert!(e.to_string().contains("exhausted"));
    }

    #[test]
    fn holes_between_windows_are_never_used() {
        // Like x86's MSI window at 0xfee00000: two windows with a reserved hole.
        let mut a = IovaAllocator::new(&[
            IovaRange::from_inclusive(0, 0xfedf_ffff),
            IovaRange::from_inclusive(0xfef0_0000, 0xffff_ffff),
        ]);
        a.alloc(0xfed0_0000, 4096).unwrap();
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert!(
            x.raw() >= 0xfef0_0000,
            "allocated inside the reserved hole: {x:?}"
        );
    }

    #[test]
    fn double_free_and_bad_requests_are_rejected() {
        let mut a = IovaAllocator::new(&[IovaRange::new(0, MB)]);
        let x = a.alloc(4096, 4096).unwrap();
        a.free(x, 4096).unwrap();
        assert_eq!(
            a.free(x, 4096),
            Err(IovaError::NotAllocated { iova: x, len: 4096 })
        );
        assert!(matches!(
            a.alloc(0, 4096),
            Err(IovaError::InvalidRequest { .. })
        ));
        assert!(matches!(
            a.alloc(4096, 3),
            Err(IovaError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn fragmentation_then_full_reuse() {
        let mut a = IovaAllocator::new(&[IovaRange::new(0, 64 * 4096)]);
        let v: Vec<_> = (0..64).map(|_| a.alloc(4096, 4096).unwrap()).collect();
        for x in v.iter().step_by(2) {
            a.free(*x, 4096).unwrap();
        }
        assert!(a.alloc(8192, 4096).is_err(), "only single-page holes exist");
        for x in v.iter().skip(1).step_by(2) {
            a.free(*x, 4096).unwrap();
        }
        assert_eq!(a.free_bytes(), 64 * 4096);
        assert_eq!(a.alloc(64 * 4096, 4096).unwrap(), Iova(0));
    }

    /// Issue 15 item 4: 16 and 64 KiB granules (arm64 SMMU) in windows
    /// whose bounds are only 4 KiB aligned: every range is aligned, inside
    /// a window, and the space heals back after frees.
    #[test]
    fn large_granules_in_windows_not_aligned_to_them() {
        // (granule, whole aligned granules the two windows hold)
        for (g, fit) in [(16 << 10, 5 + 8), (64 << 10u64, 4 + 8)] {
            let windows = [
                IovaRange::new(0x10_3000, 0x10_3000 + 5 * g + 0x1000),
                IovaRange::new(0x4000_1000, 0x4000_1000 + 9 * g),
            ];
            let mut a = IovaAllocator::new(&windows);
            let total = a.free_bytes();
            let mut got = Vec::new();
            while let Ok(x) = a.alloc(g, g) {
                assert!(x.is_aligned(g), "{x:?} not aligned to {g:#x}");
                assert!(windows
                    .iter()
                    .any(|w| w.start <= x.raw() && x.raw() + g <= w.end));
                got.push(x);
            }
            assert_eq!(got.len(), fit, "granule {g:#x}");
            for x in got {
                a.free(x, g).unwrap();
            }
            assert_eq!(a.free_bytes(), total);
            assert_eq!(a.allocated_bytes(), 0);
        }
    }

    /// Issue 27 item 9 (e): a range the allocator never owned (x86's MSI
    /// hole between the two windows, or beyond them) is not "allocated":
    /// freeing it must fail, or the next alloc hands out an IOVA outside
    /// every valid window.
    #[test]
    fn freeing_a_range_it_never_owned_is_refused() {
        let windows = [
            IovaRange::new(0x10_0000, 0xfee0_0000),
            IovaRange::new(0xfef0_0000, 1 << 48),
        ];
        let mut a = IovaAllocator::new(&windows);
        let hole = Iova(0xfee0_0000);
        assert_eq!(
            a.free(hole, 0x10_0000),
            Err(IovaError::NotAllocated {
                iova: hole,
                len: 0x10_0000
            })
        );
        // Straddling a window's edge, below the first window, past the
        // last, and a length that overflows.
        for (iova, len) in [
            (0xfedf_f000, 0x2000),
            (0, 0x1000),
            (0xf_0000, 0x2_0000),
            (1 << 48, 0x1000),
            ((1 << 48) - 0x1000, 0x2000),
            (u64::MAX - 0xfff, 0x2000),
        ] {
            assert_eq!(
                a.free(Iova(iova), len),
                Err(IovaError::NotAllocated {
                    iova: Iova(iova),
                    len
                }),
                "{iova:#x}+{len:#x}"
            );
        }
        // Nothing was added: allocations stay inside the windows.
        a.alloc(0xfed0_0000, 4096).unwrap();
        let x = a.alloc(0x20_0000, 4096).unwrap();
        assert!(x.raw() >= 0xfef0_0000, "allocated in the MSI hole: {x:?}");
        assert_eq!(
            a.free_bytes(),
            windows.iter().map(|w| w.len()).sum::<u64>() - 0xfed0_0000 - 0x20_0000
        );
        // Real allocations still free, also one ending at a window's end.
        a.free(x, 0x20_0000).unwrap();
        a.free(Iova(0x10_0000), 0xfed0_0000).unwrap();
        assert_eq!(a.allocated_bytes(), 0);
    }
}
