//! A ublk request: the kernel's I/O descriptor decoded for the device
//! (blocks, bytes, FUA), or the errno the kernel gets at once, and what a
//! success tells it.

use crate::sys::{self, IoDesc};
use crate::target::Caps;

/// A request, decoded from its descriptor: `lba` and `blocks` in the
/// device's logical blocks, `bytes` of data (reads and writes).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are described above
pub enum Request {
    /// Read `blocks` from `lba`.
    Read { lba: u64, blocks: u32, bytes: u32 },
    /// Write `blocks` at `lba`, with Force Unit Access if `fua`.
    Write {
        lba: u64,
        blocks: u32,
        bytes: u32,
        fua: bool,
    },
    /// Flush the volatile write cache.
    Flush,
    /// Deallocate `blocks` from `lba`.
    Discard { lba: u64, blocks: u32 },
    /// Write zeroes to `blocks` from `lba`.
    WriteZeroes { lba: u64, blocks: u32 },
}

/// Decode a descriptor for a device with `caps`: the request, or the
/// errno the kernel gets at once (an operation the device cannot do, a
/// range not in whole blocks, longer than the tag's buffer, or past the
/// end).
pub fn map_request(d: &IoDesc, caps: &Caps) -> Result<Request, i32> {
    let shift = caps.block_shift - 9; // 512-byte sectors to blocks
    let range = || -> Result<(u64, u32), i32> {
        let mask = (1u64 << shift) - 1;
        if d.nr_sectors == 0 || d.start_sector & mask != 0 || u64::from(d.nr_sectors) & mask != 0 {
            return Err(-libc::EINVAL);
        }
        let lba = d.start_sector >> shift;
        let blocks = d.nr_sectors >> shift;
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= caps.blocks => Ok((lba, blocks)),
            _ => Err(-libc::EIO),
        }
    };
    let data = || -> Result<(u64, u32, u32), i32> {
        let (lba, blocks) = range()?;
        let bytes = u64::from(d.nr_sectors) << 9;
        if bytes > u64::from(caps.max_io) {
            return Err(-libc::EINVAL);
        }
        Ok((lba, blocks, bytes as u32))
    };
    match d.op() {
        sys::IO_OP_READ => {
            let (lba, blocks, bytes) = data()?;
            Ok(Request::Read { lba, blocks, bytes })
        }
        sys::IO_OP_WRITE => {
            let (lba, blocks, bytes) = data()?;
            Ok(Request::Write {
                lba,
                blocks,
                bytes,
                fua: d.flags() & sys::IO_F_FUA != 0 && caps.fua,
            })
        }
        sys::IO_OP_FLUSH => Ok(Request::Flush),
        sys::IO_OP_DISCARD if caps.discard => {
            let (lba, blocks) = range()?;
            Ok(Request::Discard { lba, blocks })
        }
        sys::IO_OP_WRITE_ZEROES if caps.write_zeroes_blocks > 0 => {
            let (lba, blocks) = range()?;
            if blocks > caps.write_zeroes_blocks {
                return Err(-libc::EINVAL);
            }
            Ok(Request::WriteZeroes { lba, blocks })
        }
        _ => Err(-libc::EOPNOTSUPP),
    }
}

/// What the kernel is told on success: the bytes moved for reads and
/// writes (less would make the driver re-queue the rest), 0 otherwise.
pub(super) fn success(r: &Request) -> i32 {
    match *r {
        Request::Read { bytes, .. } | Request::Write { bytes, .. } => bytes as i32,
        _ => 0,
    }
}
