//! `write-pattern`, `check-pattern` and `gen-pattern`: the cross-check with
//! the kernel's view of namespace 1.

use super::*;

pub(crate) fn write_pattern(a: &DevPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev)?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK);
        let at = p.offset + done;
        pattern::fill(p.seed, at, &mut buf[..n as usize]);
        qp.write_blocking(NSID, at >> shift, &buf[..n as usize])
            .map_err(ctx("write"))?;
        done += n;
    }
    qp.flush_blocking(NSID).map_err(ctx("flush"))?;
    println!(
        "wrote {} bytes of pattern seed {} at offset {} (LBA {}) through {}, flushed",
        p.len,
        p.seed,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name()
    );
    Ok(())
}

pub(crate) fn check_pattern(a: &DevPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev)?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const CHUNK: u64 = 1 << 20;
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK);
        let at = p.offset + done;
        let got = read_range(&mut qp, shift, at, n)?;
        if let Some((off, want, found)) = pattern::first_mismatch(p.seed, at, &got) {
            return Err(format!(
                "pattern seed {} differs at byte offset {off} (LBA {}): expected {want:#018x}, found {found:#018x}",
                p.seed,
                off >> shift
            ));
        }
        done += n;
    }
    println!(
        "read {} bytes at offset {} (LBA {}) through {}: identical to pattern seed {}",
        p.len,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name(),
        p.seed
    );
    Ok(())
}

pub(crate) fn gen_pattern(p: &PatternArgs) -> Result<(), Failure> {
    if p.offset % pattern::WORD != 0 || p.len % pattern::WORD != 0 || p.len == 0 {
        return Err(format!(
            "--offset {} and --len {} must be non-zero multiples of {}",
            p.offset,
            p.len,
            pattern::WORD
        ));
    }
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut out = std::io::stdout().lock();
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK) as usize;
        pattern::fill(p.seed, p.offset + done, &mut buf[..n]);
        out.write_all(&buf[..n])
            .map_err(ctx("writing the pattern to stdout"))?;
        done += n as u64;
    }
    out.flush().map_err(ctx("flushing stdout"))
}
