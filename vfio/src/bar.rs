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

use crate::backend::Mmio;
use crate::barrier;
use crate::sys;

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
pub struct Bar {
    ptr: NonNull<u8>,
    len: usize,
    backing: BarBacking,
}

// SAFETY: `Bar` owns its mapping and only hands out raw pointers or values
// copied with volatile accesses; MMIO registers are meant to be accessed from
// any thread, and the memory stand-in is only touched through the same
// volatile, naturally aligned 32-bit accesses.
unsafe impl Send for Bar {}
// SAFETY: see `Send`; `&Bar` allows nothing but volatile loads/stores of
// whole, aligned registers and raw pointers.
unsafe impl Sync for Bar {}

impl std::fmt::Debug for Bar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bar")
            .field("ptr", &self.ptr)
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
        let ptr = sys::mmap_shared(fd, offset, len)?;
        Ok(Self {
            ptr,
            len,
            backing: BarBacking::Device { region },
        })
    }

    /// A memory-backed stand-in of `len` bytes (rounded up to whole pages),
    /// zero-filled. Behaves like a BAR for every access method.
    pub fn anonymous(len: usize) -> io::Result<Self> {
        let len = len.max(1).div_ceil(crate::PAGE_SIZE) * crate::PAGE_SIZE;
        // SAFETY: a private anonymous mapping with a null hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
            backing: BarBacking::Memory,
        })
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
        Ok(unsafe { barrier::mmio_read32(self.ptr.as_ptr().add(offset).cast::<u32>()) })
    }

    /// Write the 32-bit register at `offset`, or say why not.
    #[inline]
    pub fn try_write32(&self, offset: usize, value: u32) -> Result<(), BarAccessError> {
        self.check(offset, 4)?;
        // SAFETY: as in `try_read32`. `mmio_write32` orders every earlier
        // memory access (queue memory a register describes) before the store
        // (Linux `writel`).
        unsafe { barrier::mmio_write32(self.ptr.as_ptr().add(offset).cast::<u32>(), value) };
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
        Ok(unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset).cast::<u32>()) })
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
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: `ptr..+len` is the mapping this value created and owns;
        // doorbell pointers must not outlive the Bar (documented).
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            log::error!(
                "munmap of BAR mapping failed: {}",
                io::Error::last_os_error()
            );
        }
    }
}

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
