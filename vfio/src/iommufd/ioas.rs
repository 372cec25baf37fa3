//! [`Ioas`]: the [`Iommu`] over an IOAS's two calls, map and unmap.
//!
//! What iommufd adds to the mapping layer lives here, apart from the device
//! and the file descriptors: the allowed ranges floored like type1's, the
//! unmap of coalesced runs with its "only so many bytes" check, the errno
//! hints, the counters. [`IoasCalls`] is the seam: the kernel's IOAS
//! ([`super::IommufdIommu`]) implements it with `IOMMU_IOAS_MAP`/`UNMAP`, and
//! the unit tests with an in-process IOAS that follows `iommufd.h`'s rules, so
//! a [`crate::DmaSpace`] and the strict and lazy mappers run over this code
//! without a kernel.

use std::io;
use std::ptr::NonNull;

use super::sys::IoasGeometry;
use crate::container::{coalesce, usable_iova_ranges};
use crate::iommu::{DmaDir, Iommu, IommuCounters, IommuError};
use crate::iova::{Iova, IovaRange};

/// The two calls of an IO address space.
///
/// # Safety
///
/// Implementors: after `unmap` returns `Ok(n)`, the device can no longer
/// reach the `n` bytes unmapped (the IOTLB has been synced), as
/// [`Iommu`]'s contract requires.
pub unsafe trait IoasCalls: Send + Sync {
    /// `IOMMU_IOAS_MAP` of `vaddr..vaddr+len` at the fixed `iova`.
    ///
    /// # Safety
    ///
    /// As [`Iommu::map`]: the memory stays allocated until an unmap covering
    /// it succeeds, and no reference is formed over it meanwhile.
    unsafe fn map(&self, iova: u64, vaddr: NonNull<u8>, len: u64, dir: DmaDir) -> io::Result<()>;

    /// `IOMMU_IOAS_UNMAP` of `[iova, iova+len)`: the bytes unmapped.
    fn unmap(&self, iova: u64, len: u64) -> io::Result<u64>;
}

/// An IOAS as an [`Iommu`].
#[derive(Debug)]
pub struct Ioas<C> {
    calls: C,
    ranges: Vec<IovaRange>,
    reported: Vec<IovaRange>,
    alignment: u64,
    counters: IommuCounters,
}

impl<C: IoasCalls> Ioas<C> {
    /// An IOAS whose geometry (read after the attach) is `geometry`.
    pub fn new(calls: C, geometry: IoasGeometry) -> Self {
        let ranges = usable_iova_ranges(Some(&geometry.ranges));
        log::debug!(
            "IOAS: IOVA alignment {:#x}, allowed ranges {:?}",
            geometry.alignment,
            geometry.ranges
        );
        Self {
            calls,
            ranges,
            reported: geometry.ranges,
            alignment: geometry.alignment,
            counters: IommuCounters::default(),
        }
    }

    /// The calls (the kernel's IOAS, or a test's).
    pub fn calls(&self) -> &C {
        &self.calls
    }

    /// The allowed ranges as reported.
    pub fn reported_ranges(&self) -> &[IovaRange] {
        &self.reported
    }

    /// The alignment a map's IOVA and length must have.
    pub fn iova_alignment(&self) -> u64 {
        self.alignment
    }

    /// Unmap `[iova, iova+len)`, which covers `n` whole mappings, with one call.
    fn unmap_run(&self, iova: Iova, len: u64, n: u64) -> Result<(), IommuError> {
        match self.calls.unmap(iova.raw(), len) {
            Ok(done) if done == len => {
                // iommufd tears each mapping (an "area") down with its own
                // iommu_unmap, and each of those syncs the IOTLB.
                self.counters.on_unmap(n, len, n);
                Ok(())
            }
            Ok(done) => {
                self.counters.on_unmap(0, done, u64::from(done > 0));
                Err(IommuError::Unmap {
                    iova,
                    len,
                    reason: format!("only {done:#x} bytes were mapped there"),
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Err(IommuError::Gone),
            Err(e) => Err(IommuError::Unmap {
                iova,
                len,
                reason: unmap_reason(&e),
            }),
        }
    }
}

/// The errno of a failed `IOMMU_IOAS_MAP`, with what to do about it.
pub fn map_reason(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            " — iommufd charges pinned pages to RLIMIT_MEMLOCK: raise it (`mcqio-perf doctor`)"
        }
        Some(libc::EEXIST) => " — the IOVA range is already mapped",
        Some(libc::EINVAL) => " — address or length not aligned to the IOAS's IOVA alignment",
        Some(libc::ENOENT) => " — outside the IOAS's allowed IOVA ranges, or the IOAS is gone",
        _ => "",
    };
    format!("{e}{hint}")
}

/// The errno of a failed `IOMMU_IOAS_UNMAP`, with what it means.
fn unmap_reason(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) => " — nothing was mapped there",
        Some(libc::EINVAL) => " — the range splits a mapping",
        _ => "",
    };
    format!("{e}{hint}")
}

