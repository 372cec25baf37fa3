//! [`AppBuffer`]: page-aligned, locked application memory for strict and lazy modes.

use std::ptr::NonNull;

use crate::dma::{DmaError, PAGE_SIZE};

/// Page-aligned anonymous memory owned by the application, populated at
/// allocation and locked with `mlock` (unless the IOMMU pins mapped pages
/// itself, see [`AppBuffer::for_space`]) so it stays resident.
///
/// A strict or lazy mapper takes the buffer by value for the duration of an
/// I/O and hands it back only after the IOMMU mapping is gone, so whoever
/// holds an `AppBuffer` holds memory the device cannot reach: that is why,
/// unlike DMA regions, it can give out ordinary slices.
pub struct AppBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AppBuffer` exclusively owns its anonymous mapping (no other handle
// to the pages exists outside a mapper that holds the buffer by value), so
// moving it to another thread moves sole ownership.
unsafe impl Send for AppBuffer {}
// SAFETY: `&AppBuffer` only allows reads through `as_slice`; writes need
// `&mut`, so shared references across threads cannot race.
unsafe impl Sync for AppBuffer {}

impl std::fmt::Debug for AppBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
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

impl AppBuffer {
    /// Allocate `len` bytes (rounded up to 4 KiB), zeroed, populated and locked.
    pub fn new(len: usize) -> Result<Self, DmaError> {
        Self::with_lock(len, true)
    }

    /// A buffer for mapping into `space`: locked with `mlock` only when the
    /// IOMMU does not pin mapped pages itself. VFIO type1 pins and charges
    /// `RLIMIT_MEMLOCK` at map time, so an `mlock` on top would count every
    /// byte twice against the limit of a non-root process.
    pub fn for_space(space: &crate::DmaSpace, len: usize) -> Result<Self, DmaError> {
        Self::with_lock(len, !space.iommu().pins_pages())
    }

    /// Allocate `len` bytes (rounded up to 4 KiB), zeroed and populated;
    /// `mlock`ed when `lock` is true.
    pub fn with_lock(len: usize, lock: bool) -> Result<Self, DmaError> {
        if len == 0 {
            return Err(DmaError::ZeroLength);
        }
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        // SAFETY: an anonymous private mapping with a null hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
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
        let buf = AppBuffer {
            ptr: NonNull::new(p.cast()).expect("mmap returned null without MAP_FIXED"),
            len,
        };
        // SAFETY: `p..p+len` is the mapping just created, owned by `buf`
        // (which munmaps it if we return the error below).
        if lock && unsafe { libc::mlock(p, len) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(DmaError::Lock {
                len,
                limit: memlock_limit(),
                source,
            });
        }
        Ok(buf)
    }

    /// Length in bytes (a multiple of 4 KiB).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer is at least one page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Host address of byte 0 (4 KiB aligned).
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The bytes. Not mapped for DMA while you can call this (see type docs).
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is our live, initialised (zero-filled
        // anonymous) mapping; the holder of the buffer is its only user.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AppBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is the mapping this value created and owns;
        // no IOMMU mapping of it exists (mappers only drop or return an
        // AppBuffer after its unmap returned; a failed unmap leaks it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
