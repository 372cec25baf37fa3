//! `ufs-rw`: the rw check on LU 0, one MCQ queue pair per thread.

use super::*;

pub(crate) struct Report {
    pub(crate) hw_queue: Option<u16>,
    pub(crate) ios: u64,
    pub(crate) bytes: u64,
}

/// One thread: write every extent (QD `qd`), then read each back and
/// compare with the pattern.
pub(crate) fn worker(
    ctrl: &Arc<UfsController>,
    shift: u32,
    seed: u64,
    qd: usize,
    max_io: usize,
    extents: &[Extent],
) -> Result<Report, Failure> {
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    let mut free: Vec<DmaBuf> = (0..qd)
        .map(|_| ctrl.alloc_buf(max_io, DmaDir::Bidirectional))
        .collect::<Result<_, _>>()
        .map_err(ctx("allocating buffers"))?;
    let mut ios = 0u64;
    for write in [true, false] {
        let what = if write { "write" } else { "read" };
        let mut next = 0usize;
        let mut inflight = 0usize;
        let mut err: Option<Failure> = None;
        let mut last_progress = Instant::now();
        while next < extents.len() || inflight > 0 {
            while next < extents.len() && inflight < qd {
                let e = extents[next];
                let mut buf = free.pop().ok_or("no free buffer")?;
                let blocks = (e.len >> shift) as u32;
                let r = if write {
                    let mut v = vec![0u8; e.len as usize];
                    pattern::fill(seed, e.offset, &mut v);
                    buf.write_at(0, &v).map_err(ctx("filling a buffer"))?;
                    qp.write(LUN, e.offset >> shift, blocks, buf, next as u64)
                } else {
                    buf.fill(POISON);
                    qp.read(LUN, e.offset >> shift, blocks, buf, next as u64)
                };
                if let Err(e) = r {
                    return Err(format!("{what} submit: {:?}", e.kind));
                }
                next += 1;
                inflight += 1;
            }
            qp.submit();
            let n = qp
                .poll(qd, |c| {
                    inflight -= 1;
                    let Some(buf) = c.buf else {
                        err.get_or_insert(format!("{what} {} lost its buffer", c.tag));
                        return;
                    };
                    if let Err(e) = c.result {
                        err.get_or_insert(format!("{what} of extent {}: {e}", c.tag));
                    } else if !write {
                        let e = extents[c.tag as usize];
                        let mut v = vec![0u8; e.len as usize];
                        match buf.read_at(0, &mut v) {
                            Err(x) => {
                                err.get_or_insert(format!("reading a buffer: {x}"));
                            }
                            Ok(()) => {
                                if let Some((off, want, got)) =
                                    pattern::first_mismatch(seed, e.offset, &v)
                                {
                                    err.get_or_insert(format!(
                                        "read back differs at byte {off} (LBA {}, extent {} of {} bytes at {}): expected {want:#018x}, found {got:#018x}",
                                        off >> shift, c.tag, e.len, e.offset
                                    ));
                                }
                            }
                        }
                    }
                    free.push(buf);
                })
                .map_err(ctx(what))?;
            if let Some(e) = err.take() {
                return Err(e);
            }
            ios += n as u64;
            if n > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > COMMAND_TIMEOUT {
                return Err(format!(
                    "{what}: {inflight} command(s) without a completion for {COMMAND_TIMEOUT:?}"
                ));
            } else {
                std::thread::yield_now();
            }
        }
        if write {
            qp.flush_blocking(LUN).map_err(ctx("flush"))?;
        }
    }
    let hw_queue = qp.hw_queue();
    qp.close(|_| {}).map_err(ctx("closing the queue pair"))?;
    Ok(Report {
        hw_queue,
        ios,
        bytes: extents.iter().map(|e| e.len).sum::<u64>() * 2,
    })
}