// SAFETY: `unmap`/`unmap_many` return Ok only when every call to
// `IoasCalls::unmap` returned the full length, after which the device cannot
// reach that memory (`IoasCalls`' contract).
unsafe impl<C: IoasCalls> Iommu for Ioas<C> {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError> {
        // SAFETY: the caller upholds `Iommu::map`'s contract, which is
        // `IoasCalls::map`'s.
        match unsafe { self.calls.map(iova.raw(), vaddr, len as u64, dir) } {
            Ok(()) => {
                self.counters.on_map(len as u64);
                Ok(())
            }
            Err(e) => Err(IommuError::Map {
                iova,
                len,
                reason: map_reason(&e),
            }),
        }
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError> {
        if len == 0 {
            return Ok(());
        }
        self.unmap_run(iova, len, 1)
    }

    /// One `IOMMU_IOAS_UNMAP` per run of exactly adjacent ranges (a range
    /// that covers whole mappings unmaps all of them).
    fn unmap_many(&self, ranges: &[(Iova, u64)]) -> Result<(), IommuError> {
        coalesce(ranges)
            .into_iter()
            .try_for_each(|(iova, len, n)| self.unmap_run(iova, len, n))
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        self.ranges.clone()
    }

    fn min_page_size(&self) -> usize {
        // The IOVA alignment is at most the host page; DmaSpace rounds up to
        // the host page anyway, so report the larger.
        (self.alignment as usize).max(crate::host_page_size())
    }

    fn counters(&self) -> &IommuCounters {
        &self.counters
    }

