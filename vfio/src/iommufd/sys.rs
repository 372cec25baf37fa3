//! The raw iommufd calls on an IOAS: its allowed IOVA ranges, map, unmap.
//!
//! The structs are `iommufd-bindings`' (the rust-vmm bindings of
//! `include/uapi/linux/iommufd.h`); the layout this code relies on is checked
//! again here at compile time. `iommufd-ioctls` wraps map and unmap too, but
//! its map is a safe function that hands memory to a device and always maps
//! read+write, and it has no range query: the three calls are made here, one
//! small `unsafe` block each. Binding the device cdev to the iommufd and
//! attaching it to the IOAS are `vfio-ioctls`' (`VfioDevice::new_from_fd`).
//!
//! The range query is written over a closure ([`read_ranges`]) so the
//! two-call protocol (`EMSGSIZE` and a larger array) runs in unit tests
//! against a fake kernel.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::RawFd;
use std::ptr::NonNull;

use iommufd_bindings::iommufd::{
    iommu_ioas_iova_ranges, iommu_ioas_map, iommu_ioas_unmap, iommu_iova_range,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA as MAP_FIXED_IOVA,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE as MAP_READABLE,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE as MAP_WRITEABLE, IOMMUFD_CMD_IOAS_IOVA_RANGES,
    IOMMUFD_CMD_IOAS_MAP, IOMMUFD_CMD_IOAS_UNMAP, IOMMUFD_TYPE,
};

use crate::iommu::DmaDir;
use crate::iova::IovaRange;

/// `IOMMU_IOAS_IOVA_RANGES`: `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_IOVA_RANGES)`.
const IOMMU_IOAS_IOVA_RANGES: libc::Ioctl =
    libc::_IO(IOMMUFD_TYPE as u32, IOMMUFD_CMD_IOAS_IOVA_RANGES);
/// `IOMMU_IOAS_MAP`: `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_MAP)`.
const IOMMU_IOAS_MAP: libc::Ioctl = libc::_IO(IOMMUFD_TYPE as u32, IOMMUFD_CMD_IOAS_MAP);
/// `IOMMU_IOAS_UNMAP`: `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_UNMAP)`.
const IOMMU_IOAS_UNMAP: libc::Ioctl = libc::_IO(IOMMUFD_TYPE as u32, IOMMUFD_CMD_IOAS_UNMAP);

// The uAPI layout (include/uapi/linux/iommufd.h), as this file uses it.
const _: () = {
    assert!(size_of::<iommu_iova_range>() == 16);
    assert!(offset_of!(iommu_iova_range, last) == 8);
    assert!(size_of::<iommu_ioas_iova_ranges>() == 32);
    assert!(offset_of!(iommu_ioas_iova_ranges, ioas_id) == 4);
    assert!(offset_of!(iommu_ioas_iova_ranges, num_iovas) == 8);
    assert!(offset_of!(iommu_ioas_iova_ranges, allowed_iovas) == 16);
    assert!(offset_of!(iommu_ioas_iova_ranges, out_iova_alignment) == 24);
    assert!(size_of::<iommu_ioas_map>() == 40);
    assert!(offset_of!(iommu_ioas_map, flags) == 4);
    assert!(offset_of!(iommu_ioas_map, ioas_id) == 8);
    assert!(offset_of!(iommu_ioas_map, user_va) == 16);
    assert!(offset_of!(iommu_ioas_map, length) == 24);
    assert!(offset_of!(iommu_ioas_map, iova) == 32);
    assert!(size_of::<iommu_ioas_unmap>() == 24);
    assert!(offset_of!(iommu_ioas_unmap, ioas_id) == 4);
    assert!(offset_of!(iommu_ioas_unmap, iova) == 8);
    assert!(offset_of!(iommu_ioas_unmap, length) == 16);
};

/// Ranges asked for on the first query; a fresh IOAS behind an Intel or Arm
/// IOMMU reports two or three (the MSI window and reserved regions cut it).
const FIRST_QUERY: usize = 8;
/// Upper bound on the ranges accepted, so a confused answer cannot make us
/// allocate without limit.
const MAX_RANGES: usize = 4096;

/// What `IOMMU_IOAS_IOVA_RANGES` says about an IOAS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoasGeometry {
    /// The allowed IOVA ranges, in the kernel's order (ascending).
    pub ranges: Vec<IovaRange>,
    /// The alignment a map's IOVA and length must have (`out_iova_alignment`;
    /// 1 when any is allowed, never more than the host page).
    pub alignment: u64,
}

/// One answer of the range query: the total number of ranges the IOAS has
/// (which may exceed what fitted) and the IOVA alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangesAnswer {
    /// `num_iovas` as the kernel wrote it back.
    pub total: u32,
    /// `out_iova_alignment`.
    pub alignment: u64,
}

