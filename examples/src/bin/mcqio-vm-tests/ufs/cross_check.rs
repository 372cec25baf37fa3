//! `ufs-write-pattern` and `ufs-check-pattern`: the cross-check on LU 0.

use super::*;

/// Check that `[offset, offset+len)` is block-aligned and inside LU 0.
pub(crate) fn check_range(ctrl: &UfsController, offset: u64, len: u64) -> Result<u32, Failure> {
    let (shift, size) = lu0(ctrl)?;
    let mask = (1u64 << shift) - 1;
    if len == 0 || offset & mask != 0 || len & mask != 0 {
        return Err(format!(
            "offset {offset} and length {len} must be non-zero multiples of the {}-byte block size",
            1u64 << shift
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!(
            "range {offset}+{len} is past the end of LU {LUN} ({size} bytes)"
        ));
    }
    Ok(shift)
}

pub(crate) const CHUNK: u64 = 1 << 20;

pub(crate) fn write_pattern(a: &UfsPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev, Some(1))?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK) as usize;
        let at = p.offset + done;
        pattern::fill(p.seed, at, &mut buf[..n]);
        qp.write_blocking(LUN, at >> shift, &buf[..n])
            .map_err(ctx("write"))?;
        done += n as u64;
    }
    qp.flush_blocking(LUN).map_err(ctx("flush"))?;
    println!(
        "wrote {} bytes of pattern seed {} at offset {} (LBA {}) of LU {LUN} through {} ({:?}), flushed",
        p.len,
        p.seed,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name(),
        ctrl.mode()
    );
    qp.close(|_| {}).map_err(ctx("closing the queue pair"))
}

pub(crate) fn check_pattern(a: &UfsPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev, Some(1))?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    let mut buf = vec![POISON; CHUNK as usize];
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK) as usize;
        let at = p.offset + done;
        buf[..n].fill(POISON);
        qp.read_blocking(LUN, at >> shift, &mut buf[..n])
            .map_err(ctx("read"))?;
        if let Some((off, want, found)) = pattern::first_mismatch(p.seed, at, &buf[..n]) {
            return Err(format!(
                "pattern seed {} differs at byte offset {off} (LBA {}): expected {want:#018x}, found {found:#018x}",
                p.seed,
                off >> shift
            ));
        }
        done += n as u64;
    }
    println!(
        "read {} bytes at offset {} (LBA {}) of LU {LUN} through {} ({:?}): identical to pattern seed {}",
        p.len,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name(),
        ctrl.mode(),
        p.seed
    );
    qp.close(|_| {}).map_err(ctx("closing the queue pair"))
}
