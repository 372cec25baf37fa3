//! [`Bar`]: an RAII memory mapping of a device region (BAR0) with volatile,
//! bounds-checked register access.
//!
//! The same type backs the memory stand-in ([`Bar::anonymous`]): anonymous
//! zeroed pages instead of the device, so every access path (bounds checks,
//! volatile loads and stores, doorbell pointers) is tested without hardware.
//!
//! Access styles:
//! - [`Bar::try_read32`] / [`Bar::try_write32`] (and 64-bit variants) for
//!   offsets that come from users or from the device: they return a
//!   [`BarAccessError`] instead of touching memory outside the mapping.
//! - The [`Mmio`] methods for the driver's own register offsets: they check
//!   the same way and panic on a bad offset (a driver bug), as the trait
//!   documents. The check is one compare against the length, negligible next
//!   to an uncached MMIO access, and it is what keeps these safe functions
//!   sound in release builds.
//! - [`Bar::doorbell`]: a checked raw pointer computed once, for the I/O path
//!   that rings doorbells with [`barrier::mmio_write32_relaxed`].
//!
//! Register reads and writes carry the ordering of Linux's `readl`/`writel`
//! (see [`crate::barrier`]).

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};

use crate::backend::Mmio;
use crate::barrier;

/// A rejected register access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BarAccessError {
    /// The access does not fit in the mapping.
    #[error("{width}-byte access at offset {offset:#x} is outside the {len:#x}-byte BAR mapping")]
    OutOfBounds {
        /// Offset of the access.
        offset: usize,
        /// Access width in bytes.
        width: usize,
        /// Length of the mapping.
        len: usize,
    },
    /// The offset is not a multiple of the access width.
    #[error("{width}-byte access at offset {offset:#x} is not naturally aligned")]
    Misaligned {
        /// Offset of the access.
        offset: usize,
        /// Access width in bytes.
        width: usize,
    },
}

/// What a [`Bar`] maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarBacking {
    /// A region of a VFIO device fd (real MMIO).
    Device {
        /// VFIO region index (0 = BAR0).
        region: u32,
    },
    /// Anonymous zeroed memory: the stand-in for tests.
    Memory,
}

/// A mapped device region; unmapped on drop.
///
/// The mapping is a [`MmapRaw`]: memmap2 makes the `mmap` and `munmap`
/// calls, and only ever gives out raw pointers, so no Rust reference is
/// formed over MMIO memory (a reference would let the compiler assume
/// nothing else changes the bytes, which the device does). `Send` and
/// `Sync` come from `MmapRaw`: `&Bar` allows nothing but volatile loads and
/// stores of whole, aligned registers and raw pointers, which is how MMIO
/// registers are accessed from any thread.
pub struct Bar {
    map: MmapRaw,
    len: usize,
    backing: BarBacking,
}

impl std::fmt::Debug for Bar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bar")
            .field("ptr", &self.ptr())
            .field("len", &format_args!("{:#x}", self.len))
            .field("backing", &self.backing)
            .finish()
    }
}