    fn pins_pages(&self) -> bool {
        // IOMMU_IOAS_MAP pins every page it maps, charged to the user's
        // locked_vm (iommufd's default accounting).
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::dma::{DmaSpace, HugePages};
    use crate::mapping::{DmaMapper, LazyConfig, LazyMapper, StrictMapper};
    use crate::{AppBuffer, IoBuffer, PAGE_SIZE};

    /// An in-process IOAS that follows `iommufd.h`: a map at a fixed IOVA
    /// must not overlap a mapping (`EEXIST`) and must lie in an allowed
    /// range (`ENOENT`); an unmap must cover whole mappings (`EINVAL` if it
    /// cuts one, `ENOENT` if it covers none) and returns the bytes unmapped.
    /// `fail_unmaps` makes that many next unmaps fail with `EIO`.
    #[derive(Default)]
    struct FakeIoas {
        areas: Mutex<BTreeMap<u64, u64>>,
        allowed: Vec<IovaRange>,
        unmap_calls: AtomicU32,
        fail_unmaps: AtomicU32,
    }

    // SAFETY: the fake is not a device: nothing can reach memory through it.
    unsafe impl IoasCalls for Arc<FakeIoas> {
        unsafe fn map(&self, iova: u64, _: NonNull<u8>, len: u64, _: DmaDir) -> io::Result<()> {
            let end = iova + len;
            if !self.allowed.iter().any(|r| r.start <= iova && end <= r.end) {
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            let mut a = self.areas.lock().unwrap();
            let overlaps = a
                .range(..end)
                .next_back()
                .is_some_and(|(&s, &l)| s + l > iova);
            if overlaps {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            a.insert(iova, len);
            Ok(())
        }

        fn unmap(&self, iova: u64, len: u64) -> io::Result<u64> {
            self.unmap_calls.fetch_add(1, Ordering::Relaxed);
            if self
                .fail_unmaps
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let end = iova + len;
            let mut a = self.areas.lock().unwrap();
            let inside: Vec<(u64, u64)> = a
                .range(..end)
                .map(|(&s, &l)| (s, l))
                .filter(|&(s, l)| s + l > iova)
                .collect();
            if inside.iter().any(|&(s, l)| s < iova || s + l > end) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            if inside.is_empty() {
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            Ok(inside
                .iter()
                .map(|&(s, l)| a.remove(&s).map_or(0, |_| l))
                .sum())
        }
    }

    fn ioas() -> (Arc<FakeIoas>, Arc<Ioas<Arc<FakeIoas>>>) {
        // What VT-d reports for a fresh IOAS with a 48-bit address width.
        let ranges = vec![
            IovaRange::from_inclusive(0, 0xfedf_ffff),
            IovaRange::from_inclusive(0xfef0_0000, (1 << 48) - 1),
        ];
        let fake = Arc::new(FakeIoas {
            allowed: ranges.clone(),
            ..FakeIoas::default()
        });
        let geometry = IoasGeometry {
            ranges,
            alignment: PAGE_SIZE as u64,
        };
        (fake.clone(), Arc::new(Ioas::new(fake, geometry)))
    }

    fn app(pages: usize) -> IoBuffer {
        AppBuffer::new(pages * PAGE_SIZE).unwrap().into()
    }

    #[test]
    fn adjacent_unmaps_are_one_call_and_short_unmaps_are_errors() {
        let (fake, ioas) = ioas();
        let mem = vec![0u64; 4 * PAGE_SIZE / 8];
        let p = NonNull::new(mem.as_ptr() as *mut u8).unwrap();
        for i in 0..3u64 {
            let at = Iova(0x10_0000 + i * PAGE_SIZE as u64);
            // SAFETY: `mem` outlives every mapping of this test, and the fake
            // IOAS never touches it.
            unsafe { ioas.map(at, p, PAGE_SIZE, DmaDir::FromDevice) }.unwrap();
        }
        // A second map of the same IOVA: EEXIST, with the hint.
        // SAFETY: as above.
        let e = unsafe { ioas.map(Iova(0x10_0000), p, PAGE_SIZE, DmaDir::ToDevice) }.unwrap_err();
        assert!(e.to_string().contains("already mapped"), "{e}");
        let pg = PAGE_SIZE as u64;
        ioas.unmap_many(&[
            (Iova(0x10_0000 + 2 * pg), pg),
            (Iova(0x10_0000), pg),
            (Iova(0x10_0000 + pg), pg),
        ])
        .unwrap();
        assert_eq!(fake.unmap_calls.load(Ordering::Relaxed), 1);
        let s = ioas.counters().snapshot();
        assert_eq!(
            (s.maps, s.unmapped_ranges, s.unmap_calls, s.mapped_bytes),
            (3, 3, 1, 0)
        );
        // Nothing mapped there any more: an error that says so.
        let e = ioas.unmap(Iova(0x10_0000), pg).unwrap_err();
        assert!(e.to_string().contains("nothing was mapped there"), "{e}");
        // An unmap over one mapping and a hole reports the short length.
        // SAFETY: as above.
        unsafe { ioas.map(Iova(0x20_0000), p, PAGE_SIZE, DmaDir::FromDevice) }.unwrap();
        let e = ioas.unmap(Iova(0x20_0000 - pg), 2 * pg).unwrap_err();
        assert!(e.to_string().contains("only 0x1000 bytes"), "{e}");
        // The MSI window and the first 64 KiB are never handed out.
        assert_eq!(
            ioas.valid_ranges()[0],
            IovaRange::new(0x1_0000, 0xfee0_0000)
        );
    }

    #[test]
    fn strict_and_lazy_mappers_run_over_the_ioas() {
        let (fake, ioas) = ioas();
        let space = DmaSpace::new(ioas.clone(), HugePages::Never);
        let mut strict = StrictMapper::new(&space, 1 << 20).unwrap();
        let x = strict
            .map(app(2), 2 * PAGE_SIZE, DmaDir::FromDevice, 0)
            .unwrap();
        assert_eq!(fake.areas.lock().unwrap().len(), 1);
        let mut out = Vec::new();
        strict.release(x, &mut out).unwrap();
        assert!(fake.areas.lock().unwrap().is_empty());

        let cfg = LazyConfig {
            batch: 8,
            max_delay: std::time::Duration::from_secs(3600),
        };
        let mut lazy = LazyMapper::new(&space, 1 << 20, cfg).unwrap();
        let before = fake.unmap_calls.load(Ordering::Relaxed);
        let mapped: Vec<_> = (0..8)
            .map(|i| {
                lazy.map(app(1), PAGE_SIZE, DmaDir::Bidirectional, i)
                    .unwrap()
            })
            .collect();
        assert_eq!(fake.areas.lock().unwrap().len(), 8);
        for m in mapped {
            lazy.release(m, &mut out).unwrap();
        }
        // The eighth release fills the batch: the eight adjacent mappings of
        // the window go with one IOMMU_IOAS_UNMAP.
        assert_eq!(fake.unmap_calls.load(Ordering::Relaxed) - before, 1);
        assert!(fake.areas.lock().unwrap().is_empty());
    }

    #[test]
    fn a_failed_unmap_leaks_the_memory_instead_of_freeing_it() {
        let (fake, ioas) = ioas();
        let space = DmaSpace::new(ioas, HugePages::Never);
        let mut strict = StrictMapper::new(&space, 1 << 20).unwrap();
        let x = strict
            .map(app(1), PAGE_SIZE, DmaDir::FromDevice, 0)
            .unwrap();
        fake.fail_unmaps.store(1, Ordering::Relaxed);
        let mut out = Vec::new();
        assert!(strict.release(x, &mut out).is_err());
        // Still mapped in the IOAS, and the buffer was not handed back.
        assert_eq!(fake.areas.lock().unwrap().len(), 1);
        assert!(out.is_empty());
    }
}
