//! Test doubles for the mapping layer (feature `test-utils`).
//!
//! [`CountingIommu`] is an in-process IOMMU that records every live mapping,
//! enforces VFIO type1's rules (no overlapping maps, an unmap must not split a
//! mapping), charges a configurable busy-wait per IOTLB invalidation, and lets
//! a test play the device: [`CountingIommu::device_write`] /
//! [`CountingIommu::device_read`] translate an IOVA and touch the host memory
//! behind it, or count a fault when nothing is mapped there.
//!
//! The cost model follows VFIO type1: one unmap call tears down every mapping
//! in its range and syncs the IOTLB once per 512 of them
//! (`VFIO_IOMMU_TLB_SYNC_MAX`); `unmap_many` is one call per range, as there
//! is no multi-range ioctl. The invalidation wait happens under the domain
//! lock, as type1 holds `iommu->lock` across unmap and sync — so concurrent
//! strict unmaps serialise, which is the contention ECMDQ-style per-CPU
//! queues remove.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::VFIO_TLB_SYNC_MAX;
use crate::iommu::{DmaDir, Iommu, IommuCounters, IommuError};
use crate::iova::{Iova, IovaRange};

#[derive(Copy, Clone, Debug)]
struct Live {
    len: u64,
    vaddr: usize,
    dir: DmaDir,
}

/// A device access the IOMMU blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("IOMMU fault: device {kind} of {len} bytes at IOVA {iova} ({why})")]
pub struct DeviceFault {
    /// Faulting address.
    pub iova: Iova,
    /// Access length.
    pub len: usize,
    /// "read" or "write".
    pub kind: &'static str,
    /// "not mapped" or "direction".
    pub why: &'static str,
}

/// An IOMMU test double that records live mappings and models costs.
#[derive(Debug)]
pub struct CountingIommu {
    live: Mutex<BTreeMap<u64, Live>>,
    ranges: Vec<IovaRange>,
    invalidation_cost: Duration,
    map_cost: Duration,
    min_page_size: usize,
    counters: IommuCounters,
    faults: AtomicU64,
}

/// Default address space: 1 TiB starting at 1 MiB (a 40-bit IOMMU).
const DEFAULT_SPACE: IovaRange = IovaRange::new(1 << 20, 1 << 40);

fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

impl Default for CountingIommu {
    fn default() -> Self {
        Self::new()
    }
}

impl CountingIommu {
    /// A free (zero-cost) IOMMU over `[1 MiB, 1 TiB)`.
    pub fn new() -> Self {
        Self {
            live: Mutex::new(BTreeMap::new()),
            ranges: vec![DEFAULT_SPACE],
            invalidation_cost: Duration::ZERO,
            map_cost: Duration::ZERO,
            min_page_size: 4096,
            counters: IommuCounters::default(),
            faults: AtomicU64::new(0),
        }
    }

    /// Busy-wait this long per IOTLB invalidation (under the domain lock).
    pub fn with_invalidation_cost(mut self, d: Duration) -> Self {
        self.invalidation_cost = d;
        self
    }

    /// Busy-wait this long per map call (page pinning and PTE writes).
    pub fn with_map_cost(mut self, d: Duration) -> Self {
        self.map_cost = d;
        self
    }

    /// Report `page` as the IOMMU's granule ([`Iommu::min_page_size`], a
    /// power of two): maps and unmaps must then be aligned multiples of it,
    /// as on an arm64 SMMU with a 16 KiB or 64 KiB granule.
    pub fn with_min_page_size(mut self, page: usize) -> Self {
        self.min_page_size = page;
        self
    }

    /// Use these valid windows instead of the default.
    pub fn with_ranges(mut self, ranges: Vec<IovaRange>) -> Self {
        self.ranges = ranges;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of live mappings.
    pub fn live_mappings(&self) -> usize {
        self.lock().len()
    }

    /// Whether `iova` is inside a live mapping.
    pub fn is_mapped(&self, iova: Iova) -> bool {
        Self::lookup(&self.lock(), iova, 1).is_some()
    }

    /// Whether any live mapping points into host memory `[ptr, ptr+len)`.
    pub fn maps_host_range(&self, ptr: NonNull<u8>, len: usize) -> bool {
        let (s, e) = (ptr.as_ptr() as usize, ptr.as_ptr() as usize + len);
        self.lock()
            .values()
            .any(|l| l.vaddr < e && l.vaddr + l.len as usize > s)
    }

    /// Device accesses blocked so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    fn lookup(map: &BTreeMap<u64, Live>, iova: Iova, len: usize) -> Option<(u64, Live)> {
        let (&start, &l) = map.range(..=iova.raw()).next_back()?;
        let end = iova.raw().checked_add(len as u64)?;
        (end <= start + l.len).then_some((start, l))
    }