impl Bar {
    /// Map `len` bytes of VFIO region `region` that starts at `offset` of the
    /// device fd.
    pub(crate) fn map_device(fd: RawFd, region: u32, offset: u64, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-length region",
            ));
        }
        // Shared, read+write (memmap2's raw mapping); never MAP_POPULATE:
        // touching MMIO pages ahead of time would read device registers.
        let map = MmapOptions::new().offset(offset).len(len).map_raw(fd)?;
        Self::new(map, BarBacking::Device { region })
    }

    fn new(map: MmapRaw, backing: BarBacking) -> io::Result<Self> {
        if map.as_mut_ptr().is_null() {
            return Err(io::Error::other("mmap returned null"));
        }
        Ok(Self {
            len: map.len(),
            map,
            backing,
        })
    }

    /// Byte 0 of the mapping (non-null: checked in `new`; fixed for the
    /// mapping's life).
    #[inline]
    fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// A memory-backed stand-in of `len` bytes (rounded up to whole pages),
    /// zero-filled. Behaves like a BAR for every access method.
    pub fn anonymous(len: usize) -> io::Result<Self> {
        let len = len.max(1).div_ceil(crate::PAGE_SIZE) * crate::PAGE_SIZE;
        // Straight into a MmapRaw: the MmapMut's slice view is never used.
        let map = MmapRaw::from(MmapOptions::new().len(len).map_anon()?);
        Self::new(map, BarBacking::Memory)
    }

    /// What the mapping is backed by.
    pub fn backing(&self) -> BarBacking {
        self.backing
    }

    fn check(&self, offset: usize, width: usize) -> Result<(), BarAccessError> {
        if offset % width != 0 {
            return Err(BarAccessError::Misaligned { offset, width });
        }
        match offset.checked_add(width) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(BarAccessError::OutOfBounds {
                offset,
                width,
                len: self.len,
            }),
        }
    }

    /// Read the 32-bit register at `offset`, or say why not.
    #[inline]
    pub fn try_read32(&self, offset: usize) -> Result<u32, BarAccessError> {
        self.check(offset, 4)?;
        // SAFETY: checked in bounds and 4-aligned (the mapping is page-aligned);
        // the mapping lives as long as `self`; the accessor forms no reference.
        // `mmio_read32` orders the load before later loads (Linux `readl`).
        Ok(unsafe { barrier::mmio_read32(self.ptr().add(offset).cast::<u32>()) })
    }

    /// Write the 32-bit register at `offset`, or say why not.
    #[inline]
    pub fn try_write32(&self, offset: usize, value: u32) -> Result<(), BarAccessError> {
        self.check(offset, 4)?;
        // SAFETY: as in `try_read32`. `mmio_write32` orders every earlier
        // memory access (queue memory a register describes) before the store
        // (Linux `writel`).
        unsafe { barrier::mmio_write32(self.ptr().add(offset).cast::<u32>(), value) };
        Ok(())
    }

    /// Read a 64-bit register as two 32-bit reads, low dword first (what
    /// NVMe allows for every 64-bit register and some controllers require).
    pub fn try_read64(&self, offset: usize) -> Result<u64, BarAccessError> {
        self.check(offset, 8)?;
        let lo = self.try_read32(offset)? as u64;
        let hi = self.try_read32(offset + 4)? as u64;
        Ok(lo | (hi << 32))
    }

    /// Write a 64-bit register as two 32-bit writes, low dword first.
    pub fn try_write64(&self, offset: usize, value: u64) -> Result<(), BarAccessError> {
        self.check(offset, 8)?;
        self.try_write32(offset, value as u32)?;
        self.try_write32(offset + 4, (value >> 32) as u32)
    }

    /// The address of the 32-bit register at `offset`, for doorbells.
    ///
    /// Stores through it must not outlive the `Bar`; make them with
    /// [`barrier::mmio_write32_relaxed`] after the barrier that orders what
    /// the doorbell publishes ([`barrier::stores_before_doorbell`]).
    pub fn doorbell(&self, offset: usize) -> Result<NonNull<u32>, BarAccessError> {
        self.check(offset, 4)?;
        // SAFETY: in bounds of the mapping (checked), so the pointer stays
        // inside the same allocation and is non-null.
        Ok(unsafe { NonNull::new_unchecked(self.ptr().add(offset).cast::<u32>()) })
    }
}

impl Mmio for Bar {
    #[inline]
    fn read32(&self, offset: usize) -> u32 {
        self.try_read32(offset).unwrap_or_else(|e| panic!("{e}"))
    }

