//! The raw VFIO calls that `vfio-ioctls` does not offer.
//!
//! - `VFIO_IOMMU_GET_INFO` with its capability chain (the valid IOVA ranges
//!   and the DMA-mapping budget).
//! - `VFIO_IOMMU_MAP_DMA` with per-direction flags (`vfio-ioctls` always maps
//!   read+write), and `VFIO_IOMMU_UNMAP_DMA` returning the unmapped size so a
//!   coalesced unmap of many mappings can be checked.
//! - `pread`/`pwrite` on the device fd for config space (`vfio-ioctls`'
//!   `region_read` swallows errors); the BAR mapping itself is memmap2's (bar.rs).
//!
//! Each call is one small `unsafe` block returning `io::Result`. The parser of
//! the capability chain is safe code over bytes and is unit-tested with
//! hand-built chains.

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use vfio_bindings::bindings::vfio::{
    vfio_info_cap_header, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap,
    vfio_iommu_type1_info, vfio_iommu_type1_info_cap_iova_range, vfio_iova_range, VFIO_BASE,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_IOMMU_INFO_CAPS, VFIO_IOMMU_INFO_PGSIZES,
    VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL, VFIO_TYPE,
};

use crate::iommu::DmaDir;
use crate::iova::IovaRange;

/// `VFIO_IOMMU_GET_INFO`: `_IO(VFIO_TYPE, VFIO_BASE + 12)` (`include/uapi/linux/vfio.h`).
const VFIO_IOMMU_GET_INFO: libc::Ioctl = libc::_IO(VFIO_TYPE as u32, VFIO_BASE + 12);
/// `VFIO_IOMMU_MAP_DMA`: `_IO(VFIO_TYPE, VFIO_BASE + 13)`.
const VFIO_IOMMU_MAP_DMA: libc::Ioctl = libc::_IO(VFIO_TYPE as u32, VFIO_BASE + 13);
/// `VFIO_IOMMU_UNMAP_DMA`: `_IO(VFIO_TYPE, VFIO_BASE + 14)`.
const VFIO_IOMMU_UNMAP_DMA: libc::Ioctl = libc::_IO(VFIO_TYPE as u32, VFIO_BASE + 14);

const _: () = assert!(size_of::<vfio_iommu_type1_info>() == 24);
const _: () = assert!(size_of::<vfio_info_cap_header>() == 8);
const _: () = assert!(size_of::<vfio_iommu_type1_info_cap_iova_range>() == 16);
const _: () = assert!(size_of::<vfio_iova_range>() == 16);
const _: () = assert!(size_of::<vfio_iommu_type1_dma_map>() == 32);
const _: () = assert!(size_of::<vfio_iommu_type1_dma_unmap>() == 24);

/// Upper bound on the `GET_INFO` buffer, so a confused kernel answer cannot
/// make us allocate without limit.
const MAX_INFO_LEN: usize = 1 << 20;
/// Upper bound on capability-chain hops (defends against a cycle).
const MAX_CAPS: usize = 64;

/// What `VFIO_IOMMU_GET_INFO` reports about a type1 container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IommuInfo {
    /// Bitmap of supported IOMMU page sizes (bit n set: 2^n bytes).
    pub pgsizes: Option<u64>,
    /// Valid IOVA windows, if the kernel reports them (Linux ≥ 5.4).
    pub iova_ranges: Option<Vec<IovaRange>>,
    /// How many more DMA mappings the container accepts (Linux ≥ 5.10;
    /// `vfio_iommu_type1.dma_entry_limit`, 65535 by default).
    pub dma_avail: Option<u32>,
}

fn u32_at(buf: &[u8], off: usize) -> Option<u32> {
    let b = buf.get(off..off.checked_add(4)?)?;
    Some(u32::from_ne_bytes(b.try_into().ok()?))
}

fn u16_at(buf: &[u8], off: usize) -> Option<u16> {
    let b = buf.get(off..off.checked_add(2)?)?;
    Some(u16::from_ne_bytes(b.try_into().ok()?))
}

