//! PRP lists: the data pointers of a command as the PCIe transport
//! describes them (PRP1, PRP2, or a chained list in pages each slot
//! reserves at queue creation).

use crate::core::error::{Error, Result};
use crate::core::io::{IoBuf, SubmitErrorKind};
use crate::nvme::pcie::controller::Controller;
use crate::nvme::pcie::queue::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::nvme::spec::sqe::MAX_NLB;
use std::ptr::NonNull;

/// PRP entries per list page.
const PRP_PER_PAGE: usize = (PAGE_SIZE / 8) as usize;
/// Most PRP list pages reserved per command slot: 64 pages chain
/// `64 * 511 + 1` entries, enough for 127 MiB per command. A larger
/// per-command limit (`ControllerOptions::max_transfer` on a controller
/// without MDTS) is refused at queue creation instead of reserving (or
/// overflowing the size of) that much DMA memory per slot.
const MAX_PRP_LIST_PAGES: u64 = 64;

pub(super) struct PrpWriter {
    pub(super) list: *mut u64,
    pub(super) list_iova: u64,
    pages: usize,
    page: usize,
    idx: usize,
    count: usize,
    first: u64,
}

impl PrpWriter {
    #[inline]
    fn push(&mut self, addr: u64) -> Result<(), ()> {
        if self.idx == PRP_PER_PAGE {
            // The page is full: its last slot becomes a pointer to the next
            // list page, and the entry that was there moves to the next page.
            if self.page + 1 >= self.pages {
                return Err(());
            }
            let last_at = self.page * PRP_PER_PAGE + PRP_PER_PAGE - 1;
            let next_at = (self.page + 1) * PRP_PER_PAGE;
            // SAFETY: both indices are inside this slot's `pages` list pages,
            // which are live DMA memory owned by the queue; the device does
            // not read them before the doorbell. Volatile, no reference.
            unsafe {
                let last = self.list.add(last_at).read_volatile();
                self.list.add(next_at).write_volatile(last);
                self.list
                    .add(last_at)
                    .write_volatile(self.list_iova + ((self.page as u64 + 1) << PAGE_SHIFT));
            }
            self.page += 1;
            self.idx = 1;
        }
        // SAFETY: `page < pages` and `idx < PRP_PER_PAGE`: inside the slot's
        // list pages (see above).
        unsafe {
            self.list
                .add(self.page * PRP_PER_PAGE + self.idx)
                .write_volatile(addr)
        };
        if self.count == 0 {
            self.first = addr;
        }
        self.idx += 1;
        self.count += 1;
        Ok(())
    }

    /// PRP2: nothing, the single second page, or the list.
    #[inline]
    fn finish(&self) -> u64 {
        match self.count {
            0 => 0,
            1 => self.first,
            _ => self.list_iova,
        }
    }
}

/// A queue's PRP list pages: `pages` controller pages per command slot,
/// in DMA memory the queue pair owns (`QueuePair::prp_mem`), and the
/// per-command limit PRPs are built for.
#[derive(Copy, Clone, Debug)]
pub(super) struct PrpLists {
    pub(super) ptr: NonNull<u64>,
    pub(super) iova: u64,
    pub(super) pages: usize,
    pub(super) max_xfer: u64,
}

impl PrpLists {
    #[inline]
    pub(super) fn writer(&self, slot: u16) -> PrpWriter {
        let off = slot as usize * self.pages * PRP_PER_PAGE;
        PrpWriter {
            // SAFETY: `slot < depth` and the PRP region holds `depth *
            // pages` pages, so the slot's first list page is inside it.
            list: unsafe { self.ptr.as_ptr().add(off) },
            list_iova: self.iova + ((slot as u64 * self.pages as u64) << PAGE_SHIFT),
            pages: self.pages,
            page: 0,
            idx: 0,
            count: 0,
            first: 0,
        }
    }

