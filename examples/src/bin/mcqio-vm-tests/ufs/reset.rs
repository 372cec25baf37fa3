//! `ufs-reset`: a host controller reset with I/O in flight on every queue pair.

use super::*;

/// `ufs-reset`: see the subcommand's help.
pub(crate) fn reset(a: &UfsDevArgs) -> Result<(), Failure> {
    use std::collections::BTreeMap;
    // Two hardware queues in MCQ mode (I/O in flight on both), the one
    // list in legacy mode.
    let ctrl = open(a, Some(2))?;
    let (shift, size) = lu0(&ctrl)?;
    let pairs = match ctrl.mode() {
        UfsMode::Mcq { queues } => usize::from(queues.min(2)),
        UfsMode::Legacy => 1,
    };
    let mut qps: Vec<UfsQueuePair> = (0..pairs)
        .map(|_| ctrl.create_qpair(Default::default()))
        .collect::<Result<_, _>>()
        .map_err(ctx("creating the queue pairs"))?;
    // Per pair: 8 reads of data written first and 8 writes of new data,
    // 256 KiB each, in a 4 MiB region of its own, rung; then 4 more
    // reads queued in the ring but not rung when the reset comes (the
    // controller never sees them: they must end AbortedByReset).
    const IO: u64 = 256 << 10;
    const READS: u64 = 8;
    const WRITES: u64 = 8;
    const UNRUNG: u64 = 4;
    const UNRUNG_TAG: u64 = 100;
    let blocks = (IO >> shift) as u32;
    let base = |p: usize| size / 4 + p as u64 * (8 << 20);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let (old_seed, new_seed) = (clock, clock ^ 0x5eed);
    let mut data = vec![0u8; ((READS + WRITES) * IO) as usize];
    for (p, qp) in qps.iter_mut().enumerate() {
        pattern::fill(old_seed, base(p), &mut data);
        qp.write_blocking(LUN, base(p) >> shift, &data)
            .map_err(ctx("writing the data the reads expect"))?;
    }
    let mut io = vec![0u8; IO as usize];
    for (p, qp) in qps.iter_mut().enumerate() {
        for i in 0..READS + WRITES {
            let off = base(p) + i * IO;
            let mut buf = ctrl
                .alloc_buf(IO as usize, DmaDir::Bidirectional)
                .map_err(ctx("allocating a buffer"))?;
            let r = if i < READS {
                buf.fill(POISON);
                qp.read(LUN, off >> shift, blocks, buf, i)
            } else {
                pattern::fill(new_seed, off, &mut io);
                buf.write_at(0, &io).map_err(ctx("filling a buffer"))?;
                qp.write(LUN, off >> shift, blocks, buf, i)
            };
            r.map_err(|e| format!("submit: {:?}", e.kind))?;
        }
    }
    for qp in qps.iter_mut() {
        qp.submit();
    }
    for (p, qp) in qps.iter_mut().enumerate() {
        for j in 0..UNRUNG {
            let buf = ctrl
                .alloc_buf(IO as usize, DmaDir::Bidirectional)
                .map_err(ctx("allocating a buffer"))?;
            qp.read(
                LUN,
                (base(p) + j * IO) >> shift,
                blocks,
                buf,
                UNRUNG_TAG + j,
            )
            .map_err(|e| format!("submit: {:?}", e.kind))?;
        }
    }
    let t0 = Instant::now();
    ctrl.reset().map_err(ctx("host controller reset"))?;
    let reset_ms = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "reset with {} commands rung and {} queued but not rung on {pairs} queue pair(s) of {} KiB each: {reset_ms:.1} ms (HCE = 0, link start-up, NOP, fDeviceInit, {:?})",
        pairs as u64 * (READS + WRITES),
        pairs as u64 * UNRUNG,
        IO >> 10,
        ctrl.mode()
    );
    for qp in qps.iter_mut() {
        if qp.submit() {
            return Err("a doorbell was rung before the queue pair saw the reset".into());
        }
    }
    let mut rewrite = Vec::new();
    for (p, qp) in qps.iter_mut().enumerate() {
        let mut done = BTreeMap::new();
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while done.len() < (READS + WRITES + UNRUNG) as usize {
            let mut dup = None;
            qp.poll(usize::MAX, |c| {
                let tag = c.tag;
                if done.insert(tag, c).is_some() {
                    dup = Some(tag);
                }
            })
            .map_err(ctx("poll after the reset"))?;
            if let Some(t) = dup {
                return Err(format!("pair {p}: command {t} completed twice"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "pair {p}: {} of {} commands completed after the reset",
                    done.len(),
                    READS + WRITES + UNRUNG
                ));
            }
        }
        for _ in 0..8 {
            let mut extra = 0;
            qp.poll(usize::MAX, |_| extra += 1)
                .map_err(ctx("poll after the reset"))?;
            if extra > 0 {
                return Err(format!("pair {p}: {extra} extra completion(s)"));
            }
        }
        let (mut ok, mut aborted) = (0, 0);
        for (&i, c) in &done {
            if i >= UNRUNG_TAG {
                if c.result != Err(mcqio::IoError::AbortedByReset) || c.buf.is_none() {
                    return Err(format!(
                        "pair {p}: a read the controller never saw ended {:?} (buffer back: {})",
                        c.result,
                        c.buf.is_some()
                    ));
                }
                continue;
            }
            let off = base(p) + i * IO;
            let buf = c
                .buf
                .as_ref()
                .ok_or_else(|| format!("pair {p}: command {i} came back without its buffer"))?;
            match c.result {
                Ok(()) => {
                    ok += 1;
                    if i < READS {
                        buf.read_at(0, &mut io).map_err(ctx("reading a buffer"))?;
                        if let Some((at, want, got)) = pattern::first_mismatch(old_seed, off, &io) {
                            return Err(format!(
                                "pair {p}: read {i} completed before the reset with wrong data at byte {at}: expected {want:#018x}, found {got:#018x}"
                            ));
                        }
                    }
                }
                Err(mcqio::IoError::AbortedByReset) => {
                    aborted += 1;
                    if i >= READS {
                        rewrite.push((p, off));
                    }
                }
                Err(e) => return Err(format!("pair {p}: command {i}: {e}")),
            }
        }
        println!(
            "  pair {p} (hardware queue {:?}): of the rung commands {ok} completed before the reset, {aborted} ended AbortedByReset; the {UNRUNG} not rung ended AbortedByReset; all with their buffers; queue re-created ({} recovery)",
            qp.hw_queue(),
            qp.recoveries()
        );
        if qp.recoveries() != 1 {
            return Err(format!(
                "pair {p}: {} recoveries, expected 1",
                qp.recoveries()
            ));
        }
    }
    // The writes the reset ended may or may not have reached the medium:
    // write them again, then every block must read back right through
    // the re-created queues.
    for &(p, off) in &rewrite {
        pattern::fill(new_seed, off, &mut io);
        qps[p]
            .write_blocking(LUN, off >> shift, &io)
            .map_err(ctx("rewriting after the reset"))?;
    }
    let verify = |qps: &mut Vec<UfsQueuePair>, when: &str| -> Result<(), Failure> {
        let mut back = vec![0u8; ((READS + WRITES) * IO) as usize];
        for p in 0..pairs {
            // Read each region through the other pair too.
            let qp = &mut qps[(p + 1) % pairs];
            qp.read_blocking(LUN, base(p) >> shift, &mut back)
                .map_err(ctx("reading back"))?;
            let (r, w) = back.split_at((READS * IO) as usize);
            let bad = pattern::first_mismatch(old_seed, base(p), r).or_else(|| {
                pattern::first_mismatch(new_seed, base(p) + READS * IO, w)
                    .map(|(at, a, b)| (at + READS * IO, a, b))
            });
            if let Some((at, want, got)) = bad {
                return Err(format!(
                    "{when}: region of pair {p} differs at byte {at}: expected {want:#018x}, found {got:#018x}"
                ));
            }
        }
        Ok(())
    };
    verify(&mut qps, "after the reset")?;
    println!(
        "every block reads back right after the reset ({} MiB, {} write(s) repeated)",
        (pairs as u64 * (READS + WRITES) * IO) >> 20,
        rewrite.len()
    );
    // A second reset with nothing in flight: the pairs recover again.
    ctrl.reset().map_err(ctx("second reset"))?;
    verify(&mut qps, "after a second reset")?;
    println!(
        "second reset (idle): the queue pairs recovered again; {} resets, {} bytes leaked",
        ctrl.resets(),
        ctrl.leaked_bytes()
    );
    if ctrl.leaked_bytes() != 0 {
        return Err("buffers were leaked".into());
    }
    for qp in qps {
        qp.close(|_| {}).map_err(ctx("closing a queue pair"))?;
    }
    Ok(())
}