    #[inline]
    fn write32(&self, offset: usize, value: u32) {
        self.try_write32(offset, value)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn base(&self) -> NonNull<u8> {
        // SAFETY: `new` refused a null mapping, and the address of a live
        // mapping does not change.
        unsafe { NonNull::new_unchecked(self.ptr()) }
    }

    fn len(&self) -> usize {
        self.len
    }
}

// Drop: `MmapRaw` unmaps; doorbell pointers must not outlive the Bar
// (documented at `Bar::doorbell`).

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_reads_back_32_and_64_bit() {
        let bar = Bar::anonymous(0x2000).unwrap();
        assert_eq!(bar.len(), 0x2000);
        assert_eq!(bar.backing(), BarBacking::Memory);
        assert_eq!(bar.read32(0x14), 0);
        bar.write32(0x14, 0x0046_0001);
        assert_eq!(bar.read32(0x14), 0x0046_0001);
        bar.write64(0x28, 0x1234_5678_9abc_d000);
        assert_eq!(bar.read64(0x28), 0x1234_5678_9abc_d000);
        // Low dword first, little-endian layout of the two halves.
        assert_eq!(bar.read32(0x28), 0x9abc_d000);
        assert_eq!(bar.read32(0x2c), 0x1234_5678);
        assert_eq!(bar.try_read64(0x28), Ok(0x1234_5678_9abc_d000));
        bar.try_write64(0x30, u64::MAX).unwrap();
        assert_eq!(bar.try_read32(0x34), Ok(u32::MAX));
    }

    #[test]
    fn checked_access_rejects_out_of_bounds_and_misaligned() {
        let bar = Bar::anonymous(0x1000).unwrap();
        assert_eq!(bar.try_read32(0xffc), Ok(0));
        assert_eq!(
            bar.try_read32(0x1000),
            Err(BarAccessError::OutOfBounds {
                offset: 0x1000,
                width: 4,
                len: 0x1000
            })
        );
        assert!(matches!(
            bar.try_write64(0xffc, 1),
            Err(BarAccessError::Misaligned { .. })
        ));
        assert!(matches!(
            bar.try_read64(0xff8 + 8),
            Err(BarAccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            bar.try_write32(usize::MAX - 3, 1),
            Err(BarAccessError::OutOfBounds { .. })
        ));
        assert_eq!(
            bar.try_write32(2, 1),
            Err(BarAccessError::Misaligned {
                offset: 2,
                width: 4
            })
        );
        assert!(bar.doorbell(0x1000).is_err());
        // Nothing was written by the rejected calls.
        assert!((0..0x1000).step_by(4).all(|o| bar.read32(o) == 0));
    }

    #[test]
    #[should_panic(expected = "outside the 0x1000-byte BAR mapping")]
    fn mmio_trait_panics_on_driver_bug() {
        let bar = Bar::anonymous(0x1000).unwrap();
        bar.write32(0x1000, 1);
    }

    /// A device region is a shared mapping of the fd at the region's
    /// offset: stores reach the file, loads see it (a regular file stands
    /// in for the VFIO device fd).
    #[test]
    fn device_mapping_is_shared_at_the_region_offset() {
        use std::io::{Read, Seek, SeekFrom, Write};
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("mcqio-bar-test-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        let mut page = vec![0u8; 3 * 0x1000];
        page[0x1000..0x1004].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        f.write_all(&page).unwrap();
        let bar = Bar::map_device(f.as_raw_fd(), 0, 0x1000, 0x2000).unwrap();
        assert_eq!(bar.backing(), BarBacking::Device { region: 0 });
        assert_eq!(bar.len(), 0x2000);
        assert_eq!(bar.read32(0), 0x1234_5678);
        bar.write32(0x1ffc, 0xfeed_f00d);
        assert!(bar.try_read32(0x2000).is_err());
        drop(bar);
        let mut back = [0u8; 4];
        f.seek(SeekFrom::Start(0x2ffc)).unwrap();
        f.read_exact(&mut back).unwrap();
        assert_eq!(u32::from_le_bytes(back), 0xfeed_f00d);
        assert!(Bar::map_device(f.as_raw_fd(), 0, 0, 0).is_err());
    }

    #[test]
    fn doorbell_pointer_hits_the_register() {
        let bar = Bar::anonymous(0x2000).unwrap();
        let db = bar.doorbell(0x1008).unwrap();
        // SAFETY: `db` is an aligned register inside `bar`, which outlives
        // the store.
        unsafe { crate::barrier::mmio_write32_relaxed(db.as_ptr(), 7) };
        assert_eq!(bar.read32(0x1008), 7);
        assert_eq!(db.as_ptr() as usize - bar.base().as_ptr() as usize, 0x1008);
    }
}