/// Run the range query's protocol over `query`, which fills the slice it is
/// given (as much as fits) and answers with the total: when the total is
/// larger than the slice (or the kernel says `EMSGSIZE`), ask again with room
/// for all of them.
pub fn read_ranges(
    mut query: impl FnMut(&mut [iommu_iova_range]) -> io::Result<RangesAnswer>,
) -> io::Result<IoasGeometry> {
    let mut buf = vec![iommu_iova_range::default(); FIRST_QUERY];
    loop {
        let answer = match query(&mut buf) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) && buf.len() < MAX_RANGES => {
                // The answer did not say how many: double.
                buf.resize((buf.len() * 2).min(MAX_RANGES), iommu_iova_range::default());
                continue;
            }
            Err(e) => return Err(e),
        };
        let total = answer.total as usize;
        if total > buf.len() {
            if total > MAX_RANGES {
                return Err(io::Error::other(format!(
                    "the IOAS reports {total} IOVA ranges (more than {MAX_RANGES})"
                )));
            }
            buf.resize(total, iommu_iova_range::default());
            continue;
        }
        let ranges = buf[..total]
            .iter()
            // The kernel reports inclusive ends.
            .filter(|r| r.start <= r.last)
            .map(|r| IovaRange::from_inclusive(r.start, r.last))
            .collect();
        return Ok(IoasGeometry {
            ranges,
            alignment: answer.alignment.max(1),
        });
    }
}

/// `IOMMU_IOAS_IOVA_RANGES` on `ioas` of the iommufd `fd`.
pub fn ioas_iova_ranges(fd: RawFd, ioas: u32) -> io::Result<IoasGeometry> {
    read_ranges(|buf| {
        let mut q = iommu_ioas_iova_ranges {
            size: size_of::<iommu_ioas_iova_ranges>() as u32,
            ioas_id: ioas,
            num_iovas: buf.len() as u32,
            __reserved: 0,
            allowed_iovas: buf.as_mut_ptr() as u64,
            out_iova_alignment: 0,
        };
        // SAFETY: `q` is valid for reads and writes during the call, and
        // `allowed_iovas` points to `num_iovas` writable `iommu_iova_range`s
        // (`buf`, borrowed mutably for the call); the kernel writes no more.
        let r = unsafe { libc::ioctl(fd, IOMMU_IOAS_IOVA_RANGES, &mut q) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RangesAnswer {
            total: q.num_iovas,
            alignment: q.out_iova_alignment,
        })
    })
}

/// The map flags for a direction (as the device sees it), at a fixed IOVA.
pub fn map_flags(dir: DmaDir) -> u32 {
    let mut f = MAP_FIXED_IOVA;
    if dir.device_reads() {
        f |= MAP_READABLE;
    }
    if dir.device_writes() {
        f |= MAP_WRITEABLE;
    }
    f
}