    /// PRP1/PRP2 for `bytes` of `buf` starting `off` bytes into it, writing
    /// a PRP list into `slot`'s pages when more than two pages are touched.
    ///
    /// Empty segments are skipped wherever they sit: they describe no
    /// memory, so their IOVA (often the start or end of some other buffer)
    /// must never reach the device. The first segment that carries data may
    /// start at any 4-byte aligned IOVA; every later one must start on a
    /// page, and every one but the last must end on a page.
    #[inline(always)]
    pub(super) fn build<B: IoBuf>(
        &self,
        buf: &B,
        off: u64,
        bytes: u64,
        slot: u16,
    ) -> Result<(u64, u64), SubmitErrorKind> {
        let nseg = buf.segment_count();
        if nseg == 1 {
            let seg0 = buf.segment(0);
            let len = seg0.len as u64;
            if len < off || len - off < bytes {
                return Err(SubmitErrorKind::BufferTooSmall {
                    needed: off + bytes,
                    available: len,
                });
            }
            let start = seg0.iova.raw() + off;
            // The common case first, in one test of each: dword aligned
            // and inside its first page, one PRP entry (the general walk
            // below computed the first page's room, then compared; issue
            // 28). `bytes` is at most the buffer's length, so the sum does
            // not wrap.
            if start & 3 == 0 && (start & PAGE_MASK) + bytes <= PAGE_SIZE {
                return Ok((start, 0));
            }
            if start & 3 != 0 {
                return Err(SubmitErrorKind::Misaligned {
                    segment: 0,
                    iova: seg0.iova,
                });
            }
            let first_room = PAGE_SIZE - (start & PAGE_MASK);
            if bytes <= first_room {
                return Ok((start, 0));
            }
            let next = start + first_room;
            let rest = bytes - first_room;
            if rest <= PAGE_SIZE {
                return Ok((start, next));
            }
            let count = (rest + PAGE_MASK) >> PAGE_SHIFT;
            let mut w = self.writer(slot);
            for i in 0..count {
                w.push(next + (i << PAGE_SHIFT))
                    .map_err(|_| self.too_large(bytes))?;
            }
            return Ok((start, w.finish()));
        }
        self.build_vectored(buf, off, bytes, slot)
    }

    /// [`build`](Self::build) for buffers of several segments.
    fn build_vectored<B: IoBuf>(
        &self,
        buf: &B,
        off: u64,
        bytes: u64,
        slot: u16,
    ) -> Result<(u64, u64), SubmitErrorKind> {
        let mut w = self.writer(slot);
        let mut skip = off;
        let mut remaining = bytes;
        let mut prp1 = None;
        for i in 0..buf.segment_count() {
            if remaining == 0 {
                break;
            }
            let seg = buf.segment(i);
            let len = seg.len as u64;
            // Empty segments (and whole segments before `off`) carry no data.
            if len <= skip {
                skip -= len;
                continue;
            }
            let Some(s) = seg.iova.raw().checked_add(skip) else {
                return Err(SubmitErrorKind::Misaligned {
                    segment: i,
                    iova: seg.iova,
                });
            };
            let avail = len - skip;
            skip = 0;
            let take = avail.min(remaining);
            remaining -= take;
            let misaligned = Err(SubmitErrorKind::Misaligned {
                segment: i,
                iova: seg.iova,
            });
            // A data segment followed by more data must end on a page.
            if remaining > 0 && s.wrapping_add(avail) & PAGE_MASK != 0 {
                return misaligned;
            }
            let mut a = if prp1.is_none() {
                if s & 3 != 0 {
                    return misaligned;
                }
                prp1 = Some(s);
                (s & !PAGE_MASK) + PAGE_SIZE
            } else {
                if s & PAGE_MASK != 0 {
                    return misaligned;
                }
                s
            };
            while a < s + take {
                w.push(a).map_err(|_| self.too_large(bytes))?;
                a += PAGE_SIZE;
            }
        }
        match prp1 {
            Some(p1) if remaining == 0 => Ok((p1, w.finish())),
            _ => Err(SubmitErrorKind::BufferTooSmall {
                needed: off + bytes,
                available: buf.total_len() as u64,
            }),
        }
    }

    #[cold]
    fn too_large(&self, bytes: u64) -> SubmitErrorKind {
        SubmitErrorKind::TransferTooLarge {
            bytes,
            max: self.max_xfer,
        }
    }
}