    /// Translate under the caller's lock guard (held across the access, so
    /// an unmap cannot race it).
    fn translate(
        &self,
        map: &BTreeMap<u64, Live>,
        iova: Iova,
        len: usize,
        write: bool,
    ) -> Result<usize, DeviceFault> {
        let kind = if write { "write" } else { "read" };
        let fault = |why| {
            self.faults.fetch_add(1, Ordering::Relaxed);
            DeviceFault {
                iova,
                len,
                kind,
                why,
            }
        };
        let Some((start, l)) = Self::lookup(map, iova, len) else {
            return Err(fault("not mapped"));
        };
        let allowed = if write {
            l.dir.device_writes()
        } else {
            l.dir.device_reads()
        };
        if !allowed {
            return Err(fault("direction"));
        }
        Ok(l.vaddr + (iova.raw() - start) as usize)
    }

    /// Play the device: DMA-write `data` at `iova`, or count a fault.
    pub fn device_write(&self, iova: Iova, data: &[u8]) -> Result<(), DeviceFault> {
        let map = self.lock();
        let host = self.translate(&map, iova, data.len(), true)?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: `host..host+len` lies inside a live mapping (the lock is
            // held, so it cannot be unmapped meanwhile), whose host memory the
            // `Iommu::map` contract keeps allocated until unmap; volatile byte
            // stores form no reference to it.
            unsafe { (host as *mut u8).add(i).write_volatile(*b) };
        }
        Ok(())
    }

    /// Play the device: DMA-read `dst.len()` bytes at `iova`, or count a fault.
    pub fn device_read(&self, iova: Iova, dst: &mut [u8]) -> Result<(), DeviceFault> {
        let map = self.lock();
        let host = self.translate(&map, iova, dst.len(), false)?;
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: as in `device_write`.
            *b = unsafe { (host as *const u8).add(i).read_volatile() };
        }
        Ok(())
    }
}

// SAFETY: `unmap` removes the mappings from `live` before returning, and every
// device access (`device_read`/`device_write`) translates through `live`, so
// after `unmap` returns no access can reach the unmapped host memory.
unsafe impl Iommu for CountingIommu {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        dir: DmaDir,
    ) -> Result<(), IommuError> {
        let err = |reason: &str| IommuError::Map {
            iova,
            len,
            reason: reason.to_owned(),
        };
        let page = self.min_page_size();
        if len == 0 || len % page != 0 || !iova.is_aligned(page as u64) {
            return Err(err(
                "length and IOVA must be non-zero multiples of the page size",
            ));
        }
        if vaddr.as_ptr() as usize % page != 0 {
            return Err(err("host address not page aligned"));
        }
        let end = iova
            .raw()
            .checked_add(len as u64)
            .ok_or_else(|| err("IOVA overflow"))?;
        if !self
            .ranges
            .iter()
            .any(|r| r.start <= iova.raw() && end <= r.end)
        {
            return Err(err("outside the valid IOVA ranges"));
        }
        let mut map = self.lock();
        let before = map.range(..end).next_back();
        if before.is_some_and(|(&s, l)| s + l.len > iova.raw()) {
            return Err(err("overlaps an existing mapping (EEXIST)"));
        }
        map.insert(
            iova.raw(),
            Live {
                len: len as u64,
                vaddr: vaddr.as_ptr() as usize,
                dir,
            },
        );
        spin(self.map_cost);
        drop(map);
        self.counters.on_map(len as u64);
        Ok(())
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), IommuError> {
        let err = |reason: &str| IommuError::Unmap {
            iova,
            len,
            reason: reason.to_owned(),
        };
        let page = self.min_page_size as u64;
        if len == 0 || len % page != 0 || !iova.is_aligned(page) {
            return Err(err(
                "length and IOVA must be non-zero multiples of the page size",
            ));
        }
        let end = iova
            .raw()
            .checked_add(len)
            .ok_or_else(|| err("IOVA overflow"))?;
        let mut map = self.lock();
        // A mapping starting before `iova` and reaching into the range would be split.
        if let Some((&s, l)) = map.range(..iova.raw()).next_back() {
            if s + l.len > iova.raw() {
                return Err(err("range splits a mapping"));
            }
        }
        let inside: Vec<(u64, u64)> = map
            .range(iova.raw()..end)
            .map(|(&s, l)| (s, l.len))
            .collect();
        if inside.last().is_some_and(|&(s, l)| s + l > end) {
            return Err(err("range splits a mapping"));
        }
        if inside.is_empty() {
            return Err(err("nothing mapped in range"));
        }
        let mut bytes = 0;
        for &(s, l) in &inside {
            map.remove(&s);
            bytes += l;
        }
        let n = inside.len() as u64;
        let syncs = n.div_ceil(VFIO_TLB_SYNC_MAX);
        for _ in 0..syncs {
            spin(self.invalidation_cost);
        }
        drop(map);
        self.counters.on_unmap(n, bytes, syncs);
        Ok(())
    }

    fn valid_ranges(&self) -> Vec<IovaRange> {
        self.ranges.clone()
    }

    fn min_page_size(&self) -> usize {
        self.min_page_size
    }

    fn counters(&self) -> &IommuCounters {
        &self.counters
    }
}
