//! What an IOAS's range calls mean: IOTLB syncs per unmap and the errno
//! hints of `IOMMU_IOAS_MAP`/`UNMAP` (the rest is [`crate::ranged`]'s, shared
//! with type1), and, in the tests, an in-process IOAS that follows
//! `iommufd.h`'s rules, on which a [`crate::DmaSpace`] and the strict and lazy
//! mappers run over the same [`Ranged`](crate::ranged::Ranged) code the
//! kernel's IOAS uses.

/// IOTLB syncs of one unmap of `n` whole mappings: iommufd tears each mapping
/// (an "area") down with its own `iommu_unmap`, and each of those syncs.
pub(super) fn syncs(n: u64) -> u64 {
    n
}

/// What a failed `IOMMU_IOAS_MAP`'s errno means.
pub(super) fn map_hint(errno: i32) -> &'static str {
    match errno {
        libc::ENOMEM => {
            " — iommufd charges pinned pages to RLIMIT_MEMLOCK: raise it (`mcqio-perf doctor`)"
        }
        libc::EEXIST => " — the IOVA range is already mapped",
        libc::EINVAL => " — address or length not aligned to the IOAS's IOVA alignment",
        libc::ENOENT => " — outside the IOAS's allowed IOVA ranges, or the IOAS is gone",
        _ => "",
    }
}

/// What a failed `IOMMU_IOAS_UNMAP`'s errno means.
pub(super) fn unmap_hint(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => " — nothing was mapped there",
        libc::EINVAL => " — the range splits a mapping",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use std::io;
    use std::ptr::NonNull;

    use super::*;
    use crate::container::usable_iova_ranges;
    use crate::dma::{DmaSpace, HugePages};
    use crate::iommu::{DmaDir, Iommu};
    use crate::iova::{Iova, IovaRange};
    use crate::mapping::{DmaMapper, LazyConfig, LazyMapper, StrictMapper};
    use crate::ranged::{RangeCalls, Ranged};
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
    unsafe impl RangeCalls for Arc<FakeIoas> {
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

        fn syncs(&self, n: u64) -> u64 {
            syncs(n)
        }

        fn map_hint(&self, errno: i32) -> &'static str {
            map_hint(errno)
        }

        fn unmap_hint(&self, errno: i32) -> &'static str {
            unmap_hint(errno)
        }
    }

    fn ioas() -> (Arc<FakeIoas>, Arc<Ranged<Arc<FakeIoas>>>) {
        // What VT-d reports for a fresh IOAS with a 48-bit address width.
        let ranges = vec![
            IovaRange::from_inclusive(0, 0xfedf_ffff),
            IovaRange::from_inclusive(0xfef0_0000, (1 << 48) - 1),
        ];
        let fake = Arc::new(FakeIoas {
            allowed: ranges.clone(),
            ..FakeIoas::default()
        });
        let usable = usable_iova_ranges(Some(&ranges));
        (fake.clone(), Arc::new(Ranged::new(fake, usable, PAGE_SIZE)))
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