pub(crate) fn rw(a: &UfsRwArgs) -> Result<(), Failure> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a
        .shape
        .threads
        .unwrap_or(if a.dev.legacy { 1 } else { cpus })
        .max(1);
    let ctrl = open(&a.dev, Some(threads.min(32) as u16))?;
    let (shift, size) = lu0(&ctrl)?;
    let threads = match ctrl.mode() {
        UfsMode::Legacy if threads > 1 && a.shape.threads.is_none() => 1,
        _ => threads,
    };
    let seed = a.shape.seed();
    let probe: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    let max_io = a
        .shape
        .check(probe.max_transfer(), usize::from(ctrl.depth()))?;
    drop(probe);
    let per_thread = a.shape.bytes.div_ceil(threads as u64);
    println!(
        "ufs-rw: {:?}, {threads} thread(s) x 1 queue pair, {} MiB each in I/Os of {}..{} KiB at QD {}, seed {seed:#x}",
        ctrl.mode(),
        per_thread >> 20,
        a.shape.min_io >> 10,
        max_io >> 10,
        a.shape.qd
    );
    let plans: Vec<Vec<Extent>> = a
        .shape
        .plans(seed, threads, size, max_io)?
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    if let Some(mode) = a.shape.dma {
        let engine = a.engine_mapped;
        if engine && mode == DmaMode::Premapped {
            return Err("--engine-mapped maps per I/O: use --dma strict or lazy".into());
        }
        return rw_mapped(
            &ctrl,
            mode,
            engine,
            threads,
            (shift, seed),
            a.shape.qd,
            max_io,
            plans,
        );
    }
    let t0 = Instant::now();
    let reports: Vec<Result<Report, Failure>> = std::thread::scope(|s| {
        let hs: Vec<_> = plans
            .iter()
            .map(|ext| {
                let ctrl = &ctrl;
                s.spawn(move || worker(ctrl, shift, seed, a.shape.qd, max_io as usize, ext))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut ios, mut bytes, mut queues) = (0, 0, Vec::new());
    for (i, r) in reports.into_iter().enumerate() {
        let r = r.map_err(|e| format!("thread {i}: {e}"))?;
        println!(
            "  thread {i}: hardware queue {:?}, {} commands, {} MiB written and read back",
            r.hw_queue,
            r.ios,
            r.bytes >> 21
        );
        queues.push(r.hw_queue);
        ios += r.ios;
        bytes += r.bytes;
    }
    queues.sort_unstable();
    queues.dedup();
    if matches!(ctrl.mode(), UfsMode::Mcq { .. }) && queues.len() != threads {
        return Err(format!(
            "{threads} threads shared hardware queues: {queues:?}"
        ));
    }
    println!(
        "ufs-rw: OK: {ios} commands, {} MiB written and read back identical in {secs:.2} s ({} hardware queue(s))",
        bytes >> 21,
        queues.len()
    );
    Ok(())
}

/// `ufs-rw --dma MODE`: the same extents through the NVMe checks' own
/// write/read/verify worker, one queue pair per thread: buffers from a
/// [`QueueMapper`] in `mode` (premapped pool, strict or lazy) on a
/// `UfsQueuePair<Mapped>`, or with `engine` the engine's own
/// `MappedQueuePair` (strict or lazy) mapping application buffers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rw_mapped(
    ctrl: &Arc<UfsController>,
    mode: DmaMode,
    engine: bool,
    threads: usize,
    (shift, seed): (u32, u64),
    qd: usize,
    max_io: u64,
    plans: Vec<Vec<Extent>>,
) -> Result<(), Failure> {
    let t0 = Instant::now();
    let reports: Vec<Result<WorkerReport, Failure>> = std::thread::scope(|s| {
        let hs: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(i, ext)| {
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6d61_7070 ^ i as u64);
                    if engine {
                        let mapping = match mode {
                            DmaMode::Strict => mcqio::MappingMode::Strict,
                            DmaMode::Lazy => mcqio::MappingMode::lazy(),
                            DmaMode::Premapped => unreachable!("refused before the threads start"),
                        };
                        let mut qp = ctrl
                            .create_mapped_qpair(UfsQpairOptions {
                                mapping,
                                ..Default::default()
                            })
                            .map_err(ctx("creating a mapped queue pair"))?;
                        let mut lane = AppLane::new(ctrl.dma(), mode, qd, max_io as usize)?;
                        let r = super::worker(&mut qp, &mut lane, shift, seed, &ext, &mut rng);
                        let st = qp.mapper_stats();
                        qp.close(|_| ())
                            .map_err(ctx("closing the mapped queue pair"))?;
                        return r.map(|mut r| {
                            r.lane = format!(
                                "{}: {} maps, {} unmaps in {} unmap calls, {} IOTLB invalidations",
                                r.lane, st.maps, st.unmaps, st.unmap_calls, st.invalidations
                            );
                            r
                        });
                    }
                    let mut qp: UfsQueuePair<Mapped> = ctrl
                        .create_qpair_for(Default::default())
                        .map_err(ctx("creating a queue pair"))?;
                    let mut lane = MapperLane::for_space(ctrl.dma(), mode, qd, max_io as usize)?;
                    let r = super::worker(&mut qp, &mut lane, shift, seed, &ext, &mut rng);
                    qp.close(|_| ()).map_err(ctx("closing the queue pair"))?;
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut ios, mut bytes, mut queues) = (0, 0, Vec::new());
    for (i, r) in reports.into_iter().enumerate() {
        let r = r.map_err(|e| format!("thread {i}: {e}"))?;
        println!(
            "  thread {i}: hardware queue {}, {} commands, {} MiB written and read back; {}",
            r.qid,
            r.ios,
            r.bytes >> 21,
            r.lane
        );
        queues.push(r.qid);
        ios += r.ios;
        bytes += r.bytes;
    }
    queues.sort_unstable();
    queues.dedup();
    if matches!(ctrl.mode(), UfsMode::Mcq { .. }) && queues.len() != threads {
        return Err(format!(
            "{threads} threads shared hardware queues: {queues:?}"
        ));
    }
    println!(
        "ufs-rw: OK ({mode} mapping{}): {ios} commands, {} MiB written and read back identical in {secs:.2} s",
        if engine { " by the engine's MappedQueuePair" } else { "" },
        bytes >> 21
    );
    Ok(())
}