/// PRP list pages each command slot needs: one entry per page of the
/// largest command after PRP1, chained across list pages. The largest
/// command is the smaller of `max_xfer` and `MAX_NLB` blocks of the largest
/// block size of any namespace (a command never moves more).
pub(super) fn prp_pages_per_slot(ctrl: &Controller, max_xfer: u64) -> Result<usize> {
    let max_lba_shift = ctrl
        .namespaces()
        .iter()
        .map(|n| n.lba_shift)
        .max()
        .unwrap_or(PAGE_SHIFT);
    let most_blocks = 1u64
        .checked_shl(max_lba_shift)
        .and_then(|lba| lba.checked_mul(MAX_NLB as u64))
        .unwrap_or(u64::MAX);
    let per_cmd = max_xfer.min(most_blocks);
    // Entries after PRP1: at most one per page of the transfer, plus one
    // for a buffer that does not start on a page boundary.
    let entries = (per_cmd >> PAGE_SHIFT) + 1;
    let per_page = PRP_PER_PAGE as u64;
    let pages = if entries <= per_page {
        1
    } else {
        (entries - 1).div_ceil(per_page - 1)
    };
    if pages > MAX_PRP_LIST_PAGES {
        return Err(Error::InvalidOption(format!(
            "a transfer limit of {per_cmd} bytes per command would need {pages} PRP list pages per queue slot (at most {MAX_PRP_LIST_PAGES}); set ControllerOptions::max_transfer to at most {} bytes",
            (MAX_PRP_LIST_PAGES * (per_page - 1)) << PAGE_SHIFT
        )));
    }
    Ok(pages as usize)
}

/// Bytes of a queue's PRP-list region: `prp_pages` controller pages per
/// slot, rounded up to whole granules of the DMA space (the largest of the
/// host page and the IOMMU page: the unit of every allocation, map and
/// unmap; a 64 KiB-granule IOMMU refuses a 4 KiB mapping). List entries and
/// list pages stay 4 KiB controller pages whatever the granule.
pub(super) fn prp_region_len(depth: u16, prp_pages: usize, granule: usize) -> Option<usize> {
    let granule = granule.max(PAGE_SIZE as usize);
    (depth as usize)
        .checked_mul(prp_pages)?
        .checked_mul(PAGE_SIZE as usize)?
        .checked_next_multiple_of(granule)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walk a PRP list the way a controller does: the last entry of a list
    /// page points to the next page when more than one entry remains.
    fn walk(mem: &[u64], list_iova: u64, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let (mut page, mut idx) = (0usize, 0usize);
        while out.len() < n {
            let v = mem[page * PRP_PER_PAGE + idx];
            if idx == PRP_PER_PAGE - 1 && n - out.len() > 1 {
                assert_eq!(v, list_iova + ((page as u64 + 1) << PAGE_SHIFT));
                page += 1;
                idx = 0;
                continue;
            }
            out.push(v);
            idx += 1;
        }
        out
    }

    /// Issue 12 item 10: the PRP-list region is a whole number of IOMMU
    /// pages (and at least the controller pages the slots need).
    #[test]
    fn prp_region_is_whole_iommu_pages() {
        assert_eq!(prp_region_len(3, 1, 4096).unwrap(), 3 * 4096);
        assert_eq!(
            prp_region_len(3, 1, 1024).unwrap(),
            3 * 4096,
            "never below a controller page"
        );
        assert_eq!(prp_region_len(3, 1, 64 << 10).unwrap(), 64 << 10);
        assert_eq!(prp_region_len(17, 1, 64 << 10).unwrap(), 128 << 10);
        assert_eq!(prp_region_len(16, 2, 64 << 10).unwrap(), 128 << 10);
    }

    /// The PRP writer's raw-pointer arithmetic (also run under Miri, over
    /// ordinary memory): chained list pages, exact capacity, overflow.
    #[test]
    fn prp_writer_chains_list_pages() {
        let pages = 3;
        let cap = pages * (PRP_PER_PAGE - 1) + 1;
        for n in [
            0,
            1,
            2,
            3,
            PRP_PER_PAGE - 1,
            PRP_PER_PAGE,
            PRP_PER_PAGE + 1,
            cap,
        ] {
            let mut mem = vec![0u64; pages * PRP_PER_PAGE];
            let list_iova = 0x10_0000;
            let mut w = PrpWriter {
                list: mem.as_mut_ptr(),
                list_iova,
                pages,
                page: 0,
                idx: 0,
                count: 0,
                first: 0,
            };
            let want: Vec<u64> = (0..n as u64)
                .map(|i| 0x4000_0000 + (i << PAGE_SHIFT))
                .collect();
            for &a in &want {
                w.push(a).expect("within capacity");
            }
            let prp2 = w.finish();
            match n {
                0 => assert_eq!(prp2, 0),
                1 => assert_eq!(prp2, want[0]),
                _ => {
                    assert_eq!(prp2, list_iova);
                    assert_eq!(walk(&mem, list_iova, n), want, "{n} entries");
                }
            }
            if n == cap {
                assert!(w.push(0).is_err(), "one past capacity is refused");
            }
        }
    }
}