fn u64_at(buf: &[u8], off: usize) -> Option<u64> {
    let b = buf.get(off..off.checked_add(8)?)?;
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

/// Decode a `vfio_iommu_type1_info` answer and its capability chain.
///
/// `buf` holds the whole answer (header first). Malformed chains (offsets out
/// of the buffer, cycles, truncated entries) end the walk; what was decoded
/// until then is kept.
pub fn parse_iommu_info(buf: &[u8]) -> IommuInfo {
    let mut info = IommuInfo::default();
    let Some(flags) = u32_at(buf, 4) else {
        return info;
    };
    if flags & VFIO_IOMMU_INFO_PGSIZES != 0 {
        info.pgsizes = u64_at(buf, 8);
    }
    if flags & VFIO_IOMMU_INFO_CAPS == 0 {
        return info;
    }
    let mut off = u32_at(buf, 16).unwrap_or(0) as usize;
    let mut hops = 0;
    while off != 0 && hops < MAX_CAPS {
        hops += 1;
        let (Some(id), Some(next)) = (u16_at(buf, off), u32_at(buf, off + 4)) else {
            break;
        };
        match u32::from(id) {
            VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE => {
                let Some(n) = u32_at(buf, off + 8) else { break };
                let first = off + size_of::<vfio_iommu_type1_info_cap_iova_range>();
                let mut ranges = Vec::new();
                for i in 0..n as usize {
                    let at = first + i * size_of::<vfio_iova_range>();
                    match (u64_at(buf, at), u64_at(buf, at + 8)) {
                        // The kernel reports inclusive ends.
                        (Some(s), Some(e)) if s <= e => {
                            ranges.push(IovaRange::from_inclusive(s, e))
                        }
                        (Some(_), Some(_)) => {}
                        _ => break,
                    }
                }
                info.iova_ranges = Some(ranges);
            }
            VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL => info.dma_avail = u32_at(buf, off + 8),
            _ => {}
        }
        // Capabilities chain forward; anything else is malformed.
        if (next as usize) <= off {
            break;
        }
        off = next as usize;
    }
    info
}

/// `VFIO_IOMMU_GET_INFO` on a container fd that has its IOMMU set.
pub fn iommu_get_info(container: RawFd) -> io::Result<IommuInfo> {
    let mut len = size_of::<vfio_iommu_type1_info>();
    loop {
        // u64 elements keep the buffer 8-byte aligned for the kernel struct.
        let mut buf = vec![0u64; len.div_ceil(8)];
        let bytes = buf.len() * 8;
        let hdr = buf.as_mut_ptr().cast::<vfio_iommu_type1_info>();
        // SAFETY: `buf` is at least `size_of::<vfio_iommu_type1_info>()` bytes,
        // zeroed and 8-aligned; we only set `argsz`.
        unsafe { (*hdr).argsz = bytes as u32 };
        // SAFETY: the kernel writes at most `argsz` bytes into `buf`, which
        // is that long and lives across the call.
        let r = unsafe { libc::ioctl(container, VFIO_IOMMU_GET_INFO, hdr) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `hdr` points to the initialized header inside `buf`.
        let want = unsafe { (*hdr).argsz } as usize;
        if want > bytes && want <= MAX_INFO_LEN {
            // The capability chain did not fit: ask again with room for it.
            len = want;
            continue;
        }
        let raw: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        return Ok(parse_iommu_info(&raw[..bytes]));
    }
}

/// The map flags for a direction (as the device sees it).
pub fn map_flags(dir: DmaDir) -> u32 {
    let mut f = 0;
    if dir.device_reads() {
        f |= VFIO_DMA_MAP_FLAG_READ;
    }
    if dir.device_writes() {
        f |= VFIO_DMA_MAP_FLAG_WRITE;
    }
    f
}

/// `VFIO_IOMMU_MAP_DMA`.
///
/// # Safety
///
/// `vaddr..vaddr+len` must stay mapped in this process until a successful
/// unmap of `iova..iova+len`; the device may read and write it at any time
/// meanwhile (see [`crate::Iommu::map`]).
pub unsafe fn map_dma(
    container: RawFd,
    iova: u64,
    vaddr: NonNull<u8>,
    len: u64,
    dir: DmaDir,
) -> io::Result<()> {
    let map = vfio_iommu_type1_dma_map {
        argsz: size_of::<vfio_iommu_type1_dma_map>() as u32,
        flags: map_flags(dir),
        vaddr: vaddr.as_ptr() as u64,
        iova,
        size: len,
    };
    // SAFETY: `map` is a valid, initialized struct for the duration of the
    // call; the memory contract is the caller's (see `# Safety`).
    let r = unsafe { libc::ioctl(container, VFIO_IOMMU_MAP_DMA, &map) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `VFIO_IOMMU_UNMAP_DMA` of `[iova, iova+len)`; returns the bytes unmapped.
pub fn unmap_dma(container: RawFd, iova: u64, len: u64) -> io::Result<u64> {
    let mut unmap = vfio_iommu_type1_dma_unmap {
        argsz: size_of::<vfio_iommu_type1_dma_unmap>() as u32,
        flags: 0,
        iova,
        size: len,
        ..Default::default()
    };
    // SAFETY: `unmap` is valid for reads and writes during the call; the
    // kernel writes back the unmapped size.
    let r = unsafe { libc::ioctl(container, VFIO_IOMMU_UNMAP_DMA, &mut unmap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unmap.size)
}

/// Read exactly `buf.len()` bytes at `offset` of fd.
pub fn pread_exact(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is valid for writes of `rest.len()` bytes.
        let n = unsafe {
            libc::pread(
                fd,
                rest.as_mut_ptr().cast(),
                rest.len(),
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Write all of `buf` at `offset` of fd.
pub fn pwrite_all(fd: RawFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        // SAFETY: `rest` is valid for reads of `rest.len()` bytes.
        let n = unsafe {
            libc::pwrite(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::ErrorKind::WriteZero.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Build a GET_INFO answer: header, then the given (id, payload) caps.
    fn answer(flags: u32, pgsizes: u64, caps: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; 24];
        b[4..8].copy_from_slice(&flags.to_ne_bytes());
        b[8..16].copy_from_slice(&pgsizes.to_ne_bytes());
        if !caps.is_empty() {
            b[16..20].copy_from_slice(&24u32.to_ne_bytes());
        }
        for (i, (id, payload)) in caps.iter().enumerate() {
            let start = b.len();
            let next = if i + 1 < caps.len() {
                (start + 8 + payload.len()) as u32
            } else {
                0
            };
            b.extend_from_slice(&id.to_ne_bytes());
            b.extend_from_slice(&1u16.to_ne_bytes());
            b.extend_from_slice(&next.to_ne_bytes());
            b.extend_from_slice(payload);
        }
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b
    }

    fn iova_cap(ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&(ranges.len() as u32).to_ne_bytes());
        p.extend_from_slice(&0u32.to_ne_bytes());
        for (s, e) in ranges {
            p.extend_from_slice(&s.to_ne_bytes());
            p.extend_from_slice(&e.to_ne_bytes());
        }
        p
    }

    #[test]
    fn decodes_iova_ranges_and_dma_avail() {
        let buf = answer(
            VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS,
            0x4020_1000,
            &[
                (
                    VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16,
                    iova_cap(&[(0, 0xfedf_ffff), (0xfef0_0000, 0xff_ffff_ffff)]),
                ),
                (
                    VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL as u16,
                    65535u32.to_ne_bytes().to_vec(),
                ),
            ],
        );
        let i = parse_iommu_info(&buf);
        assert_eq!(i.pgsizes, Some(0x4020_1000));
        assert_eq!(
            i.iova_ranges.unwrap(),
            vec![
                IovaRange::new(0, 0xfee0_0000),
                IovaRange::new(0xfef0_0000, 0x100_0000_0000)
            ]
        );
        assert_eq!(i.dma_avail, Some(65535));
    }

    #[test]
    fn no_caps_means_no_ranges() {
        let i = parse_iommu_info(&answer(VFIO_IOMMU_INFO_PGSIZES, 0x1000, &[]));
        assert_eq!(i.pgsizes, Some(0x1000));
        assert_eq!(i.iova_ranges, None);
    }

    #[test]
    fn malformed_chains_do_not_panic_or_loop() {
        // A count far larger than the buffer: decoding stops at the end.
        let mut buf = answer(
            VFIO_IOMMU_INFO_CAPS,
            0,
            &[(
                VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16,
                iova_cap(&[(0x1000, 0x1fff)]),
            )],
        );
        buf[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_ne_bytes());
        let i = parse_iommu_info(&buf);
        assert_eq!(i.iova_ranges.unwrap(), vec![IovaRange::new(0x1000, 0x2000)]);

        // A chain pointing back at itself ends.
        let mut buf = answer(VFIO_IOMMU_INFO_CAPS, 0, &[(9, vec![0; 8])]);
        buf[24 + 4..24 + 8].copy_from_slice(&24u32.to_ne_bytes());
        let _ = parse_iommu_info(&buf);
        // Offsets beyond the buffer and truncated buffers are ignored.
        let mut buf = answer(VFIO_IOMMU_INFO_CAPS, 0, &[]);
        buf[16..20].copy_from_slice(&10_000u32.to_ne_bytes());
        assert_eq!(parse_iommu_info(&buf), IommuInfo::default());
        assert_eq!(parse_iommu_info(&[1, 2, 3]), IommuInfo::default());
    }

    #[test]
    fn direction_flags() {
        assert_eq!(map_flags(DmaDir::ToDevice), VFIO_DMA_MAP_FLAG_READ);
        assert_eq!(map_flags(DmaDir::FromDevice), VFIO_DMA_MAP_FLAG_WRITE);
        assert_eq!(
            map_flags(DmaDir::Bidirectional),
            VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE
        );
    }

    #[test]
    fn ioctl_numbers_match_the_uapi() {
        // _IO(';', 100 + n) = 0x3b00 | (100 + n)
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3b70);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
    }
}