/// `IOMMU_IOAS_MAP` of `vaddr..vaddr+len` at the fixed `iova` of `ioas`.
///
/// # Safety
///
/// `vaddr..vaddr+len` must stay mapped in this process until a successful
/// unmap of `iova..iova+len`; the device may read and write it at any time
/// meanwhile (see [`crate::Iommu::map`]).
pub unsafe fn ioas_map(
    fd: RawFd,
    ioas: u32,
    iova: u64,
    vaddr: NonNull<u8>,
    len: u64,
    dir: DmaDir,
) -> io::Result<()> {
    let map = iommu_ioas_map {
        size: size_of::<iommu_ioas_map>() as u32,
        flags: map_flags(dir),
        ioas_id: ioas,
        __reserved: 0,
        user_va: vaddr.as_ptr() as u64,
        length: len,
        iova,
    };
    // SAFETY: `map` is a valid, initialized struct for the duration of the
    // call (with FIXED_IOVA the kernel writes nothing back); the memory
    // contract is the caller's (see `# Safety`).
    let r = unsafe { libc::ioctl(fd, IOMMU_IOAS_MAP, &map) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `IOMMU_IOAS_UNMAP` of `[iova, iova+len)` of `ioas`; returns the bytes
/// unmapped.
pub fn ioas_unmap(fd: RawFd, ioas: u32, iova: u64, len: u64) -> io::Result<u64> {
    let mut unmap = iommu_ioas_unmap {
        size: size_of::<iommu_ioas_unmap>() as u32,
        ioas_id: ioas,
        iova,
        length: len,
    };
    // SAFETY: `unmap` is valid for reads and writes during the call; the
    // kernel writes back the unmapped length.
    let r = unsafe { libc::ioctl(fd, IOMMU_IOAS_UNMAP, &mut unmap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unmap.length)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake kernel that owns `ranges` and answers the query as
    /// `iommufd.h` says: fill what fits, report the total, `EMSGSIZE` when
    /// the array is too small (if `emsgsize`).
    struct FakeIoas {
        ranges: Vec<(u64, u64)>,
        alignment: u64,
        emsgsize: bool,
        calls: Vec<usize>,
    }

    impl FakeIoas {
        fn query(&mut self, buf: &mut [iommu_iova_range]) -> io::Result<RangesAnswer> {
            self.calls.push(buf.len());
            let total = self.ranges.len();
            if total > buf.len() && self.emsgsize {
                return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
            }
            for (slot, &(start, last)) in buf.iter_mut().zip(&self.ranges) {
                *slot = iommu_iova_range { start, last };
            }
            Ok(RangesAnswer {
                total: total as u32,
                alignment: self.alignment,
            })
        }
    }

    fn fake(ranges: Vec<(u64, u64)>, emsgsize: bool) -> FakeIoas {
        FakeIoas {
            ranges,
            alignment: 4096,
            emsgsize,
            calls: Vec::new(),
        }
    }

    #[test]
    fn intel_ranges_feed_the_allocator_around_the_msi_window() {
        // What a fresh IOAS behind VT-d with a 39-bit address width reports:
        // everything but the MSI window.
        let mut k = fake(vec![(0, 0xfedf_ffff), (0xfef0_0000, 0x7f_ffff_ffff)], false);
        let g = read_ranges(|b| k.query(b)).unwrap();
        assert_eq!(k.calls, [FIRST_QUERY]);
        assert_eq!(g.alignment, 4096);
        assert_eq!(
            g.ranges,
            [
                IovaRange::new(0, 0xfee0_0000),
                IovaRange::new(0xfef0_0000, 1 << 39)
            ]
        );
        // Into the allocator the way the backend does it: floored at 64 KiB.
        let usable = crate::container::usable_iova_ranges(Some(&g.ranges));
        let mut a = crate::IovaAllocator::new(&usable);
        let low = a.alloc(0xfee0_0000 - 0x1_0000, 4096).unwrap();
        assert_eq!(low.raw(), 0x1_0000);
        let next = a.alloc(2 << 20, 2 << 20).unwrap().raw();
        assert!(
            next >= 0xfef0_0000 && next + (2 << 20) <= 1 << 39,
            "{next:#x}"
        );
    }

    #[test]
    fn more_ranges_than_fit_are_asked_for_again() {
        let many: Vec<(u64, u64)> = (0..20u64)
            .map(|i| (i << 32, (i << 32) + 0xffff_ffff))
            .collect();
        // Linux answers EMSGSIZE (with the total written back, which the
        // closure cannot see here): the query doubles until all fit.
        let mut k = fake(many.clone(), true);
        let g = read_ranges(|b| k.query(b)).unwrap();
        assert_eq!(g.ranges.len(), 20);
        assert_eq!(k.calls, [8, 16, 32]);
        // An answer with the total and no error: one more call, sized exactly.
        let mut k = fake(many, false);
        let g = read_ranges(|b| k.query(b)).unwrap();
        assert_eq!(g.ranges.len(), 20);
        assert_eq!(g.ranges[19], IovaRange::new(19 << 32, 20 << 32));
        assert_eq!(k.calls, [8, 20]);
    }

    #[test]
    fn odd_answers_are_survived() {
        // An alignment of 0 reads as "any"; an empty range is dropped.
        let mut k = fake(vec![(0x2000, 0x1000), (0x1_0000, 0x1_ffff)], false);
        k.alignment = 0;
        let g = read_ranges(|b| k.query(b)).unwrap();
        assert_eq!(g.alignment, 1);
        assert_eq!(g.ranges, [IovaRange::new(0x1_0000, 0x2_0000)]);
        // A total beyond any real IOAS is an error, not an allocation.
        let r = read_ranges(|_| {
            Ok(RangesAnswer {
                total: u32::MAX,
                alignment: 1,
            })
        });
        assert!(r.unwrap_err().to_string().contains("IOVA ranges"));
        // Other errors pass through.
        let r = read_ranges(|_| Err(io::Error::from_raw_os_error(libc::ENOENT)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn direction_flags() {
        assert_eq!(map_flags(DmaDir::ToDevice), MAP_FIXED_IOVA | MAP_READABLE);
        assert_eq!(
            map_flags(DmaDir::FromDevice),
            MAP_FIXED_IOVA | MAP_WRITEABLE
        );
        assert_eq!(
            map_flags(DmaDir::Bidirectional),
            MAP_FIXED_IOVA | MAP_READABLE | MAP_WRITEABLE
        );
    }

    #[test]
    fn ioctl_numbers_match_the_uapi() {
        // _IO(';', 0x80 + n) = 0x3b00 | (0x80 + n)
        assert_eq!(IOMMU_IOAS_IOVA_RANGES, 0x3b84);
        assert_eq!(IOMMU_IOAS_MAP, 0x3b85);
        assert_eq!(IOMMU_IOAS_UNMAP, 0x3b86);
    }
}
